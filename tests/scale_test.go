package tests

// The brain's cost follows the work, not the number of tenants: timers in
// JetStream bring due work to it (approval expiries, event re-deliveries),
// idle tenants hold no connection and get no query, and a tenant whose
// pool was closed is served on the first try.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"n8nbrain/brain"
	"n8nbrain/deploy/devstack"
	"n8nbrain/edge"
	"n8nbrain/registry"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// noSafetyNet turns the timers' reconciliation pass off for the test's
// length: only timers can bring due work.
func noSafetyNet(c *brain.Config) {
	c.ReconcileInterval = time.Hour
	c.EventRetryBase = 100 * time.Millisecond
	c.EventRetryMax = 500 * time.Millisecond
}

// An approval expires at its time, by its timer, with nothing scanning.
func TestTimersExpireApprovals(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	sp := spec("timer-exp")
	sp.ApprovalTTL = 2 * time.Second
	a := s.tenant(sp)
	hook := newWebhook(t)
	s.startBrain("r1", noSafetyNet)
	ea := s.startEdge(a, withWebhook(hook))

	id := "<timer-expiry@customer.example>"
	apID := ea.submit(quoteEmail(id)).reply(t).Action.ApprovalID
	start := time.Now()
	ev := hook.accepted(wire.EventApprovalExpired, id)
	t.Logf("expired %s after the proposal (TTL 2s, timers have a one-second resolution)", time.Since(start))
	if ev.ApprovalID != apID || ev.NextTurn != 2 {
		t.Fatalf("expiry event %+v", ev)
	}
	db := s.tenantDB(a)
	if n := count(t, db, `SELECT count(*) FROM approvals WHERE id = $1 AND status = 'expired' AND decided_by = 'expiry'`, apID); n != 1 {
		t.Fatal("the approval is not expired by the expiry")
	}
	if n := count(t, db, `SELECT count(*) FROM work_items WHERE id = $1 AND status = 'escalated' AND needs_human`, id); n != 1 {
		t.Fatal("the item was not re-queued for a human")
	}
}

// An event n8n did not accept is delivered again by its tenant's outbox
// timer, with nothing scanning.
func TestTimersRedeliverEvents(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("timer-out"))
	hook := newWebhook(t)
	hook.down.Store(true)
	s.startBrain("r1", noSafetyNet)
	ea := s.startEdge(a, func(c *edge.Config) {
		withWebhook(hook)(c)
		c.WebhookRetries = 1 // the edge parks it fast; the brain's timer brings it back
	})
	id := "<timer-redeliver@customer.example>"
	apID := ea.submit(quoteEmail(id)).reply(t).Action.ApprovalID
	if r := ea.decide(apID, "approve", map[string]string{"by": "alice"}); r.Status != http.StatusOK {
		t.Fatalf("approve: %d %s", r.Status, r.Body)
	}
	// Refused at least twice (a first publication and a re-delivery) ...
	refused := 0
	for refused < 3 {
		select {
		case d := <-hook.arrived:
			if d.Status != http.StatusOK {
				refused++
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d refused deliveries: the event is not published again", refused)
		}
	}
	// ... then accepted once n8n is back.
	hook.down.Store(false)
	hook.accepted(wire.EventApprovalDecided, id)
	eventually(t, 10*time.Second, "the event to be marked delivered", func() bool {
		return count(t, s.tenantDB(a), `SELECT count(*) FROM outbox WHERE delivered_at IS NOT NULL AND kind = 'approval_decided'`) == 1
	})
}

// A burst of approvals sets its tenant's expiry and outbox timers a few
// times, not once per approval: each tenant has one timer of each kind, and
// a replica that set it for an earlier time leaves it. The events still
// reach n8n at once, published straight after each turn's commit.
func TestTimersSetOncePerBurst(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("timer-burst"))
	hook := newWebhook(t)
	s.startBrain("r1", noSafetyNet)
	ea := s.startEdge(a, withWebhook(hook))
	st, err := s.stack.Streams.JS.Stream(context.Background(), subjects.SchedulesStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	before := info.State.LastSeq
	const n = 30
	for i := range n {
		id := fmt.Sprintf("<burst-%d@customer.example>", i)
		if r := ea.submit(quoteEmail(id)).reply(t); r.Action == nil || r.Action.ApprovalID == "" {
			t.Fatalf("turn %d: no approval: %+v", i, r)
		}
		hook.accepted(wire.EventApprovalRequested, id)
	}
	info, err = st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Every schedule stored is a publish into SCHEDULES (a replacement
	// too): per approval there would be two, 60 in all.
	published := info.State.LastSeq - before
	t.Logf("%d approvals set their tenant's timers %d times", n, published)
	if published > 8 {
		t.Fatalf("%d approvals published %d timers: timers are set per approval, not per tenant", n, published)
	}
	if published == 0 {
		t.Fatal("no timer was set at all")
	}
	db := s.tenantDB(a)
	eventually(t, 10*time.Second, "every event marked delivered", func() bool {
		return count(t, db, `SELECT count(*) FROM outbox WHERE kind = 'approval_requested' AND delivered_at IS NOT NULL`) == n
	})
}

// Idle tenants cost nothing: with many provisioned and one used, once the
// pools' idle time has passed the replica holds no tenant connection, and
// over an idle window no tenant database sees a single transaction from
// it. A turn for a tenant whose pool was closed succeeds on the first try.
func TestIdleTenantsCostNothing(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	const n = 12
	var tenants []*devstack.Tenant
	for i := range n {
		tenants = append(tenants, s.tenant(spec(fmt.Sprintf("idle-%02d", i))))
	}
	ops, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsURL := "http://" + ops.Addr().String()
	s.startBrain("r1", func(c *brain.Config) {
		noSafetyNet(c)
		c.OpsListener = ops
		c.DBIdleTimeout = time.Second
	})
	e0 := s.startEdge(tenants[0], nil)
	// An invoice: the rule closes it, with no approval and no event, so the
	// tenant has nothing pending afterwards (a pending event is work: its
	// timer brings it back until an edge accepts it).
	invoice := func(id string) *wire.TurnSubmitRequest {
		req := quoteEmail(id)
		req.Email.Subject = "Invoice 1042"
		return req
	}
	if rep := e0.submit(invoice("<idle-warm@x>")).reply(t); rep.Status != wire.WorkItemStatusClosed {
		t.Fatalf("the invoice was not closed by its rule: %+v", rep)
	}
	if p := metricValue(t, metricsURL, "brain_db_pools_open"); p != 1 {
		t.Fatalf("%v tenant pools open after one tenant's turn, want 1", p)
	}
	// Over an idle window the brain opens no pool and holds no session on
	// any tenant database: sampled from both sides, the brain's gauges and
	// Postgres's own list of sessions (application_name "brain").
	admin := s.adminConn("postgres")
	var dbs []string
	for _, tn := range tenants {
		dbs = append(dbs, tn.DB.DBName)
	}
	brainSessions := func() int {
		var n int
		if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'brain' AND datname = ANY($1)`, dbs).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	eventually(t, 15*time.Second, "every idle pool to be closed", func() bool {
		return metricValue(t, metricsURL, "brain_db_pools_open") == 0 && metricValue(t, metricsURL, "brain_db_conns") == 0 &&
			brainSessions() == 0
	})
	deadline := time.Now().Add(3 * time.Second)
	samples := 0
	for time.Now().Before(deadline) {
		if sessions := brainSessions(); sessions != 0 {
			t.Fatalf("%d brain sessions on tenant databases while every tenant is idle", sessions)
		}
		if p := metricValue(t, metricsURL, "brain_db_pools_open"); p != 0 {
			t.Fatalf("%v tenant pools opened while every tenant is idle", p)
		}
		samples++
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d samples over 3 s: no tenant pool, no brain session", samples)
	// The tenant whose pool was closed: served on the first try.
	if r := e0.submit(invoice("<idle-again@x>")); r.Status != http.StatusOK {
		t.Fatalf("first turn after the pool was closed: %d %s", r.Status, r.Body)
	}
	if logs := s.logs.String(); strings.Contains(logs, "turn failed; will be retried") {
		t.Fatal("a turn failed and was retried: the closed pool was not reopened cleanly")
	}
}

// addRegistryTenants writes n tenants straight into the registry (their
// databases are never reached: they stay idle) and provisions their streams,
// as many tenants as the test needs without n databases.
func addRegistryTenants(t testing.TB, s *system, prefix string, n int) []*registry.Tenant {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	reg, err := s.stack.Ops.RegistryAdmin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(context.Background())
	var out []*registry.Tenant
	for i := range n {
		kp, err := nkeys.CreateAccount()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		tn := registry.Tenant{ID: registry.TenantID(fmt.Sprintf("%s-%04d", prefix, i)), NATSAccount: pub, Status: registry.TenantStatusActive,
			DB:          registry.DBConfig{Host: "127.0.0.1", Port: 1, Name: "never", User: "never", PasswordSealed: []byte("never opened")},
			TurnCeiling: 8, ApprovalMode: registry.ApprovalModeReviewApp, ApprovalTTL: time.Hour, CatalogueVersion: 1,
			Categories: []string{"general"}}
		if err := registry.TenantInsert(ctx, reg, tn); err != nil {
			t.Fatal(err)
		}
		if err := s.stack.Streams.EnsureTenant(ctx, &tn); err != nil {
			t.Fatal(err)
		}
		out = append(out, &tn)
	}
	return out
}

// A replica binds to every tenant in the registry at start, and a change to
// one tenant's row reloads that tenant only.
func TestManyTenantsStartAndReloadOne(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	const n = 200
	addRegistryTenants(t, s, "many", n)
	a := s.tenant(spec("many-real"))
	ops, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsURL := "http://" + ops.Addr().String()
	start := time.Now()
	s.startBrain("r1", func(c *brain.Config) {
		noSafetyNet(c)
		c.OpsListener = ops
		c.RegistryRefresh = time.Hour // only notifications reload
	})
	eventually(t, time.Minute, "the replica to bind every tenant", func() bool {
		return metricValue(t, metricsURL, "brain_tenants_consumed") == n+1
	})
	t.Logf("bound %d tenants' consumers in %s", n+1, time.Since(start))
	all := metricValue(t, metricsURL, `brain_registry_reloads_total{scope="all"}`)
	one := metricValue(t, metricsURL, `brain_registry_reloads_total{scope="tenant"}`)

	// One tenant's ceiling changes: that tenant is reloaded, nothing else.
	reg, err := s.stack.Ops.RegistryAdmin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(context.Background())
	if _, err := reg.Exec(context.Background(), `UPDATE tenants SET turn_ceiling = 1 WHERE id = $1`, a.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the change to be reloaded", func() bool {
		return metricValue(t, metricsURL, `brain_registry_reloads_total{scope="tenant"}`) == one+1
	})
	if got := metricValue(t, metricsURL, `brain_registry_reloads_total{scope="all"}`); got != all {
		t.Fatalf("a change to one tenant reloaded the whole registry (%v → %v)", all, got)
	}
	// And it applies: turn 2 is past the new ceiling of 1.
	ea := s.startEdge(a, nil)
	id := "<many-ceiling@x>"
	ea.submit(quoteEmail(id)).reply(t)
	if rep := ea.submit(later(id, 2, nil)).reply(t); rep.Status != wire.WorkItemStatusHalted {
		t.Fatalf("turn 2 past the new ceiling: %+v", rep)
	}
}
