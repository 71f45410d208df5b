package tests

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"n8nbrain/brain"
	"n8nbrain/deploy/devstack"
	"n8nbrain/edge"
	"n8nbrain/nats/account"
	"n8nbrain/wire"
)

// webhook stands in for n8n's Webhook node: it records every delivery and
// answers 503 while down.
type webhook struct {
	t      *testing.T
	srv    *httptest.Server
	secret string
	down   atomic.Bool

	mu         sync.Mutex
	deliveries []delivery
	arrived    chan delivery
}

type delivery struct {
	Status int
	Key    string
	Event  wire.Event
}

func newWebhook(t *testing.T) *webhook {
	h := &webhook{t: t, secret: "webhook-secret-" + randomHex(8), arrived: make(chan delivery, 4096)}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev wire.Event
		if err := json.Unmarshal(body, &ev); err != nil {
			t.Errorf("webhook got a body that is not an event: %s", body)
		}
		mac := hmac.New(sha256.New, []byte(h.secret))
		mac.Write(body)
		if r.Header.Get("X-Brain-Webhook-Token") != h.secret || r.Header.Get("X-Brain-Signature") != "sha256="+hex.EncodeToString(mac.Sum(nil)) {
			t.Errorf("webhook delivery without a valid token and signature: %v", r.Header)
		}
		d := delivery{Status: http.StatusOK, Key: r.Header.Get("Idempotency-Key"), Event: ev}
		if h.down.Load() {
			d.Status = http.StatusServiceUnavailable
		}
		h.mu.Lock()
		h.deliveries = append(h.deliveries, d)
		h.mu.Unlock()
		h.arrived <- d
		w.WriteHeader(d.Status)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

// accepted waits for n8n to have accepted an event of the given kind for the work item.
func (h *webhook) accepted(kind wire.EventKind, workItemID string) wire.Event {
	h.t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case d := <-h.arrived:
			if d.Status == http.StatusOK && d.Event.Kind == kind && d.Event.WorkItemID == workItemID {
				return d.Event
			}
		case <-deadline:
			h.t.Fatalf("no %s event for %s reached the webhook", kind, workItemID)
		}
	}
}

func (h *webhook) all() []delivery {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]delivery(nil), h.deliveries...)
}

// fastEvents makes the brain forward events and sweep expiries quickly.
// fastEvents retries undelivered events quickly and runs the timers'
// safety net often (tests that write approvals straight into a database
// have no timers: the reconciliation pass finds them). Timers themselves
// are proven with the safety net off (TestTimers*).
func fastEvents(c *brain.Config) {
	c.EventRetryBase = 100 * time.Millisecond
	c.EventRetryMax = 500 * time.Millisecond
	c.ReconcileInterval = 50 * time.Millisecond
}

func withWebhook(h *webhook) func(*edge.Config) {
	return func(c *edge.Config) {
		c.WebhookURL = h.srv.URL
		c.WebhookSecret = h.secret
		c.WebhookRetries = 3
		c.WebhookInitialInterval = 20 * time.Millisecond
		c.WebhookMaxInterval = 100 * time.Millisecond
	}
}

func (c *edgeClient) approval(id string) wire.ApprovalGetReply {
	c.t.Helper()
	r := c.do(http.MethodGet, "/v1/approvals/"+id, nil)
	if r.Status != http.StatusOK {
		c.t.Fatalf("get approval: %d %s", r.Status, r.Body)
	}
	var rep wire.ApprovalGetReply
	if err := json.Unmarshal(r.Body, &rep); err != nil {
		c.t.Fatal(err)
	}
	return rep
}

func (c *edgeClient) decide(id, decision string, body any) response {
	c.t.Helper()
	return c.do(http.MethodPost, "/v1/approvals/"+id+"/"+decision, body)
}

func later(id string, turn int, lr *wire.LatestResult) *wire.TurnSubmitRequest {
	return &wire.TurnSubmitRequest{WorkItemID: id, Turn: turn, LatestResult: lr}
}

func sendParams(t *testing.T, a *wire.Action) (approvalID, hash string) {
	t.Helper()
	var p struct {
		ApprovalID    string `json:"approval_id"`
		ContentSHA256 string `json:"content_sha256"`
		AbortIf       string `json:"abort_if_replied_since"`
	}
	if err := json.Unmarshal(a.Params, &p); err != nil {
		t.Fatal(err)
	}
	if p.AbortIf == "" {
		t.Fatalf("send_reply without its reconciliation precondition: %s", a.Params)
	}
	return p.ApprovalID, p.ContentSHA256
}

// 1. The full loop: email → draft awaiting approval → approve on the edge →
// event delivered to the webhook → next turn → send_reply with the approved
// hash → outcome succeeded → item closed.
func TestApprovalLoop(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("loop-a"))
	hook := newWebhook(t)
	s.startBrain("r1", fastEvents)
	ea := s.startEdge(a, withWebhook(hook))
	id := "<loop@customer.example>"

	rep := ea.submit(quoteEmail(id)).reply(t)
	if rep.Status != wire.WorkItemStatusAwaitingApproval || rep.Action == nil || !rep.Action.RequiresApproval || rep.Action.ApprovalID == "" {
		t.Fatalf("turn 1: %+v", rep)
	}
	apID := rep.Action.ApprovalID
	got := ea.approval(apID)
	if got.Approval.Status != wire.ApprovalStatusPending || got.Approval.Proof != wire.ProofExactText ||
		got.Approval.ProposedSHA256 != wire.ContentSHA256(rep.Action.Params) || got.Email == nil || got.Email.Subject != quoteEmail(id).Email.Subject {
		t.Fatalf("approval record: %+v", got)
	}
	// Nothing moves until a human decides: the next turn just waits.
	if r := ea.submit(later(id, 2, nil)).reply(t); r.Action != nil || r.Status != wire.WorkItemStatusAwaitingApproval {
		t.Fatalf("turn before approval: %+v", r)
	}

	dr := ea.decide(apID, "approve", map[string]string{"by": "alice"})
	if dr.Status != http.StatusOK {
		t.Fatalf("approve: %d %s", dr.Status, dr.Body)
	}
	var decided wire.ApprovalDecideReply
	if err := json.Unmarshal(dr.Body, &decided); err != nil {
		t.Fatal(err)
	}
	if decided.Approval.Status != wire.ApprovalStatusApproved || decided.Approval.DecidedBy != "n8n:alice" ||
		decided.Approval.ApprovedSHA256 != got.Approval.ProposedSHA256 || decided.Approval.DecidedAt == nil {
		t.Fatalf("decided approval: %+v", decided.Approval)
	}
	ev := hook.accepted(wire.EventApprovalDecided, id)
	if ev.EventID != decided.EventID || ev.ApprovalID != apID || ev.Decision != "approved" || ev.NextTurn != 3 {
		t.Fatalf("event: %+v (decide said event %s)", ev, decided.EventID)
	}
	// A second decision is a conflict, not a second event.
	if e := ea.decide(apID, "reject", map[string]string{"by": "bob", "reason": "changed my mind"}).error(t, http.StatusConflict); e.Reason != wire.ReasonAlreadyResolved {
		t.Fatalf("second decision: %+v", e)
	}

	send := ea.submit(later(id, ev.NextTurn, nil)).reply(t)
	if send.Action == nil || send.Action.Name != "send_reply" || send.Action.RequiresApproval {
		t.Fatalf("turn after approval: %+v", send)
	}
	if sid, hash := sendParams(t, send.Action); sid != apID || hash != decided.Approval.ApprovedSHA256 {
		t.Fatalf("send_reply carries %s/%s, want %s/%s", sid, hash, apID, decided.Approval.ApprovedSHA256)
	}
	done := ea.submit(later(id, ev.NextTurn+1, &wire.LatestResult{Action: "send_reply", Outcome: wire.OutcomeSucceeded})).reply(t)
	if done.Status != wire.WorkItemStatusClosed || done.Action != nil {
		t.Fatalf("after send: %+v", done)
	}
	db := s.tenantDB(a)
	var status, outcome, state string
	if err := db.QueryRow(context.Background(), `SELECT status, outcome, action_state FROM work_items WHERE id = $1`, id).Scan(&status, &outcome, &state); err != nil {
		t.Fatal(err)
	}
	if status != "closed" || outcome != "succeeded" || state != "succeeded" {
		t.Fatalf("item %s/%s/%s, want closed/succeeded/succeeded", status, outcome, state)
	}
	eventually(t, 10*time.Second, "the event to be marked delivered", func() bool {
		return count(t, db, `SELECT count(*) FROM outbox WHERE kind = 'approval_decided' AND delivered_at IS NOT NULL`) == 1
	})
	for _, d := range hook.all() {
		if d.Key != d.Event.EventID {
			t.Fatalf("Idempotency-Key %q is not the event id %q", d.Key, d.Event.EventID)
		}
	}
}

// 2. Edit-and-approve: send_reply carries the edited text's hash; the
// original hash is kept on the record.
func TestEditAndApprove(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("edit-a"))
	hook := newWebhook(t)
	s.startBrain("r1", fastEvents)
	ea := s.startEdge(a, withWebhook(hook))
	id := "<edit@customer.example>"
	rep := ea.submit(quoteEmail(id)).reply(t)
	apID := rep.Action.ApprovalID
	proposed := wire.ContentSHA256(rep.Action.Params)

	edited := map[string]string{"subject": "Re: your deck", "body": "Hi Jo, your quote is attached. Regards", "tone": "formal"}
	// Params that break the action's schema are refused and change nothing.
	if e := ea.decide(apID, "edit", map[string]any{"by": "alice", "params": map[string]string{"subject": "x"}}).error(t, http.StatusBadRequest); e.Field == "" {
		t.Fatalf("invalid edit: %+v", e)
	}
	dr := ea.decide(apID, "edit", map[string]any{"by": "alice", "params": edited})
	if dr.Status != http.StatusOK {
		t.Fatalf("edit: %d %s", dr.Status, dr.Body)
	}
	canon, _ := json.Marshal(edited) // map keys marshal sorted: the canonical form
	wantHash := wire.ContentSHA256(canon)
	got := ea.approval(apID).Approval
	if got.ProposedSHA256 != proposed || got.EditedSHA256 != wantHash || got.ApprovedSHA256 != wantHash || string(got.Edited) != string(canon) {
		t.Fatalf("record after edit: proposed %s edited %s approved %s (%s); want %s, %s", got.ProposedSHA256, got.EditedSHA256, got.ApprovedSHA256, got.Edited, proposed, wantHash)
	}
	ev := hook.accepted(wire.EventApprovalDecided, id)
	send := ea.submit(later(id, ev.NextTurn, nil)).reply(t)
	if _, hash := sendParams(t, send.Action); hash != wantHash {
		t.Fatalf("send_reply hash %s, want the edited text's %s", hash, wantHash)
	}
}

// An edit at the catalogue's limits is accepted end to end: a body of
// 20,000 characters of 4 bytes each (80 KB of UTF-8), and one of 20,000
// characters JSON writes as \u003c (120 KB), through the edge's body limit,
// the tenant's NATS payload limit and the brain's API limit.
func TestEditAtTheCatalogueLimits(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("edit-big"))
	s.startBrain("r1", nil)
	ea := s.startEdge(a, nil)
	for i, body := range []string{strings.Repeat("😀", 20_000), strings.Repeat("<", 20_000)} {
		rep := ea.submit(quoteEmail(fmt.Sprintf("<edit-big-%d@customer.example>", i))).reply(t)
		edited := map[string]string{"subject": "Re: your deck", "body": body}
		dr := ea.decide(rep.Action.ApprovalID, "edit", map[string]any{"by": "alice", "params": edited})
		if dr.Status != http.StatusOK {
			t.Fatalf("edit of %d bytes: %d %.300s", len(body), dr.Status, dr.Body)
		}
		canon, _ := json.Marshal(edited)
		if got := ea.approval(rep.Action.ApprovalID).Approval; got.EditedSHA256 != wire.ContentSHA256(canon) {
			t.Fatalf("edit of %d bytes: edited hash %s, want %s", len(body), got.EditedSHA256, wire.ContentSHA256(canon))
		}
	}
	// One character more is the catalogue's refusal, naming the parameter,
	// not a size limit's.
	rep := ea.submit(quoteEmail("<edit-big-over@customer.example>")).reply(t)
	over := map[string]any{"by": "alice", "params": map[string]string{"subject": "Re", "body": strings.Repeat("😀", 20_001)}}
	if e := ea.decide(rep.Action.ApprovalID, "edit", over).error(t, http.StatusBadRequest); e.Field != "edited" || !strings.Contains(e.Message, `"body" is longer than 20000 characters`) {
		t.Fatalf("an edit over the body's limit: %+v", e)
	}
}

// 3. 1,000 approvals straddling their expiry, two sweepers at once: none
// approved without a human, each expired approval re-queued exactly once,
// late approvals rejected.
func TestExpiryRace(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("expiry-a"))
	ctx := context.Background()
	const n = 1000
	pool, err := pgxpool.New(ctx, s.tenantURL(a))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// Work items awaiting approval, their approvals expiring from 1.2s in
	// the past to 4.6s in the future (the database's clock): wide enough to
	// straddle the approvals on a loaded machine.
	if _, err := pool.Exec(ctx, `
		INSERT INTO work_items (id, turn, status, needs_human, catalogue_version, approval_mode, last_action, action_state)
		SELECT 'exp-' || i, 1, 'awaiting_approval', false, 1, 'review_app', 'draft_reply', 'pending' FROM generate_series(1, $1) i;
		`, n); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO approvals (id, work_item_id, turn, action, catalogue_version, approval_mode, proof, status, proposed, proposed_sha256, expires_at)
		SELECT gen_random_uuid(), 'exp-' || i, 1, 'draft_reply', 1, 'review_app', 'exact_text', 'pending',
			'{"body":"b","subject":"s"}', repeat('a', 64), now() + make_interval(secs => (i % 30 - 6) * 0.2)
		FROM generate_series(1, $1) i`, n); err != nil {
		t.Fatal(err)
	}
	rows, _ := pool.Query(ctx, `SELECT id::text FROM approvals ORDER BY random()`)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	s.startBrain("sweeper-1", fastEvents)
	s.startBrain("sweeper-2", fastEvents)
	ea := s.startEdge(a, nil)

	approved := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	work := make(chan string)
	for range 16 {
		wg.Go(func() {
			for id := range work {
				r := ea.decide(id, "approve", map[string]string{"by": "alice"})
				switch {
				case r.Status == http.StatusOK:
					mu.Lock()
					approved[id] = true
					mu.Unlock()
				case r.Status == http.StatusConflict && strings.Contains(string(r.Body), wire.ReasonApprovalExpired):
				default:
					t.Errorf("approve %s: %d %s", id, r.Status, r.Body)
				}
			}
		})
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
	eventually(t, 20*time.Second, "every approval to be resolved", func() bool {
		return count(t, s.tenantDB(a), `SELECT count(*) FROM approvals WHERE status = 'pending'`) == 0
	})

	db := s.tenantDB(a)
	if c := count(t, db, `SELECT count(*) FROM approvals WHERE status = 'approved' AND (decided_by <> 'n8n:alice' OR decided_at >= expires_at)`); c != 0 {
		t.Fatalf("%d approvals approved without a human in time", c)
	}
	if c := count(t, db, `SELECT count(*) FROM approvals WHERE status = 'approved'`); c != len(approved) {
		t.Fatalf("%d approved in the database, %d approvals answered 200", c, len(approved))
	}
	expired := count(t, db, `SELECT count(*) FROM approvals WHERE status = 'expired'`)
	if expired+len(approved) != n || expired == 0 || len(approved) == 0 {
		t.Fatalf("approved %d + expired %d != %d (the test must straddle the expiry)", len(approved), expired, n)
	}
	if c := count(t, db, `SELECT count(*) FROM (SELECT payload->>'approval_id' FROM outbox WHERE kind = 'approval_expired'
			GROUP BY 1 HAVING count(*) <> 1) x`); c != 0 {
		t.Fatalf("%d expired approvals re-queued more than once", c)
	}
	if c := count(t, db, `SELECT count(*) FROM outbox WHERE kind = 'approval_expired'`); c != expired {
		t.Fatalf("%d approval_expired events for %d expiries", c, expired)
	}
	if c := count(t, db, `SELECT count(*) FROM approvals ap JOIN work_items w ON w.id = ap.work_item_id
			WHERE ap.status = 'expired' AND NOT (w.status = 'escalated' AND w.needs_human AND w.status_reason = 'approval_expired')`); c != 0 {
		t.Fatalf("%d expired approvals whose item was not re-queued for a human", c)
	}
	// Late approvals are refused with a clear error.
	var late string
	if err := db.QueryRow(ctx, `SELECT id::text FROM approvals WHERE status = 'expired' LIMIT 1`).Scan(&late); err != nil {
		t.Fatal(err)
	}
	if e := ea.decide(late, "approve", map[string]string{"by": "alice"}).error(t, http.StatusConflict); e.Reason != wire.ReasonApprovalExpired {
		t.Fatalf("late approval: %+v", e)
	}
}

// 4. Webhook down for a while, then up: every event delivered with a stable
// idempotency key, none lost across a brain restart and an edge restart.
func TestEventsSurviveRestartsWhileWebhookIsDown(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("events-a"))
	hook := newWebhook(t)
	hook.down.Store(true)
	stopBrain := s.startBrain("before", fastEvents)
	ea := s.startEdge(a, withWebhook(hook))

	items := []string{"<ev1@x>", "<ev2@x>", "<ev3@x>"}
	events := map[string]string{} // event id → work item
	for _, id := range items {
		rep := ea.submit(quoteEmail(id)).reply(t)
		dr := ea.decide(rep.Action.ApprovalID, "approve", map[string]string{"by": "alice"})
		var d wire.ApprovalDecideReply
		if err := json.Unmarshal(dr.Body, &d); err != nil || dr.Status != http.StatusOK {
			t.Fatalf("approve: %d %s", dr.Status, dr.Body)
		}
		events[d.EventID] = id
	}
	// Every event was tried against the dead webhook at least once.
	tried := map[string]bool{}
	for len(tried) < len(events) {
		select {
		case d := <-hook.arrived:
			if d.Event.Kind == wire.EventApprovalDecided {
				tried[d.Event.EventID] = true
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d of %d events reached the (down) webhook", len(tried), len(events))
		}
	}
	stopBrain()
	ea.stop()
	s.startBrain("after", fastEvents)
	s.startEdge(a, withWebhook(hook))
	hook.down.Store(false)

	delivered := map[string]bool{}
	for len(delivered) < len(events) {
		select {
		case d := <-hook.arrived:
			if d.Status == http.StatusOK && d.Event.Kind == wire.EventApprovalDecided {
				delivered[d.Event.EventID] = true
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d of %d events delivered after the webhook came back", len(delivered), len(events))
		}
	}
	for id := range events {
		if !delivered[id] {
			t.Fatalf("event %s lost", id)
		}
	}
	for _, d := range hook.all() {
		if d.Event.Kind != wire.EventApprovalDecided {
			continue // each item's approval_requested event too
		}
		if d.Key != d.Event.EventID || events[d.Event.EventID] != d.Event.WorkItemID {
			t.Fatalf("delivery with unstable key or wrong item: %+v", d)
		}
	}
	db := s.tenantDB(a)
	eventually(t, 10*time.Second, "every event to be marked delivered", func() bool {
		return count(t, db, `SELECT count(*) FROM outbox WHERE delivered_at IS NULL`) == 0
	})
}

// 5. closed_manual closes the item with the human's action recorded, and
// appears in the report; a pending approval is superseded.
func TestClosedManual(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("manual-a"))
	s.startBrain("r1", fastEvents)
	ea := s.startEdge(a, nil)
	id := "<manual@customer.example>"
	rep := ea.submit(quoteEmail(id)).reply(t)
	// The human replied from their phone before anyone approved the draft.
	human := &wire.HumanAction{Kind: "replied", Text: "Sorted it on the phone, Jo."}
	done := ea.submit(later(id, 2, &wire.LatestResult{Action: "draft_reply", Outcome: wire.OutcomeClosedManual, HumanAction: human})).reply(t)
	if done.Status != wire.WorkItemStatusClosedManual || done.Action != nil {
		t.Fatalf("closed_manual turn: %+v", done)
	}
	db := s.tenantDB(a)
	var outcome string
	var recorded []byte
	if err := db.QueryRow(context.Background(), `SELECT outcome, human_action FROM work_items WHERE id = $1`, id).Scan(&outcome, &recorded); err != nil {
		t.Fatal(err)
	}
	var gotHuman wire.HumanAction
	if err := json.Unmarshal(recorded, &gotHuman); err != nil || outcome != "closed_manual" || gotHuman.Text != human.Text || gotHuman.Kind != human.Kind {
		t.Fatalf("item outcome %q, human action %s", outcome, recorded)
	}
	if st := ea.approval(rep.Action.ApprovalID).Approval.Status; st != wire.ApprovalStatusSuperseded {
		t.Fatalf("pending approval is %s, want superseded", st)
	}
	// And one that succeeded, for the rates.
	ok := "<ok@customer.example>"
	r1 := ea.submit(quoteEmail(ok)).reply(t)
	ea.decide(r1.Action.ApprovalID, "approve", map[string]string{"by": "alice"})
	ea.submit(later(ok, 2, nil)).reply(t)
	ea.submit(later(ok, 3, &wire.LatestResult{Action: "send_reply", Outcome: wire.OutcomeSucceeded})).reply(t)

	r := ea.do(http.MethodGet, "/v1/report", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("report: %d %s", r.Status, r.Body)
	}
	var rep2 wire.OutcomeReport
	if err := json.Unmarshal(r.Body, &rep2); err != nil {
		t.Fatal(err)
	}
	if rep2.Items != 2 || rep2.ClosedManual != 1 || rep2.Succeeded != 1 || rep2.ClosedManualRate != 0.5 ||
		rep2.Approvals.Superseded != 1 || rep2.Approvals.Approved != 1 || rep2.Turnaround.Count != 1 {
		t.Fatalf("report: %s", r.Body)
	}

	// The report's scans grow with the tenant's items, on a cluster other
	// tenants share: it is computed at most once every 10 s per tenant and
	// since, so a call right after answers the same figures, while another
	// since is computed afresh.
	ea.submit(quoteEmail("<after-report@customer.example>")).reply(t)
	items := func(path string) int {
		t.Helper()
		r := ea.do(http.MethodGet, path, nil)
		var rep wire.OutcomeReport
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &rep) != nil {
			t.Fatalf("%s: %d %s", path, r.Status, r.Body)
		}
		return rep.Items
	}
	if n := items("/v1/report"); n != 2 {
		t.Errorf("the report again at once counts %d items, want the 2 it answered (computed at most every 10 s)", n)
	}
	if n := items("/v1/report?since=" + url.QueryEscape(time.Now().Add(-time.Hour).UTC().Format(time.RFC3339))); n != 3 {
		t.Errorf("the report since an hour ago counts %d items, want 3", n)
	}
}

// 6. A mode change does not affect an in-flight item; new items get the new mode.
func TestApprovalModeChangeAppliesToNewItemsOnly(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("mode-a"))
	s.startBrain("r1", fastEvents)
	ea := s.startEdge(a, nil)
	old := "<inflight@customer.example>"
	r := ea.submit(quoteEmail(old)).reply(t)
	if p := ea.approval(r.Action.ApprovalID).Approval; p.ApprovalMode != "review_app" || p.Proof != wire.ProofExactText {
		t.Fatalf("in-flight approval: %+v", p)
	}
	s.registryExec(`UPDATE tenants SET approval_mode = 'mailbox' WHERE id = $1`, a.ID)
	var fresh wire.Approval
	n := 0
	eventually(t, 10*time.Second, "the mode change to reach the brain", func() bool {
		n++
		rep := ea.submit(quoteEmail(fmt.Sprintf("<new-%d@customer.example>", n))).reply(t)
		fresh = ea.approval(rep.Action.ApprovalID).Approval
		return fresh.ApprovalMode == "mailbox"
	})
	if fresh.Proof != wire.ProofProposalOnly {
		t.Fatalf("new item's approval proves %q, want %q", fresh.Proof, wire.ProofProposalOnly)
	}
	// The in-flight item finishes under review_app: approval → send_reply.
	ea.decide(r.Action.ApprovalID, "approve", map[string]string{"by": "alice"})
	if send := ea.submit(later(old, 2, nil)).reply(t); send.Action == nil || send.Action.Name != "send_reply" {
		t.Fatalf("in-flight item after the mode change: %+v", send)
	}
	// The new item is mailbox: n8n places the draft and the human sends it;
	// the brain never sends.
	ea.decide(fresh.ID, "approve", map[string]string{"by": "alice"})
	if next := ea.submit(later(fresh.WorkItemID, 2, nil)).reply(t); next.Action != nil {
		t.Fatalf("mailbox item got an action after approval: %+v", next)
	}
}

// 7. Tenant B cannot list, read, approve or receive events for tenant A's
// approvals, through any subject or HTTP route.
func TestApprovalsAreTenantScoped(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a, b := s.tenant(spec("scope-a")), s.tenant(spec("scope-b"))
	hookA, hookB := newWebhook(t), newWebhook(t)
	s.startBrain("r1", fastEvents)
	ea, eb := s.startEdge(a, withWebhook(hookA)), s.startEdge(b, withWebhook(hookB))

	// An attacker account whose JWT imports A's API and events with A's key.
	brainPub := s.stack.Brain.Public
	enc := s.attacker("evil-events", func(ac *jwt.AccountClaims) {
		ac.Imports = account.ImportsFor(a.Account.Public, brainPub, s.stack.StreamsAccount.Public)
		ac.Imports.Add(&jwt.Import{Name: "wild-events", Account: brainPub, Subject: "brain.event.*.>", LocalSubject: "wev.*.>", Type: jwt.Stream})
	})
	if _, err := enc.Request("api.approval.list", []byte(`{}`), 2*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("forged API import: %v, want no responders", err)
	}
	id := "<scoped@customer.example>"
	apID := ea.submit(quoteEmail(id)).reply(t).Action.ApprovalID
	// With A's approval id in hand, the forged API import still reaches nothing.
	if _, err := enc.Request("api.approval.get", []byte(`{"approval_id":"`+apID+`"}`), 2*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("forged API import: %v, want no responders", err)
	}
	// From here on, everything the attacker's account can receive is counted.
	var leaked atomic.Int64
	if _, err := enc.Subscribe(">", func(*nats.Msg) { leaked.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}

	if e := eb.do(http.MethodGet, "/v1/approvals/"+apID, nil).error(t, http.StatusNotFound); e.Code != wire.CodeNotFound {
		t.Fatalf("B read A's approval: %+v", e)
	}
	for d, body := range map[string]any{
		"approve": map[string]any{"by": "mallory"},
		"reject":  map[string]any{"by": "mallory", "reason": "no"},
		"edit":    map[string]any{"by": "mallory", "params": map[string]string{"subject": "s", "body": "b"}},
	} {
		eb.decide(apID, d, body).error(t, http.StatusNotFound)
	}
	var list wire.ApprovalListReply
	lr := eb.do(http.MethodGet, "/v1/approvals", nil)
	if err := json.Unmarshal(lr.Body, &list); err != nil || lr.Status != http.StatusOK || len(list.Approvals) != 0 {
		t.Fatalf("B's list: %d %s", lr.Status, lr.Body)
	}
	// A's approval still pending and A's human can decide it; the event
	// reaches A's webhook only.
	if st := ea.approval(apID).Approval.Status; st != wire.ApprovalStatusPending {
		t.Fatalf("A's approval is %s after B's attempts", st)
	}
	ea.decide(apID, "approve", map[string]string{"by": "alice"})
	hookA.accepted(wire.EventApprovalDecided, id)
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := len(hookB.all()); n != 0 {
		t.Fatalf("B's webhook received %d deliveries of A's events", n)
	}
	if n := leaked.Load(); n != 0 {
		t.Fatalf("the forged account received %d messages", n)
	}
	if n := count(t, s.tenantDB(b), `SELECT count(*) FROM approvals`) + count(t, s.tenantDB(b), `SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("tenant B's database has %d approval or event rows", n)
	}
}

// A halted item's event reaches n8n too.
func TestHaltEventIsDelivered(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	sp := spec("halt-a")
	sp.TurnCeiling = 1
	a := s.tenant(sp)
	hook := newWebhook(t)
	s.startBrain("r1", fastEvents)
	ea := s.startEdge(a, withWebhook(hook))
	id := "<halt@customer.example>"
	ea.submit(quoteEmail(id)).reply(t)
	if r := ea.submit(later(id, 2, nil)).reply(t); r.Status != wire.WorkItemStatusHalted {
		t.Fatalf("turn 2: %+v", r)
	}
	ev := hook.accepted(wire.EventItemHalted, id)
	if ev.NextTurn != 3 || ev.Reason != "turn_ceiling" {
		t.Fatalf("halt event: %+v", ev)
	}
}

// tenantURL is the tenant's own runtime role URL.
func (s *system) tenantURL(tn *devstack.Tenant) string { return tn.DB.AppURL }

// A draft awaiting approval announces itself: approval_requested reaches n8n
// through the real relay, naming the approval, and is written in the turn's
// own transaction (the approval and its event exist together or not at all).
func TestApprovalRequestedEvent(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("requested-a"))
	hook := newWebhook(t)
	s.startBrain("r1", fastEvents)
	ea := s.startEdge(a, withWebhook(hook))
	id := "<requested@customer.example>"

	rep := ea.submit(quoteEmail(id)).reply(t)
	if rep.Status != wire.WorkItemStatusAwaitingApproval || rep.Action == nil || rep.Action.ApprovalID == "" {
		t.Fatalf("turn 1: %+v", rep)
	}
	ev := hook.accepted(wire.EventApprovalRequested, id)
	if ev.ApprovalID != rep.Action.ApprovalID || ev.Action != "draft_reply" || ev.NextTurn != 2 || ev.Decision != "" {
		t.Fatalf("approval_requested event: %+v (approval %s)", ev, rep.Action.ApprovalID)
	}
	db := s.tenantDB(a)
	eventually(t, 10*time.Second, "the event to be marked delivered", func() bool {
		return count(t, db, `SELECT count(*) FROM outbox WHERE kind = 'approval_requested' AND delivered_at IS NOT NULL`) == 1
	})
	// Same transaction: both rows' created_at default to now(), the start
	// of the transaction that wrote them, to the microsecond.
	if c := count(t, db, `SELECT count(*) FROM outbox o JOIN approvals ap ON ap.id::text = o.payload->>'approval_id'
			WHERE o.kind = 'approval_requested' AND o.created_at = ap.created_at`); c != 1 {
		t.Fatalf("%d approval_requested events written in their approval's transaction, want 1", c)
	}
	// A replayed turn writes nothing: still one request event.
	if r := ea.submit(quoteEmail(id)).reply(t); !r.Replayed {
		t.Fatalf("turn 1 again: %+v", r)
	}
	if c := count(t, db, `SELECT count(*) FROM outbox WHERE kind = 'approval_requested'`); c != 1 {
		t.Fatalf("%d approval_requested events after a replay, want 1", c)
	}
	// An action that needs no approval announces nothing.
	ea.submit(&wire.TurnSubmitRequest{WorkItemID: "<invoice@customer.example>", Turn: 1,
		Email: &wire.Email{From: "Jo <jo@customer.example>", Subject: "Invoice 42", Body: "Attached."}}).reply(t)
	if c := count(t, db, `SELECT count(*) FROM outbox WHERE kind = 'approval_requested'`); c != 1 {
		t.Fatalf("%d approval_requested events, want 1 (the invoice needs no approval)", c)
	}
}
