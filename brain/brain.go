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
	"runtime"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"n8nbrain/brain/internal/approval"
	"n8nbrain/brain/internal/capture"
	"n8nbrain/brain/internal/engine"
	"n8nbrain/brain/internal/fair"
	"n8nbrain/brain/internal/guard"
	"n8nbrain/brain/internal/model"
	"n8nbrain/brain/internal/outbox"
	"n8nbrain/brain/internal/tenancy"
	"n8nbrain/brain/internal/timer"
	"n8nbrain/brain/internal/turn"
	"n8nbrain/internal/telemetry"
	"n8nbrain/nats/connwatch"
	"n8nbrain/registry"
	"n8nbrain/subjects"
)

// Run runs one brain replica until ctx is done. A replica asked to stop
// while it is still starting returns nil, like one stopped after.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	err := run(ctx, cfg, log)
	if err != nil && ctx.Err() != nil {
		return nil
	}
	return err
}

func run(ctx context.Context, cfg Config, log *slog.Logger) error {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("brain config: %w", err)
	}
	log = log.With("replica", cfg.Replica)
	tp := cfg.TracerProvider
	var queryTracer pgx.QueryTracer
	if telemetry.IsOn(tp) {
		queryTracer = telemetry.PgxTracer{}
	} else {
		tp = telemetry.Off().TracerProvider
	}
	inst := newInstruments()

	sealer, err := registry.NewSealer(cfg.SealingKey, cfg.PreviousSealingKey)
	if err != nil {
		return err
	}
	dir, err := tenancy.Open(ctx, tenancy.Config{
		RegistryURL:    cfg.RegistryURL,
		Sealer:         sealer,
		PerTenantConns: cfg.DBConnsPerTenant,
		MaxConns:       cfg.DBMaxConns,
		SSLMode:        cfg.DBSSLMode,
		SSLRootCert:    cfg.DBSSLRootCert,
		IdleTimeout:    cfg.DBIdleTimeout,
		Refresh:        cfg.RegistryRefresh,
		QueryTracer:    queryTracer,
	}, log)
	if err != nil {
		return err
	}
	defer dir.Close()

	// Reconnects are unlimited, but nats.go still closes the connection for
	// good when the server refuses the credential twice (revoked, expired)
	// or sends an error that ends it: the replica then stops with an error
	// (main exits 1) for its supervisor to restart it, rather than staying
	// up with nothing to do (see connwatch).
	connect := func(name string, log *slog.Logger) (*nats.Conn, *connwatch.Watch, error) {
		watch := connwatch.New(log)
		nc, err := nats.Connect(cfg.NATSURL, append(watch.Options(),
			nats.UserCredentials(cfg.CredsFile),
			nats.Name(name),
		)...)
		if err != nil {
			return nil, nil, fmt.Errorf("connect nats: %w", err)
		}
		return nc, watch, nil
	}
	nc, watch, err := connect("brain-"+cfg.Replica, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	// The tenant API has a connection of its own: the calls of every
	// tenant arrive on it, so a tenant flooding them can at worst make the
	// server cut that one (see tenantAPI), never the turns' connection.
	apiNC, apiWatch, err := connect("brain-"+cfg.Replica+"-api", log.With("nats_conn", "api"))
	if err != nil {
		return err
	}
	defer apiNC.Close()
	// The turn streams live in the STREAMS account; this client reaches
	// their consumers, acks and reply storage through the BRAIN account's
	// imports, and can administer nothing.
	js, err := jetstream.NewWithAPIPrefix(nc, subjects.StreamsAPIPrefix)
	if err != nil {
		return err
	}

	mc, stage, err := modelStage(ctx, cfg.Model, inst, log)
	if err != nil {
		return err
	}
	var m engine.Model // stays a nil interface without a model: rules only
	if stage != nil {
		m = stage
	}
	eng := engine.New(m)
	timers := timer.NewNext(timer.New(js))
	fwd := outbox.New(outbox.Config{RetryBase: cfg.EventRetryBase, RetryMax: cfg.EventRetryMax,
		BeforeForward: cfg.Hooks.BeforeForwardFunc}, dir, timers, nc, log)
	approvals := approval.New(dir, timers, fwd, log)
	proc := turn.New(dir, eng, approvals, approvals, turn.Hooks{AfterStepFunc: cfg.Hooks.AfterStepFunc, AfterCommitFunc: cfg.Hooks.AfterCommitFunc}, log)
	sched := fair.New[queued](cfg.TenantWorkers)
	b := &brain{cfg: cfg, log: log, nc: nc, natsWatch: watch, apiNC: apiNC, apiWatch: apiWatch, js: js, dir: dir, proc: proc, approvals: approvals, outbox: fwd,
		model: mc, stage: stage, sched: sched, consumers: newConsumers(js, sched, log),
		inst: inst, tracer: tp.Tracer(telemetry.Scope)}
	b.pending = newPendingWatch(dir, log)
	b.metrics = b.newMetrics()

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	b.held = newHeld(runCtx, b)
	var wg sync.WaitGroup
	wg.Go(func() { _ = dir.Run(runCtx) })
	wg.Go(func() { fwd.Run(runCtx) })
	wg.Go(func() { b.consumeDue(runCtx) })
	wg.Go(func() { b.reconcile(runCtx) })
	wg.Go(func() { b.pending.run(runCtx) })

	api := b.newAPIServer()
	b.consumers.api = api
	defer api.stop()
	waitWorkers := b.turnWorkers(ctx)
	// The consumers are stopped on their own context, before the workers'
	// queue is handed back at shutdown.
	consumeCtx, stopConsuming := context.WithCancel(runCtx)
	consumersDone := make(chan struct{})
	b.consumers.reconcile(ctx, dir.Tenants())
	go func() { defer close(consumersDone); b.consumers.run(consumeCtx, dir.Tenants) }()
	// The heartbeats of queued and held turns outlive the replica's
	// context: they stop once handBack has sent those turns back, so that
	// JetStream does not redeliver one while the consumers are halting.
	beatCtx, stopBeats := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBeats()
	// handBack stops taking turns and sends those this replica has not
	// started back to JetStream at once (another replica takes them):
	// held turns first, since a probe that found its database back pushes
	// them to the queue, which is handed back next.
	handBack := func() {
		stopConsuming()
		<-consumersDone
		for _, q := range append(b.held.close(), b.sched.Close()...) {
			_ = q.m.Nak()
		}
		stopBeats()
	}
	wg.Go(func() { b.heartbeatQueued(beatCtx) })
	var ops *http.Server
	if ln := cfg.OpsListener; ln != nil || cfg.OpsAddr != "" {
		if ln == nil {
			if ln, err = net.Listen("tcp", cfg.OpsAddr); err != nil {
				handBack()
				waitWorkers()
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
	log.Info("brain replica ready", "workers", cfg.Workers, "tenant_workers", cfg.TenantWorkers, "gomaxprocs", runtime.GOMAXPROCS(0),
		"tenants", len(dir.Tenants()), "consuming", b.consumers.count())

	var stopErr error
	select {
	case <-ctx.Done():
	case <-watch.Closed():
		stopErr = watch.ClosedError()
		log.Error("brain replica stopping: its NATS connection is closed for good", "error", stopErr)
	case <-apiWatch.Closed():
		stopErr = apiWatch.ClosedError()
		log.Error("brain replica stopping: its NATS connection for the tenant API is closed for good", "error", stopErr)
	}
	// No new turns; turns being decided finish, within the grace.
	handBack()
	b.waitInflight(cfg.ShutdownGrace, waitWorkers)
	if ops != nil {
		_ = ops.Close()
	}
	stopRun()
	wg.Wait()
	b.held.wait()
	log.Info("brain replica stopped")
	return stopErr
}

type brain struct {
	cfg Config
	log *slog.Logger
	nc  *nats.Conn
	// natsWatch says when nc is closed for good or its credential refused.
	natsWatch *connwatch.Watch
	// apiNC carries the tenant API only (api.go); apiWatch follows it.
	apiNC    *nats.Conn
	apiWatch *connwatch.Watch
	js       jetstream.JetStream
	dir      *tenancy.Directory
	proc     *turn.Processor
	// approvals serves the tenant API and takes part in every turn.
	approvals *approval.Approvals
	outbox    *outbox.Forwarder
	// model and stage are nil when the brain runs rules only.
	model *model.Client
	stage *capture.Stage
	// sched shares the workers fairly between tenants; consumers feed it.
	sched     *fair.Scheduler[queued]
	consumers *consumers
	// inst are the metrics observed on the hot path; metrics is this
	// replica's registry (its own: never the global default one).
	inst    *instruments
	metrics *prometheus.Registry
	// tracer starts a turn's spans: a no-op one when tracing is off.
	tracer trace.Tracer
	// pending keeps each active tenant's approvals and outbox backlog.
	pending *pendingWatch
	// held keeps the turns of tenants whose database does not answer.
	held *held
}

// modelStage builds the model client and stage, or nothing (rules only)
// when no model server is configured. A server that does not answer at
// start-up is a warning, not a failure: the circuit breaker keeps items
// from waiting on it, and they are escalated as model_unavailable.
func modelStage(ctx context.Context, cfg ModelConfig, inst *instruments, log *slog.Logger) (*model.Client, *capture.Stage, error) {
	if cfg.URL == "" {
		log.Info("no model server configured (BRAIN_OLLAMA_URL): running rules only; items no confident rule decides are escalated to a human")
		return nil, nil, nil
	}
	u, err := model.ParseURL(cfg.URL)
	if err != nil {
		return nil, nil, fmt.Errorf("brain config: BRAIN_OLLAMA_URL: %w", err)
	}
	mc, err := model.New(model.Config{
		URL:           cfg.URL,
		Timeout:       cfg.Timeout,
		KeepAlive:     cfg.KeepAlive,
		RetryDelay:    cfg.RetryDelay,
		MaxConcurrent: cfg.Concurrency,
		Breaker: model.BreakerConfig{
			Window:       cfg.BreakerWindow,
			MinCalls:     cfg.BreakerMinCalls,
			FailureRatio: cfg.BreakerFailureRatio,
			CoolDown:     cfg.BreakerCoolDown,
		},
	}, log)
	if err != nil {
		return nil, nil, err
	}
	stage := capture.New(mc, capture.Config{DefaultModel: cfg.Name, CallObservedFunc: inst.modelCallObserved}, log)
	if v, err := mc.Ping(ctx); err != nil {
		log.Warn("model server not reachable at start-up; items needing the model are escalated as model_unavailable until it answers",
			"model_url", u.Redacted(), "model", cfg.Name, "error", err)
	} else {
		log.Info("model stage configured", "model_url", u.Redacted(), "model", cfg.Name, "ollama_version", v,
			"model_timeout", cfg.Timeout.String())
	}
	return mc, stage, nil
}

// reconcile is the timers' safety net: every cfg.ReconcileInterval it
// visits every tenant once, spread evenly over the interval (never a burst
// of pools): it sweeps expired approvals, which sets the expiry timer,
// forwards undelivered events, which sets the outbox timer, and counts the
// tenant's pending work. It repairs the timers a replica that died between
// a commit and its wake-up left unset; in normal work the timers do
// everything. A visit leaves nothing open: an idle tenant's pool is opened
// for the visit's few statements on one connection and closed after it
// (tenancy.Directory.Visit), so an idle replica holds no tenant connection
// between visits, whatever the number of tenants.
func (b *brain) reconcile(ctx context.Context) {
	for {
		tenants := b.dir.Tenants()
		step := b.cfg.ReconcileInterval / time.Duration(max(len(tenants), 1))
		for _, t := range tenants {
			select {
			case <-ctx.Done():
				return
			case <-time.After(step):
			}
			if t.Status != registry.TenantStatusActive {
				continue
			}
			b.visit(ctx, t, max(step, visitTimeout))
		}
		if len(tenants) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(step):
			}
		}
	}
}

// visitTimeout bounds one tenant's visit by the reconciliation pass, at
// least (a replica at its connection cap waits for a place, up to the
// connect timeout at each connection).
const visitTimeout = 30 * time.Second

func (b *brain) visit(ctx context.Context, t *registry.Tenant, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := b.dir.Visit(ctx, t, func(pool *pgxpool.Pool) error {
		return b.guarded(t, "the reconciliation pass", func() error { b.reconcileOn(ctx, t, pool); return nil })
	})
	if err = b.dir.Check(t, err); err != nil && ctx.Err() == nil && !tenancy.Logged(err) {
		b.log.Warn("reconcile: open the tenant's pool", "tenant_id", t.ID, "error", err)
	}
}

// reconcileOn is one tenant's visit by the reconciliation pass, on its pool.
func (b *brain) reconcileOn(ctx context.Context, t *registry.Tenant, pool *pgxpool.Pool) {
	if _, err := b.approvals.ExpireOn(ctx, t, pool); err != nil && ctx.Err() == nil {
		b.log.Warn("reconcile approvals", "tenant_id", t.ID, "error", err)
	}
	if err := b.outbox.ForwardOn(ctx, t, pool); err != nil && ctx.Err() == nil {
		b.log.Warn("reconcile events", "tenant_id", t.ID, "error", err)
	}
	// No tenant's figures are older than one interval.
	if err := b.pending.countOn(ctx, t, pool); err != nil && ctx.Err() == nil {
		b.log.Debug("count pending approvals and events", "tenant_id", t.ID, "error", err)
	}
}

// guarded runs fn, the brain's own work for tenant t (a timer, the
// reconciliation pass), with a panic in it turned into guard.ErrPanicked.
func (b *brain) guarded(t *registry.Tenant, what string, fn func() error) error {
	return guard.Run(b.log, what+" panicked, a bug in the brain; it runs again later", fn, "tenant_id", string(t.ID))
}

// waitInflight waits for turns in flight, at most grace; the turns left are
// redelivered by JetStream to another replica.
func (b *brain) waitInflight(grace time.Duration, waitWorkers func()) {
	done := make(chan struct{})
	go func() { waitWorkers(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		b.log.Warn("shutdown grace over; turns still in flight will be redelivered")
	}
}
