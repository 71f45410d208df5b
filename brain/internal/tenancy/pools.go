package tenancy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"n8nbrain/registry"
)

// A tenant's pool is opened on first use and held by leases: whoever runs
// SQL for a tenant leases its pool for the whole piece of work (a turn,
// model calls included, from its first statement to its commit) and
// releases it after. A pool someone holds is never closed under them:
// neither to make room under the cap (eviction) nor as idle; a pool retired
// while held (its registry entry changed) is closed when its last lease
// ends.
//
// The cap counts slots, PerTenantConns per pool, from the moment a pool is
// opened until its Close has returned (every connection closed), so a pool
// being closed still counts and a new one cannot overlap it: the tenant
// connections of a replica never exceed MaxConns.

// ErrAtCapacity means every tenant connection slot is held by a pool in
// use, and none was freed before the caller's deadline; retry later.
var ErrAtCapacity = errors.New("tenant connection cap reached")

type tenantPool struct {
	id       registry.TenantID
	pool     *pgxpool.Pool
	db       registry.DBConfig
	lastUsed time.Time
	// leases is how many hold the pool now; leased counts every lease
	// since it opened (a visit tells whether anyone else used it).
	leases int
	leased int64
	// retired: no longer the tenant's pool; closed once leases is 0.
	retired bool
}

// poolSet is the directory's pools and slots, guarded by Directory.mu.
type poolSet struct {
	open     map[registry.TenantID]*tenantPool // each tenant's current pool
	retiring map[*tenantPool]struct{}          // retired, still leased
	slots    int                               // held by pools not yet closed
	freeing  int                               // of those, held by pools being closed
	waiters  int                               // leases waiting for a slot
	freed    chan struct{}                     // closed (and replaced) when a slot may be had
	closing  sync.WaitGroup
	closed   bool // Directory.Close: no pool opens any more
}

// errClosed is a lease asked of a closed directory (a replica stopping).
var errClosed = errors.New("tenancy: the directory is closed")

func newPoolSet() *poolSet {
	return &poolSet{open: map[registry.TenantID]*tenantPool{}, retiring: map[*tenantPool]struct{}{}, freed: make(chan struct{})}
}

// Lease returns t's pool, opening it if needed, held open for the caller
// until release is called (once, after the caller's last statement). When
// every slot under the cap is held by a pool in use, it waits for one to be
// freed (an idle pool is closed to make room) until ctx ends: ErrAtCapacity.
func (d *Directory) Lease(ctx context.Context, t *registry.Tenant) (pool *pgxpool.Pool, release func(), err error) {
	tp, _, err := d.lease(ctx, t)
	if err != nil {
		return nil, nil, err
	}
	var once sync.Once
	return tp.pool, func() { once.Do(func() { d.release(tp, false) }) }, nil
}

// Visit runs fn on t's pool, for background work that must not keep a
// tenant's connections open (the reconciliation pass visiting every
// tenant): a pool that was open is used and stays open; a pool opened for
// the visit is closed when fn returns, unless someone else leased it
// meanwhile (the tenant became active).
func (d *Directory) Visit(ctx context.Context, t *registry.Tenant, fn func(*pgxpool.Pool) error) error {
	tp, opened, err := d.lease(ctx, t)
	if err != nil {
		return err
	}
	defer d.release(tp, opened)
	return fn(tp.pool)
}

func (d *Directory) lease(ctx context.Context, t *registry.Tenant) (*tenantPool, bool, error) {
	for {
		d.mu.Lock()
		tp, wait, err := d.leaseLocked(ctx, t)
		opened := tp != nil && tp.leased == 1
		if wait != nil {
			d.pools.waiters++
		}
		d.mu.Unlock()
		if wait == nil {
			return tp, opened, err
		}
		select {
		case <-ctx.Done():
		case <-wait:
		}
		d.mu.Lock()
		d.pools.waiters--
		d.mu.Unlock()
		if ctx.Err() != nil {
			return nil, false, fmt.Errorf("open pool for tenant %s: %w", t.ID, ErrAtCapacity)
		}
	}
}

// leaseLocked leases t's pool, or returns a channel to wait on for a slot.
func (d *Directory) leaseLocked(ctx context.Context, t *registry.Tenant) (*tenantPool, <-chan struct{}, error) {
	ps := d.pools
	if ps.closed {
		return nil, nil, errClosed
	}
	if tp, ok := ps.open[t.ID]; ok {
		if sameDB(tp.db, t.DB) {
			tp.leases++
			tp.leased++
			tp.lastUsed = time.Now()
			return tp, nil, nil
		}
		d.retireLocked(tp)
	}
	per := int(d.cfg.PerTenantConns)
	for ps.slots+per > d.cfg.MaxConns {
		// Pools already closing free enough: wait for them rather than
		// closing more.
		if ps.slots-ps.freeing+per <= d.cfg.MaxConns || !d.evictIdleLocked() {
			return nil, ps.freed, nil
		}
	}
	pool, err := d.newPool(ctx, t)
	if err != nil {
		return nil, nil, err
	}
	tp := &tenantPool{id: t.ID, pool: pool, db: t.DB, lastUsed: time.Now(), leases: 1, leased: 1}
	ps.open[t.ID] = tp
	ps.slots += per
	return tp, nil, nil
}

// release ends a lease. closeUnshared (a visit that opened the pool)
// closes the pool too when nobody else leased it.
func (d *Directory) release(tp *tenantPool, closeUnshared bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	tp.leases--
	tp.lastUsed = time.Now()
	if tp.leases > 0 || d.pools.closed {
		return
	}
	switch {
	case tp.retired:
		delete(d.pools.retiring, tp)
		d.closeLocked(tp)
	case closeUnshared && tp.leased == 1:
		d.retireLocked(tp)
	case d.pools.waiters > 0:
		// Now idle: a waiting lease may close it to make room.
		d.signalLocked()
	}
}

// retireLocked makes tp no longer its tenant's pool, and closes it now or,
// when it is leased, once its last lease ends.
func (d *Directory) retireLocked(tp *tenantPool) {
	if d.pools.open[tp.id] == tp {
		delete(d.pools.open, tp.id)
	}
	if tp.retired {
		return
	}
	tp.retired = true
	if tp.leases > 0 {
		d.pools.retiring[tp] = struct{}{}
		return
	}
	d.closeLocked(tp)
}

// closeLocked closes tp without holding the lock (closing sends each
// connection a goodbye); its slots are free once every connection is closed.
func (d *Directory) closeLocked(tp *tenantPool) {
	per := int(d.cfg.PerTenantConns)
	d.pools.freeing += per
	d.pools.closing.Go(func() {
		tp.pool.Close()
		d.mu.Lock()
		d.pools.slots -= per
		d.pools.freeing -= per
		d.signalLocked()
		d.mu.Unlock()
	})
}

func (d *Directory) signalLocked() {
	close(d.pools.freed)
	d.pools.freed = make(chan struct{})
}

// evictIdleLocked retires the least recently used pool that nobody holds.
// It reports whether one was found.
func (d *Directory) evictIdleLocked() bool {
	var victim *tenantPool
	for _, tp := range d.pools.open {
		if tp.leases > 0 || tp.pool.Stat().AcquiredConns() > 0 {
			continue
		}
		if victim == nil || tp.lastUsed.Before(victim.lastUsed) {
			victim = tp
		}
	}
	if victim == nil {
		return false
	}
	d.retireLocked(victim)
	return true
}

// closeIdlePools retires the pools nobody held for IdleTimeout.
func (d *Directory) closeIdlePools() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, tp := range d.pools.open {
		if tp.leases == 0 && time.Since(tp.lastUsed) > d.cfg.IdleTimeout && tp.pool.Stat().AcquiredConns() == 0 {
			d.retireLocked(tp)
		}
	}
}

func (d *Directory) newPool(ctx context.Context, t *registry.Tenant) (*pgxpool.Pool, error) {
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
	return pool, nil
}

func sameDB(a, b registry.DBConfig) bool {
	return a.Host == b.Host && a.Port == b.Port && a.Name == b.Name && a.User == b.User &&
		bytes.Equal(a.PasswordSealed, b.PasswordSealed)
}

// PoolStats is the tenant pools' use on this replica.
type PoolStats struct {
	Pools    int // open tenant pools (retired ones still in use included)
	Conns    int // their connections, idle or in use
	Acquired int // their connections in use
}

// Stats returns the tenant pools' use.
func (d *Directory) Stats() PoolStats {
	d.mu.RLock()
	defer d.mu.RUnlock()
	st := PoolStats{Pools: len(d.pools.open) + len(d.pools.retiring)}
	add := func(tp *tenantPool) {
		ps := tp.pool.Stat()
		st.Conns += int(ps.TotalConns())
		st.Acquired += int(ps.AcquiredConns())
	}
	for _, tp := range d.pools.open {
		add(tp)
	}
	for tp := range d.pools.retiring {
		add(tp)
	}
	return st
}

// Close closes every pool, waiting for connections in use, and the
// registry connection.
func (d *Directory) Close() {
	d.mu.Lock()
	var all []*tenantPool
	for _, tp := range d.pools.open {
		all = append(all, tp)
	}
	for tp := range d.pools.retiring {
		all = append(all, tp)
	}
	d.pools.open, d.pools.retiring = map[registry.TenantID]*tenantPool{}, map[*tenantPool]struct{}{}
	d.pools.closed = true
	d.mu.Unlock()
	for _, tp := range all {
		tp.pool.Close()
	}
	d.pools.closing.Wait()
	d.reg.Close()
}
