package tenancy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
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
// The cap counts connections, not pools. Opening a pool costs nothing (a
// pgxpool connects on demand); each connection takes one of MaxConns
// places before it is dialled and gives it back when its socket is closed,
// so the tenant connections of a replica never exceed MaxConns, however
// many pools are open and however each pool grows within PerTenantConns.
// So many tenants can keep one idle connection each while a busy one uses
// its whole pool. A connection that finds every place taken makes room: it
// closes the least recently used pool nobody holds (its connections are
// idle) or, when every pool with connections is held, one idle connection
// of the least recently used of them, and waits until it has its place or
// its connect timeout ends (ErrAtCapacity).

// ErrAtCapacity means every tenant connection the cap allows is open and
// none was freed within the connect timeout; retry later.
var ErrAtCapacity = errors.New("tenant connection cap reached")

// ConnectTimeout bounds a tenant connection's whole connect, the wait for a
// place under the cap included.
const ConnectTimeout = 5 * time.Second

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

// poolSet is the directory's pools and connection places, guarded by
// Directory.mu (waiting, read without it, is changed under it).
type poolSet struct {
	open     map[registry.TenantID]*tenantPool // each tenant's current pool
	retiring map[*tenantPool]struct{}          // retired, still leased
	conns    int                               // places held: connections dialled and not yet closed
	freeing  int                               // of those, held by pools being closed
	waiting  atomic.Int32                      // connections waiting for a place
	freed    chan struct{}                     // closed (and replaced) when a place may be had
	closing  sync.WaitGroup
	closed   bool // Directory.Close: no pool opens any more
}

// errClosed is a lease asked of a closed directory (a replica stopping).
var errClosed = errors.New("tenancy: the directory is closed")

func newPoolSet() *poolSet {
	return &poolSet{open: map[registry.TenantID]*tenantPool{}, retiring: map[*tenantPool]struct{}{}, freed: make(chan struct{})}
}

// Lease returns t's pool, opening it if needed, held open for the caller
// until release is called (once, after the caller's last statement).
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

// lease leases t's pool; opened reports whether this lease opened it.
func (d *Directory) lease(ctx context.Context, t *registry.Tenant) (tp *tenantPool, opened bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ps := d.pools
	if ps.closed {
		return nil, false, errClosed
	}
	if tp, ok := ps.open[t.ID]; ok {
		if sameDB(tp.db, t.DB) {
			tp.leases++
			tp.leased++
			tp.lastUsed = time.Now()
			return tp, false, nil
		}
		d.retireLocked(tp)
	}
	pool, err := d.newPool(ctx, t)
	if err != nil {
		return nil, false, err
	}
	tp = &tenantPool{id: t.ID, pool: pool, db: t.DB, lastUsed: time.Now(), leases: 1, leased: 1}
	ps.open[t.ID] = tp
	return tp, true, nil
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
	case d.pools.waiting.Load() > 0:
		// Now idle: a waiting connection may close it to make room.
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
// connection a goodbye); each connection gives its place back as its
// socket closes.
func (d *Directory) closeLocked(tp *tenantPool) {
	n := int(tp.pool.Stat().TotalConns())
	d.pools.freeing += n
	d.pools.closing.Go(func() {
		tp.pool.Close()
		d.mu.Lock()
		d.pools.freeing -= n
		d.mu.Unlock()
	})
}

func (d *Directory) signalLocked() {
	close(d.pools.freed)
	d.pools.freed = make(chan struct{})
}

// takeConn takes a place under the cap for a connection about to be
// dialled, making room or waiting for it until ctx ends (ErrAtCapacity).
func (d *Directory) takeConn(ctx context.Context) error {
	ps := d.pools
	for {
		d.mu.Lock()
		if ps.closed {
			d.mu.Unlock()
			return errClosed
		}
		if ps.conns < d.cfg.MaxConns {
			ps.conns++
			d.mu.Unlock()
			return nil
		}
		var idleIn *pgxpool.Pool
		if ps.freeing <= int(ps.waiting.Load()) {
			// Unless pools already closing free enough for every
			// connection waiting, make room.
			idleIn = d.makeRoomLocked()
		}
		freed := ps.freed
		ps.waiting.Add(1)
		d.mu.Unlock()
		if idleIn != nil {
			closeOneIdle(ctx, idleIn)
		}
		select {
		case <-ctx.Done():
		case <-freed:
		case <-time.After(roomPoll):
		}
		ps.waiting.Add(-1)
		if ctx.Err() != nil {
			return fmt.Errorf("%w (%d connections)", ErrAtCapacity, d.cfg.MaxConns)
		}
	}
}

// roomPoll is how often a connection waiting for a place looks again for
// an idle connection to close: a connection given back to a pool in use
// signals nobody.
const roomPoll = 20 * time.Millisecond

// giveConn gives back a connection's place.
func (d *Directory) giveConn() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pools.conns--
	if d.pools.waiting.Load() > 0 {
		d.signalLocked()
	}
}

// dial is every tenant connection's dial function: the connection holds a
// place under the cap from before it is dialled until its socket is closed.
func (d *Directory) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if err := d.takeConn(ctx); err != nil {
		return nil, err
	}
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, network, addr)
	if err != nil {
		d.giveConn()
		return nil, err
	}
	return &placedConn{Conn: c, give: sync.OnceFunc(d.giveConn)}, nil
}

// placedConn gives its place under the cap back when it is first closed.
type placedConn struct {
	net.Conn
	give func()
}

func (c *placedConn) Close() error {
	err := c.Conn.Close()
	c.give()
	return err
}

// makeRoomLocked closes the least recently used pool that nobody holds
// and that has connections; when every such pool is held, it returns the
// least recently used pool with an idle connection, for the caller to close
// one of them without the lock (nil when there is none).
func (d *Directory) makeRoomLocked() (idleIn *pgxpool.Pool) {
	var victim, idle *tenantPool
	for _, tp := range d.pools.open {
		st := tp.pool.Stat()
		if st.IdleConns() > 0 && (idle == nil || tp.lastUsed.Before(idle.lastUsed)) {
			idle = tp
		}
		if tp.leases > 0 || st.AcquiredConns() > 0 || st.TotalConns() == 0 {
			continue
		}
		if victim == nil || tp.lastUsed.Before(victim.lastUsed) {
			victim = tp
		}
	}
	if victim != nil {
		d.retireLocked(victim)
		return nil
	}
	if idle != nil {
		return idle.pool
	}
	return nil
}

// closeOneIdle closes one of pool's idle connections, if it still has one.
func closeOneIdle(ctx context.Context, pool *pgxpool.Pool) {
	conns := pool.AcquireAllIdle(ctx)
	if len(conns) == 0 {
		return
	}
	conns[0].Hijack().Close(ctx)
	for _, c := range conns[1:] {
		c.Release()
	}
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
	pc, err := poolConfig(t.DB.Host, t.DB.Port, d.cfg.SSLMode, d.cfg.SSLRootCert)
	if err != nil {
		return nil, err
	}
	pc.ConnConfig.Database = t.DB.Name
	pc.ConnConfig.User = t.DB.User
	pc.ConnConfig.Password = string(password)
	pc.ConnConfig.ConnectTimeout = ConnectTimeout
	pc.ConnConfig.DialFunc = d.dial
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
	Conns    int // their connections, idle or in use: the places held under the cap
	Acquired int // their connections in use
	Waiting  int // connections waiting for a place under the cap
}

// Stats returns the tenant pools' use.
func (d *Directory) Stats() PoolStats {
	d.mu.RLock()
	defer d.mu.RUnlock()
	st := PoolStats{Pools: len(d.pools.open) + len(d.pools.retiring), Conns: d.pools.conns, Waiting: int(d.pools.waiting.Load())}
	for _, tp := range d.pools.open {
		st.Acquired += int(tp.pool.Stat().AcquiredConns())
	}
	for tp := range d.pools.retiring {
		st.Acquired += int(tp.pool.Stat().AcquiredConns())
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
