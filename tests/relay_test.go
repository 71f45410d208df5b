package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/brain"
	"n8nbrain/catalogue"
	"n8nbrain/deploy/devstack"
	"n8nbrain/edge"
	"n8nbrain/nats/account"
	"n8nbrain/registry"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// 1. A turn from tenant A's edge writes only to A's database.
func TestTurnWritesOnlyToItsTenantsDatabase(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a, b := s.tenant(spec("iso-a")), s.tenant(spec("iso-b"))
	s.startBrain("r1", nil)
	ea := s.startEdge(a, nil)

	rep := ea.submit(quoteEmail("<m1@customer.example>")).reply(t)
	if rep.Status != wire.WorkItemStatusAwaitingApproval || rep.Action == nil || rep.Action.Name != "draft_reply" || !rep.Action.RequiresApproval {
		t.Fatalf("unexpected decision: %+v", rep)
	}
	dbA, dbB := s.tenantDB(a), s.tenantDB(b)
	if n := count(t, dbA, `SELECT count(*) FROM decisions WHERE work_item_id = $1`, "<m1@customer.example>"); n != 1 {
		t.Fatalf("tenant A has %d decisions, want 1", n)
	}
	for _, table := range []string{"work_items", "decisions", "step_checkpoints"} {
		if n := count(t, dbB, `SELECT count(*) FROM `+table); n != 0 {
			t.Errorf("tenant B's %s has %d rows after A's turn", table, n)
		}
	}
}

// 2. A body naming tenant B, sent through A's edge (and straight over A's
// NATS connection), is rejected, counted, and writes nothing anywhere.
func TestBodyNamingAnotherTenantIsRejected(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a, b := s.tenant(spec("name-a")), s.tenant(spec("name-b"))
	_, opsURL := s.startOpsBrain("r1", nil)
	ea := s.startEdge(a, nil)

	req := quoteEmail("<forged@x>")
	req.TenantID = string(b.ID)
	e := ea.submit(req).error(t, http.StatusForbidden)
	if e.Reason != wire.ReasonTenantMismatch {
		t.Fatalf("reason %q, want %q", e.Reason, wire.ReasonTenantMismatch)
	}

	// The same forgery straight over NATS with A's credentials.
	nc := s.tenantConn(a)
	req2 := quoteEmail("<forged2@x>")
	req2.TenantID = string(b.ID)
	key := subjects.TurnKey(req2.WorkItemID, req2.Turn)
	sub, err := nc.SubscribeSync(subjects.ReplyLocal(key))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(req2)
	js, _ := jetstream.New(nc)
	if _, err := js.Publish(context.Background(), subjects.TurnLocal(key), body); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(wire.HeaderStatus) != wire.StatusError || !bytes.Contains(m.Data, []byte(wire.ReasonTenantMismatch)) {
		t.Fatalf("want a tenant_mismatch error reply, got %s %s", m.Header, m.Data)
	}
	if n := metric(t, opsURL, "brain_turns_tenant_mismatch_total"); n != 2 {
		t.Fatalf("tenant mismatch counter = %d, want 2", n)
	}
	for _, tn := range []*struct {
		name string
		conn *pgx.Conn
	}{{"A", s.tenantDB(a)}, {"B", s.tenantDB(b)}} {
		if n := count(t, tn.conn, `SELECT count(*) FROM work_items`) + count(t, tn.conn, `SELECT count(*) FROM decisions`); n != 0 {
			t.Errorf("tenant %s has %d rows after a forged turn", tn.name, n)
		}
	}
}

// 3. A tenant account whose JWT imports the brain's subjects with another
// tenant's key gets no responders and sees none of the other's replies.
func TestForgedImportsReachNothing(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a, b := s.tenant(spec("forge-a")), s.tenant(spec("forge-b"))
	s.startBrain("r1", nil)
	ea := s.startEdge(a, nil)

	// The attacker controls its own account (signed by the operator, as
	// onboarding would) and writes imports naming tenant A's key, and
	// wildcards, in the account token position.
	brainPub, streamsPub := s.stack.Brain.Public, s.stack.StreamsAccount.Public
	enc := s.attacker("evil", func(ac *jwt.AccountClaims) {
		ac.Imports = account.ImportsFor(a.Account.Public, brainPub, streamsPub) // A's key, A's local names
		ac.Imports.Add(
			&jwt.Import{Name: "wild-turns", Account: streamsPub, Subject: "brain.turn.*.>", LocalSubject: "wturn.*.>", Type: jwt.Service},
			&jwt.Import{Name: "wild-replies", Account: streamsPub, Subject: "brain.reply.*.>", LocalSubject: "wreply.*.>", Type: jwt.Stream},
			&jwt.Import{Name: "wild-live", Account: streamsPub, Subject: "brain.live.*.>", LocalSubject: "wlive.*.>", Type: jwt.Stream},
			&jwt.Import{Name: "wild-results", Account: streamsPub, Subject: "$JS.API.DIRECT.GET.*.brain.reply.*.>", LocalSubject: "wresult.*.*.>", Type: jwt.Service},
			// The private exports, without the activation token only the
			// BRAIN account holds: pulling A's turns, storing A's replies.
			&jwt.Import{Name: "steal-next", Account: streamsPub, Subject: subjects.ConsumerNext, Type: jwt.Service},
			&jwt.Import{Name: "forge-reply", Account: streamsPub, Subject: subjects.ReplyAll, Type: jwt.Service},
		)
	})
	// Everything the attacker's account can receive while A's turn is
	// decided and answered: nothing may arrive.
	var seen []string
	var mu sync.Mutex
	catchAll, err := enc.Subscribe(">", func(m *nats.Msg) {
		mu.Lock()
		seen = append(seen, m.Subject)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
	req := quoteEmail("<secret@customer.example>")
	key := subjects.TurnKey(req.WorkItemID, req.Turn)
	ea.submit(req).reply(t) // A's turn is decided and its reply published
	// A round trip on the attacker's connection: anything routed to it has arrived.
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := catchAll.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 0 {
		t.Fatalf("the forged account received %d messages: %v", len(seen), seen)
	}

	for _, subj := range []string{subjects.TurnLocal(key), subjects.ResultLocal(key), "wturn." + a.Account.Public + "." + key,
		"wresult." + subjects.ResultsStream(a.Account.Public) + "." + a.Account.Public + "." + key, subjects.APILocal(subjects.APIApprovalList),
		"$JS.API.CONSUMER.MSG.NEXT." + subjects.TurnsStream(a.Account.Public) + "." + subjects.TurnsConsumer,
		subjects.Reply(a.Account.Public, key)} {
		_, err := enc.Request(subj, []byte(`{}`), 2*time.Second)
		if !errors.Is(err, nats.ErrNoResponders) {
			t.Errorf("forged request on %s: got %v, want no responders", subj, err)
		}
	}
	// Tenant B, legitimately asking for A's key through its own import,
	// is scoped to B's namespace: nothing there.
	m, err := s.tenantConn(b).Request(subjects.ResultLocal(key), nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get("Status") != "404" {
		t.Fatalf("tenant B read A's result: %s %s", m.Header, m.Data)
	}
}

// 4. The same turn retried 5 times returns byte-identical replies and one decision.
func TestRetriesReturnByteIdenticalReplies(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("retry-a"))
	s.startBrain("r1", nil)
	ea := s.startEdge(a, nil)
	req := quoteEmail("<retry@customer.example>")

	first := ea.submit(req)
	orig := first.reply(t)
	if orig.Replayed {
		t.Fatal("first answer is marked replayed")
	}
	var replays [][]byte
	for i := 0; i < 5; i++ {
		r := ea.submit(req)
		rep := r.reply(t)
		if !rep.Replayed {
			t.Fatalf("retry %d not marked replayed", i+1)
		}
		rep.Replayed = false
		if a, b := mustJSON(t, rep), mustJSON(t, orig); !bytes.Equal(a, b) {
			t.Fatalf("retry %d decided differently:\n%s\n%s", i+1, a, b)
		}
		replays = append(replays, r.Body)
	}
	for i := 1; i < len(replays); i++ {
		if !bytes.Equal(replays[i], replays[0]) {
			t.Fatalf("retry %d bytes differ:\n%s\n%s", i+1, replays[i], replays[0])
		}
	}
	if n := count(t, s.tenantDB(a), `SELECT count(*) FROM decisions WHERE work_item_id = $1`, req.WorkItemID); n != 1 {
		t.Fatalf("%d decisions, want 1", n)
	}
}

// 5. The same key with a different payload is rejected and nothing changes,
// whether JetStream catches it (turn still in TURNS) or the tenant database
// does (turn aged out of TURNS).
func TestSameKeyDifferentPayloadIsRejected(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("reuse-a"))
	s.startBrain("r1", nil)
	ea := s.startEdge(a, nil)
	req := quoteEmail("<reuse@customer.example>")
	ea.submit(req).reply(t)
	db := s.tenantDB(a)
	before := snapshot(t, db, req.WorkItemID)

	other := quoteEmail(req.WorkItemID)
	other.Email.Body = "A different email under the same key"
	e := ea.submit(other).error(t, http.StatusConflict)
	if e.Reason != wire.ReasonIdempotencyKeyReused {
		t.Fatalf("reason %q, want %q", e.Reason, wire.ReasonIdempotencyKeyReused)
	}
	if after := snapshot(t, db, req.WorkItemID); after != before {
		t.Fatalf("state changed:\n%s\n%s", before, after)
	}

	// Age the turn out of TURNS and RESULTS: only the database guards now.
	js := s.stack.Streams.JS
	key := subjects.TurnKey(req.WorkItemID, 1)
	for name, subj := range map[string]string{subjects.TurnsStream(a.Account.Public): subjects.Turn(a.Account.Public, key),
		subjects.ResultsStream(a.Account.Public): subjects.Reply(a.Account.Public, key)} {
		st, err := js.Stream(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Purge(context.Background(), jetstream.WithPurgeSubject(subj)); err != nil {
			t.Fatal(err)
		}
	}
	other.Email.Body = "Yet another payload, after the stream forgot the first"
	e = ea.submit(other).error(t, http.StatusConflict)
	if e.Reason != wire.ReasonIdempotencyKeyReused {
		t.Fatalf("after purge: reason %q, want %q", e.Reason, wire.ReasonIdempotencyKeyReused)
	}
	if after := snapshot(t, db, req.WorkItemID); after != before {
		t.Fatalf("state changed after purge:\n%s\n%s", before, after)
	}
	// And the original payload still replays.
	if rep := ea.submit(req).reply(t); !rep.Replayed {
		t.Fatal("original payload not replayed")
	}
}

// 6. 50 concurrent identical submissions: one decision, and all 50 callers get it.
func TestConcurrentIdenticalSubmissions(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("conc-a"))
	s.startBrain("r1", nil)
	s.startBrain("r2", nil)
	ea := s.startEdge(a, nil)
	req := quoteEmail("<concurrent@customer.example>")

	const n = 50
	replies := make([]wire.TurnSubmitReply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := ea.submit(req)
			if r.Status != http.StatusOK {
				t.Errorf("caller %d: %d %s", i, r.Status, r.Body)
				return
			}
			_ = json.Unmarshal(r.Body, &replies[i])
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// One caller's publish made the decision; the others are retries of it.
	fresh := 0
	for _, r := range replies {
		if !r.Replayed {
			fresh++
		}
	}
	if fresh != 1 {
		t.Errorf("%d callers were told replayed:false, want the one whose publish the brain decided", fresh)
	}
	want := replies[0]
	want.Replayed = false
	for i, r := range replies {
		r.Replayed = false
		if !bytes.Equal(mustJSON(t, r), mustJSON(t, want)) {
			t.Fatalf("caller %d got a different decision: %+v vs %+v", i, r, want)
		}
	}
	if c := count(t, s.tenantDB(a), `SELECT count(*) FROM decisions WHERE work_item_id = $1`, req.WorkItemID); c != 1 {
		t.Fatalf("%d decisions, want 1", c)
	}
}

// 7. An out-of-sequence turn gets 409 with the expected turn and does not
// burn its key; the turn ceiling halts the item, visibly on the item.
func TestSequenceAndCeiling(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	sp := spec("seq-a")
	sp.TurnCeiling = 3
	a := s.tenant(sp)
	s.startBrain("r1", nil)
	ea := s.startEdge(a, nil)
	id := "<seq@customer.example>"
	ea.submit(quoteEmail(id)).reply(t)

	turn := func(n int) *wire.TurnSubmitRequest { return &wire.TurnSubmitRequest{WorkItemID: id, Turn: n} }
	e := ea.submit(turn(3)).error(t, http.StatusConflict)
	if e.Reason != wire.ReasonTurnOutOfSequence || e.ExpectedTurn != 2 {
		t.Fatalf("got %+v, want out of sequence expecting 2", e)
	}
	// A turn that skipped ahead is not burnt: once turn 2 is decided, the
	// very same turn 3 is decided too.
	ea.submit(turn(2)).reply(t)
	ea.submit(turn(3)).reply(t)

	rep := ea.submit(turn(4)).reply(t)
	if rep.Status != wire.WorkItemStatusHalted || rep.Reason != "turn_ceiling" || rep.Action != nil {
		t.Fatalf("turn past the ceiling: %+v", rep)
	}
	var status string
	var needsHuman bool
	if err := s.tenantDB(a).QueryRow(context.Background(), `SELECT status, needs_human FROM work_items WHERE id = $1`, id).Scan(&status, &needsHuman); err != nil {
		t.Fatal(err)
	}
	if status != "halted" || !needsHuman {
		t.Fatalf("item status %q needs_human %v, want halted and flagged", status, needsHuman)
	}
	e = ea.submit(turn(5)).error(t, http.StatusUnprocessableEntity)
	if e.Reason != wire.ReasonItemHalted {
		t.Fatalf("turn after halt: %+v", e)
	}
	// The halting turn replays like any decided turn.
	if rep := ea.submit(turn(4)).reply(t); !rep.Replayed || rep.Status != wire.WorkItemStatusHalted {
		t.Fatalf("halt replay: %+v", rep)
	}
}

// 8. A replica that dies after committing and before acking: the turn is
// redelivered to another replica and answered exactly once.
func TestReplicaDyingBeforeAckLosesNothing(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("crash-a"))
	crashed := make(chan struct{})
	var once sync.Once
	stop1 := s.startBrain("doomed", func(c *brain.Config) {
		c.Hooks.AfterCommitFunc = func(registry.TenantID, string, int) error {
			once.Do(func() { close(crashed) })
			return errors.New("replica killed after commit")
		}
	})
	ea := s.startEdge(a, nil)
	req := quoteEmail("<crash@customer.example>")
	res := make(chan response, 1)
	go func() { res <- ea.submit(req) }()

	select {
	case <-crashed:
	case <-time.After(15 * time.Second):
		t.Fatal("the doomed replica never took the turn")
	}
	stop1()
	s.startBrain("survivor", nil)
	r := <-res
	rep := r.reply(t)
	if rep.Replayed {
		t.Fatal("the caller's only answer is marked replayed; the redelivered message should return the original bytes")
	}
	db := s.tenantDB(a)
	if n := count(t, db, `SELECT count(*) FROM decisions WHERE work_item_id = $1`, req.WorkItemID); n != 1 {
		t.Fatalf("%d decisions, want exactly 1", n)
	}
	var stored []byte
	if err := db.QueryRow(context.Background(), `SELECT reply FROM decisions WHERE work_item_id = $1`, req.WorkItemID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stored, r.Body) {
		t.Fatalf("answer differs from the stored decision:\n%s\n%s", r.Body, stored)
	}
}

// 9. An edge that missed the live reply gets it through the result subject.
func TestMissedReplyIsFetchedFromResults(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("missed-a"))
	ea := s.startEdge(a, func(c *edge.Config) { c.TurnWait = 300 * time.Millisecond })
	req := quoteEmail("<missed@customer.example>")

	// No brain yet: the edge gives up waiting and says where to look.
	r := ea.submit(req)
	if r.Status != http.StatusAccepted {
		t.Fatalf("want 202, got %d %s", r.Status, r.Body)
	}
	loc := r.Header.Get("Location")
	if want := "/v1/turns/" + subjects.TurnKey(req.WorkItemID, 1) + "?fingerprint=" + wire.Fingerprint(req); loc != want {
		t.Fatalf("Location %q, want %q", loc, want)
	}
	// The live reply is published while nobody waits for it.
	s.startBrain("late", nil)
	var got response
	eventually(t, 20*time.Second, "the decision to be fetchable", func() bool {
		got = ea.do(http.MethodGet, loc, nil)
		return got.Status == http.StatusOK
	})
	rep := got.reply(t)
	if rep.WorkItemID != req.WorkItemID || rep.Action == nil || rep.Action.Name != "draft_reply" {
		t.Fatalf("fetched %+v", rep)
	}
	// Nobody had this decision before: its first delivery is not a replay;
	// every later one is.
	if rep.Replayed {
		t.Fatalf("the first delivery after a 202 says replayed: %s", got.Body)
	}
	again := ea.do(http.MethodGet, loc, nil)
	if rep2 := again.reply(t); !rep2.Replayed {
		t.Fatalf("the second fetch is not marked replayed: %s", again.Body)
	}
	// Re-submitting is safe: the stored decision, not a second one.
	if resub := ea.submit(req); !bytes.Equal(resub.Body, again.Body) {
		t.Fatalf("resubmission differs from fetched result:\n%s\n%s", resub.Body, again.Body)
	}
	// A client whose payload lost the key gets what a POST would answer:
	// 409, never the decision made for other content.
	other := quoteEmail(req.WorkItemID)
	other.Email.Body = "someone else's e-mail under the same work item and turn"
	if e := ea.do(http.MethodGet, "/v1/turns/"+subjects.TurnKey(req.WorkItemID, 1)+"?fingerprint="+wire.Fingerprint(other), nil).
		error(t, http.StatusConflict); e.Reason != wire.ReasonIdempotencyKeyReused {
		t.Fatalf("GET with another payload's fingerprint: %+v", e)
	}
	if n := count(t, s.tenantDB(a), `SELECT count(*) FROM decisions`); n != 1 {
		t.Fatalf("%d decisions, want 1", n)
	}
}

// A client holding the tenant's own edge credentials sends requests whose
// reply subject is the tenant's reply.<key> (or the inbox of the edge's
// read of a stored reply): the server answers there for whoever asks, so
// another turn's stored reply, a PubAck or an API answer lands where the
// edge waits. None is taken as the answer: the waiting turn still gets the
// truth (202 while no brain answers), never another key's decision as an
// idempotency_key_reused.
func TestForgedLiveReplyIsNotTheAnswer(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("forged-live"))
	stop := s.startBrain("r1", nil)
	ea := s.startEdge(a, func(c *edge.Config) { c.TurnWait = 3 * time.Second })
	first := quoteEmail("<first@customer.example>")
	ea.submit(first).reply(t)
	k1 := subjects.TurnKey(first.WorkItemID, first.Turn)
	stop() // no brain: the next turn waits for its live reply

	nc := s.tenantConn(a)
	second := quoteEmail("<second@customer.example>")
	k2 := subjects.TurnKey(second.WorkItemID, second.Turn)
	done := make(chan response, 1)
	go func() { done <- ea.submit(second) }()
	eventually(t, 5*time.Second, "the second turn to be in the stream", func() bool {
		st, err := s.stack.Streams.JS.Stream(context.Background(), subjects.TurnsStream(a.Account.Public))
		if err != nil {
			return false
		}
		info, err := st.Info(context.Background())
		return err == nil && info.State.Msgs == 2 // the edge has published and waits
	})
	for _, forged := range []string{subjects.ResultLocal(k1), subjects.TurnLocal(k1), subjects.APILocal("approval.list")} {
		if err := nc.PublishRequest(forged, subjects.ReplyLocal(k2), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.Status != http.StatusAccepted {
		t.Fatalf("the waiting turn got %d %s, want 202: a forged message on reply.%s was taken as its answer", r.Status, r.Body, k2)
	}
	if !strings.Contains(s.logs.String(), "not that turn's reply; dropped") {
		t.Error("no log line says a forged live reply was dropped")
	}
	s.startBrain("r2", nil)
	var got response
	eventually(t, 20*time.Second, "the second turn's decision", func() bool {
		got = ea.submit(second)
		return got.Status == http.StatusOK
	})
	if rep := got.reply(t); rep.WorkItemID != second.WorkItemID {
		t.Fatalf("the second turn's decision names %s", rep.WorkItemID)
	}
}

// 10. Runtime roles: A's role cannot connect to B's database, the brain's
// registry role cannot write, no runtime role is superuser or owns tables.
func TestRuntimeRolesAreConfined(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a, b := s.tenant(spec("role-a")), s.tenant(spec("role-b"))
	ctx := context.Background()

	cfg, err := pgx.ParseConfig(a.DB.AppURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Database = b.DB.DBName
	if conn, err := pgx.ConnectConfig(ctx, cfg); err == nil {
		conn.Close(ctx)
		t.Fatal("tenant A's role connected to tenant B's database")
	} else if code := pgCode(err); code != "42501" {
		t.Fatalf("want insufficient_privilege, got %v", err)
	}

	reg, err := pgx.Connect(ctx, s.stack.RegistryURL)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)
	for _, stmt := range []string{
		`INSERT INTO tenants (id, nats_account, db_host, db_port, db_name, db_user, db_password_sealed) VALUES ('x', 'A` + strings.Repeat("A", 55) + `', 'h', 1, 'd', 'u', '\x00')`,
		`UPDATE tenants SET status = 'disabled'`,
		`DELETE FROM tenants`,
		`UPDATE triage_rules SET action = 'send_reply'`,
	} {
		if _, err := reg.Exec(ctx, stmt); pgCode(err) != "42501" {
			t.Errorf("registry role ran %q: %v", stmt, err)
		}
	}
	admin := s.adminConn("postgres")
	roles := []string{a.DB.AppRole, b.DB.AppRole, reg.Config().User}
	var super int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_roles WHERE rolname = ANY($1) AND (rolsuper OR rolcreatedb OR rolcreaterole OR rolbypassrls)`, roles).Scan(&super); err != nil {
		t.Fatal(err)
	}
	if super != 0 {
		t.Fatalf("%d runtime roles have superuser-like powers", super)
	}
	for _, tn := range []struct {
		db, role string
	}{{a.DB.DBName, a.DB.AppRole}, {b.DB.DBName, b.DB.AppRole}} {
		if n := count(t, s.adminConn(tn.db), `SELECT count(*) FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE r.rolname = $1`, tn.role); n != 0 {
			t.Errorf("role %s owns %d relations", tn.role, n)
		}
	}
}

// 12. An action the tenant has not enabled is never returned to it, even
// when a rule in the registry names it, and a change of enabled actions in
// the registry applies to the next turn without a restart.
func TestActionsNotEnabledAreNeverReturned(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	sp := spec("enabled-a")
	sp.EnabledActions = []catalogue.Name{catalogue.DraftReply, catalogue.EscalateItem}
	sp.Rules = sp.Rules[:1]
	a := s.tenant(sp)
	// A rule written behind the ops tool's back, naming an action the
	// tenant never enabled.
	s.registryExec(`INSERT INTO triage_rules (tenant_id, position, name, match, category, priority, action, params, confidence)
		VALUES ($1, 10, 'jobs', '{"subject_keywords":["leak"]}', 'booking', 'urgent', 'create_job',
		'{"title":"Fix leak","description":"d","external_ref":"r"}', 1)`, a.ID)
	s.startBrain("r1", nil)
	ea := s.startEdge(a, nil)
	leak := &wire.TurnSubmitRequest{WorkItemID: "<leak@x>", Turn: 1, Email: &wire.Email{From: "a@b.example", Subject: "Leak in the roof", Body: "water everywhere"}}
	rep := ea.submit(leak).reply(t)
	if rep.Action == nil || rep.Action.Name != "escalate_item" || rep.Reason != "rule_action_not_enabled" {
		t.Fatalf("want escalation instead of create_job, got %+v", rep)
	}

	// Ops switches draft_reply and escalate_item off: the next new item gets
	// neither, without restarting the brain.
	s.registryExec(`UPDATE tenants SET enabled_actions = '{close_item}', updated_at = now() WHERE id = $1`, a.ID)
	var last wire.TurnSubmitReply
	n := 0
	eventually(t, 10*time.Second, "the registry change to reach the brain", func() bool {
		n++
		last = ea.submit(quoteEmail("<after-change-" + string(rune('a'+n)) + "@x>")).reply(t)
		return last.Action == nil
	})
	if last.Status != wire.WorkItemStatusEscalated || last.Reason != "rule_action_not_enabled" {
		t.Fatalf("after disabling: %+v", last)
	}
	if rep := ea.submit(leak).reply(t); !rep.Replayed {
		t.Fatal("a decided turn must replay its stored decision, whatever the registry says now")
	}
}

// Disabled and unknown tenants are refused by the brain with a typed error.
func TestDisabledTenantIsRefused(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("disabled-a"))
	s.registryExec(`UPDATE tenants SET status = 'disabled' WHERE id = $1`, a.ID)
	s.startBrain("r1", nil)
	ea := s.startEdge(a, nil)
	if e := ea.submit(quoteEmail("<d@x>")).error(t, http.StatusForbidden); e.Reason != wire.ReasonTenantDisabled {
		t.Fatalf("got %+v", e)
	}

	// An account that passed NATS onboarding but has no registry row.
	ghost, err := s.stack.Operator.TenantAccount("ghost", nil, s.stack.Brain.Public, s.stack.StreamsAccount.Public)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.stack.NATS.PutAccount(ghost.Public, ghost.JWT); err != nil {
		t.Fatal(err)
	}
	creds, _ := account.UserCreds(ghost, "edge", account.RoleEdge)
	path := t.TempDir() + "/ghost.creds"
	if err := writeFile(path, creds); err != nil {
		t.Fatal(err)
	}
	// Its turns have no stream to land in (provisioning creates a tenant's
	// streams with its registry row): a 503 that says so, after the edge's
	// publish retries.
	ge := s.startEdge(&devstack.Tenant{ID: "ghost", EdgeCreds: path, Token: a.Token}, func(c *edge.Config) { c.PublishTimeout = time.Second })
	if e := ge.submit(quoteEmail("<g@x>")).error(t, http.StatusServiceUnavailable); e.Reason != wire.ReasonNotProvisioned {
		t.Fatalf("got %+v", e)
	}
}

func snapshot(t *testing.T, db *pgx.Conn, id string) string {
	t.Helper()
	var s string
	err := db.QueryRow(context.Background(), `SELECT row_to_json(w)::text || (SELECT string_agg(row_to_json(d)::text, ',') FROM decisions d WHERE d.work_item_id = w.id)
		FROM work_items w WHERE id = $1`, id).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// An edge given another kind of user's credentials (here the brain's) does
// not start: it names the setting, instead of serving turns that never get
// a reply while /readyz says ready.
func TestEdgeWithAnotherUsersCredentialsDoesNotStart(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("wrongcreds-a"))
	cfg := s.stack.EdgeConfig(a)
	cfg.CredsFile = s.stack.BrainConfig("wrongcreds").CredsFile
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = edge.Serve(ctx, ln, cfg, slog.New(s.logs.handler()).With("component", "edge"))
	if err == nil || !strings.Contains(err.Error(), "EDGE_NATS_CREDS") || !strings.Contains(err.Error(), "reply.>") {
		t.Fatalf("an edge with the brain's credentials: %v; want it to refuse to start, naming EDGE_NATS_CREDS", err)
	}
}
