package tests

// Tenant database connections are bounded: a replica's connections stay
// under BRAIN_DB_MAX_CONNS whatever the number of tenants, a pool a turn is
// using is never closed under it (the turn commits on the first try), room
// is made by closing the least recently used idle pool, and an idle pool
// is closed.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"n8nbrain/brain"
	"n8nbrain/deploy/devstack"
	"n8nbrain/internal/ollamafake"
	"n8nbrain/wire"
)

// sumMetric adds up every sample of name whose labels contain all of
// labels (`outcome="retried"`), from /metrics.
func sumMetric(t *testing.T, url, name string, labels ...string) float64 {
	t.Helper()
	res, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(res.Body)
next:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue next
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		sum += v
	}
	return sum
}

// assertFirstTry fails when the replica retried, held or dropped any turn:
// every turn was decided on its first try.
func assertFirstTry(t *testing.T, ops string) {
	t.Helper()
	for _, outcome := range []string{brain.OutcomeRetried, brain.OutcomeHeld, brain.OutcomeDropped} {
		if n := sumMetric(t, ops, "brain_turns_total", `outcome="`+outcome+`"`); n != 0 {
			t.Errorf("%v turns %s: not every turn succeeded on the first try", n, outcome)
		}
	}
}

// tenantSessions counts the sessions of the given tenant roles in
// Postgres's own view, and the databases they are on.
func tenantSessions(t *testing.T, s *system, roles []string) func() (sessions, dbs int) {
	admin := s.adminConn("postgres")
	return func() (int, int) {
		var n, d int
		if err := admin.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT datname) FROM pg_stat_activity
			WHERE usename = ANY($1)`, roles).Scan(&n, &d); err != nil {
			t.Error(err)
		}
		return n, d
	}
}

// A pool a turn holds is not closed under it to make room for another
// tenant, even while the turn uses none of its connections (its model
// calls): with room for one connection, held by the idle connection of a
// pool whose turn waits on the model, another tenant's turn takes that
// connection's place (the connection is closed, the pool stays open), and
// when the model answers the held turn commits on its own pool, both on
// their first try. Before leases, the other tenant evicted the first one's
// pool (no connection in use at that moment) and the first turn's commit
// failed on the closed pool.
func TestPoolInUseIsNotEvicted(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	hold := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	arrived := make(chan struct{}, 1)
	answer := answerFunc(goodClassify, goodDraft)
	fake := ollamafake.New(t, func(req *api.ChatRequest) ollamafake.Reply {
		rep := answer(req)
		if e, _ := emailOf(req); stepOf(req) == "classify" && strings.HasSuffix(e.Subject, "[held]") {
			arrived <- struct{}{}
			rep.Wait = hold
		}
		return rep
	})
	held, other := s.tenant(modelSpec("held-a")), s.tenant(modelSpec("held-b"))
	heldEdge, otherEdge := s.startEdge(held, nil), s.startEdge(other, nil)
	_, ops := s.startModelBrain("r1", fake, func(c *brain.Config) {
		c.DBMaxConns, c.DBConnsPerTenant = 1, 1 // room for one connection
		c.Model.Concurrency = 8
		c.Model.Timeout = time.Minute
		c.ReconcileInterval = time.Hour
	})
	// A failed test lets the held model call go first (cleanups run last
	// registered first).
	t.Cleanup(release)
	heldSessions := tenantSessions(t, s, []string{held.DB.AppRole})
	// The held tenant's first turn leaves its pool with the one connection.
	if r := heldEdge.submit(closedInvoice("<held-0@customer.example>")); r.Status != http.StatusOK {
		t.Fatalf("the held tenant's first turn: %d %s", r.Status, r.Body)
	}
	heldDone := make(chan error, 1)
	go func() {
		req := pergola("<held-1@customer.example>")
		req.Email.Subject += " [held]"
		r, err := heldEdge.trySubmit(req)
		if err == nil && r.Status != http.StatusOK {
			err = fmt.Errorf("the held turn: %d %s", r.Status, r.Body)
		}
		heldDone <- err
	}()
	select {
	case <-arrived:
	case <-time.After(20 * time.Second):
		t.Fatal("the held turn's model call never arrived")
	}
	if r := otherEdge.submit(pergola("<other-1@customer.example>")); r.Status != http.StatusOK {
		t.Fatalf("the other tenant's turn while the held turn waits: %d %s", r.Status, r.Body)
	}
	select {
	case err := <-heldDone:
		t.Fatalf("the held turn finished before its model answered: %v", err)
	default:
	}
	if n, _ := heldSessions(); n != 0 {
		t.Fatalf("the held tenant has %d sessions under a cap of one, with the other tenant's turn done", n)
	}
	if p := metricValue(t, ops, "brain_db_pools_open"); p != 2 {
		t.Fatalf("%v pools open while the held turn holds its pool, want 2: its pool was closed under it", p)
	}
	release()
	if err := <-heldDone; err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tn   *devstack.Tenant
		item string
	}{{held, "<held-1@customer.example>"}, {other, "<other-1@customer.example>"}} {
		if n := count(t, s.tenantDB(c.tn), `SELECT count(*) FROM decisions WHERE work_item_id = $1`, c.item); n != 1 {
			t.Errorf("%s: %d decisions, want 1", c.item, n)
		}
	}
	assertFirstTry(t, ops)
}

// Making room closes the least recently used idle pool, and only that one:
// with room for two connections, one per pool, and two tenants' pools
// idle with one connection each, a third tenant's turn closes the older
// pool's connection and leaves the newer one's open.
func TestEvictionClosesTheLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	var tns []*devstack.Tenant
	var roles []string
	var edges []*edgeClient
	for _, n := range []string{"lru-old", "lru-new", "lru-third"} {
		tn := s.tenant(spec(n))
		tns = append(tns, tn)
		roles = append(roles, tn.DB.AppRole)
		edges = append(edges, s.startEdge(tn, nil))
	}
	_, ops := s.startOpsBrain("r1", func(c *brain.Config) {
		c.DBMaxConns, c.DBConnsPerTenant = 2, 1
		c.ReconcileInterval = time.Hour
	})
	sessionsOf := make([]func() (int, int), len(tns))
	for i := range tns {
		sessionsOf[i] = tenantSessions(t, s, roles[i:i+1])
	}
	// After a turn the replica counts the tenant's pending work on its pool
	// (pending.go, a second later): each count is waited for, so that none
	// reopens an evicted pool while the sessions are read.
	counted := func(i int) {
		eventually(t, 10*time.Second, "the replica to count the tenant's pending work", func() bool {
			return metricValue(t, ops, fmt.Sprintf(`brain_pending_snapshot_timestamp_seconds{tenant=%q}`, tns[i].ID)) > 0
		})
	}
	for i := range 2 {
		if r := edges[i].submit(closedInvoice(fmt.Sprintf("<lru-%d@x>", i))); r.Status != http.StatusOK {
			t.Fatalf("tenant %d: %d %s", i, r.Status, r.Body)
		}
		counted(i)
		eventually(t, 10*time.Second, "the turn's connection to stay open", func() bool {
			n, _ := sessionsOf[i]()
			return n == 1
		})
	}
	if r := edges[2].submit(closedInvoice("<lru-2@x>")); r.Status != http.StatusOK {
		t.Fatalf("the third tenant: %d %s", r.Status, r.Body)
	}
	counted(2)
	eventually(t, 10*time.Second, "the least recently used pool's connection to close", func() bool {
		n, _ := sessionsOf[0]()
		return n == 0
	})
	if n, _ := sessionsOf[1](); n != 1 {
		t.Fatalf("the newer idle pool has %d sessions, want its 1: making room for one connection closed more", n)
	}
	if n, _ := sessionsOf[2](); n != 1 {
		t.Fatalf("the third tenant has %d sessions, want 1", n)
	}
	if p := metricValue(t, ops, "brain_db_pools_open"); p != 2 {
		t.Fatalf("%v pools open, want the newer one and the third", p)
	}
	assertFirstTry(t, ops)
}

// The cap holds with more busy tenants than it has room for: six tenants
// submitting at once through a cap of eight connections with four per
// tenant (two full pools). Sampled from Postgres's own list of sessions
// throughout, the tenant roles never hold more than eight, more than two
// tenants hold connections at once (the cap counts connections), and every
// turn is decided on its first try.
func TestConnectionCapHolds(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	const tenants, callers, perCaller, maxConns = 6, 3, 6, 8
	var roles []string
	var tns []*devstack.Tenant
	var edges []*edgeClient
	for i := range tenants {
		tn := s.tenant(spec(fmt.Sprintf("cap-%d", i)))
		tns = append(tns, tn)
		roles = append(roles, tn.DB.AppRole)
		edges = append(edges, s.startEdge(tn, nil))
	}
	_, ops := s.startOpsBrain("r1", func(c *brain.Config) {
		c.DBMaxConns, c.DBConnsPerTenant = maxConns, 4
		c.ReconcileInterval = time.Hour
	})
	sample := tenantSessions(t, s, roles)
	var peak, samples, peakDBs atomic.Int64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		// A session counts when two samples in a row see it: the backend of
		// a connection the brain closed to make room lingers in
		// pg_stat_activity for a moment after the socket is closed (and its
		// place given to the next connection); one the brain holds is there
		// for a whole statement at least. (One sample alone saw 9 in about
		// one run of twelve, before and after 2026-12-07.)
		prev := 0
		for {
			n, d := sample()
			samples.Add(1)
			if held := min(n, prev); int64(held) > peak.Load() {
				peak.Store(int64(held))
			}
			prev = n
			if int64(d) > peakDBs.Load() {
				peakDBs.Store(int64(d))
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	})
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i, e := range edges {
		for c := range callers {
			wg.Go(func() {
				for k := range perCaller {
					r, err := e.trySubmit(quoteEmail(fmt.Sprintf("<cap-%d-%d-%d@customer.example>", i, c, k)))
					if err != nil || r.Status != http.StatusOK {
						failed.Add(1)
						t.Errorf("tenant %d: %v %d %s", i, err, r.Status, r.Body)
					}
				}
			})
		}
	}
	wg.Wait()
	close(stop)
	sampler.Wait()
	t.Logf("%d turns of %d tenants; %d samples of pg_stat_activity: at most %d tenant sessions on at most %d databases at once",
		tenants*callers*perCaller, tenants, samples.Load(), peak.Load(), peakDBs.Load())
	if failed.Load() > 0 {
		t.Fatalf("%d turns failed", failed.Load())
	}
	if peak.Load() > maxConns {
		t.Fatalf("%d tenant sessions at once, over the cap of %d", peak.Load(), maxConns)
	}
	if peak.Load() == 0 || samples.Load() < 20 {
		t.Fatalf("the sampler saw no tenant session in %d samples: it measured nothing", samples.Load())
	}
	// The cap counts connections, not pools: more tenants hold a connection
	// at once than full pools would fit under it.
	if peakDBs.Load() <= maxConns/4 {
		t.Fatalf("sessions on at most %d tenant databases at once: the cap has room for %d full pools, "+
			"and for a connection of each of the %d tenants", peakDBs.Load(), maxConns/4, tenants)
	}
	for i := range tenants {
		db := s.tenantDB(tns[i])
		if n := count(t, db, `SELECT count(*) FROM decisions`); n != callers*perCaller {
			t.Errorf("tenant %d: %d decisions, want %d", i, n, callers*perCaller)
		}
	}
	assertFirstTry(t, ops)
}

// A pool idle for BRAIN_DB_IDLE_TIMEOUT is closed: the replica holds no
// connection of an idle tenant, and the tenant's next turn opens a new
// pool and is decided on the first try.
func TestIdlePoolIsClosed(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("idle-pool"))
	_, ops := s.startOpsBrain("r1", func(c *brain.Config) {
		c.DBIdleTimeout = time.Second
		c.ReconcileInterval = time.Hour
	})
	ea := s.startEdge(a, nil)
	sessions := tenantSessions(t, s, []string{a.DB.AppRole})
	if rep := ea.submit(closedInvoice("<idle-pool-1@x>")).reply(t); rep.Status != wire.WorkItemStatusClosed {
		t.Fatalf("the invoice was not closed by its rule: %+v", rep)
	}
	if p := metricValue(t, ops, "brain_db_pools_open"); p != 1 {
		t.Fatalf("%v pools open after the tenant's turn, want 1", p)
	}
	eventually(t, 15*time.Second, "the idle pool to be closed", func() bool {
		n, _ := sessions()
		return metricValue(t, ops, "brain_db_pools_open") == 0 && metricValue(t, ops, "brain_db_conns") == 0 && n == 0
	})
	if rep := ea.submit(closedInvoice("<idle-pool-2@x>")).reply(t); rep.Status != wire.WorkItemStatusClosed {
		t.Fatalf("the turn after the pool was closed: %+v", rep)
	}
	assertFirstTry(t, ops)
}
