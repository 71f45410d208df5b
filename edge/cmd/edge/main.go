// Command edge runs a tenant's edge beside its n8n; see package edge.
// `edge healthcheck` asks a running edge on EDGE_ADDR whether it is ready (a
// container health check; exit 0 or 1).
package main

import (
	"context"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"
	// EDGE_REVIEW_TIMEZONE works in a container without a zoneinfo database.
	_ "time/tzdata"

	"n8nbrain/edge"
	"n8nbrain/internal/healthcheck"
	"n8nbrain/internal/loglevel"
	"n8nbrain/internal/telemetry"
	"n8nbrain/internal/usage"
)

const help = `edge relays one tenant's n8n to the brain until SIGINT or SIGTERM. It takes no
flags: it is configured from the environment (EDGE_NATS_URL, EDGE_NATS_CREDS, EDGE_TOKEN
and the optional rest; README.md, section Configuration, lists them with their defaults).

  edge              serve on EDGE_ADDR
  edge healthcheck  ask the edge on EDGE_ADDR whether it is ready (exit 0 or 1)
  edge --help       this text

It runs one thread of Go code unless GOMAXPROCS is set: it shares its host with n8n.
`

func main() {
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		cfg, err := edge.ConfigFromEnv(os.Getenv)
		os.Exit(healthcheck.Main(cfg.Addr, err))
	}
	if run, code := usage.Check("edge", os.Args[1:], help, os.Stdout, os.Stderr); !run {
		os.Exit(code)
	}
	// One thread of Go code serves a tenant's turns at a fraction of a core
	// and measured 0.81-0.87x the CPU per turn of Go's default of one per core
	// (BENCHMARKS.md, 2026-12-06): the cores are n8n's too.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	level, levelErr := loglevel.Parse("EDGE_LOG_LEVEL", os.Getenv("EDGE_LOG_LEVEL"))
	logger := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if levelErr != nil {
		logger.Error("edge config", "error", levelErr)
		os.Exit(1)
	}
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
	tp, err := telemetry.FromEnv(ctx, os.Getenv, "n8nbrain-edge")
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			logger.Warn("flush traces", "error", err)
		}
	}()
	if telemetry.IsOn(tp.TracerProvider) {
		logger.Info("tracing on: spans are exported over OTLP/HTTP (OTEL_EXPORTER_OTLP_ENDPOINT)")
	}
	cfg.TracerProvider = tp.TracerProvider
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	return edge.Serve(ctx, ln, cfg, logger)
}
