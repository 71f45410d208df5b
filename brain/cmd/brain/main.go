// Command brain runs one brain replica, configured from the environment
// (see brain.ConfigFromEnv; tracing from the standard OTEL_* variables,
// see package telemetry).
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"n8nbrain/brain"
	"n8nbrain/internal/telemetry"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := brain.ConfigFromEnv(os.Getenv)
	var tp telemetry.Provider
	if err == nil {
		tp, err = telemetry.FromEnv(ctx, os.Getenv, "n8nbrain-brain")
	}
	if err == nil {
		if telemetry.IsOn(tp.TracerProvider) {
			log.Info("tracing on: spans are exported over OTLP/HTTP (OTEL_EXPORTER_OTLP_ENDPOINT)")
		}
		cfg.TracerProvider = tp.TracerProvider
		err = brain.Run(ctx, cfg, log)
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if serr := tp.Shutdown(sctx); serr != nil {
			log.Warn("flush traces", "error", serr)
		}
		cancel()
	}
	if err != nil {
		log.Error("brain stopped", "error", err)
		os.Exit(1)
	}
}
