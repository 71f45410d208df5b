// Package outbox forwards the events written in tenant databases to the
// tenants over NATS, until the edge reports n8n accepted them.
//
// A turn's events (Stage) are written already sent once and published by
// the replica that committed them, straight after the commit: no extra
// round trip to the database on the turn's path. Other events are forwarded
// when something wakes the forwarder for their tenant, never by polling
// every tenant: the commit that wrote them (Kick, in this replica), or the
// tenant's outbox timer (package timer) when an event no edge acknowledged
// is due again, on whichever replica takes it. After each pass the
// forwarder sets the tenant's timer to its next undelivered event's
// attempt, so a tenant with nothing to deliver has no timer at all. The
// brain's slow reconciliation pass wakes every tenant now and then, in case
// a replica died between a commit and its wake-up.
//
// Why not watermill's forwarder: watermill-sql keeps its own message and
// offset tables (created by DDL at run time, or coupled to its schema in our
// migrations), wants a database/sql transaction to publish into, and one
// subscriber per database; our tenant roles run no DDL, our transactions are
// pgx, and the outbox is one table per tenant database. A claim with FOR
// UPDATE SKIP LOCKED (store.OutboxClaimDue) is the whole forwarder, and
// several replicas can run it at once. Watermill earns its place on the
// edge, delivering to n8n with retry and a poison queue.
package outbox

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"n8nbrain/brain/internal/guard"
	"n8nbrain/brain/internal/store"
	"n8nbrain/brain/internal/tenancy"
	"n8nbrain/registry"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// Config of the forwarder. The zero value of a field means its default.
type Config struct {
	// RetryBase and RetryMax space re-publishes of an event nobody acked:
	// base·2^attempts, at most max. Defaults 2s and 5m.
	RetryBase time.Duration
	RetryMax  time.Duration
	// BeforeForward, if set, runs as a tenant's events are forwarded (a
	// test panics in it, as a bug in forwarding would).
	BeforeForward func(registry.TenantID)
}

func (c Config) withDefaults() Config {
	if c.RetryBase == 0 {
		c.RetryBase = 2 * time.Second
	}
	if c.RetryMax == 0 {
		c.RetryMax = 5 * time.Minute
	}
	return c
}

// Pools gives the pool of a tenant's own database.
type Pools interface {
	// Lease returns the pool, held open until release (tenancy.Directory).
	Lease(ctx context.Context, t *registry.Tenant) (pool *pgxpool.Pool, release func(), err error)
	// Check returns err, or a *tenancy.LoginError when the tenant's
	// database refuses the tenant's role (and records and logs it).
	Check(t *registry.Tenant, err error) error
}

// Timers keeps a tenant's one outbox timer (timer.Next).
type Timers interface {
	Ensure(ctx context.Context, account, kind string, t time.Time, onErr func(error))
	Set(ctx context.Context, account, kind string, t time.Time) error
	Clear(account, kind string)
}

// Forwarder publishes due events.
type Forwarder struct {
	cfg    Config
	pools  Pools
	timers Timers
	nc     *nats.Conn
	log    *slog.Logger

	mu     sync.Mutex
	kicked map[registry.TenantID]*registry.Tenant
	wake   chan struct{}
}

// New returns a forwarder.
func New(cfg Config, pools Pools, timers Timers, nc *nats.Conn, log *slog.Logger) *Forwarder {
	return &Forwarder{cfg: cfg.withDefaults(), pools: pools, timers: timers, nc: nc, log: log,
		kicked: map[registry.TenantID]*registry.Tenant{}, wake: make(chan struct{}, 1)}
}

// Kick makes the forwarder forward t's events soon (after a commit that
// wrote some). It never blocks.
func (f *Forwarder) Kick(t *registry.Tenant) {
	f.mu.Lock()
	f.kicked[t.ID] = t
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Stage writes ev in a turn's transaction and publishes it once the
// transaction commits, with the tenant's outbox timer set to bring it back
// if no edge acknowledges it within RetryBase. The event is on its way the
// moment the turn is decided, for the cost of one statement in the turn's
// batch.
func (f *Forwarder) Stage(w *store.TurnWrite, t *registry.Tenant, ev wire.Event) {
	payload := store.EventPayload(ev)
	w.Extra = append(w.Extra, store.OutboxInsertSent(ev, payload, f.cfg.RetryBase))
	w.OnCommit(func(ctx context.Context) {
		// Core publish: the edge receives it live through the event
		// export; if none listens, the timer brings it back.
		if err := f.nc.Publish(subjects.Event(t.NATSAccount, ev.EventID), payload); err != nil {
			f.log.Warn("publish event; its timer publishes it again", "tenant_id", t.ID, "event_id", ev.EventID, "error", err)
		}
		f.timers.Ensure(ctx, t.NATSAccount, subjects.DueOutbox, time.Now().Add(f.cfg.RetryBase), func(err error) {
			f.log.Warn("set the outbox timer; the reconciliation pass sets it later", "tenant_id", t.ID, "error", err)
		})
	})
}

// Run forwards the kicked tenants' events until ctx is done.
func (f *Forwarder) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
		}
		f.mu.Lock()
		batch := f.kicked
		f.kicked = map[registry.TenantID]*registry.Tenant{}
		f.mu.Unlock()
		for _, t := range batch {
			if ctx.Err() != nil {
				return
			}
			err := guard.Run(f.log, "forwarding events panicked, a bug in the brain; the reconciliation pass forwards them later",
				func() error { return f.Forward(ctx, t) }, "tenant_id", t.ID)
			if err != nil && ctx.Err() == nil && !tenancy.Logged(err) {
				f.log.Warn("forward events", "tenant_id", t.ID, "error", err)
			}
		}
	}
}

// Forward publishes t's events that are due, then sets t's outbox timer to
// its next undelivered event's attempt (none when all are delivered). An
// error leaves the timer as it was; the reconciliation pass repairs it.
func (f *Forwarder) Forward(ctx context.Context, t *registry.Tenant) error {
	if t.Status != registry.TenantStatusActive {
		return nil
	}
	pool, release, err := f.pools.Lease(ctx, t)
	if err != nil {
		return f.pools.Check(t, err)
	}
	defer release()
	return f.pools.Check(t, f.forward(ctx, t, pool))
}

// ForwardOn is Forward on a tenant database the caller holds (the
// reconciliation pass's visit).
func (f *Forwarder) ForwardOn(ctx context.Context, t *registry.Tenant, q store.DBTX) error {
	if t.Status != registry.TenantStatusActive {
		return nil
	}
	return f.pools.Check(t, f.forward(ctx, t, q))
}

func (f *Forwarder) forward(ctx context.Context, t *registry.Tenant, pool store.DBTX) error {
	if f.cfg.BeforeForward != nil {
		f.cfg.BeforeForward(t.ID)
	}
	for {
		evs, err := store.OutboxClaimDue(ctx, pool, 100, f.cfg.RetryBase, f.cfg.RetryMax)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			// Core publish: the edge receives it live through the event
			// export. If no edge listens, the claim above already set the
			// next attempt; the timer brings it back then.
			if err := f.nc.Publish(subjects.Event(t.NATSAccount, ev.ID), ev.Payload); err != nil {
				return err
			}
			f.log.Debug("event published", "tenant_id", t.ID, "event_id", ev.ID, "attempt", ev.Attempts)
		}
		if len(evs) < 100 {
			break
		}
	}
	next, ok, err := store.OutboxNextAttempt(ctx, pool)
	if err != nil {
		return err
	}
	if !ok {
		f.timers.Clear(t.NATSAccount, subjects.DueOutbox)
		return nil
	}
	return f.timers.Set(ctx, t.NATSAccount, subjects.DueOutbox, next)
}
