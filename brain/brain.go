// Package brain is the central, stateless decision service. Run builds the
// whole component graph of one replica, top to bottom: the registry
// directory and tenant pools, the NATS connection and JetStream streams, the
// Capture engine, the turn processor, and the consumers listed in consume.go.
// Any replica can answer any turn; several share one durable consumer.
package brain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/brain/internal/engine"
	"n8nbrain/brain/internal/tenancy"
	"n8nbrain/brain/internal/turn"
	"n8nbrain/nats/stream"
	"n8nbrain/registry"
)

// Run runs one brain replica until ctx is done.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("brain config: %w", err)
	}
	log = log.With("replica", cfg.Replica)

	sealer, err := registry.NewSealer(cfg.SealingKey)
	if err != nil {
		return err
	}
	dir, err := tenancy.Open(ctx, tenancy.Config{
		RegistryURL:    cfg.RegistryURL,
		Sealer:         sealer,
		PerTenantConns: cfg.DBConnsPerTenant,
		MaxConns:       cfg.DBMaxConns,
		Refresh:        cfg.RegistryRefresh,
	}, log)
	if err != nil {
		return err
	}
	defer dir.Close()

	nc, err := nats.Connect(cfg.NATSURL,
		nats.UserCredentials(cfg.CredsFile),
		nats.Name("brain-"+cfg.Replica),
		nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("nats disconnected", "error", err) }),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("nats reconnected") }),
	)
	if err != nil {
		return fmt.Errorf("connect nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	setupCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	cons, err := stream.Ensure(setupCtx, js, cfg.Streams)
	cancel()
	if err != nil {
		return err
	}

	eng := engine.New(nil)
	proc := turn.New(dir, eng, nil, nil, turn.Hooks(cfg.Hooks), log)
	b := &brain{cfg: cfg, log: log, nc: nc, js: js, dir: dir, proc: proc}

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	var wg sync.WaitGroup
	wg.Go(func() { _ = dir.Run(runCtx) })

	cc, err := b.consumeTurns(ctx, cons)
	if err != nil {
		return err
	}
	var ops *http.Server
	if ln := cfg.OpsListener; ln != nil || cfg.OpsAddr != "" {
		if ln == nil {
			if ln, err = net.Listen("tcp", cfg.OpsAddr); err != nil {
				cc.Stop()
				return fmt.Errorf("listen on BRAIN_OPS_ADDR: %w", err)
			}
		}
		ops = &http.Server{Handler: b.opsRoutes(), ReadHeaderTimeout: 5 * time.Second}
		wg.Go(func() {
			if err := ops.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("ops server", "error", err)
			}
		})
		log.Info("ops endpoints listening", "addr", ln.Addr().String())
	}
	log.Info("brain replica ready", "workers", cfg.Workers, "tenants", len(dir.Tenants()))

	<-ctx.Done()
	cc.Stop()
	b.waitInflight(cfg.ShutdownGrace)
	if ops != nil {
		_ = ops.Close()
	}
	stopRun()
	wg.Wait()
	log.Info("brain replica stopped")
	return nil
}

type brain struct {
	cfg  Config
	log  *slog.Logger
	nc   *nats.Conn
	js   jetstream.JetStream
	dir  *tenancy.Directory
	proc *turn.Processor

	inflight sync.WaitGroup
}

// waitInflight waits for turns in flight, at most grace; the rest are
// redelivered by JetStream to another replica.
func (b *brain) waitInflight(grace time.Duration) {
	done := make(chan struct{})
	go func() { b.inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		b.log.Warn("shutdown grace over; turns still in flight will be redelivered")
	}
}
