package engine

import (
	"context"
	"encoding/json"
	"errors"
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
			if got.Action.Action.RequiresApproval != (tt.wantAction == catalogue.DraftReply) {
				t.Fatal("requires_approval not from the catalogue")
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
