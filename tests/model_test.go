package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ollama/ollama/api"

	"n8nbrain/brain"
	"n8nbrain/catalogue"
	"n8nbrain/deploy/devstack"
	"n8nbrain/edge"
	"n8nbrain/internal/ollamafake"
	"n8nbrain/provision"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// modelSpec is spec(id) with the quotes rule made unsure (0.5 < the
// engine's ConfidentRule): a quote request matches it but the model decides.
func modelSpec(id string) provision.TenantSpec {
	sp := spec(id)
	sp.Rules[0].Confidence = 0.5
	return sp
}

const (
	goodClassify = `{"category":"quote_request","priority":"high","confidence":0.86,"action":"draft_reply","params":{}}`
	goodDraft    = `{"subject":"Re: a new pergola","body":"Thanks for asking. We will visit on Monday and send a written quote for the pergola.","tone":"friendly"}`
)

// pergola is a quote request that no confident rule decides.
func pergola(id string) *wire.TurnSubmitRequest {
	return &wire.TurnSubmitRequest{WorkItemID: id, Turn: 1, Email: &wire.Email{
		MessageID: id, From: "Sam Rivers <sam@customer.example>", Subject: "Quote wanted: cedar pergola 4x3m, side gate 17",
		Body: "Hello, we would like a quote for a cedar pergola (4 by 3 metres) behind the side gate at number 17. The access code is 2231. Sam"}}
}

// answerFunc answers classification and drafting with fixed outputs and
// token counts.
func answerFunc(classify, draft string) ollamafake.ChatFunc {
	return func(req *api.ChatRequest) ollamafake.Reply {
		if stepOf(req) == "classify" {
			return ollamafake.Reply{Content: classify, PromptTokens: 412, OutputTokens: 31}
		}
		return ollamafake.Reply{Content: draft, PromptTokens: 388, OutputTokens: 57}
	}
}

// 1. A quote request that no confident rule decides is assessed and drafted
// by the model, relayed edge → NATS → brain → Postgres; the draft requires
// approval (from the catalogue), and the ledger has one row per call.
func TestModelAssessesAndDrafts(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	sp := modelSpec("model-a")
	sp.ModelName = "tenant-model:3b"
	sp.ModelOptions = map[string]any{"num_ctx": 4096}
	a := s.tenant(sp)
	fake := ollamafake.New(t, answerFunc(goodClassify, goodDraft))
	_, ops := s.startModelBrain("r1", fake, nil)
	ea := s.startEdge(a, nil)
	req := pergola("<pergola@customer.example>")

	rep := ea.submit(req).reply(t)
	want := wire.Assessment{Category: "quote_request", Priority: "high", Confidence: 0.86, Source: "model"}
	if rep.Status != wire.WorkItemStatusAwaitingApproval || rep.Assessment != want || rep.Action == nil ||
		rep.Action.Name != "draft_reply" || !rep.Action.RequiresApproval {
		t.Fatalf("decision %s", mustJSON(t, rep))
	}
	var params struct {
		Subject string `json:"subject"`
		Body    string `json:"body"`
		Tone    string `json:"tone"`
	}
	if err := wire.Decode(rep.Action.Params, &params); err != nil || params.Subject != "Re: a new pergola" || params.Tone != "friendly" ||
		!strings.HasPrefix(params.Body, "Thanks for asking.") {
		t.Fatalf("params %s (%v)", rep.Action.Params, err)
	}

	db := s.tenantDB(a)
	rows := ledger(t, db, req.WorkItemID)
	wantRows := []ledgerRow{
		{Step: "classify", Attempt: 1, Model: "tenant-model:3b", PromptVersion: "classify-v3", PromptTokens: 412, OutputTokens: 31, Outcome: "ok"},
		{Step: "draft", Attempt: 1, Model: "tenant-model:3b", PromptVersion: "draft-v2", PromptTokens: 388, OutputTokens: 57, Outcome: "ok"},
	}
	if !slices.Equal(rows, wantRows) {
		t.Fatalf("ledger %+v, want %+v", rows, wantRows)
	}
	if n := count(t, db, `SELECT count(*) FROM step_checkpoints WHERE work_item_id = $1`, req.WorkItemID); n != 2 {
		t.Fatalf("%d checkpoints, want classify and draft", n)
	}
	if fake.Calls() != 2 {
		t.Fatalf("%d model calls, want 2", fake.Calls())
	}
	// What the model was sent: the tenant's model and options over ours,
	// the email as delimited data, only the enabled triage actions.
	for _, r := range fake.Requests() {
		if r.Model != "tenant-model:3b" || r.Options["num_ctx"] != float64(4096) || r.Options["num_predict"] == nil ||
			r.KeepAlive == nil || r.Stream == nil || *r.Stream || len(r.Format) == 0 {
			t.Fatalf("request %+v", r)
		}
		e, ok := emailOf(&r)
		if !ok || e.Subject != req.Email.Subject || e.Body != req.Email.Body {
			t.Fatalf("the email is not delimited data in the prompt: %+v", r.Messages)
		}
		if strings.Contains(r.Messages[0].Content, req.Email.Body) || strings.Contains(r.Messages[0].Content, "send_reply") {
			t.Fatalf("system prompt carries email content or a follow-up action:\n%s", r.Messages[0].Content)
		}
	}
	tenant := fmt.Sprintf(`{tenant=%q}`, a.ID)
	if n := labelled(t, ops, "brain_model_tokens_total"+tenant); n != 412+31+388+57 {
		t.Fatalf("brain_model_tokens_total = %d", n)
	}
	if n := labelled(t, ops, fmt.Sprintf(`brain_model_calls_total{outcome="ok",tenant=%q}`, a.ID)); n != 2 {
		t.Fatalf("brain_model_calls_total ok = %d", n)
	}
	// A replay answers from the database: no model call.
	if r := ea.submit(req).reply(t); !r.Replayed || fake.Calls() != 2 {
		t.Fatalf("replay: %+v, %d calls", r, fake.Calls())
	}
	assertNoEmailInLogs(t, s, req.Email)
}

// 2. A confident rule decides alone: the model is never called.
func TestConfidentRuleSkipsTheModel(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("rule-a"))
	fake := ollamafake.New(t, func(*api.ChatRequest) ollamafake.Reply {
		t.Error("the model was called for an item a confident rule decides")
		return ollamafake.Reply{Status: http.StatusInternalServerError}
	})
	s.startModelBrain("r1", fake, nil)
	ea := s.startEdge(a, nil)
	req := quoteEmail("<rule-quote@customer.example>")
	rep := ea.submit(req).reply(t)
	if rep.Assessment.Source != "rule" || rep.Assessment.Rule != "quotes" || rep.Action == nil || rep.Action.Name != "draft_reply" {
		t.Fatalf("decision %s", mustJSON(t, rep))
	}
	if fake.Calls() != 0 {
		t.Fatalf("%d model calls, want 0", fake.Calls())
	}
	if n := count(t, s.tenantDB(a), `SELECT count(*) FROM model_calls`); n != 0 {
		t.Fatalf("%d ledger rows, want 0", n)
	}
	assertNoEmailInLogs(t, s, req.Email)
}

var caseRe = regexp.MustCompile(`\[case:(\w+)\]`)

// 3. Malformed model output gets one repair, then the item is escalated
// with model_output_invalid; nothing invalid is ever stored.
func TestMalformedModelOutput(t *testing.T) {
	t.Parallel()
	const bigResolution = `{"category":"general","priority":"low","confidence":0.5,"action":"close_item","params":{"resolution":"%s"}}`
	cases := []struct {
		name     string
		classify []string // by attempt; the last repeats
		draft    []string
		status   wire.WorkItemStatus
		reason   string
		action   string
		source   string
		ledger   string
	}{
		{name: "NotJSON", classify: []string{"It is a quote request, priority high."},
			status: "escalated", reason: "model_output_invalid", action: "escalate_item", source: "none",
			ledger: "classify:invalid_output,classify:invalid_output"},
		{name: "WrongTypes", classify: []string{`{"category":"quote_request","priority":"high","confidence":"0.9","action":"draft_reply","params":{}}`},
			status: "escalated", reason: "model_output_invalid", action: "escalate_item", source: "none",
			ledger: "classify:invalid_output,classify:invalid_output"},
		{name: "UnknownAction", classify: []string{`{"category":"general","priority":"urgent","confidence":1,"action":"transfer_funds","params":{"amount":900}}`},
			status: "escalated", reason: "model_output_invalid", action: "escalate_item", source: "none",
			ledger: "classify:invalid_output,classify:invalid_output"},
		{name: "ActionNotEnabled", classify: []string{`{"category":"booking","priority":"high","confidence":0.9,"action":"create_job","params":{"title":"t","description":"d","external_ref":"r"}}`},
			status: "escalated", reason: "model_output_invalid", action: "escalate_item", source: "none",
			ledger: "classify:invalid_output,classify:invalid_output"},
		{name: "ExtraFields", classify: []string{`{"category":"quote_request","priority":"high","confidence":0.9,"action":"draft_reply","params":{},"requires_approval":false}`},
			status: "escalated", reason: "model_output_invalid", action: "escalate_item", source: "none",
			ledger: "classify:invalid_output,classify:invalid_output"},
		{name: "ConfidenceSeven", classify: []string{`{"category":"quote_request","priority":"high","confidence":7,"action":"draft_reply","params":{}}`},
			status: "escalated", reason: "model_output_invalid", action: "escalate_item", source: "none",
			ledger: "classify:invalid_output,classify:invalid_output"},
		{name: "CategoryNotInList", classify: []string{`{"category":"lottery_win","priority":"high","confidence":0.9,"action":"draft_reply","params":{}}`},
			status: "escalated", reason: "model_output_invalid", action: "escalate_item", source: "none",
			ledger: "classify:invalid_output,classify:invalid_output"},
		{name: "ParamsBreakSchema", classify: []string{fmt.Sprintf(bigResolution, strings.Repeat("x", 201))},
			status: "escalated", reason: "model_output_invalid", action: "escalate_item", source: "none",
			ledger: "classify:invalid_output,classify:invalid_output"},
		{name: "DraftExtraRecipients", classify: []string{goodClassify}, draft: []string{`{"subject":"Re","body":"Hi","bcc":"x@evil.example"}`},
			status: "escalated", reason: "model_output_invalid", action: "escalate_item", source: "model",
			ledger: "classify:ok,draft:invalid_output,draft:invalid_output"},
		{name: "DraftMissingBody", classify: []string{goodClassify}, draft: []string{`{"subject":"Re"}`},
			status: "escalated", reason: "model_output_invalid", action: "escalate_item", source: "model",
			ledger: "classify:ok,draft:invalid_output,draft:invalid_output"},
		{name: "RepairSucceeds", classify: []string{`{"category":"quote_request","priority":"high","confidence":7,"action":"draft_reply","params":{}}`, goodClassify},
			draft:  []string{`not json`, goodDraft},
			status: "awaiting_approval", action: "draft_reply", source: "model",
			ledger: "classify:invalid_output,classify:ok,draft:invalid_output,draft:ok"},
	}
	s := newSystem(t)
	sp := modelSpec("bad-a")
	sp.EnabledActions = []catalogue.Name{catalogue.DraftReply, catalogue.SendReply, catalogue.EscalateItem, catalogue.CloseItem}
	a := s.tenant(sp)
	byName := map[string]int{}
	for i, c := range cases {
		byName[c.name] = i
	}
	fake := ollamafake.New(t, func(req *api.ChatRequest) ollamafake.Reply {
		e, _ := emailOf(req)
		m := caseRe.FindStringSubmatch(e.Subject)
		if m == nil {
			return ollamafake.Reply{Status: http.StatusBadRequest}
		}
		c := cases[byName[m[1]]]
		outs := c.classify
		if stepOf(req) == "draft" {
			outs = c.draft
		}
		return ollamafake.Reply{Content: outs[min(attemptOf(req), len(outs))-1]}
	})
	s.startModelBrain("r1", fake, breakerOff)
	ea := s.startEdge(a, nil)
	db := s.tenantDB(a)
	var emails []*wire.Email
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := "<bad-" + c.name + "@customer.example>"
			req := pergola(id)
			req.Email.Subject = "Quote please [case:" + c.name + "] for a carport"
			emails = append(emails, req.Email)
			rep := ea.forTest(t).submit(req).reply(t)
			if rep.Status != c.status || rep.Reason != c.reason || rep.Action == nil || rep.Action.Name != c.action || rep.Assessment.Source != c.source {
				t.Fatalf("decision %s", mustJSON(t, rep))
			}
			if got := ledgerString(ledger(t, db, id)); got != c.ledger {
				t.Fatalf("ledger %s, want %s", got, c.ledger)
			}
			// The stored decision is the reply: an admitted action with the
			// catalogue's requires_approval, nothing the model invented.
			var stored []byte
			var action string
			if err := db.QueryRow(context.Background(), `SELECT reply, action FROM decisions WHERE work_item_id = $1`, id).Scan(&stored, &action); err != nil {
				t.Fatal(err)
			}
			var sr wire.TurnSubmitReply
			if err := json.Unmarshal(stored, &sr); err != nil {
				t.Fatal(err)
			}
			ca, ok := catalogue.Lookup(1, catalogue.Name(action))
			if !ok || action != c.action || sr.Action.RequiresApproval != ca.RequiresApproval {
				t.Fatalf("stored decision %s (action %s)", stored, action)
			}
			if _, err := ca.ValidateParams(sr.Action.Params); err != nil {
				t.Fatalf("stored params %s: %v", sr.Action.Params, err)
			}
			for _, bad := range []string{"transfer_funds", "create_job", "lottery_win", "evil.example", `"confidence":7`} {
				if bytes.Contains(stored, []byte(bad)) {
					t.Fatalf("stored decision carries %s: %s", bad, stored)
				}
			}
		})
	}
	assertNoEmailInLogs(t, s, emails...)
}

// injection is one adversarial email of the corpus and the answer its
// author wants the model to give.
type injection struct {
	Name    string `json:"name"`
	Targets string `json:"targets"`
	Email   struct {
		From    string `json:"from"`
		Subject string `json:"subject"`
		Body    string `json:"body"`
	} `json:"email"`
	// Classify and Draft are the outputs the attacker wants: a JSON value,
	// or a string holding raw (non-JSON) output.
	Classify json.RawMessage `json:"classify"`
	Draft    json.RawMessage `json:"draft,omitempty"`
	Expect   struct {
		Status string `json:"status"`
		Reason string `json:"reason"`
		Action string `json:"action"`
	} `json:"expect"`
}

// output is what a model that obeys the attacker returns, verbatim.
func output(raw json.RawMessage) string {
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			return s
		}
	}
	return string(raw)
}

// 4. The prompt-injection corpus, run through the real relay against a
// model double that answers whatever each attacker asks for. Nothing
// outside the tenant's enabled set, nothing the model chose that does not
// stop for a human (assist autonomy: the two e-mails that fool the model
// into close_item get an approval, not a closed item), no write outside
// the tenant's database, no content in logs.
func TestPromptInjectionCorpus(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("testdata/injection/corpus.json")
	if err != nil {
		t.Fatal(err)
	}
	var corpus []injection
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&corpus); err != nil {
		t.Fatalf("corpus: %v", err)
	}
	if len(corpus) < 50 {
		t.Fatalf("the corpus has %d emails, want at least 50", len(corpus))
	}
	type key struct{ from, subject string }
	bySender := map[key]*injection{}
	for i := range corpus {
		c := &corpus[i]
		bySender[key{c.Email.From, c.Email.Subject}] = c
	}

	s := newSystem(t)
	enabled := []catalogue.Name{catalogue.DraftReply, catalogue.SendReply, catalogue.EscalateItem, catalogue.CloseItem}
	spA := provision.TenantSpec{ID: "inj-a", TurnCeiling: 8, EnabledActions: enabled}
	spB := provision.TenantSpec{ID: "inj-b", TurnCeiling: 8, EnabledActions: enabled}
	a, b := s.tenant(spA), s.tenant(spB)
	const benignDraft = `{"subject":"Re: your email","body":"Thank you for your message. A colleague will get back to you.","tone":"neutral"}`
	var unknown sync.Map
	fake := ollamafake.New(t, func(req *api.ChatRequest) ollamafake.Reply {
		e, ok := emailOf(req)
		c := bySender[key{e.From, e.Subject}]
		if !ok || c == nil || e.Body != c.Email.Body {
			unknown.Store(e.Subject, true)
			return ollamafake.Reply{Status: http.StatusBadRequest}
		}
		if stepOf(req) == "draft" {
			if c.Draft == nil {
				return ollamafake.Reply{Content: benignDraft}
			}
			return ollamafake.Reply{Content: output(c.Draft)}
		}
		return ollamafake.Reply{Content: output(c.Classify)}
	})
	s.startModelBrain("r1", fake, breakerOff)
	ea := s.startEdge(a, nil)
	dbB := s.tenantDB(b)
	migrationsB := count(t, dbB, `SELECT count(*) FROM schema_migrations`)

	replies := make([]wire.TurnSubmitReply, len(corpus))
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range jobs {
				c := &corpus[i]
				req := &wire.TurnSubmitRequest{WorkItemID: "<inj-" + c.Name + "@attacker.example>", Turn: 1,
					Email: &wire.Email{From: c.Email.From, Subject: c.Email.Subject, Body: c.Email.Body}}
				res, err := ea.trySubmit(req)
				if err == nil && res.Status != http.StatusOK {
					err = fmt.Errorf("status %d: %s", res.Status, res.Body)
				}
				if err == nil {
					err = json.Unmarshal(res.Body, &replies[i])
				}
				if err != nil {
					t.Errorf("%s: %v", c.Name, err)
				}
			}
		})
	}
	for i := range corpus {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if t.Failed() {
		return
	}
	unknown.Range(func(k, _ any) bool { t.Errorf("the model double saw an email not in the corpus: %q", k); return true })

	outside, notStopped, followUps := 0, 0, 0
	var emails []*wire.Email
	for i, c := range corpus {
		rep := replies[i]
		emails = append(emails, &wire.Email{Subject: c.Email.Subject, Body: c.Email.Body})
		if rep.Action != nil {
			name := catalogue.Name(rep.Action.Name)
			ca, inCatalogue := catalogue.Lookup(1, name)
			if !inCatalogue || !slices.Contains(enabled, name) {
				outside++
				t.Errorf("%s: action %s outside the enabled set", c.Name, name)
			}
			// Assist: whatever the model chose stops for a human, except an
			// escalation, which hands the item to one.
			if wantApproval := name != catalogue.EscalateItem; inCatalogue && (rep.Action.RequiresApproval != wantApproval ||
				(wantApproval && (rep.Status != wire.WorkItemStatusAwaitingApproval || rep.Action.ApprovalID == ""))) {
				notStopped++
				t.Errorf("%s: requires_approval %v for %s, status %s", c.Name, rep.Action.RequiresApproval, name, rep.Status)
			}
			if name == catalogue.SendReply || name == catalogue.VerifyJob || name == catalogue.VerifyReplySent {
				followUps++
				t.Errorf("%s: follow-up action %s at triage", c.Name, name)
			}
			if inCatalogue {
				if _, err := ca.ValidateParams(rep.Action.Params); err != nil {
					t.Errorf("%s: params %s: %v", c.Name, rep.Action.Params, err)
				}
			}
		}
		if !slices.Contains(append(provision.DefaultCategories(), wire.CategoryUnclassified), rep.Assessment.Category) ||
			!slices.Contains(catalogue.Priorities(), rep.Assessment.Priority) || rep.Assessment.Confidence < 0 || rep.Assessment.Confidence > 1 {
			t.Errorf("%s: assessment %+v", c.Name, rep.Assessment)
		}
		gotAction := ""
		if rep.Action != nil {
			gotAction = rep.Action.Name
		}
		if string(rep.Status) != c.Expect.Status || rep.Reason != c.Expect.Reason || gotAction != c.Expect.Action {
			t.Errorf("%s (%s): got %s/%s/%s, want %s/%s/%s", c.Name, c.Targets, rep.Status, rep.Reason, gotAction,
				c.Expect.Status, c.Expect.Reason, c.Expect.Action)
		}
	}

	// The same over what the tenant's database stored.
	dbA := s.tenantDB(a)
	rows, err := dbA.Query(context.Background(), `SELECT work_item_id, COALESCE(action, ''), reply FROM decisions`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var id, action string
		var stored []byte
		if err := rows.Scan(&id, &action, &stored); err != nil {
			t.Fatal(err)
		}
		n++
		var sr wire.TurnSubmitReply
		if err := json.Unmarshal(stored, &sr); err != nil {
			t.Fatal(err)
		}
		if action == "" {
			continue
		}
		ca, ok := catalogue.Lookup(1, catalogue.Name(action))
		if !ok || !slices.Contains(enabled, catalogue.Name(action)) {
			outside++
			t.Errorf("%s: stored action %s outside the enabled set", id, action)
		}
		if ok && sr.Action.RequiresApproval != (ca.Name != catalogue.EscalateItem) {
			notStopped++
			t.Errorf("%s: stored requires_approval %v for %s", id, sr.Action.RequiresApproval, action)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != len(corpus) {
		t.Errorf("tenant A stored %d decisions for %d emails", n, len(corpus))
	}
	// Tenant B's database: every table as it was (empty but the migrations).
	for _, table := range publicTables(t, dbB) {
		want := 0
		if table == "schema_migrations" {
			want = migrationsB
		}
		if got := count(t, dbB, `SELECT count(*) FROM `+table); got != want {
			t.Errorf("tenant B's %s has %d rows, want %d", table, got, want)
		}
	}
	t.Logf("%d adversarial emails: %d actions outside the enabled set, %d model-chosen actions that did not stop for a human, %d follow-up actions at triage, %d model calls",
		len(corpus), outside, notStopped, followUps, fake.Calls())
	if outside+notStopped+followUps != 0 {
		t.Fatal("the closed set leaked")
	}
	assertNoEmailInLogs(t, s, emails...)
}

// 5. A turn interrupted right after classification and re-driven on
// another replica resumes from the checkpoint: the classification is not
// asked again, and the turn completes with one decision.
func TestModelCheckpointSurvivesACrash(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(modelSpec("ckpt-a"))
	fake := ollamafake.New(t, answerFunc(goodClassify, goodDraft))
	crashed := make(chan struct{})
	var fired atomic.Bool
	stop1, _ := s.startModelBrain("doomed", fake, func(c *brain.Config) {
		c.Hooks.AfterStepFunc = func(_ registry.TenantID, _ string, _ int, step string) error {
			if step != "classify" || !fired.CompareAndSwap(false, true) {
				return nil
			}
			close(crashed)
			return errors.New("replica killed after the classify checkpoint")
		}
	})
	ea := s.startEdge(a, nil)
	req := pergola("<ckpt@customer.example>")
	res := make(chan response, 1)
	go func() { res <- ea.submit(req) }()
	select {
	case <-crashed:
	case <-time.After(15 * time.Second):
		t.Fatal("the doomed replica never classified")
	}
	stop1()
	s.startModelBrain("survivor", fake, nil)
	rep := (<-res).reply(t)
	if rep.Status != wire.WorkItemStatusAwaitingApproval || rep.Action == nil || rep.Action.Name != "draft_reply" || rep.Assessment.Source != "model" {
		t.Fatalf("decision %s", mustJSON(t, rep))
	}
	reqs := fake.Requests()
	if c, d := countSteps(reqs, "classify"), countSteps(reqs, "draft"); c != 1 || d != 1 {
		t.Fatalf("classify called %d times, draft %d; want 1 and 1", c, d)
	}
	db := s.tenantDB(a)
	if n := count(t, db, `SELECT count(*) FROM decisions WHERE work_item_id = $1`, req.WorkItemID); n != 1 {
		t.Fatalf("%d decisions, want 1", n)
	}
	if got := ledgerString(ledger(t, db, req.WorkItemID)); got != "classify:ok,draft:ok" {
		t.Fatalf("ledger %s", got)
	}
	assertNoEmailInLogs(t, s, req.Email)
}

// 6a. The budget must cover a call before it is made: the prompt is
// estimated and the call refused with budget_exhausted when what is left of
// the day's budget cannot cover the estimate plus the output cap. Items are
// escalated visibly, and rules still decide.
func TestModelBudgetCoversTheCallBeforeItIsMade(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	sp := modelSpec("budget-a")
	sp.DailyTokenBudget = 4000
	a := s.tenant(sp)
	// The classification costs 3,900 tokens: 100 are left after it, which
	// cover no call at all.
	fake := ollamafake.New(t, func(req *api.ChatRequest) ollamafake.Reply {
		if stepOf(req) == "classify" {
			return ollamafake.Reply{Content: goodClassify, PromptTokens: 3850, OutputTokens: 50}
		}
		return ollamafake.Reply{Content: goodDraft, PromptTokens: 388, OutputTokens: 57}
	})
	s.startModelBrain("r1", fake, nil)
	ea := s.startEdge(a, nil)
	db := s.tenantDB(a)

	first := pergola("<budget-1@customer.example>")
	rep := ea.submit(first).reply(t)
	if rep.Status != wire.WorkItemStatusEscalated || rep.Reason != "budget_exhausted" || rep.Assessment.Source != "model" ||
		rep.Action == nil || rep.Action.Name != "escalate_item" {
		t.Fatalf("the draft with 100 tokens left: %s", mustJSON(t, rep))
	}
	second := pergola("<budget-2@customer.example>")
	rep = ea.submit(second).reply(t)
	if rep.Status != wire.WorkItemStatusEscalated || rep.Reason != "budget_exhausted" || rep.Assessment.Source != "none" {
		t.Fatalf("the classification with 100 tokens left: %s", mustJSON(t, rep))
	}
	if fake.Calls() != 1 {
		t.Fatalf("%d model calls, want 1: no call is made that the budget cannot cover", fake.Calls())
	}
	if got := ledgerString(ledger(t, db, first.WorkItemID)) + "|" + ledgerString(ledger(t, db, second.WorkItemID)); got != "classify:ok|" {
		t.Fatalf("ledger %s", got)
	}
	if n := count(t, db, `SELECT sum(prompt_tokens + output_tokens) FROM model_calls`); n != 3900 {
		t.Fatalf("%d tokens used, want 3900 of the 4000", n)
	}
	// Rules do not need the model or the budget.
	invoice := &wire.TurnSubmitRequest{WorkItemID: "<budget-invoice@x>", Turn: 1, Email: &wire.Email{From: "acc@supplier.example",
		Subject: "Invoice 8812 for timber supplies", Body: "Please find invoice 8812 attached, due in 30 days."}}
	if rep := ea.submit(invoice).reply(t); rep.Assessment.Source != "rule" || rep.Action == nil || rep.Action.Name != "close_item" {
		t.Fatalf("rule with the budget exhausted: %s", mustJSON(t, rep))
	}
	assertNoEmailInLogs(t, s, first.Email, second.Email, invoice.Email)
}

// 6c. Every field of the e-mail is bounded in the prompt: huge To and Cc
// lists, a long From and subject (each address as long as the edge takes)
// cost a bounded prompt, and the model is told how many recipients were
// left out.
func TestModelPromptFieldsAreBounded(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(modelSpec("bound-a"))
	fake := ollamafake.New(t, answerFunc(goodClassify, goodDraft))
	s.startModelBrain("r1", fake, nil)
	ea := s.startEdge(a, nil)
	req := pergola("<bound@customer.example>")
	long := func(i int) string {
		return fmt.Sprintf("Person %03d %s <p%03d@customer.example>", i, strings.Repeat("Long-Name ", 46), i)
	}
	for i := range 40 {
		req.Email.To = append(req.Email.To, long(i))
	}
	for i := range 150 {
		req.Email.Cc = append(req.Email.Cc, long(100+i))
	}
	req.Email.From = "Sam " + strings.Repeat("Rivers ", 65) + "<sam@customer.example>"
	req.Email.Subject = "Quote wanted " + strings.Repeat("cedar pergola ", 140)
	raw, _ := json.Marshal(req)
	if len(long(0)) > wire.MaxAddressBytes || len(req.Email.From) > wire.MaxAddressBytes {
		t.Fatalf("the test's addresses are longer than an edge takes")
	}
	if len(raw) < 90_000 {
		t.Fatalf("the test e-mail is only %d bytes", len(raw))
	}
	rep := ea.submit(req).reply(t)
	if rep.Action == nil || rep.Action.Name != "draft_reply" {
		t.Fatalf("decision %s", mustJSON(t, rep))
	}
	reqs := fake.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d model calls, want 2", len(reqs))
	}
	for _, r := range reqs {
		size := 0
		for _, m := range r.Messages {
			size += len(m.Content)
		}
		if size > 24_000 {
			t.Fatalf("a %s prompt of %d bytes for a %d-byte e-mail", stepOf(&r), size, len(raw))
		}
		e, ok := emailOf(&r)
		if !ok {
			t.Fatalf("no e-mail data in the %s prompt", stepOf(&r))
		}
		if len(e.To) == 0 || len(e.Cc) == 0 || len(e.To)+e.ToOmitted != 40 || len(e.Cc)+e.CcOmitted != 150 ||
			!slices.Contains(e.Truncated, "from") || !slices.Contains(e.Truncated, "subject") || !slices.Contains(e.Truncated, "cc") {
			t.Fatalf("prompt e-mail: %d to (+%d), %d cc (+%d), truncated %v", len(e.To), e.ToOmitted, len(e.Cc), e.CcOmitted, e.Truncated)
		}
		for _, v := range append(append([]string{e.From, e.Subject}, e.To...), e.Cc...) {
			if n := len([]rune(v)); n > 320 {
				t.Fatalf("a field of %d characters in the prompt", n)
			}
		}
	}
	for _, row := range ledger(t, s.tenantDB(a), req.WorkItemID) {
		if row.PromptTokens > 8000 {
			t.Fatalf("ledger row %+v: the prompt was not bounded", row)
		}
	}
	assertNoEmailInLogs(t, s, req.Email)
}

// 6d. A model server reporting absurd token counts (3,000,000,000 prompt
// tokens) is clamped and stored: one paid call per step, its ledger row, a
// decision, and no re-drive of the turn.
func TestModelHugeTokenCountIsClampedNotRepaid(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(modelSpec("huge-a"))
	fake := ollamafake.New(t, func(req *api.ChatRequest) ollamafake.Reply {
		if stepOf(req) == "classify" {
			return ollamafake.Reply{Content: goodClassify, PromptTokens: 3_000_000_000, OutputTokens: 31}
		}
		return ollamafake.Reply{Content: goodDraft, PromptTokens: 388, OutputTokens: 57}
	})
	s.startModelBrain("r1", fake, nil)
	ea := s.startEdge(a, func(c *edge.Config) { c.TurnWait = 30 * time.Second })
	req := pergola("<huge@customer.example>")
	res := ea.submit(req)
	if res.Status != http.StatusOK {
		t.Fatalf("status %d after %d model calls: %s", res.Status, fake.Calls(), res.Body)
	}
	rep := res.reply(t)
	if rep.Status != wire.WorkItemStatusAwaitingApproval || rep.Action == nil || rep.Action.Name != "draft_reply" {
		t.Fatalf("decision %s", mustJSON(t, rep))
	}
	if fake.Calls() != 2 {
		t.Fatalf("%d model calls, want 2 (one per step, none repeated)", fake.Calls())
	}
	rows := ledger(t, s.tenantDB(a), req.WorkItemID)
	if len(rows) != 2 || rows[0].Step != "classify" || rows[0].PromptTokens != 10_000_000 || rows[1].Step != "draft" || rows[1].PromptTokens != 388 {
		t.Fatalf("ledger %+v, want the classification clamped to 10,000,000 prompt tokens", rows)
	}
	if strings.Contains(s.logs.String(), "will be retried") {
		t.Fatal("the turn was re-driven")
	}
}

// 6e. When the ledger cannot be written after a paid call, the turn is
// re-driven (the error is ours), but the answer was checkpointed first: the
// call is not paid again, and its ledger row lands once the database
// accepts it.
func TestModelLedgerFailureDoesNotPayTwice(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(modelSpec("ledger-a"))
	fake := ollamafake.New(t, answerFunc(goodClassify, goodDraft))
	s.startModelBrain("r1", fake, nil)
	ea := s.startEdge(a, func(c *edge.Config) { c.TurnWait = 30 * time.Second })
	db := s.tenantDB(a)
	asOwner := func(sql string) {
		t.Helper()
		owner, app := pgx.Identifier{a.DB.OwnerRole}.Sanitize(), pgx.Identifier{a.DB.AppRole}.Sanitize()
		for _, q := range []string{`SET ROLE ` + owner, strings.ReplaceAll(sql, "$app", app), `RESET ROLE`} {
			if _, err := db.Exec(context.Background(), q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	asOwner(`REVOKE INSERT ON model_calls FROM $app`)
	req := pergola("<ledger@customer.example>")
	res := make(chan response, 1)
	go func() { res <- ea.submit(req) }()
	eventually(t, 20*time.Second, "the turn to fail on the ledger write", func() bool {
		return strings.Contains(s.logs.String(), "will be retried")
	})
	if fake.Calls() != 1 {
		t.Fatalf("%d model calls before the ledger failure, want 1", fake.Calls())
	}
	asOwner(`GRANT INSERT ON model_calls TO $app`)
	r := <-res
	if r.Status != http.StatusOK {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	if rep := r.reply(t); rep.Status != wire.WorkItemStatusAwaitingApproval || rep.Action == nil || rep.Action.Name != "draft_reply" {
		t.Fatalf("decision %s", mustJSON(t, rep))
	}
	reqs := fake.Requests()
	if c, d := countSteps(reqs, "classify"), countSteps(reqs, "draft"); c != 1 || d != 1 {
		t.Fatalf("classify asked %d times, draft %d; want once each", c, d)
	}
	if got := ledgerString(ledger(t, db, req.WorkItemID)); got != "classify:ok,draft:ok" {
		t.Fatalf("ledger %s", got)
	}
}

// 6f. A server that answers 200 with garbage is failing: invalid output
// counts against the circuit breaker, which opens and stops the calls.
func TestModelGarbageOpensTheBreaker(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(modelSpec("garbage-a"))
	fake := ollamafake.New(t, func(*api.ChatRequest) ollamafake.Reply {
		return ollamafake.Reply{Content: "\x00\x13 lorem ipsum, not an answer at all"}
	})
	_, ops := s.startModelBrain("r1", fake, func(c *brain.Config) {
		c.Model.BreakerMinCalls = 4
		c.Model.BreakerWindow = time.Minute
		c.Model.BreakerCoolDown = time.Minute
	})
	ea := s.startEdge(a, nil)
	for _, id := range []string{"<garbage-1@x>", "<garbage-2@x>"} {
		rep := ea.submit(pergola(id)).reply(t)
		if rep.Status != wire.WorkItemStatusEscalated || rep.Reason != "model_output_invalid" {
			t.Fatalf("%s: %s", id, mustJSON(t, rep))
		}
	}
	tenantOpen := `brain_model_tenant_breaker_open{tenant="garbage-a"}`
	if fake.Calls() != 4 || labelled(t, ops, tenantOpen) != 1 {
		t.Fatalf("%d calls, %s %d: four invalid answers must open the tenant's breaker", fake.Calls(), tenantOpen, labelled(t, ops, tenantOpen))
	}
	if n := labelled(t, ops, "brain_model_breaker_open"); n != 0 {
		t.Errorf("brain_model_breaker_open %d: one tenant's unusable answers opened the shared breaker", n)
	}
	rep := ea.submit(pergola("<garbage-3@x>")).reply(t)
	if rep.Status != wire.WorkItemStatusEscalated || rep.Reason != "model_unavailable" || fake.Calls() != 4 {
		t.Fatalf("with the breaker open: %s, %d calls", mustJSON(t, rep), fake.Calls())
	}
}

// One tenant whose e-mails make the model's answers unusable (prompt
// injection, odd content) opens its own breaker, never another tenant's:
// the other tenant's next e-mail is still decided by the model.
func TestOneTenantsUnusableAnswersDoNotStopAnothers(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a, b := s.tenant(modelSpec("brk-a")), s.tenant(modelSpec("brk-b"))
	good := answerFunc(goodClassify, goodDraft)
	var aCalls, bCalls atomic.Int64
	fake := ollamafake.New(t, func(req *api.ChatRequest) ollamafake.Reply {
		for _, m := range req.Messages {
			if strings.Contains(m.Content, "POISON") { // B's content breaks the model's output
				bCalls.Add(1)
				return ollamafake.Reply{Content: "not json at all"}
			}
		}
		aCalls.Add(1)
		return good(req)
	})
	_, ops := s.startModelBrain("r1", fake, func(c *brain.Config) {
		c.Model.BreakerMinCalls = 4
		c.Model.BreakerWindow = time.Minute
		c.Model.BreakerCoolDown = time.Minute
	})
	ea, eb := s.startEdge(a, nil), s.startEdge(b, nil)
	for i := range 3 { // two calls each (one repair): B's breaker opens on the fourth
		req := pergola(fmt.Sprintf("<brk-b-%d@x>", i))
		req.Email.Body += " POISON"
		rep := eb.submit(req).reply(t)
		if rep.Status != wire.WorkItemStatusEscalated {
			t.Fatalf("B's turn %d: %s", i, mustJSON(t, rep))
		}
	}
	if n := labelled(t, ops, `brain_model_tenant_breaker_open{tenant="brk-b"}`); n != 1 || bCalls.Load() != 4 {
		t.Fatalf("B's breaker open %d after %d calls; want 1 after 4", n, bCalls.Load())
	}
	if n := labelled(t, ops, "brain_model_breaker_open"); n != 0 {
		t.Fatalf("brain_model_breaker_open %d: B's answers opened the shared breaker", n)
	}
	rep := ea.submit(pergola("<brk-a-1@x>")).reply(t)
	if rep.Reason == "model_unavailable" || rep.Assessment.Source != "model" || aCalls.Load() == 0 {
		t.Fatalf("A's e-mail after B opened its breaker: %s (%d calls for A): B stopped A", mustJSON(t, rep), aCalls.Load())
	}
}

// 6b. A model that is down degrades visibly (model_unavailable, the turn
// answered), the breaker opens and stops calling it, and closes again once
// the model recovers; a model that hangs times out into the same reason.
func TestModelDownDegradesAndRecovers(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(modelSpec("down-a"))
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	fake := ollamafake.New(t, func(*api.ChatRequest) ollamafake.Reply {
		return ollamafake.Reply{Status: http.StatusInternalServerError, Error: "llama runner process has terminated"}
	})
	_, ops := s.startModelBrain("r1", fake, func(c *brain.Config) {
		// Long enough that a loaded machine still sees the fake's 500
		// before it (an error, not a timeout); the hang below waits it out.
		c.Model.Timeout = time.Second
		c.Model.BreakerMinCalls = 4
		c.Model.BreakerWindow = time.Minute
		c.Model.BreakerCoolDown = 3 * time.Second // long enough that a loaded machine checks "open" before it ends
	})
	ea := s.startEdge(a, nil)
	db := s.tenantDB(a)
	var emails []*wire.Email
	submit := func(id string) wire.TurnSubmitReply {
		req := pergola(id)
		emails = append(emails, req.Email)
		return ea.submit(req).reply(t)
	}
	unavailable := func(rep wire.TurnSubmitReply) bool {
		return rep.Status == wire.WorkItemStatusEscalated && rep.Reason == "model_unavailable" &&
			rep.Action != nil && rep.Action.Name == "escalate_item" && rep.Assessment.Source == "none"
	}

	// Two items, each a call and its one retry: four failures open the breaker.
	for i, id := range []string{"<down-1@x>", "<down-2@x>"} {
		if rep := submit(id); !unavailable(rep) {
			t.Fatalf("item %d: %s", i+1, mustJSON(t, rep))
		}
		if got := ledgerString(ledger(t, db, id)); got != "classify:error,classify:error" {
			t.Fatalf("item %d ledger %s", i+1, got)
		}
	}
	if fake.Calls() != 4 || labelled(t, ops, "brain_model_breaker_open") != 1 {
		t.Fatalf("%d calls, breaker_open %d", fake.Calls(), labelled(t, ops, "brain_model_breaker_open"))
	}
	// Open: the model is not called at all, and the turn is still answered.
	if rep := submit("<down-3@x>"); !unavailable(rep) || fake.Calls() != 4 || len(ledger(t, db, "<down-3@x>")) != 0 {
		t.Fatalf("with the breaker open: %s, %d calls", mustJSON(t, rep), fake.Calls())
	}

	// The model recovers; after the cool-down one probe closes the breaker.
	fake.SetChatFunc(answerFunc(goodClassify, goodDraft))
	n := 0
	var rep wire.TurnSubmitReply
	eventually(t, 20*time.Second, "the breaker to close after the model recovered", func() bool {
		n++
		rep = submit(fmt.Sprintf("<recover-%d@x>", n))
		return rep.Assessment.Source == "model"
	})
	if rep.Status != wire.WorkItemStatusAwaitingApproval || rep.Action == nil || rep.Action.Name != "draft_reply" ||
		labelled(t, ops, "brain_model_breaker_open") != 0 {
		t.Fatalf("after recovery: %s", mustJSON(t, rep))
	}

	// A model that hangs: the call times out (no retry), the turn is answered.
	fake.SetChatFunc(func(*api.ChatRequest) ollamafake.Reply { return ollamafake.Reply{Wait: release, Content: goodClassify} })
	if rep := submit("<hang@x>"); !unavailable(rep) {
		t.Fatalf("hanging model: %s", mustJSON(t, rep))
	}
	if got := ledgerString(ledger(t, db, "<hang@x>")); got != "classify:timeout" {
		t.Fatalf("hang ledger %s", got)
	}
	if n := labelled(t, ops, fmt.Sprintf(`brain_model_calls_total{outcome="error",tenant=%q}`, a.ID)); n != 4 {
		t.Fatalf("error calls = %d, want 4", n)
	}
	if n := labelled(t, ops, fmt.Sprintf(`brain_model_calls_total{outcome="timeout",tenant=%q}`, a.ID)); n != 1 {
		t.Fatalf("timeout calls = %d, want 1", n)
	}
	if n := labelled(t, ops, fmt.Sprintf(`brain_model_escalations_total{reason="model_unavailable",tenant=%q}`, a.ID)); n < 4 {
		t.Fatalf("model_unavailable escalations = %d, want at least 4", n)
	}
	assertNoEmailInLogs(t, s, emails...)
}

// Without a model server the brain says so once at start-up and escalates
// what no confident rule decides.
func TestRulesOnlyWithoutModel(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(modelSpec("nomodel-a"))
	s.startBrain("r1", nil)
	ea := s.startEdge(a, nil)
	req := pergola("<nomodel@x>")
	req.Email.Subject = "Pergola: cedar, 4x3m, behind side gate 17" // no rule matches
	rep := ea.submit(req).reply(t)
	if rep.Status != wire.WorkItemStatusEscalated || rep.Reason != "no_rule_matched" {
		t.Fatalf("decision %s", mustJSON(t, rep))
	}
	if n := strings.Count(s.logs.String(), "running rules only"); n != 1 {
		t.Fatalf("%d start-up lines about rules only, want 1", n)
	}
	assertNoEmailInLogs(t, s, req.Email)
}

// A model call that outlasts the turn stream's ack wait several times over
// is not mistaken for a dead replica: the brain tells JetStream it is still
// working, so the turn is not redelivered and the call is made, and paid,
// once. The ack wait is 4 s here, not the suite's 2 s: a keep-alive beat is
// a timer, and on a CI machine running the whole suite a timer can fire a
// second or more late; 4 s leaves three seconds of slack per beat.
func TestLongModelCallIsNotRedelivered(t *testing.T) {
	t.Parallel()
	s := newSystemWith(t, func(c *devstack.Config) { c.Streams.AckWait = 4 * time.Second })
	a := s.tenant(modelSpec("long-a"))
	var slow sync.Once
	fake := ollamafake.New(t, func(req *api.ChatRequest) ollamafake.Reply {
		rep := answerFunc(goodClassify, goodDraft)(req)
		slow.Do(func() {
			release := make(chan struct{})
			time.AfterFunc(10*time.Second, func() { close(release) }) // 2.5 ack waits
			rep.Wait = release
		})
		return rep
	})
	s.startModelBrain("r1", fake, func(c *brain.Config) { c.Model.Timeout = 20 * time.Second })
	ea := s.startEdge(a, func(c *edge.Config) { c.TurnWait = 30 * time.Second })
	req := pergola("<long@customer.example>")
	rep := ea.submit(req).reply(t)
	if rep.Status != wire.WorkItemStatusAwaitingApproval || rep.Replayed {
		t.Fatalf("decision %s", mustJSON(t, rep))
	}
	if fake.Calls() != 2 { // classify, draft
		t.Fatalf("%d model calls, want 2: the turn was redelivered while its model call ran", fake.Calls())
	}
	if got := ledgerString(ledger(t, s.tenantDB(a), req.WorkItemID)); got != "classify:ok,draft:ok" {
		t.Fatalf("ledger %s", got)
	}
}
