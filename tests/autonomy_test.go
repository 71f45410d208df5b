package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"testing"

	"github.com/ollama/ollama/api"

	"n8nbrain/catalogue"
	"n8nbrain/internal/ollamafake"
	"n8nbrain/wire"
)

var actRe = regexp.MustCompile(`\[act:(\w+)\]`)

// autonomyChoices is what the model double answers when an email's subject
// carries [act:<name>]: a valid classification choosing that action.
var autonomyChoices = map[string]string{
	"draft_reply":        `{"category":"quote_request","priority":"high","confidence":0.9,"action":"draft_reply","params":{}}`,
	"create_job":         `{"category":"booking","priority":"high","confidence":0.9,"action":"create_job","params":{"title":"Fix the gate","description":"The side gate hinge is broken.","site_address":"17 Side St"}}`,
	"close_item":         `{"category":"complaint","priority":"normal","confidence":0.97,"action":"close_item","params":{"resolution":"resolved at the sender's request"}}`,
	"escalate_item":      `{"category":"complaint","priority":"urgent","confidence":0.6,"action":"escalate_item","params":{"reason":"an angry customer"}}`,
	"send_reply":         `{"category":"general","priority":"low","confidence":0.9,"action":"send_reply","params":{"approval_id":"6f1c1c9e-3b4f-4c3e-9d0a-1a2b3c4d5e6f","content_sha256":"` + fmt.Sprintf("%064d", 0) + `","abort_if_replied_since":"2026-01-01T00:00:00Z"}}`,
	"verify_reply_sent":  `{"category":"general","priority":"low","confidence":0.9,"action":"verify_reply_sent","params":{"approval_id":"6f1c1c9e-3b4f-4c3e-9d0a-1a2b3c4d5e6f","content_sha256":"` + fmt.Sprintf("%064d", 0) + `"}}`,
	"verify_job_created": `{"category":"general","priority":"low","confidence":0.9,"action":"verify_job_created","params":{"external_ref":"x"}}`,
}

// envelopeAutonomy is the "autonomy" member of a decision envelope as sent.
func envelopeAutonomy(t *testing.T, body []byte) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	var a string
	if raw, ok := m["autonomy"]; !ok || json.Unmarshal(raw, &a) != nil {
		t.Fatalf("the envelope has no autonomy string: %s", body)
	}
	return a
}

// Assist autonomy, through the real relay with a model double that picks
// each enabled action in turn: every action the model chooses stops for a
// human (an approval record, requires_approval true) and, once approved,
// the next turn carries out exactly what the human approved. The model's
// escalate_item already hands the item to a human and is not approved
// again; follow-up actions are never offered at triage; a deterministic
// rule still acts alone.
func TestAutonomyAssistModelActionsStopForAHuman(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(modelSpec("auto-a")) // every v1 action enabled; autonomy left to its default
	fake := ollamafake.New(t, func(req *api.ChatRequest) ollamafake.Reply {
		if stepOf(req) == "draft" {
			return ollamafake.Reply{Content: goodDraft}
		}
		e, _ := emailOf(req)
		m := actRe.FindStringSubmatch(e.Subject)
		if m == nil {
			return ollamafake.Reply{Status: http.StatusBadRequest}
		}
		return ollamafake.Reply{Content: autonomyChoices[m[1]]}
	})
	s.startModelBrain("r1", fake, breakerOff) // three items get invalid answers on purpose
	ea := s.startEdge(a, nil)
	db := s.tenantDB(a)
	approvals := func(id string) int {
		return count(t, db, `SELECT count(*) FROM approvals WHERE work_item_id = $1`, id)
	}

	for _, tc := range []struct {
		action string
		// after approval: the action of the next turn and the item's status
		next       string
		nextStatus wire.WorkItemStatus
		edit       map[string]any // edit and approve with these params
	}{
		{action: "draft_reply", next: "send_reply", nextStatus: wire.WorkItemStatusOpen},
		{action: "create_job", next: "create_job", nextStatus: wire.WorkItemStatusOpen,
			edit: map[string]any{"title": "Fix the side gate", "description": "Replace the broken hinge."}},
		{action: "close_item", next: "close_item", nextStatus: wire.WorkItemStatusClosed,
			edit: map[string]any{"resolution": "checked by a human: nothing to do"}},
	} {
		t.Run(tc.action, func(t *testing.T) {
			ea := ea.forTest(t)
			id := "<auto-" + tc.action + "@customer.example>"
			req := pergola(id)
			req.Email.Subject = "About the gate [act:" + tc.action + "]"
			res := ea.submit(req)
			rep := res.reply(t)
			if got := envelopeAutonomy(t, res.Body); got != "assist" {
				t.Fatalf("autonomy %q, want assist", got)
			}
			if rep.Status != wire.WorkItemStatusAwaitingApproval || rep.Action == nil || rep.Action.Name != tc.action ||
				!rep.Action.RequiresApproval || rep.Action.ApprovalID == "" || rep.Assessment.Source != "model" {
				t.Fatalf("turn 1: %s", res.Body)
			}
			ap := ea.approval(rep.Action.ApprovalID).Approval
			if ap.Action != tc.action || ap.Status != wire.ApprovalStatusPending || ap.ProposedSHA256 != wire.ContentSHA256(rep.Action.Params) {
				t.Fatalf("approval record %+v", ap)
			}
			// Nothing happens until a human decides.
			if r := ea.submit(later(id, 2, nil)).reply(t); r.Action != nil || r.Status != wire.WorkItemStatusAwaitingApproval {
				t.Fatalf("turn 2 before the decision: %+v", r)
			}
			want := rep.Action.Params
			if tc.edit != nil {
				if tc.action == "create_job" {
					tc.edit["external_ref"] = catalogue.ItemRef(id) // the brain's, kept by an edit
				}
				dr := ea.decide(ap.ID, "edit", map[string]any{"by": "alice", "params": tc.edit})
				if dr.Status != http.StatusOK {
					t.Fatalf("edit: %d %s", dr.Status, dr.Body)
				}
				want, _ = json.Marshal(tc.edit) // map keys marshal sorted: the canonical form
			} else if dr := ea.decide(ap.ID, "approve", map[string]string{"by": "alice"}); dr.Status != http.StatusOK {
				t.Fatalf("approve: %d %s", dr.Status, dr.Body)
			}
			res = ea.submit(later(id, 3, nil))
			next := res.reply(t)
			if next.Action == nil || next.Action.Name != tc.next || next.Action.RequiresApproval || next.Status != tc.nextStatus {
				t.Fatalf("turn 3 after approval: %s", res.Body)
			}
			if tc.next != "send_reply" && !bytes.Equal(next.Action.Params, want) {
				t.Fatalf("turn 3 carries %s, the human approved %s", next.Action.Params, want)
			}
			if n := approvals(id); n != 1 {
				t.Fatalf("%d approval records, want the one the human decided", n)
			}
		})
	}

	// The model's escalate_item hands the item to a human already.
	t.Run("escalate_item", func(t *testing.T) {
		id := "<auto-escalate@customer.example>"
		req := pergola(id)
		req.Email.Subject = "About the gate [act:escalate_item]"
		res := ea.forTest(t).submit(req)
		rep := res.reply(t)
		if envelopeAutonomy(t, res.Body) != "assist" || rep.Status != wire.WorkItemStatusEscalated || rep.Action == nil ||
			rep.Action.Name != "escalate_item" || rep.Action.RequiresApproval || rep.Action.ApprovalID != "" || approvals(id) != 0 {
			t.Fatalf("turn 1: %s", res.Body)
		}
	})
	// Follow-ups are never the model's to choose: not offered, refused.
	for _, f := range []catalogue.Name{catalogue.SendReply, catalogue.VerifyReplySent, catalogue.VerifyJob} {
		t.Run(string(f), func(t *testing.T) {
			id := "<auto-" + string(f) + "@customer.example>"
			req := pergola(id)
			req.Email.Subject = "About the gate [act:" + string(f) + "]"
			rep := ea.forTest(t).submit(req).reply(t)
			if rep.Status != wire.WorkItemStatusEscalated || rep.Reason != "model_output_invalid" || rep.Action == nil ||
				rep.Action.Name != "escalate_item" || approvals(id) != 0 {
				t.Fatalf("turn 1: %+v", rep)
			}
		})
	}
	// A confident rule is deterministic: it acts without approval, as before.
	t.Run("Rule", func(t *testing.T) {
		id := "<auto-rule@supplier.example>"
		req := &wire.TurnSubmitRequest{WorkItemID: id, Turn: 1, Email: &wire.Email{From: "acc@supplier.example",
			Subject: "Invoice 8812 for timber supplies", Body: "Please find invoice 8812 attached, due in 30 days."}}
		res := ea.forTest(t).submit(req)
		rep := res.reply(t)
		if envelopeAutonomy(t, res.Body) != "assist" || rep.Assessment.Source != "rule" || rep.Action == nil || rep.Action.Name != "close_item" ||
			rep.Action.RequiresApproval || rep.Status != wire.WorkItemStatusClosed || approvals(id) != 0 {
			t.Fatalf("rule decision: %s", res.Body)
		}
	})
	if n := countSteps(fake.Requests(), "classify"); n != 10 {
		t.Fatalf("%d classification requests, want 10 (four answers, three answers and their repairs; none for the rule)", n)
	}
}
