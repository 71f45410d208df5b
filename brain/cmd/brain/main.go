// Command brain runs one brain replica, configured from the environment
// (see brain.ConfigFromEnv; tracing from the standard OTEL_* variables, see
// package telemetry). `brain healthcheck` asks a running replica's
// BRAIN_OPS_ADDR whether it is ready (a container health check; exit 0 or 1).
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"n8nbrain/brain"
	"n8nbrain/internal/healthcheck"
	"n8nbrain/internal/loglevel"
	"n8nbrain/internal/telemetry"
	"n8nbrain/internal/usage"
)

const help = `brain runs one brain replica until SIGINT or SIGTERM. It takes no flags: it is
configured from the environment (BRAIN_NATS_URL, BRAIN_NATS_CREDS, BRAIN_REGISTRY_URL,
BRAIN_SEALING_KEY and the optional rest; README.md, section Configuration, lists them
with their defaults).

  brain              run a replica
  brain healthcheck  ask the replica on BRAIN_OPS_ADDR whether it is ready (exit 0 or 1)
  brain --help       this text
`

func main() {
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		cfg, err := brain.ConfigFromEnv(os.Getenv)
		os.Exit(healthcheck.Main(cfg.OpsAddr, err))
	}
	if run, code := usage.Check("brain", os.Args[1:], help, os.Stdout, os.Stderr); !run {
		os.Exit(code)
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
