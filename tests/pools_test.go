package tests

// Tenant database connections are bounded: a replica's connections stay
// under BRAIN_DB_MAX_CONNS whatever the number of tenants, a pool a turn is
// using is never closed under it (the turn commits on the first try), and
// an idle pool is closed.

import (
	"bufio"
	"context"
	"fmt"
	"net"
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

// assertFirstTry fails when the replica retried or dropped any turn: every
// turn was decided on its first delivery.
func assertFirstTry(t *testing.T, ops string) {
	t.Helper()
	for _, outcome := range []string{brain.OutcomeRetried, brain.OutcomeDropped} {
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
// tenant, even while the turn holds no connection (its model calls): with
// room for two pools, two tenants' turns held in their model calls keep a
// third tenant's turn waiting, and when they finish every turn commits on
// its first try. Before leases, the third tenant evicted the first one's
// pool (no connection in use at that moment) and the first turn's commit
// failed on the closed pool.
func TestPoolInUseIsNotEvicted(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	names := []string{"held-a", "held-b", "held-c"}
	hold := map[string]chan struct{}{"held-a": make(chan struct{}), "held-b": make(chan struct{})}
	var released sync.Map
	release := func(n string) {
		if _, done := released.LoadOrStore(n, true); !done {
			close(hold[n])
		}
	}
	arrived := make(chan string, 16)
	answer := answerFunc(goodClassify, goodDraft)
	fake := ollamafake.New(t, func(req *api.ChatRequest) ollamafake.Reply {
		rep := answer(req)
		if stepOf(req) != "classify" {
			return rep
		}
		e, _ := emailOf(req)
		for _, n := range names {
			if strings.HasSuffix(e.Subject, "["+n+"]") {
				arrived <- n
				rep.Wait = hold[n] // nil for held-c: answered at once
			}
		}
		return rep
	})
	var tns []*devstack.Tenant
	var edges []*edgeClient
	for _, n := range names {
		tn := s.tenant(modelSpec(n))
		tns = append(tns, tn)
		edges = append(edges, s.startEdge(tn, nil))
	}
	_, ops := s.startModelBrain("r1", fake, func(c *brain.Config) {
		c.DBMaxConns, c.DBConnsPerTenant = 8, 4 // room for two pools
		c.Model.Concurrency = 8
		c.Model.Timeout = time.Minute
		c.ReconcileInterval = time.Hour
	})
	// A failed test lets the held model calls go first (cleanups run last
	// registered first).
	t.Cleanup(func() { release("held-a"); release("held-b") })
	results := make(chan error, len(names))
	submit := func(i int) {
		req := pergola(fmt.Sprintf("<held-%d@customer.example>", i))
		req.Email.Subject += " [" + names[i] + "]"
		go func() {
			r, err := edges[i].trySubmit(req)
			if err == nil && r.Status != http.StatusOK {
				err = fmt.Errorf("%s: %d %s", names[i], r.Status, r.Body)
			}
			results <- err
		}()
	}
	waitArrival := func(want string) {
		t.Helper()
		select {
		case got := <-arrived:
			if got != want {
				t.Fatalf("%s's model call arrived, want %s's", got, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s's model call never arrived", want)
		}
	}
	submit(0)
	waitArrival("held-a")
	submit(1)
	waitArrival("held-b")
	// Both pools the cap allows are held by turns in their model calls.
	submit(2)
	select {
	case got := <-arrived:
		t.Fatalf("%s's turn got a pool while two turns held both pools the cap allows: a pool in use was closed", got)
	case <-time.After(2 * time.Second):
	}
	if p := metricValue(t, ops, "brain_db_pools_open"); p != 2 {
		t.Fatalf("%v pools open while two turns hold theirs, want 2", p)
	}
	release("held-a")
	// held-a's turn commits and lets its pool go: held-c's takes the room.
	waitArrival("held-c")
	release("held-b")
	for range names {
		if err := <-results; err != nil {
			t.Error(err)
		}
	}
	for i, n := range names {
		db := s.tenantDB(tns[i])
		if c := count(t, db, `SELECT count(*) FROM decisions WHERE work_item_id = $1`, fmt.Sprintf("<held-%d@customer.example>", i)); c != 1 {
			t.Errorf("%s: %d decisions, want 1", n, c)
		}
	}
	if p := metricValue(t, ops, "brain_db_pools_open"); p > 2 {
		t.Errorf("%v pools open, more than the cap's two", p)
	}
	assertFirstTry(t, ops)
}

// The cap holds with more busy tenants than it has room for: six tenants
// submitting at once through a cap of eight connections with four per
// tenant (two pools). Sampled from Postgres's own list of sessions
// throughout, the tenant roles never hold more than eight; pools are closed
// and opened as tenants take turns, and every turn is decided on its first
// try.
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ops := "http://" + ln.Addr().String()
	s.startBrain("r1", func(c *brain.Config) {
		c.OpsListener = ln
		c.DBMaxConns, c.DBConnsPerTenant = maxConns, 4
		c.ReconcileInterval = time.Hour
	})
	sample := tenantSessions(t, s, roles)
	var peak, samples, peakDBs atomic.Int64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			n, d := sample()
			samples.Add(1)
			if int64(n) > peak.Load() {
				peak.Store(int64(n))
			}
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
	if peakDBs.Load() > maxConns/4 {
		t.Fatalf("sessions on %d tenant databases at once, but the cap has room for %d pools", peakDBs.Load(), maxConns/4)
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ops := "http://" + ln.Addr().String()
	s.startBrain("r1", func(c *brain.Config) {
		c.OpsListener = ln
		c.DBIdleTimeout = time.Second
		c.ReconcileInterval = time.Hour
	})
	ea := s.startEdge(a, nil)
	sessions := tenantSessions(t, s, []string{a.DB.AppRole})
	invoice := func(id string) *wire.TurnSubmitRequest {
		req := quoteEmail(id)
		req.Email.Subject = "Invoice 1042" // closed by its rule: nothing pending after
		return req
	}
	if rep := ea.submit(invoice("<idle-pool-1@x>")).reply(t); rep.Status != wire.WorkItemStatusClosed {
		t.Fatalf("the invoice was not closed by its rule: %+v", rep)
	}
	if p := metricValue(t, ops, "brain_db_pools_open"); p != 1 {
		t.Fatalf("%v pools open after the tenant's turn, want 1", p)
	}
	eventually(t, 15*time.Second, "the idle pool to be closed", func() bool {
		n, _ := sessions()
		return metricValue(t, ops, "brain_db_pools_open") == 0 && metricValue(t, ops, "brain_db_conns") == 0 && n == 0
	})
	if rep := ea.submit(invoice("<idle-pool-2@x>")).reply(t); rep.Status != wire.WorkItemStatusClosed {
		t.Fatalf("the turn after the pool was closed: %+v", rep)
	}
	assertFirstTry(t, ops)
}
