package engine

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"n8nbrain/catalogue"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

func tenant(enabled ...catalogue.Name) *registry.Tenant {
	return &registry.Tenant{ID: "t", CatalogueVersion: 1, EnabledActions: enabled, Categories: []string{"quote_request", "general"}}
}

// TestMatchRule: the engine triages with registry.FirstMatch (tested in
// registry), and no e-mail means no match.
func TestMatchRule(t *testing.T) {
	t.Parallel()
	rules := []registry.Rule{{Name: "domain", Match: registry.Match{SenderDomains: []string{"acme.example"}}}}
	if got := matchRule(rules, &wire.Email{From: "Jo <jo@acme.example>"}); got == nil || got.Name != "domain" {
		t.Fatalf("matched %v, want domain", got)
	}
	if got := matchRule(rules, nil); got != nil {
		t.Fatalf("no e-mail matched %v", got)
	}
}

func TestAdmitIsTheGate(t *testing.T) {
	t.Parallel()
	tn := tenant(catalogue.DraftReply, catalogue.EscalateItem)
	good := json.RawMessage(`{"subject":"s","body":"b"}`)
	if p, err := Admit(tn, 1, catalogue.DraftReply, good); err != nil || !p.Action.RequiresApproval {
		t.Fatalf("enabled action: %+v %v", p, err)
	}
	for name, tc := range map[string]struct {
		action catalogue.Name
		params string
		v      catalogue.Version
	}{
		"NotEnabled":     {catalogue.SendReply, `{}`, 1},
		"NotInCatalogue": {"transfer_funds", `{}`, 1},
		"NoSuchVersion":  {catalogue.DraftReply, `{"subject":"s","body":"b"}`, 99},
		"BadParams":      {catalogue.DraftReply, `{"subject":"s","body":"b","bcc":"x"}`, 1},
	} {
		if _, err := Admit(tn, tc.v, tc.action, json.RawMessage(tc.params)); err == nil {
			t.Errorf("%s: admitted", name)
		}
	}
}

// A model stage that returns whatever it is told to.
type stageFunc func() (Outcome, error)

func (f stageFunc) Triage(context.Context, *Input, Runtime) (Outcome, error) { return f() }

func TestGuardReadmitsModelProposals(t *testing.T) {
	t.Parallel()
	tn := tenant(catalogue.DraftReply, catalogue.EscalateItem)
	send, _ := catalogue.Lookup(1, catalogue.SendReply)
	draft, _ := catalogue.Lookup(1, catalogue.DraftReply)
	tests := []struct {
		name       string
		out        Outcome
		wantAction catalogue.Name
		wantStatus wire.WorkItemStatus
	}{
		{"NotEnabled", Outcome{Action: &Proposal{Action: send, Params: json.RawMessage(`{}`)}}, catalogue.EscalateItem, wire.WorkItemStatusEscalated},
		{"ApprovalFromCatalogue", Outcome{Status: wire.WorkItemStatusOpen, Action: &Proposal{Action: catalogue.Action{Name: catalogue.DraftReply}, Params: json.RawMessage(`{"subject":"s","body":"b"}`)}}, catalogue.DraftReply, wire.WorkItemStatusAwaitingApproval},
		{"BadParams", Outcome{Action: &Proposal{Action: draft, Params: json.RawMessage(`{"subject":"s"}`)}}, catalogue.EscalateItem, wire.WorkItemStatusEscalated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := New(stageFunc(func() (Outcome, error) { return tt.out, nil }))
			in := &Input{Tenant: tn, Item: Item{New: true, CatalogueVersion: 1, Email: &wire.Email{From: "a@b"}}, Request: &wire.TurnSubmitRequest{}}
			got, err := e.Decide(context.Background(), in, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.Action == nil || got.Action.Action.Name != tt.wantAction || got.Status != tt.wantStatus {
				t.Fatalf("got %+v", got)
			}
			if got.Action.RequiresApproval != (tt.wantAction == catalogue.DraftReply) {
				t.Fatal("requires_approval: the catalogue's for a draft, none for an escalation")
			}
		})
	}
}

// Under assist, every action a model stage proposes stops for a human at
// the gate, whatever the stage claimed about it; escalate_item hands the
// item to a human already. Rules act as the catalogue says.
func TestGuardAppliesAssistAutonomy(t *testing.T) {
	t.Parallel()
	tn := tenant(catalogue.DraftReply, catalogue.CreateJob, catalogue.EscalateItem, catalogue.CloseItem)
	tn.Autonomy = registry.AutonomyAssist
	job := `{"description":"d","external_ref":"r","title":"t"}`
	for _, tt := range []struct {
		action catalogue.Name
		params string
		status wire.WorkItemStatus
		needs  bool
	}{
		{catalogue.DraftReply, `{"body":"b","subject":"s"}`, wire.WorkItemStatusAwaitingApproval, true},
		{catalogue.CreateJob, job, wire.WorkItemStatusAwaitingApproval, true},
		{catalogue.CloseItem, `{"resolution":"spam"}`, wire.WorkItemStatusAwaitingApproval, true},
		{catalogue.EscalateItem, `{"reason":"unsure"}`, wire.WorkItemStatusEscalated, false},
	} {
		t.Run(string(tt.action), func(t *testing.T) {
			t.Parallel()
			a, _ := catalogue.Lookup(1, tt.action)
			// The stage claims no approval and an outcome of its own.
			claimed := Proposal{Action: a, Params: json.RawMessage(tt.params), RequiresApproval: false}
			claimed.Action.RequiresApproval = false
			status := wire.WorkItemStatusClosed
			if tt.action == catalogue.EscalateItem {
				status = wire.WorkItemStatusEscalated
			}
			e := New(stageFunc(func() (Outcome, error) {
				return Outcome{Action: &claimed, Status: status, NeedsHuman: tt.action == catalogue.EscalateItem, ActionState: ActionStateSent}, nil
			}))
			in := &Input{Tenant: tn, Item: Item{New: true, CatalogueVersion: 1, Email: &wire.Email{From: "a@b"}}, Request: &wire.TurnSubmitRequest{}}
			got, err := e.Decide(context.Background(), in, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.Action == nil || got.Action.Action.Name != tt.action || got.Action.RequiresApproval != tt.needs || got.Status != tt.status {
				t.Fatalf("got %+v (action %+v)", got, got.Action)
			}
			if tt.needs && (got.ActionState != ActionStatePending || got.NeedsHuman) {
				t.Fatalf("awaiting approval with state %s, needs_human %v", got.ActionState, got.NeedsHuman)
			}
		})
	}
	// A rule's close_item acts alone, as the catalogue says.
	tn.Rules = []registry.Rule{{Name: "invoices", Match: registry.Match{SubjectKeywords: []string{"invoice"}}, Category: "general",
		Priority: "low", Action: catalogue.CloseItem, Params: json.RawMessage(`{"resolution":"accounts"}`), Confidence: 0.9}}
	in := &Input{Tenant: tn, Item: Item{New: true, CatalogueVersion: 1, Email: &wire.Email{From: "a@b", Subject: "Invoice 12"}}, Request: &wire.TurnSubmitRequest{}}
	got, err := New(stageFunc(func() (Outcome, error) { t.Fatal("the model stage ran"); return Outcome{}, nil })).Decide(context.Background(), in, nil)
	if err != nil || got.Action == nil || got.Action.RequiresApproval || got.Status != wire.WorkItemStatusClosed {
		t.Fatalf("rule: %+v %v", got, err)
	}
}

// After a human approved an action other than a draft, the next turn
// carries out exactly the approved parameters (the edited ones when
// edited), without asking again; content that does not match the approved
// hash is never carried out.
func TestAfterApprovalCarriesOutTheApprovedAction(t *testing.T) {
	t.Parallel()
	tn := tenant(catalogue.CreateJob, catalogue.EscalateItem, catalogue.CloseItem)
	edited := json.RawMessage(`{"description":"d2","external_ref":"r","title":"t2"}`)
	for _, tt := range []struct {
		name     string
		last     catalogue.Name
		approved json.RawMessage
		hash     string
		action   catalogue.Name
		status   wire.WorkItemStatus
	}{
		{"CloseItem", catalogue.CloseItem, json.RawMessage(`{"resolution":"spam"}`), "", catalogue.CloseItem, wire.WorkItemStatusClosed},
		{"EditedJob", catalogue.CreateJob, edited, "", catalogue.CreateJob, wire.WorkItemStatusOpen},
		{"TamperedContent", catalogue.CloseItem, json.RawMessage(`{"resolution":"spam"}`), string(make64('d')), catalogue.EscalateItem, wire.WorkItemStatusEscalated},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			hash := tt.hash
			if hash == "" {
				hash = wire.ContentSHA256(tt.approved)
			}
			in := &Input{Tenant: tn, Request: &wire.TurnSubmitRequest{}, Item: Item{CatalogueVersion: 1, Status: wire.WorkItemStatusAwaitingApproval,
				LastAction: tt.last, LastActionParams: json.RawMessage(`{"resolution":"what the model proposed"}`), ApprovalMode: registry.ApprovalModeReviewApp,
				Approval: &Approval{ID: "0b6f1a9e-5f1c-4d0e-9a59-3f8f5c1d2e3a", Status: ApprovalStatusApproved, ApprovedSHA256: hash, Approved: tt.approved, ProposedAt: time.Now()}}}
			out, err := New(nil).Decide(context.Background(), in, nil)
			if err != nil || out.Action == nil || out.Action.Action.Name != tt.action || out.Status != tt.status || out.Action.RequiresApproval {
				t.Fatalf("got %+v %v", out, err)
			}
			if tt.action == tt.last && string(out.Action.Params) != string(tt.approved) {
				t.Fatalf("carries out %s, the human approved %s", out.Action.Params, tt.approved)
			}
		})
	}
}

func TestRulesOnlyEscalates(t *testing.T) {
	t.Parallel()
	in := &Input{Tenant: tenant(catalogue.EscalateItem), Item: Item{New: true, CatalogueVersion: 1, Email: &wire.Email{From: "a@b"}}, Request: &wire.TurnSubmitRequest{}}
	out, err := New(nil).Decide(context.Background(), in, nil)
	if err != nil || out.Reason != ReasonNoRuleMatched || !out.NeedsHuman || out.Action == nil || out.Action.Action.Name != catalogue.EscalateItem {
		t.Fatalf("got %+v %v", out, err)
	}
	in.Tenant = tenant() // escalate_item not enabled: flagged, no action
	out, _ = New(nil).Decide(context.Background(), in, nil)
	if out.Action != nil || out.Status != wire.WorkItemStatusEscalated || !out.NeedsHuman {
		t.Fatalf("got %+v", out)
	}
}

func TestOutcomes(t *testing.T) {
	t.Parallel()
	all := tenant(catalogue.DraftReply, catalogue.SendReply, catalogue.CreateJob, catalogue.EscalateItem, catalogue.VerifyReplySent, catalogue.VerifyJob)
	sendParams := json.RawMessage(`{"abort_if_replied_since":"2026-01-01T00:00:00Z","approval_id":"0b6f1a9e-5f1c-4d0e-9a59-3f8f5c1d2e3a","content_sha256":"` + string(make64('a')) + `"}`)
	item := func(last catalogue.Name, params json.RawMessage) Item {
		return Item{CatalogueVersion: 1, Status: wire.WorkItemStatusOpen, LastAction: last, LastActionParams: params, ApprovalMode: registry.ApprovalModeReviewApp}
	}
	tests := []struct {
		name       string
		item       Item
		lr         *wire.LatestResult
		wantStatus wire.WorkItemStatus
		wantAction catalogue.Name
		wantState  ActionState
	}{
		{"SendSucceeded", item(catalogue.SendReply, sendParams), &wire.LatestResult{Action: "send_reply", Outcome: wire.OutcomeSucceeded}, wire.WorkItemStatusClosed, "", ActionStateSucceeded},
		{"SendUnknownVerifies", item(catalogue.SendReply, sendParams), &wire.LatestResult{Action: "send_reply", Outcome: wire.OutcomeUnknown}, wire.WorkItemStatusOpen, catalogue.VerifyReplySent, ActionStateVerifying},
		{"JobUnknownVerifies", item(catalogue.CreateJob, json.RawMessage(`{"description":"d","external_ref":"r","title":"t"}`)), &wire.LatestResult{Action: "create_job", Outcome: wire.OutcomeUnknown}, wire.WorkItemStatusOpen, catalogue.VerifyJob, ActionStateVerifying},
		{"Failed", item(catalogue.SendReply, sendParams), &wire.LatestResult{Action: "send_reply", Outcome: wire.OutcomeFailed}, wire.WorkItemStatusEscalated, catalogue.EscalateItem, ActionStateSent},
		{"ClosedManual", item(catalogue.SendReply, sendParams), &wire.LatestResult{Action: "send_reply", Outcome: wire.OutcomeClosedManual, HumanAction: &wire.HumanAction{Kind: "replied"}}, wire.WorkItemStatusClosedManual, "", ActionStateSucceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := &Input{Tenant: all, Item: tt.item, Turn: 3, Request: &wire.TurnSubmitRequest{LatestResult: tt.lr}}
			out, err := New(nil).Decide(context.Background(), in, nil)
			if err != nil {
				t.Fatal(err)
			}
			name := catalogue.Name("")
			if out.Action != nil {
				name = out.Action.Action.Name
			}
			if out.Status != tt.wantStatus || name != tt.wantAction || out.ActionState != tt.wantState {
				t.Fatalf("got status %s action %q state %s", out.Status, name, out.ActionState)
			}
		})
	}
	in := &Input{Tenant: all, Item: item(catalogue.SendReply, sendParams), Request: &wire.TurnSubmitRequest{LatestResult: &wire.LatestResult{Action: "create_job", Outcome: wire.OutcomeSucceeded}}}
	var iie *InvalidInputError
	if _, err := New(nil).Decide(context.Background(), in, nil); !errors.As(err, &iie) || iie.Field != "latest_result.action" {
		t.Fatalf("a result for another action: %v", err)
	}
}

func TestAfterApprovalSendsOnlyTheApprovedHash(t *testing.T) {
	t.Parallel()
	all := tenant(catalogue.DraftReply, catalogue.SendReply, catalogue.EscalateItem)
	hash := string(make64('c'))
	in := &Input{Tenant: all, Request: &wire.TurnSubmitRequest{}, Item: Item{CatalogueVersion: 1, Status: wire.WorkItemStatusAwaitingApproval,
		LastAction: catalogue.DraftReply, ApprovalMode: registry.ApprovalModeReviewApp,
		Approval: &Approval{ID: "0b6f1a9e-5f1c-4d0e-9a59-3f8f5c1d2e3a", Status: ApprovalStatusApproved, ApprovedSHA256: hash, ProposedAt: time.Now()}}}
	out, _ := New(nil).Decide(context.Background(), in, nil)
	var p map[string]string
	if out.Action == nil || out.Action.Action.Name != catalogue.SendReply || json.Unmarshal(out.Action.Params, &p) != nil || p["content_sha256"] != hash {
		t.Fatalf("got %+v", out)
	}
	for status, reason := range map[ApprovalStatus]string{ApprovalStatusRejected: ReasonApprovalRejected, ApprovalStatusExpired: ReasonApprovalExpired} {
		in.Item.Approval.Status = status
		if out, _ := New(nil).Decide(context.Background(), in, nil); out.Reason != reason || out.Status != wire.WorkItemStatusEscalated {
			t.Fatalf("%s: %+v", status, out)
		}
	}
	in.Item.Approval.Status = ApprovalStatusPending
	if out, _ := New(nil).Decide(context.Background(), in, nil); out.Action != nil || out.Status != wire.WorkItemStatusAwaitingApproval {
		t.Fatalf("pending: %+v", out)
	}
}

func make64(c byte) []byte {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return b
}

// passingScores: a report's gate section that passes the default
// thresholds for close_item on invoices.
func passingScores() registry.EvalScores {
	return registry.EvalScores{Items: 40, ModelAnswers: 40, ValidFirst: 40, ValidOutputRate: 1,
		Categories: map[string]registry.CategoryScore{"invoice": {Items: 25, Predicted: 25, Correct: 25, Recall: 1, Precision: 1}},
		Decisions:  []registry.DecisionScore{{Category: "invoice", Action: catalogue.CloseItem, Decided: 20, Correct: 20, Precision: 1}}}
}

// Under auto, the gate lets the model's action go without a human only
// for a granted (action, category) whose report is of the tenant's
// configuration as it is at this decision; anything else stops as under
// assist, and the outcome says which autonomy applied.
func TestGuardAppliesAutoAutonomyOnlyWhereGrantedAndCurrent(t *testing.T) {
	t.Parallel()
	granted := func(mutate func(*registry.Tenant)) *registry.Tenant {
		tn := tenant(catalogue.DraftReply, catalogue.EscalateItem, catalogue.CloseItem)
		tn.Categories = []string{"invoice", "general"}
		tn.ModelName = "qwen3:4b"
		tn.Autonomy = registry.AutonomyAuto
		tn.Grants = []registry.AutonomyGrant{{Action: catalogue.CloseItem, Category: "invoice", ReportID: 1,
			ConfigHash: tn.DecisionConfig().Hash(), Scores: passingScores()}}
		if mutate != nil {
			mutate(tn)
		}
		return tn
	}
	closeItem, _ := catalogue.Lookup(1, catalogue.CloseItem)
	draft, _ := catalogue.Lookup(1, catalogue.DraftReply)
	for _, tt := range []struct {
		name     string
		tenant   *registry.Tenant
		category string
		proposal Proposal
		want     registry.Autonomy
	}{
		{"Granted", granted(nil), "invoice", Proposal{Action: closeItem, Params: json.RawMessage(`{"resolution":"paid"}`)}, registry.AutonomyAuto},
		{"OtherCategory", granted(nil), "general", Proposal{Action: closeItem, Params: json.RawMessage(`{"resolution":"paid"}`)}, registry.AutonomyAssist},
		{"CatalogueRequiresApproval", granted(func(tn *registry.Tenant) {
			tn.Grants = append(tn.Grants, registry.AutonomyGrant{Action: catalogue.DraftReply, Category: "invoice", ConfigHash: tn.Grants[0].ConfigHash, Scores: passingScores()})
		}), "invoice", Proposal{Action: draft, Params: json.RawMessage(`{"subject":"s","body":"b"}`)}, registry.AutonomyAssist},
		{"RuleChangedSince", granted(func(tn *registry.Tenant) {
			tn.Rules = []registry.Rule{{Name: "new", Match: registry.Match{SubjectKeywords: []string{"zzz"}}, Category: "general", Priority: "low", Confidence: 0.5}}
		}), "invoice", Proposal{Action: closeItem, Params: json.RawMessage(`{"resolution":"paid"}`)}, registry.AutonomyAssist},
		{"ModelChangedSince", granted(func(tn *registry.Tenant) { tn.ModelName = "llama3.2:3b" }), "invoice",
			Proposal{Action: closeItem, Params: json.RawMessage(`{"resolution":"paid"}`)}, registry.AutonomyAssist},
		{"TenantBackAtAssist", granted(func(tn *registry.Tenant) { tn.Autonomy = registry.AutonomyAssist }), "invoice",
			Proposal{Action: closeItem, Params: json.RawMessage(`{"resolution":"paid"}`)}, registry.AutonomyAssist},
		{"ThresholdRaised", granted(func(tn *registry.Tenant) {
			th := registry.DefaultAutonomyThresholds()
			th.MinDecisions = 50
			tn.Thresholds = &th
		}), "invoice", Proposal{Action: closeItem, Params: json.RawMessage(`{"resolution":"paid"}`)}, registry.AutonomyAssist},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := tt.proposal
			a := wire.Assessment{Category: tt.category, Priority: "normal", Confidence: 0.9, Source: "model"}
			e := New(stageFunc(func() (Outcome, error) { return Proposed(a, p), nil }))
			in := &Input{Tenant: tt.tenant, Item: Item{New: true, CatalogueVersion: 1, Email: &wire.Email{From: "a@b"}}, Request: &wire.TurnSubmitRequest{}}
			got, err := e.Decide(context.Background(), in, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.Autonomy != tt.want && !(tt.want == registry.AutonomyAssist && got.Autonomy == "") {
				t.Fatalf("autonomy %q, want %q", got.Autonomy, tt.want)
			}
			if tt.want == registry.AutonomyAuto {
				if got.Action == nil || got.Action.RequiresApproval || got.Status != wire.WorkItemStatusClosed || got.ActionState != ActionStateSent {
					t.Fatalf("granted close_item did not go ahead: %+v", got)
				}
				return
			}
			if got.Action == nil || !got.Action.RequiresApproval || got.Status != wire.WorkItemStatusAwaitingApproval {
				t.Fatalf("did not stop for a human: %+v", got)
			}
		})
	}
}

// TestRuleAdmissionFollowsTheRegistryEntry: a rule's admission is cached
// per registry entry, so the same engine decides as the entry now says:
// the rule's action admitted while enabled, escalated once a new entry
// disables it, admitted again under an entry that enables it, and the
// cache never grows past its bound.
func TestRuleAdmissionFollowsTheRegistryEntry(t *testing.T) {
	t.Parallel()
	e := New(nil)
	withRule := func(enabled ...catalogue.Name) *registry.Tenant {
		tn := tenant(enabled...)
		tn.Rules = []registry.Rule{{Name: "quotes", Match: registry.Match{SenderDomains: []string{"acme.example"}},
			Category: "quote_request", Priority: "normal", Confidence: 0.95,
			Action: catalogue.CloseItem, Params: json.RawMessage(`{"resolution":"done"}`)}}
		return tn
	}
	decide := func(tn *registry.Tenant) Outcome {
		t.Helper()
		in := &Input{Tenant: tn, Item: Item{New: true, CatalogueVersion: 1, Email: &wire.Email{From: "jo@acme.example"}},
			Request: &wire.TurnSubmitRequest{}}
		out, err := e.Decide(context.Background(), in, nil)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	on := withRule(catalogue.CloseItem, catalogue.EscalateItem)
	for range 3 {
		if out := decide(on); out.Action == nil || out.Action.Action.Name != catalogue.CloseItem || string(out.Action.Params) != `{"resolution":"done"}` {
			t.Fatalf("enabled: %+v", out)
		}
	}
	if out := decide(withRule(catalogue.EscalateItem)); out.Reason != ReasonRuleActionNotEnabled {
		t.Fatalf("disabled by a new registry entry: %+v", out)
	}
	if out := decide(withRule(catalogue.CloseItem)); out.Action == nil || out.Action.Action.Name != catalogue.CloseItem {
		t.Fatalf("enabled again: %+v", out)
	}
	for range maxCachedRules + 10 {
		decide(withRule(catalogue.CloseItem))
	}
	if n := e.ruleCount.Load(); n > maxCachedRules {
		t.Fatalf("%d cached admissions, bound %d", n, maxCachedRules)
	}
}

// create_job's external_ref is the brain's, one for each work item: a
// rule's (an old registry entry's fixed one, or none) and a model stage's
// (an e-mail naming another item's job) are replaced by the item's.
func TestExternalRefIsTheItems(t *testing.T) {
	t.Parallel()
	tn := tenant(catalogue.CreateJob, catalogue.EscalateItem)
	tn.Rules = []registry.Rule{{Name: "leaks", Match: registry.Match{SubjectKeywords: []string{"leak"}}, Category: "general",
		Priority: "high", Action: catalogue.CreateJob, Confidence: 0.9,
		Params: json.RawMessage(`{"title":"Leak","description":"Fix it","external_ref":"the-same-for-every-item"}`)}}
	job, _ := catalogue.Lookup(1, catalogue.CreateJob)
	lying := Outcome{Action: &Proposal{Action: job, Params: json.RawMessage(`{"title":"t","description":"d","external_ref":"JOB-OF-ANOTHER-ITEM"}`)}}
	e := New(stageFunc(func() (Outcome, error) { return lying, nil }))
	// A stage whose proposal carries only the action's name: the gate goes
	// by the catalogue's action, not the stage's.
	bare := Outcome{Action: &Proposal{Action: catalogue.Action{Name: catalogue.CreateJob}, Params: lying.Action.Params}}
	bareStage := New(stageFunc(func() (Outcome, error) { return bare, nil }))
	in := &Input{Tenant: tn, Item: Item{ID: "<d@x>", New: true, CatalogueVersion: 1, Email: &wire.Email{From: "a@b", Subject: "other"}},
		Request: &wire.TurnSubmitRequest{}}
	if out, err := bareStage.Decide(context.Background(), in, nil); err != nil || out.Action == nil ||
		!strings.Contains(string(out.Action.Params), catalogue.ItemRef("<d@x>")) {
		t.Errorf("a bare proposal: %+v %v, want the item's reference", out, err)
	}
	for _, tc := range []struct{ id, subject string }{{"<a@x>", "leak"}, {"<b@x>", "leak"}, {"<c@x>", "other"}} {
		in := &Input{Tenant: tn, Item: Item{ID: tc.id, New: true, CatalogueVersion: 1, Email: &wire.Email{From: "a@b", Subject: tc.subject}},
			Request: &wire.TurnSubmitRequest{}}
		out, err := e.Decide(context.Background(), in, nil)
		if err != nil || out.Action == nil || out.Action.Action.Name != catalogue.CreateJob {
			t.Fatalf("%s: %+v %v", tc.id, out, err)
		}
		var p map[string]string
		if err := json.Unmarshal(out.Action.Params, &p); err != nil || p["external_ref"] != catalogue.ItemRef(tc.id) {
			t.Errorf("%s (%s): params %s, want the item's reference %s", tc.id, tc.subject, out.Action.Params, catalogue.ItemRef(tc.id))
		}
	}
}
