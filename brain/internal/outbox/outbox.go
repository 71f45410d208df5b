// Package outbox forwards the events written in tenant databases to the
// tenants over NATS, until the edge reports n8n accepted them.
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
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"n8nbrain/brain/internal/store"
	"n8nbrain/brain/internal/tenancy"
	"n8nbrain/registry"
	"n8nbrain/subjects"
)

// Config of the forwarder. The zero value of a field means its default.
type Config struct {
	// Interval between scans of the tenant databases. Default 2s.
	Interval time.Duration
	// RetryBase and RetryMax space re-publishes of an event nobody acked:
	// base·2^attempts, at most max. Defaults 2s and 5m.
	RetryBase time.Duration
	RetryMax  time.Duration
}

func (c Config) withDefaults() Config {
	if c.Interval == 0 {
		c.Interval = 2 * time.Second
	}
	if c.RetryBase == 0 {
		c.RetryBase = 2 * time.Second
	}
	if c.RetryMax == 0 {
		c.RetryMax = 5 * time.Minute
	}
	return c
}

// Tenants lists the tenants to forward for.
type Tenants interface {
	Tenants() []*registry.Tenant
	Pool(ctx context.Context, t *registry.Tenant) (*pgxpool.Pool, error)
	// Check returns err, or a *tenancy.LoginError when the tenant's
	// database refuses the tenant's role (and records and logs it).
	Check(t *registry.Tenant, err error) error
}

// Forwarder publishes due events.
type Forwarder struct {
	cfg     Config
	tenants Tenants
	nc      *nats.Conn
	log     *slog.Logger
	kick    chan struct{}
}

// New returns a forwarder.
func New(cfg Config, tenants Tenants, nc *nats.Conn, log *slog.Logger) *Forwarder {
	return &Forwarder{cfg: cfg.withDefaults(), tenants: tenants, nc: nc, log: log, kick: make(chan struct{}, 1)}
}

// Kick makes the forwarder scan now (after a commit that wrote events).
func (f *Forwarder) Kick() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// Run forwards until ctx is done.
func (f *Forwarder) Run(ctx context.Context) {
	t := time.NewTicker(f.cfg.Interval)
	defer t.Stop()
	for {
		f.forwardAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-f.kick:
		}
	}
}

func (f *Forwarder) forwardAll(ctx context.Context) {
	for _, t := range f.tenants.Tenants() {
		if t.Status != registry.TenantStatusActive || ctx.Err() != nil {
			continue
		}
		// The forwarder reaches every tenant's database every few seconds:
		// a role its database refuses is noticed (and logged) here first.
		err := f.tenants.Check(t, f.forward(ctx, t))
		var le *tenancy.LoginError
		if err != nil && ctx.Err() == nil && !errors.As(err, &le) {
			f.log.Warn("forward events", "tenant_id", t.ID, "error", err)
		}
	}
}

func (f *Forwarder) forward(ctx context.Context, t *registry.Tenant) error {
	pool, err := f.tenants.Pool(ctx, t)
	if err != nil {
		return err
	}
	for {
		evs, err := store.OutboxClaimDue(ctx, pool, 100, f.cfg.RetryBase, f.cfg.RetryMax)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			// Core publish: the edge receives it live through the event
			// export. If no edge listens, the claim above already set the
			// next attempt; the event is published again then.
			if err := f.nc.Publish(subjects.Event(t.NATSAccount, ev.ID), ev.Payload); err != nil {
				return err
			}
			f.log.Debug("event published", "tenant_id", t.ID, "event_id", ev.ID, "attempt", ev.Attempts)
		}
		if len(evs) < 100 {
			return nil
		}
	}
}
