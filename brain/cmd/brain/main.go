// Command brain runs one brain replica, configured from the environment
// (see brain.ConfigFromEnv). `brain healthcheck` asks a running replica's
// BRAIN_OPS_ADDR whether it is ready (a container health check; exit 0 or 1).
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"n8nbrain/brain"
	"n8nbrain/internal/healthcheck"
	"n8nbrain/internal/loglevel"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		cfg, err := brain.ConfigFromEnv(os.Getenv)
		os.Exit(healthcheck.Main(cfg.OpsAddr, err))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	level, levelErr := loglevel.Parse("BRAIN_LOG_LEVEL", os.Getenv("BRAIN_LOG_LEVEL"))
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if levelErr != nil {
		log.Error("brain config", "error", levelErr)
		os.Exit(1)
	}
	cfg, err := brain.ConfigFromEnv(os.Getenv)
	if err == nil {
		err = brain.Run(ctx, cfg, log)
	}
	if err != nil {
		log.Error("brain stopped", "error", err)
		os.Exit(1)
	}
}
