package tests

// The brain's cost follows the work, not the number of tenants: timers in
// JetStream bring due work to it (approval expiries, event re-deliveries),
// idle tenants hold no connection and get no query, and a tenant whose
// pool was closed is served on the first try.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"n8nbrain/brain"
	"n8nbrain/deploy/devstack"
	"n8nbrain/edge"
	"n8nbrain/nats/stream"
	"n8nbrain/provision"
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

// expirySchedules returns the times of the tenant's stored expiry timers
// (every brain process has its own), read from SCHEDULES.
func expirySchedules(t *testing.T, s *system, account string) []time.Time {
	t.Helper()
	ctx := context.Background()
	st, err := s.stack.Streams.JS.Stream(ctx, subjects.SchedulesStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subjects.Schedule(account, subjects.DueExpiry, "*")))
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Time
	for subj := range info.State.Subjects {
		m, err := st.GetLastMsgForSubject(ctx, subj)
		if err != nil {
			continue // fired meanwhile: the server removed it
		}
		at, err := time.Parse(time.RFC3339, strings.TrimPrefix(m.Header.Get("Nats-Schedule"), "@at "))
		if err != nil {
			t.Fatalf("schedule %s: %v", subj, err)
		}
		out = append(out, at)
	}
	return out
}

// Two replicas' timers: replica A sets the tenant's expiry timer for an
// approval, then replica B, which knows nothing of A's timer, sets its own
// for a later one. A's approval still expires at its time. (With one timer
// per tenant and kind shared by every replica, B replaced A's earlier time
// with its later one, and A's approval waited for the reconciliation pass.)
func TestTimersOfTwoReplicasKeepTheEarliest(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	sp := spec("timer-two")
	sp.ApprovalTTL = 20 * time.Second
	a := s.tenant(sp)
	ea := s.startEdge(a, nil)
	db := s.tenantDB(a)
	stopA := s.startBrain("a", noSafetyNet)
	first := "<timer-two-first@customer.example>"
	ap1 := ea.submit(quoteEmail(first)).reply(t).Action.ApprovalID
	var expires1 time.Time
	if err := db.QueryRow(context.Background(), `SELECT expires_at FROM approvals WHERE id = $1`, ap1).Scan(&expires1); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "replica A's expiry timer", func() bool { return len(expirySchedules(t, s, a.Account.Public)) == 1 })
	stopA()

	// The tenant's approvals now wait an hour: B's approval expires long
	// after A's.
	s.registryExec(`UPDATE tenants SET approval_ttl_seconds = 3600 WHERE id = $1`, a.ID)
	s.startBrain("b", noSafetyNet)
	later := ea.submit(quoteEmail("<timer-two-later@customer.example>")).reply(t).Action.ApprovalID
	var expires2 time.Time
	if err := db.QueryRow(context.Background(), `SELECT expires_at FROM approvals WHERE id = $1`, later).Scan(&expires2); err != nil {
		t.Fatal(err)
	}
	if expires2.Sub(expires1) < 30*time.Minute {
		t.Fatalf("B's approval expires at %s, not long after A's (%s)", expires2, expires1)
	}
	eventually(t, 10*time.Second, "replica B's later expiry timer", func() bool {
		for _, at := range expirySchedules(t, s, a.Account.Public) {
			if at.After(expires1.Add(30 * time.Minute)) {
				return true
			}
		}
		return false
	})
	if time.Now().After(expires1) {
		t.Fatalf("the set-up took until after A's approval expired (%s): it proves nothing", expires1)
	}
	eventually(t, time.Until(expires1)+20*time.Second, "A's approval to expire", func() bool {
		return count(t, db, `SELECT count(*) FROM approvals WHERE id = $1 AND status = 'expired'`, ap1) == 1
	})
	var late time.Duration
	if err := db.QueryRow(context.Background(), `SELECT decided_at - expires_at FROM approvals WHERE id = $1`, ap1).Scan(&late); err != nil {
		t.Fatal(err)
	}
	t.Logf("A's approval expired %s after its time, with B's timer set for an hour later", late)
	if late > 5*time.Second {
		t.Fatalf("A's approval expired %s late", late)
	}
	if n := count(t, db, `SELECT count(*) FROM approvals WHERE id = $1 AND status = 'pending'`, later); n != 1 {
		t.Fatal("B's approval is no longer pending")
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
	// too): per approval there would be two, 60 in all. Per tenant there is
	// one of each kind, re-armed when it fires while events are still
	// undelivered (the test edge retries its webhook within 100 ms, and a loaded
	// machine makes a turn take longer than that), so the bound is half of
	// the per-approval count, not a count of the ideal case.
	published := info.State.LastSeq - before
	t.Logf("%d approvals set their tenant's timers %d times", n, published)
	if published >= n {
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

// Idle tenants cost nothing, with the safety net on: the reconciliation
// pass visits every tenant once per interval (here 6 s, a visit every
// 500 ms), and a visit leaves nothing open. Sampled from Postgres's own
// views throughout: no tenant role ever holds more than the one connection
// of the visit in progress, and nothing between visits (with the default
// idle timeout of 2 minutes, a pool a visit left open would stay); each
// tenant database sees the sessions and statements of one or two visits per
// window of 1.5 intervals, whatever the number of tenants. The tenant whose
// pool a visit closed is served on the first try.
func TestIdleTenantsCostNothing(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	const n = 12
	const interval = 6 * time.Second
	var tenants []*devstack.Tenant
	var roles, dbs []string
	for i := range n {
		tn := s.tenant(spec(fmt.Sprintf("idle-%02d", i)))
		tenants = append(tenants, tn)
		roles = append(roles, tn.DB.AppRole)
		dbs = append(dbs, tn.DB.DBName)
	}
	_, metricsURL := s.startOpsBrain("r1", func(c *brain.Config) {
		c.ReconcileInterval = interval // DBIdleTimeout stays at its default
	})
	admin := s.adminConn("postgres")
	type dbStats struct{ sessions, xacts int64 }
	stats := func() map[string]dbStats {
		rows, err := admin.Query(context.Background(), `SELECT datname, sessions, xact_commit + xact_rollback
			FROM pg_stat_database WHERE datname = ANY($1)`, dbs)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]dbStats{}
		for rows.Next() {
			var name string
			var st dbStats
			if err := rows.Scan(&name, &st.sessions, &st.xacts); err != nil {
				t.Fatal(err)
			}
			out[name] = st
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	sessions := tenantSessions(t, s, roles)
	before := stats()
	window := interval * 3 / 2
	deadline := time.Now().Add(window)
	samples, idle, busiest := 0, 0, 0
	for time.Now().Before(deadline) {
		sess, _ := sessions()
		busiest = max(busiest, sess)
		if sess > 1 {
			t.Fatalf("%d tenant sessions at once while every tenant is idle: visits leave connections behind", sess)
		}
		if sess == 0 {
			idle++
		}
		if samples%10 == 0 {
			if p := metricValue(t, metricsURL, "brain_db_pools_open"); p > 1 {
				t.Fatalf("%v tenant pools open while every tenant is idle", p)
			}
		}
		samples++
		time.Sleep(10 * time.Millisecond) // the sampling period
	}
	after := stats()
	// A visit is six statements (sweep, next expiry, claim, next attempt,
	// two counts), each prepared on the visit's fresh connection: Postgres
	// counts 13 transactions. 16 leaves room without letting anything
	// that polls tenants pass.
	const perVisit = 16
	totalXacts := int64(0)
	for _, tn := range tenants {
		db := tn.DB.DBName
		sess, xacts := after[db].sessions-before[db].sessions, after[db].xacts-before[db].xacts
		totalXacts += xacts
		// Postgres reports a backend's counts up to a second late
		// (PGSTAT_MIN_INTERVAL), so a visit just before the window may be
		// counted in it: one or two visits, and one more at its edge.
		if sess < 1 || sess > 3 {
			t.Errorf("%s: %d sessions over %s, want the one or two of its visits (three at the window's edge)", tn.ID, sess, window)
		}
		if xacts > 3*perVisit {
			t.Errorf("%s: %d transactions over %s, more than three visits make", tn.ID, xacts, window)
		}
	}
	// The visits the window holds, two at its edges, and those of the last
	// second before it whose counts arrive late.
	visits := int64(window/(interval/n)) + 2 + int64(time.Second/(interval/n))
	t.Logf("%d samples over %s: %d with no tenant session, at most %d at once; %d transactions on %d tenant databases (at most %d visits)",
		samples, window, idle, busiest, totalXacts, n, visits)
	if totalXacts > visits*perVisit {
		t.Fatalf("%d transactions over %s: more than %d visits make", totalXacts, window, visits)
	}
	if idle < samples/2 {
		t.Fatalf("a tenant session was open in %d of %d samples: connections are held between visits", samples-idle, samples)
	}
	// The tenant whose pool its visit closed: served on the first try.
	e0 := s.startEdge(tenants[0], nil)
	invoice := quoteEmail("<idle-again@x>")
	invoice.Email.Subject = "Invoice 1042"
	if r := e0.submit(invoice); r.Status != http.StatusOK {
		t.Fatalf("first turn after the pool was closed: %d %s", r.Status, r.Body)
	}
	assertFirstTry(t, metricsURL)
}

// addRegistryTenants writes n tenants straight into the registry, in one
// transaction (their databases are never reached: they stay idle), and
// provisions their turn streams and consumers with a few workers at once,
// in memory and small (nothing is ever published to them, and file streams
// take much longer to create under the race detector): as many tenants as
// a replica's start-up needs without n databases.
func addRegistryTenants(t testing.TB, s *system, prefix string, n int) []*registry.Tenant {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	reg, err := s.stack.Ops.RegistryAdmin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(context.Background())
	out := make([]*registry.Tenant, n)
	for i := range n {
		kp, err := nkeys.CreateAccount()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		out[i] = &registry.Tenant{ID: registry.TenantID(fmt.Sprintf("%s-%04d", prefix, i)), NATSAccount: pub, Status: registry.TenantStatusActive,
			DB:          registry.DBConfig{Host: "127.0.0.1", Port: 1, Name: "never", User: "never", PasswordSealed: []byte("never opened")},
			TurnCeiling: 8, ApprovalMode: registry.ApprovalModeReviewApp, ApprovalTTL: time.Hour, CatalogueVersion: 1,
			Categories: []string{"general"}}
	}
	small := s.streams
	small.Memory = true
	// What a replica binds to at start: the turn stream and its consumer
	// (the results stream is only written to, after a turn).
	bind := func(ctx context.Context, tn *registry.Tenant) error {
		l := provision.LimitsOf(tn.Quota)
		l.MaxBytes = 256 << 10 // below what the registry allows: these stay empty
		js := s.stack.Streams.JS
		if _, err := js.CreateOrUpdateStream(ctx, stream.Turns(small, tn.NATSAccount, l)); err != nil {
			return err
		}
		_, err := js.CreateOrUpdateConsumer(ctx, subjects.TurnsStream(tn.NATSAccount), stream.Consumer(small, l))
		return err
	}
	if err := pgx.BeginFunc(ctx, reg, func(tx pgx.Tx) error {
		for _, tn := range out {
			if err := registry.TenantInsert(ctx, tx, *tn); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	next := make(chan *registry.Tenant)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range cap(errs) {
		wg.Go(func() {
			for tn := range next {
				if err := bind(ctx, tn); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	go func() {
		defer close(next)
		for _, tn := range out {
			select {
			case next <- tn:
			case <-ctx.Done():
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		cancel()
		t.Fatal(err)
	}
	return out
}

// A replica starts with a thousand tenants in the registry within seconds
// (every tenant's turn consumer bound, its API subscribed), and a change to
// one tenant's row reloads that tenant only.
func TestManyTenantsStartAndReloadOne(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	const n = 1000
	// Generous for a loaded 2-core machine; it takes about a second when quiet.
	const startBound = 20 * time.Second
	provisioned := time.Now()
	addRegistryTenants(t, s, "many", n)
	t.Logf("wrote %d registry rows and their streams in %s", n, time.Since(provisioned))
	a := s.tenant(spec("many-real"))
	start := time.Now()
	_, metricsURL := s.startOpsBrain("r1", func(c *brain.Config) {
		noSafetyNet(c)
		c.RegistryRefresh = time.Hour // only notifications reload
	})
	eventually(t, time.Minute, "the replica to bind every tenant", func() bool {
		return metricValue(t, metricsURL, "brain_tenants_consumed") == n+1
	})
	took := time.Since(start)
	t.Logf("started and bound %d tenants' consumers in %s", n+1, took)
	if took > startBound {
		t.Fatalf("a replica took %s to start with %d tenants, more than %s", took, n+1, startBound)
	}
	all := metricValue(t, metricsURL, `brain_registry_reloads_total{scope="all"}`)
	one := metricValue(t, metricsURL, `brain_registry_reloads_total{scope="tenant"}`)

	// One tenant's ceiling changes: that tenant is reloaded, nothing else.
	s.registryExec(`UPDATE tenants SET turn_ceiling = 1 WHERE id = $1`, a.ID)
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
