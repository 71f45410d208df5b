package tenancy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"n8nbrain/registry"
)

// The leases and the cap's places on their own: a pgxpool connects on its
// first acquire, so these pools never reach a server, and the cap is tried
// with plain sockets (the whole-system tests in tests/pools_test.go run the
// same rules against Postgres, eviction included).

func testDirectory(t *testing.T, perTenant int32, maxConns int) (*Directory, func(id string) *registry.Tenant) {
	t.Helper()
	return newTestDirectory(t, Config{PerTenantConns: perTenant, MaxConns: maxConns})
}

// newTestDirectory is a directory of cfg without a registry (its sealer is
// made here): tests lease the tenants they build.
func newTestDirectory(t *testing.T, cfg Config) (*Directory, func(id string) *registry.Tenant) {
	t.Helper()
	sealer, err := registry.NewSealer(make([]byte, registry.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Sealer = sealer
	d := &Directory{cfg: cfg.withDefaults(), log: slog.New(slog.DiscardHandler), pools: newPoolSet(),
		loginFailing: map[registry.TenantID]loginState{}, loginFailures: map[registry.TenantID]int64{}}
	t.Cleanup(func() {
		d.mu.Lock()
		for _, tp := range d.pools.open {
			d.retireLocked(tp)
		}
		d.mu.Unlock()
		d.pools.closing.Wait()
	})
	tenant := func(id string) *registry.Tenant {
		tid := registry.TenantID(id)
		return &registry.Tenant{ID: tid, DB: registry.DBConfig{Host: "127.0.0.1", Port: 1, Name: id, User: id,
			PasswordSealed: sealer.Seal(tid, []byte("never used"))}}
	}
	return d, tenant
}

// places returns the places held under the cap.
func places(d *Directory) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pools.conns
}

// Opening a pool takes no place under the cap: pools connect on demand.
func TestPoolsTakeNoPlace(t *testing.T) {
	t.Parallel()
	d, tenant := testDirectory(t, 4, 4) // room for one full pool
	ctx := context.Background()
	for i := range 10 {
		_, release, err := d.Lease(ctx, tenant(fmt.Sprintf("t%d", i)))
		if err != nil {
			t.Fatalf("pool %d: %v", i, err)
		}
		defer release()
	}
	if n, st := places(d), d.Stats(); n != 0 || st.Pools != 10 {
		t.Fatalf("%d places held by %d pools that never connected; want 0 and 10", n, st.Pools)
	}
}

// The cap counts sockets: each dialled connection holds a place until it
// is closed (once, however often Close is called), and a connection that
// finds none waits for one, until its deadline: ErrAtCapacity.
func TestCapCountsConnections(t *testing.T) {
	t.Parallel()
	d, _ := testDirectory(t, 1, 2)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	ctx := context.Background()
	addr := ln.Addr().String()
	a, err := d.dial(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.dial(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := d.dial(short, "tcp", addr); !errors.Is(err, ErrAtCapacity) {
		t.Fatalf("a third connection under a cap of two: %v, want ErrAtCapacity", err)
	}
	if n := places(d); n != 2 {
		t.Fatalf("%d places held after a refused connection, want 2", n)
	}
	got := make(chan error, 1)
	go func() {
		c, err := d.dial(ctx, "tcp", addr)
		if err == nil {
			err = c.Close()
		}
		got <- err
	}()
	// The waiting connection is counted, and gets the place a closed one
	// gives back.
	for d.Stats().Waiting != 1 {
		time.Sleep(time.Millisecond)
	}
	a.Close()
	a.Close() // a second close gives nothing back
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting connection never got the place a closed one gave back")
	}
	if n := places(d); n != 1 {
		t.Fatalf("%d places held with one connection open, want 1", n)
	}
	b.Close()
	// A refused dial gives its place back at once.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	if _, err := d.dial(ctx, "tcp", deadAddr); err == nil {
		t.Fatal("dialled a closed port")
	}
	if n := places(d); n != 0 {
		t.Fatalf("%d places held with no connection open, want 0", n)
	}
}

func TestVisitClosesWhatItOpened(t *testing.T) {
	t.Parallel()
	d, tenant := testDirectory(t, 4, 64)
	ctx := context.Background()
	idle, busy := tenant("idle"), tenant("busy")
	if err := d.Visit(ctx, idle, func(*pgxpool.Pool) error { return nil }); err != nil {
		t.Fatal(err)
	}
	// A pool open before the visit stays open.
	_, release, err := d.Lease(ctx, busy)
	if err != nil {
		t.Fatal(err)
	}
	release()
	if err := d.Visit(ctx, busy, func(*pgxpool.Pool) error { return nil }); err != nil {
		t.Fatal(err)
	}
	// A pool leased by someone else during the visit stays open.
	late := tenant("late")
	if err := d.Visit(ctx, late, func(*pgxpool.Pool) error {
		_, release, err := d.Lease(ctx, late)
		if err == nil {
			release()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	d.pools.closing.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.pools.open["idle"]; ok {
		t.Fatal("the pool opened for the visit of an idle tenant is still open")
	}
	if _, ok := d.pools.open["busy"]; !ok {
		t.Fatal("the visit closed a pool that was open before it")
	}
	if _, ok := d.pools.open["late"]; !ok {
		t.Fatal("the visit closed a pool someone else used meanwhile")
	}
}

func TestRetiredPoolClosesWithItsLastLease(t *testing.T) {
	t.Parallel()
	d, tenant := testDirectory(t, 4, 8)
	ctx := context.Background()
	a := tenant("a")
	_, release, err := d.Lease(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	old := d.pools.open["a"]
	d.mu.Unlock()
	// The tenant's database details change (a password rotation): a new
	// pool, while the old one stays with its holder.
	moved := tenant("a")
	moved.DB.Port = 2
	_, releaseNew, err := d.Lease(ctx, moved)
	if err != nil {
		t.Fatal(err)
	}
	defer releaseNew()
	d.mu.Lock()
	cur, retiring := d.pools.open["a"], len(d.pools.retiring)
	d.mu.Unlock()
	if cur == old || retiring != 1 {
		t.Fatalf("new pool %v, %d pools retiring; want the new pool, and the old one retiring while leased", cur != old, retiring)
	}
	release()
	d.pools.closing.Wait()
	d.mu.Lock()
	retiring = len(d.pools.retiring)
	d.mu.Unlock()
	if retiring != 0 {
		t.Fatal("the old pool is still retiring after its last lease")
	}
	// (Its server never existed: only a closed pool says so without dialling.)
	if err := old.pool.Ping(ctx); err == nil || !strings.Contains(err.Error(), "closed pool") {
		t.Fatalf("the old pool after its last lease: %v, want it closed", err)
	}
}
