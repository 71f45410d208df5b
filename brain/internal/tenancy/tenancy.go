// Package tenancy maps a NATS account to its tenant and the tenant to a
// connection pool on its own database with its own role. The registry is the
// source of truth at each request: it is held in memory and reloaded when
// Postgres notifies a change (and on a slow timer as a safety net), so a
// change applies within moments. Pools are small, bounded per tenant and
// under a global cap, closed when idle for long or when the tenant's
// connection details change. Credentials are unsealed in memory only.
package tenancy

import (
	"bytes"
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
	// MaxConns is the global cap on tenant connections. Default 64.
	MaxConns int
	// IdleTimeout closes idle connections and, after it, idle pools: an idle
	// tenant holds no connection. Default 2m.
	IdleTimeout time.Duration
	// Refresh is the safety-net full reload interval (changes arrive through
	// LISTEN within moments). Default 2m.
	Refresh time.Duration
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
	pools     map[registry.TenantID]*tenantPool

	// Reloads counts registry reloads: All of every tenant (at start, on
	// the safety-net timer, when the listener reconnects), One of a single
	// tenant named by a change notification.
	Reloads struct{ All, One atomic.Int64 }

	// Tenants whose database refuses their role (see Check).
	loginMu       sync.Mutex
	loginFailing  map[registry.TenantID]loginState
	loginFailures map[registry.TenantID]int64
}

type tenantPool struct {
	pool     *pgxpool.Pool
	db       registry.DBConfig
	lastUsed time.Time
}

// ErrAtCapacity means every tenant connection slot is busy; retry later.
var ErrAtCapacity = errors.New("tenant connection cap reached")

// Open connects to the registry and loads every tenant.
func Open(ctx context.Context, cfg Config, log *slog.Logger) (*Directory, error) {
	cfg = cfg.withDefaults()
	if cfg.Sealer == nil {
		return nil, errors.New("tenancy: a sealer is required to open tenant credentials")
	}
	pc, err := pgxpool.ParseConfig(cfg.RegistryURL)
	if err != nil {
		return nil, fmt.Errorf("parse registry URL: %w", err)
	}
	pc.MaxConns = 4
	pc.ConnConfig.RuntimeParams["application_name"] = "brain-registry"
	reg, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect registry: %w", err)
	}
	d := &Directory{cfg: cfg, reg: reg, log: log, byAccount: map[string]*registry.Tenant{}, byID: map[registry.TenantID]*registry.Tenant{}, pools: map[registry.TenantID]*tenantPool{},
		loginFailing: map[registry.TenantID]loginState{}, loginFailures: map[registry.TenantID]int64{}}
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

// Pool returns the tenant's pool, opening it if needed. When every
// connection slot belongs to a pool in use, it waits for one to be freed
// (idle pools are closed to make room), until ctx ends: ErrAtCapacity.
func (d *Directory) Pool(ctx context.Context, t *registry.Tenant) (*pgxpool.Pool, error) {
	wait := 5 * time.Millisecond
	for {
		pool, err := d.pool(ctx, t)
		if !errors.Is(err, ErrAtCapacity) {
			return pool, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

func (d *Directory) pool(ctx context.Context, t *registry.Tenant) (*pgxpool.Pool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if tp, ok := d.pools[t.ID]; ok && sameDB(tp.db, t.DB) {
		tp.lastUsed = time.Now()
		return tp.pool, nil
	} else if ok {
		d.closePoolLocked(t.ID)
	}
	if (len(d.pools)+1)*int(d.cfg.PerTenantConns) > d.cfg.MaxConns && !d.evictIdleLocked() {
		return nil, fmt.Errorf("open pool for tenant %s: %w", t.ID, ErrAtCapacity)
	}
	password, err := d.cfg.Sealer.Open(t.ID, t.DB.PasswordSealed)
	if err != nil {
		return nil, fmt.Errorf("open credentials of tenant %s: %w", t.ID, err)
	}
	pc, err := pgxpool.ParseConfig("sslmode=prefer")
	if err != nil {
		return nil, err
	}
	pc.ConnConfig.Host = t.DB.Host
	pc.ConnConfig.Port = uint16(t.DB.Port)
	pc.ConnConfig.Database = t.DB.Name
	pc.ConnConfig.User = t.DB.User
	pc.ConnConfig.Password = string(password)
	pc.ConnConfig.ConnectTimeout = 5 * time.Second
	pc.ConnConfig.RuntimeParams["application_name"] = "brain"
	pc.ConnConfig.RuntimeParams["statement_timeout"] = "10000"
	// A role may set its own defaults (ALTER ROLE CURRENT_USER SET …);
	// settings sent at connection start win over them, so the ones the
	// brain's SQL relies on are pinned here.
	pc.ConnConfig.RuntimeParams["search_path"] = "public"
	pc.ConnConfig.RuntimeParams["default_transaction_read_only"] = "off"
	pc.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read committed"
	pc.ConnConfig.Tracer = d.cfg.QueryTracer
	id := t.ID
	pc.AfterConnect = func(context.Context, *pgx.Conn) error {
		d.loginWorks(id)
		return nil
	}
	pc.MaxConns = d.cfg.PerTenantConns
	pc.MinConns = 0
	pc.MaxConnIdleTime = d.cfg.IdleTimeout
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("open pool for tenant %s: %w", t.ID, err)
	}
	d.pools[t.ID] = &tenantPool{pool: pool, db: t.DB, lastUsed: time.Now()}
	return pool, nil
}

func sameDB(a, b registry.DBConfig) bool {
	return a.Host == b.Host && a.Port == b.Port && a.Name == b.Name && a.User == b.User &&
		bytes.Equal(a.PasswordSealed, b.PasswordSealed)
}

// evictIdleLocked closes the least recently used pool with no connection in
// use. It reports whether one was closed.
func (d *Directory) evictIdleLocked() bool {
	var victim registry.TenantID
	var oldest time.Time
	for id, tp := range d.pools {
		if tp.pool.Stat().AcquiredConns() > 0 {
			continue
		}
		if victim == "" || tp.lastUsed.Before(oldest) {
			victim, oldest = id, tp.lastUsed
		}
	}
	if victim == "" {
		return false
	}
	d.closePoolLocked(victim)
	return true
}

func (d *Directory) closePoolLocked(id registry.TenantID) {
	tp, ok := d.pools[id]
	if !ok {
		return
	}
	delete(d.pools, id)
	// Close waits for connections in use to be released; do not hold the lock.
	go tp.pool.Close()
}

// Run keeps the directory current until ctx is done: it listens for
// registry_changed notifications (reconnecting with backoff) and reloads
// everything every Refresh, and closes pools idle for longer than IdleTimeout.
func (d *Directory) Run(ctx context.Context) error {
	go d.refreshLoop(ctx)
	b := backoff.NewExponentialBackOff()
	b.MaxElapsedTime = 0
	b.MaxInterval = 10 * time.Second
	for ctx.Err() == nil {
		err := d.listen(ctx)
		if ctx.Err() != nil {
			break
		}
		wait := b.NextBackOff()
		d.log.Warn("registry listener lost; reconnecting", "error", err, "retry_in", wait.String())
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	return nil
}

func (d *Directory) listen(ctx context.Context) error {
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
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := d.reloadAll(ctx); err != nil && ctx.Err() == nil {
				d.log.Error("reload registry", "error", err)
			}
		case <-idle.C:
			d.closeIdlePools()
		}
	}
}

func (d *Directory) closeIdlePools() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, tp := range d.pools {
		if time.Since(tp.lastUsed) > d.cfg.IdleTimeout && tp.pool.Stat().AcquiredConns() == 0 {
			d.closePoolLocked(id)
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
	for id, tp := range d.pools {
		t := byID[id]
		if t == nil || !sameDB(tp.db, t.DB) {
			d.closePoolLocked(id)
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
	if tp, ok := d.pools[id]; ok && (gone || !sameDB(tp.db, t.DB)) {
		d.closePoolLocked(id)
	}
	return nil
}

// PoolStats is the tenant pools' use on this replica.
type PoolStats struct {
	Pools    int // open tenant pools
	Conns    int // their connections, idle or in use
	Acquired int // their connections in use
}

// Stats returns the tenant pools' use.
func (d *Directory) Stats() PoolStats {
	d.mu.RLock()
	defer d.mu.RUnlock()
	st := PoolStats{Pools: len(d.pools)}
	for _, tp := range d.pools {
		ps := tp.pool.Stat()
		st.Conns += int(ps.TotalConns())
		st.Acquired += int(ps.AcquiredConns())
	}
	return st
}

// Close closes every pool and the registry connection.
func (d *Directory) Close() {
	d.mu.Lock()
	pools := d.pools
	d.pools = map[registry.TenantID]*tenantPool{}
	d.mu.Unlock()
	for _, tp := range pools {
		tp.pool.Close()
	}
	d.reg.Close()
}
