package tests

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"n8nbrain/brain"
	"n8nbrain/deploy/devstack"
	"n8nbrain/deploy/localpg"
	"n8nbrain/edge"
	"n8nbrain/internal/testdb"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// Turns that arrive while the tenant's database is down are held by the
// brain and decided the moment it answers again: on their first delivery
// (none is sent back to JetStream to wait out a growing delay), within
// about a second of the database's return, and the brain says so once per
// outage rather than once per turn.
func TestTurnsResumeWhenTheDatabaseAnswers(t *testing.T) {
	t.Parallel()
	o := outageTurns(t, outageRun{down: 3 * time.Second, turns: 6})
	var last time.Duration
	for key, at := range o.answered {
		last = max(last, at.Sub(o.up))
		// The probe asks again at most every second; the turn is decided
		// in milliseconds after that. A turn sent back to JetStream after
		// failing three times would wait 4 s more.
		if after := at.Sub(o.up); after > 3*time.Second {
			t.Errorf("%s answered %.1fs after the database was back", key, after.Seconds())
		}
	}
	t.Logf("down %.1fs; the last turn answered %.2fs after the database was back", o.up.Sub(o.down).Seconds(), last.Seconds())
	var holding, resumed int
	for _, rec := range brainLog(o.s) {
		switch {
		case rec.Msg == "tenant database does not answer; holding its turns until it does":
			holding++
		case rec.Msg == "tenant database answers again; its held turns resume":
			resumed++
			t.Logf("resumed %d held turns", rec.Held)
		case rec.Msg == "turn failed; will be retried" && o.keys[rec.Key]:
			t.Errorf("%s was sent back to JetStream to retry", rec.Key)
		case rec.Msg == "turn answered" && o.keys[rec.Key] && rec.Delivered != 1:
			t.Errorf("%s was answered on delivery %d, not its first", rec.Key, rec.Delivered)
		}
	}
	if holding != 1 || resumed != 1 {
		t.Errorf("the brain said %d times that it holds the tenant's turns and %d times that they resume; want once each", holding, resumed)
	}
	// The registry shares the cluster: its reloads (every second here) and
	// its listener failed throughout, and each says so once, and once more
	// when it works again.
	eventually(t, 20*time.Second, "the registry's reload and listener back", func() bool {
		return brainLines(o.s, "registry reloads again") > 0 && brainLines(o.s, "registry listener back") > 0
	})
	for _, msg := range []string{"reload registry; the directory keeps what it last read until a reload works",
		"registry reloads again", "registry listener lost; reconnecting", "registry listener back"} {
		if n := brainLines(o.s, msg); n != 1 {
			t.Errorf("%d lines %q in a %.1fs outage, want 1", n, msg, o.up.Sub(o.down).Seconds())
		}
	}
}

// A turn is held for the brain's TurnHold at most: then it goes back to
// JetStream, to be held again on its next delivery, and is still decided
// once when the database answers.
func TestHeldTurnsGoBackToJetStreamAfterTheHold(t *testing.T) {
	t.Parallel()
	o := outageTurns(t, outageRun{hold: time.Second, down: 4 * time.Second, turns: 3})
	answered := 0
	for _, rec := range brainLog(o.s) {
		if rec.Msg == "turn answered" && o.keys[rec.Key] {
			answered++
			if rec.Delivered < 2 {
				t.Errorf("%s was answered on delivery %d: it was held past TurnHold (1s) of a 4s outage", rec.Key, rec.Delivered)
			}
		}
	}
	if answered != len(o.keys) {
		t.Errorf("%d lines of a turn answered for %d turns", answered, len(o.keys))
	}
}

// A replica that stops while it holds turns hands them back to JetStream
// at once: the replica that goes on decides them as soon as the database
// answers, not an ack wait later (30 s here).
func TestStoppingReplicaHandsBackItsHeldTurns(t *testing.T) {
	t.Parallel()
	var stopped time.Time
	o := outageTurns(t, outageRun{down: 4 * time.Second, turns: 6, ackWait: 30 * time.Second, second: true,
		midway: func(stopFirst func()) {
			stopFirst()
			stopped = time.Now()
		}})
	for key, at := range o.answered {
		if after := at.Sub(o.up); after > 3*time.Second {
			t.Errorf("%s answered %.1fs after the database was back (the first replica stopped %.1fs before it)",
				key, after.Seconds(), o.up.Sub(stopped).Seconds())
		}
	}
	byReplica := map[string]int{}
	for _, rec := range brainLog(o.s) {
		if rec.Msg == "turn answered" && o.keys[rec.Key] {
			byReplica[rec.Replica]++
		}
	}
	if byReplica["dbback-2"] != len(o.keys) {
		t.Errorf("turns answered by replica: %v; want all %d by dbback-2", byReplica, len(o.keys))
	}
}

// dbOutage is what outageTurns saw.
type dbOutage struct {
	s        *system
	down, up time.Time
	keys     map[string]bool      // the turns submitted during the outage, by key
	answered map[string]time.Time // when each was answered 200
}

// outageRun is an outage of the tenant's database under turns.
type outageRun struct {
	hold          time.Duration // the brain's TurnHold (its default if 0)
	maxDeliveries int           // the brain's MaxDeliveries (its default if 0)
	down          time.Duration // how long the database is down
	turns         int           // submitted once it is down
	ackWait       time.Duration // the turn consumer's (the harness's if 0)
	second        bool          // a second replica, dbback-2, from the start
	// turnWait is the edge's EDGE_TURN_WAIT (2 s if 0).
	turnWait time.Duration
	// midway, if not nil, runs halfway through the outage, with a function
	// that stops the first replica.
	midway func(stopFirst func())
}

// outageTurns runs a brain replica (two with r.second) and an edge on a
// Postgres cluster of the test's own, crashes the cluster, submits the
// turns as n8n does (again after each 202) and starts the cluster again
// after r.down. It returns once every turn was answered 200 (or fails the
// test), and checks each was decided once.
func outageTurns(t *testing.T, r outageRun) *dbOutage {
	c := crashUnder(t, r)
	s, e := c.s, c.e
	o := &dbOutage{s: s, down: time.Now(), keys: map[string]bool{}, answered: map[string]time.Time{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range r.turns {
		wg.Go(func() {
			req := quoteEmail(fmt.Sprintf("<dbback-%d@customer.example>", i))
			key := subjects.TurnKey(req.WorkItemID, 1)
			mu.Lock()
			o.keys[key] = true
			mu.Unlock()
			for time.Since(o.down) < time.Minute {
				res, err := e.trySubmit(req)
				switch {
				case err != nil:
					t.Errorf("%s: %v", key, err)
					return
				case res.Status == http.StatusOK:
					mu.Lock()
					o.answered[key] = time.Now()
					mu.Unlock()
					return
				case res.Status != http.StatusAccepted:
					t.Errorf("%s: %d %s", key, res.Status, res.Body)
					return
				}
			}
			t.Errorf("%s: no answer within a minute", key)
		})
	}
	if r.midway != nil {
		time.Sleep(r.down / 2)
		r.midway(c.stopFirst)
	}
	time.Sleep(r.down - time.Since(o.down))
	c.restart(t)
	o.up = time.Now()
	wg.Wait()
	if len(o.answered) != r.turns {
		t.Fatalf("%d of %d turns answered", len(o.answered), r.turns)
	}
	if n := count(t, s.tenantDB(c.tn), `SELECT count(*) FROM decisions`); n != r.turns+1 {
		t.Errorf("%d decisions, want %d", n, r.turns+1)
	}
	return o
}

// crashed is a stack whose tenant database cluster crashUnder crashed.
type crashed struct {
	pg        *localpg.Instance
	s         *system
	tn        *devstack.Tenant
	e         *edgeClient
	stopFirst func() // stops the first brain replica
}

// crashUnder starts the stack of an outageRun (a brain replica, two with
// r.second, and an edge, on a Postgres cluster of the test's own), warms it
// with one turn, then crashes the cluster.
func crashUnder(t *testing.T, r outageRun) *crashed {
	pg := testdb.PrivateCluster(t)
	s := newSystemAt(t, pg.AdminURL(), func(c *devstack.Config) {
		if r.ackWait > 0 {
			c.Streams.AckWait = r.ackWait
		}
	})
	tn := s.tenant(spec("dbback"))
	hold := func(c *brain.Config) { c.TurnHold, c.MaxDeliveries = r.hold, r.maxDeliveries }
	stopFirst := s.startBrain("dbback-1", hold)
	if r.second {
		s.startBrain("dbback-2", hold)
	}
	wait := cmp.Or(r.turnWait, 2*time.Second)
	e := s.startEdge(tn, func(c *edge.Config) { c.TurnWait = wait })
	e.submit(quoteEmail("<dbback-warm@customer.example>")).reply(t) // pools and statements warm
	if err := pg.Crash(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &crashed{pg: pg, s: s, tn: tn, e: e, stopFirst: stopFirst}
}

// restart starts the crashed cluster again, on its folder and port.
func (c *crashed) restart(t *testing.T) {
	if _, err := localpg.Ensure(context.Background(), localpg.Config{Dir: c.pg.Dir, Port: c.pg.Port}); err != nil {
		t.Fatal(err)
	}
}

// submitUntilAnswered submits req as n8n does, again after each 202, and
// sends the first other answer, or the last 202 after submitWithin.
func submitUntilAnswered(t *testing.T, e *edgeClient, req *wire.TurnSubmitRequest) <-chan response {
	answered := make(chan response, 1)
	go func() {
		start := time.Now()
		for {
			r, err := e.trySubmit(req)
			if err != nil {
				t.Error(err)
			}
			if err != nil || r.Status != http.StatusAccepted || time.Since(start) > submitWithin {
				answered <- r
				return
			}
		}
	}()
	return answered
}

// submitWithin bounds submitUntilAnswered: a hold that never ends fails
// the test rather than hang it.
const submitWithin = 30 * time.Second

// wantRefusal waits for the answer on ch, which must come within limit of
// since and refuse the turn with status and reason.
func wantRefusal(t *testing.T, ch <-chan response, since time.Time, limit time.Duration, status int, reason string) {
	t.Helper()
	r := <-ch
	if took := time.Since(since); took > limit {
		t.Errorf("answered %.1fs after the change that should end the hold, want within %s", took.Seconds(), limit)
	}
	if er := r.error(t, status); er.Reason != reason {
		t.Errorf("reason %q, want %q", er.Reason, reason)
	}
}

// registryDrivenStack is a brain replica that learns registry changes
// from its listener only (the periodic reload an hour away) and a warmed
// edge of tenant name.
func registryDrivenStack(t *testing.T, name string) (*system, *devstack.Tenant, *edgeClient) {
	s := newSystem(t)
	a := s.tenant(spec(name))
	s.startBrain(name+"-1", func(c *brain.Config) { c.RegistryRefresh = time.Hour })
	ea := s.startEdge(a, nil)
	ea.submit(quoteEmail("<" + name + "-warm@customer.example>")).reply(t)
	return s, a, ea
}

// logRecord is what the tests read of a brain's log line.
type logRecord struct {
	Msg       string `json:"msg"`
	Component string `json:"component"`
	Key       string `json:"turn_key"`
	Delivered int    `json:"delivered"`
	Held      int    `json:"held_turns"`
	Replica   string `json:"replica"`
	Answer    string `json:"answer"`
}

// brainLog is every line the system's brains logged.
func brainLog(s *system) []logRecord {
	var out []logRecord
	for line := range strings.Lines(s.logs.String()) {
		var rec logRecord
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Component == "brain" {
			out = append(out, rec)
		}
	}
	return out
}

// brainLines counts the lines msg that the system's brains logged.
func brainLines(s *system, msg string) int {
	n := 0
	for _, rec := range brainLog(s) {
		if rec.Msg == msg {
			n++
		}
	}
	return n
}

// A database that comes back refusing the tenant's role (pg_hba.conf now
// rejects it) has answered: the held turn meets the refusal at once and is
// answered 503 naming it, not held for TurnHold and answered 202.
func TestHeldTurnsMeetTheDatabasesRefusal(t *testing.T) {
	t.Parallel()
	c := crashUnder(t, outageRun{turnWait: 10 * time.Second})
	pg, tn, e := c.pg, c.tn, c.e
	res := make(chan response, 1)
	go func() {
		r, err := e.trySubmit(quoteEmail("<dbrefuse-1@customer.example>"))
		if err != nil {
			t.Error(err)
		}
		res <- r
	}()
	time.Sleep(1500 * time.Millisecond) // held by now
	hba := filepath.Join(pg.Dir, "data", "pg_hba.conf")
	b, err := os.ReadFile(hba)
	if err != nil {
		t.Fatal(err)
	}
	reject := fmt.Sprintf("host all %s 127.0.0.1/32 reject\nhost all %s ::1/128 reject\n", tn.DB.AppRole, tn.DB.AppRole)
	if err := os.WriteFile(hba, append([]byte(reject), b...), 0o600); err != nil {
		t.Fatal(err)
	}
	c.restart(t)
	wantRefusal(t, res, time.Now(), 5*time.Second, http.StatusServiceUnavailable, wire.ReasonTenantDatabaseLogin)
}

// Held turns spend a delivery each TurnHold, and their last one is not
// held: it meets the database and is answered unavailable, so a caller
// hears of an outage that outlasts them rather than waiting on 202s for as
// long as the stream keeps the turn. Sent again once the database is back,
// the same turn is decided (the edge re-drives an error reply).
func TestHeldTurnsLastDeliveryIsAnsweredUnavailable(t *testing.T) {
	t.Parallel()
	c := crashUnder(t, outageRun{hold: time.Second, maxDeliveries: 2})
	req := quoteEmail("<dblast-1@customer.example>")
	start := time.Now()
	r := <-submitUntilAnswered(t, c.e, req)
	if er := r.error(t, http.StatusServiceUnavailable); er.Code != wire.CodeUnavailable {
		t.Fatalf("code %q, want %q: %s", er.Code, wire.CodeUnavailable, r.Body)
	}
	t.Logf("answered unavailable after %.1fs of the outage", time.Since(start).Seconds())
	if n := brainLines(c.s, "turn keeps failing; answered unavailable"); n != 1 {
		t.Errorf("%d lines of a turn answered unavailable, want 1", n)
	}
	c.restart(t)
	eventually(t, 20*time.Second, "the turn decided once the database is back", func() bool {
		r, err := c.e.trySubmit(req)
		return err == nil && r.Status == http.StatusOK
	})
	if n := count(t, c.s.tenantDB(c.tn), `SELECT count(*) FROM decisions`); n != 2 {
		t.Errorf("%d decisions, want 2 (the warm-up turn's and this one's)", n)
	}
}

// A database host that answers nothing (a firewall dropping its packets:
// here a listener on the database's port that takes connections and never
// speaks) holds the turns like a database that is down: the probe's own
// deadline, which ends before the connect timeout, is no answer. The turn
// is decided on its first delivery once the database is back, and the
// hold ends once, on the database's answer.
func TestHeldTurnsWaitOutAHostThatAnswersNothing(t *testing.T) {
	t.Parallel()
	// An ack wait shorter than a probe, which waits out its deadline here:
	// the held turn is kept alive all the same, and not redelivered.
	c := crashUnder(t, outageRun{ackWait: time.Second})
	tarpit, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.pg.Port)))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			conn, err := tarpit.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
	}()
	req := quoteEmail("<dbtarpit-1@customer.example>")
	key := subjects.TurnKey(req.WorkItemID, 1)
	answered := submitUntilAnswered(t, c.e, req)
	// Past the turn's connect timeout (5 s) and two probes' deadlines (2 s).
	time.Sleep(10 * time.Second)
	_ = tarpit.Close()
	mu.Lock()
	for _, conn := range conns {
		_ = conn.Close()
	}
	t.Logf("the host took %d connections and answered none", len(conns))
	mu.Unlock()
	c.restart(t)
	if r := <-answered; r.Status != http.StatusOK {
		t.Fatalf("%d %s, want 200", r.Status, r.Body)
	}
	// The answer can reach the edge before the hold's end is logged.
	eventually(t, 5*time.Second, "the hold's end logged", func() bool {
		return brainLines(c.s, "tenant database answers again; its held turns resume") > 0
	})
	var resumed []string
	for _, rec := range brainLog(c.s) {
		switch {
		case rec.Msg == "tenant database answers again; its held turns resume":
			resumed = append(resumed, rec.Answer)
		case rec.Msg == "turn answered" && rec.Key == key && rec.Delivered != 1:
			t.Errorf("answered on delivery %d, not its first", rec.Delivered)
		}
	}
	if len(resumed) != 1 || resumed[0] != "ok" {
		t.Errorf("the hold ended %d times, on %q; want once, on the database's answer (ok)", len(resumed), resumed)
	}
}

// A held tenant that the registry disables meanwhile ends its hold at the
// next probe: its turns go to the workers, which refuse them at once,
// rather than wait out TurnHold (15 s here) against a database its
// operator has given up on.
func TestHeldTurnsOfADisabledTenantAreRefused(t *testing.T) {
	t.Parallel()
	s, a, ea := registryDrivenStack(t, "helddis")
	// The tenant's database moves to a port nobody listens on: every
	// connection is refused, the registry's own still works.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	s.registryExec(`UPDATE tenants SET db_port = $2, updated_at = now() WHERE id = $1`, a.ID, dead)
	eventually(t, 20*time.Second, "the brain to use the moved database", func() bool {
		return strings.Contains(s.logs.String(), fmt.Sprintf("127.0.0.1:%d", dead))
	})
	answered := submitUntilAnswered(t, ea, quoteEmail("<helddis-1@customer.example>"))
	eventually(t, 20*time.Second, "the turn held", func() bool {
		return brainLines(s, "tenant database does not answer; holding its turns until it does") == 1
	})
	s.registryExec(`UPDATE tenants SET status = 'disabled', updated_at = now() WHERE id = $1`, a.ID)
	wantRefusal(t, answered, time.Now(), 6*time.Second, http.StatusForbidden, wire.ReasonTenantDisabled)
	// The probe hands the turns to the workers before it logs the end of
	// the hold: the refusal can reach the edge first.
	const resumed = "tenant database answers again; its held turns resume"
	eventually(t, 5*time.Second, "the hold's end logged", func() bool { return brainLines(s, resumed) > 0 })
	var answers []string
	for _, rec := range brainLog(s) {
		if rec.Msg == resumed {
			answers = append(answers, rec.Answer)
		}
	}
	if len(answers) != 1 || answers[0] != "the tenant is disabled" {
		t.Errorf("the hold ended on %q; want once, on the tenant disabled", answers)
	}
}

// The brain's registry listener, cut three times, says so once each time
// and once when it is back, and listens again: a tenant disabled after that
// is refused at once, though the periodic reload is an hour away.
func TestRegistryListenerCutSaysSoOnce(t *testing.T) {
	t.Parallel()
	s, a, ea := registryDrivenStack(t, "listen")
	ctx := context.Background()
	admin := s.adminConn("postgres")
	for cut := 1; cut <= 3; cut++ {
		var killed int
		if err := admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = $1 AND query = 'LISTEN registry_changed'`, s.stack.Ops.Prefix+"brain_registry").Scan(&killed); err != nil {
			t.Fatal(err)
		}
		if killed != 1 {
			t.Fatalf("cut %d: %d listening sessions terminated, want 1", cut, killed)
		}
		eventually(t, 20*time.Second, "the listener back", func() bool { return brainLines(s, "registry listener back") == cut })
		if n := brainLines(s, "registry listener lost; reconnecting"); n != cut {
			t.Fatalf("after %d cuts, %d warnings that the listener is lost", cut, n)
		}
	}
	s.registryExec(`UPDATE tenants SET status = 'disabled' WHERE id = $1`, a.ID)
	eventually(t, 10*time.Second, "the disabled tenant refused", func() bool {
		res := ea.submit(quoteEmail(fmt.Sprintf("<listen-%d@customer.example>", time.Now().UnixNano())))
		return res.Status == http.StatusForbidden && strings.Contains(string(res.Body), wire.ReasonTenantDisabled)
	})
}
