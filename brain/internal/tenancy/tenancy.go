// Package tenancy maps a NATS account to its tenant and the tenant to a
// connection pool on its own database with its own role. The registry is the
// source of truth at each request: it is held in memory and reloaded when
// Postgres notifies a change (and on a slow timer as a safety net), so a
// change applies within moments. Pools are small, bounded per tenant, their
// connections together under a global cap, leased for each piece of work (never closed under
// it), closed when idle for long or when the tenant's connection details
// change. Credentials are unsealed in memory only.
package tenancy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"n8nbrain/registry"
)

// Config of the directory. The zero value of a field means its default.
type Config struct {
	RegistryURL string // the registry reader role's URL
	Sealer      *registry.Sealer
	// PerTenantConns bounds each tenant's pool. Default 4.
	PerTenantConns int32
	// MaxConns is the global cap on tenant connections, counted in
	// connections (pools.go): at least PerTenantConns, so that a busy
	// tenant's pool can reach its size. Default 64. The registry reader's
	// own pool (registryConns) is outside it.
	MaxConns int
	// IdleTimeout closes idle connections and, after it, idle pools: an idle
	// tenant holds no connection. Default 2m.
	IdleTimeout time.Duration
	// Refresh is the safety-net full reload interval (changes arrive through
	// LISTEN within moments). Default 2m.
	Refresh time.Duration
	// SSLMode is how tenant connections use TLS: one of SSLModes, as
	// libpq's sslmode. Default DefaultSSLMode. SSLRootCert is the CA
	// certificates file (PEM) that verify-ca and verify-full check the
	// servers' certificates against; empty means the system's roots.
	SSLMode     string
	SSLRootCert string
	// QueryTracer, when set, traces tenant databases' queries (nil when
	// tracing is off: pgx then does no tracing work at all).
	QueryTracer pgx.QueryTracer
}

func (c Config) withDefaults() Config {
	if c.PerTenantConns == 0 {
		c.PerTenantConns = 4
	}
	if c.MaxConns == 0 {
		c.MaxConns = 64
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 2 * time.Minute
	}
	if c.Refresh == 0 {
		c.Refresh = 2 * time.Minute
	}
	if c.SSLMode == "" {
		c.SSLMode = DefaultSSLMode
	}
	return c
}

// Directory is the in-memory registry and the tenant pools.
type Directory struct {
	cfg Config
	reg *pgxpool.Pool
	log *slog.Logger

	mu        sync.RWMutex
	byAccount map[string]*registry.Tenant
	byID      map[registry.TenantID]*registry.Tenant
	pools     *poolSet // under mu (pools.go)

	// Reloads counts registry reloads: All of every tenant (at start, on
	// the safety-net timer, when the listener reconnects), One of a single
	// tenant named by a change notification.
	Reloads struct{ All, One atomic.Int64 }

	// Tenants whose database refuses their role (see Check).
	loginMu       sync.Mutex
	loginFailing  map[registry.TenantID]loginState
	loginFailures map[registry.TenantID]int64
}

// registryConns is the size of the registry reader's pool (one of its
// connections LISTENs for changes). It is outside MaxConns.
const registryConns = 4

// Open connects to the registry and loads every tenant.
func Open(ctx context.Context, cfg Config, log *slog.Logger) (*Directory, error) {
	cfg = cfg.withDefaults()
	if cfg.Sealer == nil {
		return nil, errors.New("tenancy: a sealer is required to open tenant credentials")
	}
	if cfg.PerTenantConns < 1 || cfg.MaxConns < int(cfg.PerTenantConns) {
		return nil, fmt.Errorf("tenancy: the cap on tenant connections (%d) must be at least one tenant's pool (%d, at least 1)",
			cfg.MaxConns, cfg.PerTenantConns)
	}
	if err := checkTLS(cfg.SSLMode, cfg.SSLRootCert); err != nil {
		return nil, fmt.Errorf("tenancy: %w", err)
	}
	pc, err := pgxpool.ParseConfig(cfg.RegistryURL)
	if err != nil {
		return nil, fmt.Errorf("parse registry URL: %w", err)
	}
	pc.MaxConns = registryConns
	pc.ConnConfig.RuntimeParams["application_name"] = "brain-registry"
	reg, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect registry: %w", err)
	}
	d := &Directory{cfg: cfg, reg: reg, log: log, byAccount: map[string]*registry.Tenant{}, byID: map[registry.TenantID]*registry.Tenant{},
		pools: newPoolSet(), loginFailing: map[registry.TenantID]loginState{}, loginFailures: map[registry.TenantID]int64{}}
	if err := d.reloadAll(ctx); err != nil {
		reg.Close()
		return nil, err
	}
	return d, nil
}

// ByAccount returns the tenant of a NATS account. The returned value is a
// snapshot: never modified, replaced on change.
func (d *Directory) ByAccount(account string) (*registry.Tenant, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	t, ok := d.byAccount[account]
	return t, ok
}

// Tenants returns a snapshot of every tenant.
func (d *Directory) Tenants() []*registry.Tenant {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make([]*registry.Tenant, 0, len(d.byAccount))
	for _, t := range d.byAccount {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b *registry.Tenant) int { return compare(a.ID, b.ID) })
	return out
}

func compare(a, b registry.TenantID) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Run keeps the directory current until ctx is done: it listens for
// registry_changed notifications (reconnecting with backoff) and reloads
// everything every Refresh, and closes pools idle for longer than IdleTimeout.
func (d *Directory) Run(ctx context.Context) error {
	go d.refreshLoop(ctx)
	b := backoff.NewExponentialBackOff()
	b.MaxElapsedTime = 0
	b.MaxInterval = 10 * time.Second
	// One warning when the listener is lost and one line when it is back,
	// whatever the attempts between (an outage of the registry's server
	// would otherwise be a warning per attempt); each outage starts its
	// backoff afresh.
	var lost time.Time
	attempts := 0
	for ctx.Err() == nil {
		err := d.listen(ctx, func() {
			if !lost.IsZero() {
				d.log.Info("registry listener back", "down_ms", time.Since(lost).Milliseconds(), "attempts", attempts)
			}
			lost, attempts = time.Time{}, 0
			b.Reset()
		})
		if ctx.Err() != nil {
			break
		}
		wait := b.NextBackOff()
		if attempts++; lost.IsZero() {
			lost = time.Now()
			d.log.Warn("registry listener lost; reconnecting", "error", err, "retry_in", wait.String())
		} else {
			d.log.Debug("registry listener still lost; reconnecting", "error", err, "retry_in", wait.String())
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	return nil
}

// listen listens for registry_changed until its connection fails; up runs
// once it listens and has reloaded what changed meanwhile.
func (d *Directory) listen(ctx context.Context, up func()) error {
	conn, err := d.reg.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN registry_changed"); err != nil {
		return err
	}
	// Changes made while we were not listening are picked up here.
	if err := d.reloadAll(ctx); err != nil {
		return err
	}
	up()
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			// Leave the connection unusable for others: it may still be LISTENing.
			conn.Conn().Close(context.WithoutCancel(ctx))
			return err
		}
		if err := d.reloadOne(ctx, registry.TenantID(n.Payload)); err != nil {
			d.log.Error("reload tenant after registry change", "tenant_id", n.Payload, "error", err)
		}
	}
}

func (d *Directory) refreshLoop(ctx context.Context) {
	t := time.NewTicker(d.cfg.Refresh)
	defer t.Stop()
	idle := time.NewTicker(max(d.cfg.IdleTimeout/4, 10*time.Millisecond))
	defer idle.Stop()
	// One error when reloads start failing and one line when they work
	// again, not an error every Refresh while the registry is down.
	var failing time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			err := d.reloadAll(ctx)
			switch {
			case ctx.Err() != nil:
			case err != nil && failing.IsZero():
				failing = time.Now()
				d.log.Error("reload registry; the directory keeps what it last read until a reload works", "error", err)
			case err != nil:
				d.log.Debug("reload registry still fails", "error", err)
			case !failing.IsZero():
				d.log.Info("registry reloads again", "failed_for_ms", time.Since(failing).Milliseconds())
				failing = time.Time{}
			}
		case <-idle.C:
			d.closeIdlePools()
		}
	}
}

func (d *Directory) reloadAll(ctx context.Context) error {
	d.Reloads.All.Add(1)
	ts, err := registry.TenantList(ctx, d.reg)
	if err != nil {
		return err
	}
	byAccount := make(map[string]*registry.Tenant, len(ts))
	byID := make(map[registry.TenantID]*registry.Tenant, len(ts))
	for i := range ts {
		t := &ts[i]
		byAccount[t.NATSAccount] = t
		byID[t.ID] = t
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.byAccount, d.byID = byAccount, byID
	for id, tp := range d.pools.open {
		t := byID[id]
		if t == nil || !sameDB(tp.db, t.DB) {
			d.retireLocked(tp)
		}
	}
	return nil
}

func (d *Directory) reloadOne(ctx context.Context, id registry.TenantID) error {
	d.Reloads.One.Add(1)
	t, err := registry.TenantGet(ctx, d.reg, id)
	gone := errors.Is(err, pgx.ErrNoRows)
	if err != nil && !gone {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if old, ok := d.byID[id]; ok {
		delete(d.byAccount, old.NATSAccount)
		delete(d.byID, id)
	}
	if !gone {
		d.byAccount[t.NATSAccount] = &t
		d.byID[id] = &t
	}
	if tp, ok := d.pools.open[id]; ok && (gone || !sameDB(tp.db, t.DB)) {
		d.retireLocked(tp)
	}
	return nil
}
