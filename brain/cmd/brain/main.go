// Command brain runs one brain replica, configured from the environment
// (see brain.ConfigFromEnv).
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"n8nbrain/brain"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := brain.ConfigFromEnv(os.Getenv)
	if err == nil {
		err = brain.Run(ctx, cfg, log)
	}
	if err != nil {
		log.Error("brain stopped", "error", err)
		os.Exit(1)
	}
}
