// Command edge runs a tenant's edge beside its n8n; see package edge.
package main

import (
	"context"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	// EDGE_REVIEW_TIMEZONE works in a container without a zoneinfo database.
	_ "time/tzdata"

	"n8nbrain/edge"
)

func main() {
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, logger); err != nil {
		logger.Error("edge failed", "error", err)
		stop()
		os.Exit(1)
	}
}

func run(ctx context.Context, logger *slog.Logger) error {
	cfg, err := edge.ConfigFromEnv(os.Getenv)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	return edge.Serve(ctx, ln, cfg, logger)
}
