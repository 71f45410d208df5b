package tenancy

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"n8nbrain/registry"
)

// The leases and slots on their own: a pgxpool connects on its first
// acquire, so these pools never reach a server (the whole-system tests in
// tests/pools_test.go run the same rules against Postgres).

func testDirectory(t *testing.T, perTenant int32, maxConns int) (*Directory, func(id string) *registry.Tenant) {
	t.Helper()
	sealer, err := registry.NewSealer(make([]byte, registry.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	d := &Directory{cfg: Config{Sealer: sealer, PerTenantConns: perTenant, MaxConns: maxConns}.withDefaults(),
		log: slog.New(slog.DiscardHandler), pools: newPoolSet()}
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

// state returns the open pool of id (nil when none) and the slots held:
// a pool's slots are given back only once its Close has returned.
func state(d *Directory, id registry.TenantID) (*tenantPool, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pools.open[id], d.pools.slots
}

func TestLeasedPoolIsNotEvicted(t *testing.T) {
	t.Parallel()
	d, tenant := testDirectory(t, 4, 8) // room for two pools
	a, b, c := tenant("a"), tenant("b"), tenant("c")
	ctx := context.Background()
	_, releaseA, err := d.Lease(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	_, releaseB, err := d.Lease(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, _, err := d.Lease(short, c); !errors.Is(err, ErrAtCapacity) {
		t.Fatalf("a third pool while two are leased: %v, want ErrAtCapacity", err)
	}
	// A lease waiting for room gets it when a holder lets go.
	got := make(chan error, 1)
	go func() {
		_, releaseC, err := d.Lease(ctx, c)
		if err == nil {
			releaseC()
		}
		got <- err
	}()
	releaseA()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting lease never got the room a released pool left")
	}
	d.pools.closing.Wait()
	if tp, slots := state(d, "a"); tp != nil || slots != 8 {
		t.Fatalf("a's pool open %v, %d slots held; want a's closed and b's and c's 8", tp != nil, slots)
	}
	releaseB()
	releaseB() // a second call is harmless
	tp, _ := state(d, "b")
	if tp == nil {
		t.Fatal("b's pool was closed while leased")
	}
	d.mu.Lock()
	leases := tp.leases
	d.mu.Unlock()
	if leases != 0 {
		t.Fatalf("b's pool has %d leases after its release", leases)
	}
}

// Making room closes the least recently used idle pool, and only as many
// as the new pool needs.
func TestEvictionClosesOnlyWhatItNeeds(t *testing.T) {
	t.Parallel()
	d, tenant := testDirectory(t, 4, 8) // room for two pools
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		_, release, err := d.Lease(ctx, tenant(id))
		if err != nil {
			t.Fatal(err)
		}
		release()
	}
	_, release, err := d.Lease(ctx, tenant("c"))
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	d.pools.closing.Wait()
	if a, _ := state(d, "a"); a != nil {
		t.Fatal("a's pool, the least recently used, is still open")
	}
	if b, slots := state(d, "b"); b == nil || slots != 8 {
		t.Fatalf("b's pool open %v, %d slots held: making room for one pool closed two", b != nil, slots)
	}
}

func TestClosingPoolHoldsItsSlots(t *testing.T) {
	t.Parallel()
	d, tenant := testDirectory(t, 4, 4) // room for one pool
	ctx := context.Background()
	_, releaseA, err := d.Lease(ctx, tenant("a"))
	if err != nil {
		t.Fatal(err)
	}
	releaseA()
	d.mu.Lock()
	// a's pool is idle: b's lease retires it, and must wait for its close.
	_, wait, err := d.leaseLocked(ctx, tenant("b"))
	slots, freeing := d.pools.slots, d.pools.freeing
	d.mu.Unlock()
	if err != nil || wait == nil {
		t.Fatalf("b's pool opened before a's was closed (err %v)", err)
	}
	if slots != 4 || freeing != 4 {
		t.Fatalf("slots %d, freeing %d while a's pool closes; want 4 and 4", slots, freeing)
	}
	<-wait
	_, releaseB, err := d.Lease(ctx, tenant("b"))
	if err != nil {
		t.Fatal(err)
	}
	releaseB()
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
	if d.pools.slots != 8 {
		t.Fatalf("%d slots held by two pools of 4", d.pools.slots)
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
	old, _ := state(d, "a")
	// The tenant's database details change (a password rotation): a new
	// pool, while the old one stays with its holder.
	moved := tenant("a")
	moved.DB.Port = 2
	_, releaseNew, err := d.Lease(ctx, moved)
	if err != nil {
		t.Fatal(err)
	}
	defer releaseNew()
	d.pools.closing.Wait()
	if cur, slots := state(d, "a"); cur == old || slots != 8 {
		t.Fatalf("new pool %v, %d slots held; want the new pool and both pools' 8", cur != old, slots)
	}
	release()
	d.pools.closing.Wait()
	if _, slots := state(d, "a"); slots != 4 {
		t.Fatalf("%d slots held after the old pool's last lease, want the new pool's 4", slots)
	}
}
