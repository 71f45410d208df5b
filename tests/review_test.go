package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"n8nbrain/catalogue"
	"n8nbrain/provision"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// reviewSpec is spec with rules for every priority and a create_job rule,
// so the review queue has something to sort.
func reviewSpec(id string) provision.TenantSpec {
	sp := spec(id)
	sp.Rules = append(sp.Rules,
		registry.Rule{Name: "jobs", Match: registry.Match{SubjectKeywords: []string{"leak"}},
			Category: "booking", Priority: "urgent", Action: catalogue.CreateJob, Confidence: 0.9,
			Params: json.RawMessage(`{"title":"Fix leak for Smith & Sons","description":"Water is coming through the ceiling."}`)},
		registry.Rule{Name: "hellos", Match: registry.Match{SubjectKeywords: []string{"hello"}},
			Category: "general", Priority: "low", Action: catalogue.DraftReply, Confidence: 0.8,
			Params: json.RawMessage(`{"subject":"Re: hello","body":"Hello to you too."}`)},
		registry.Rule{Name: "questions", Match: registry.Match{SubjectKeywords: []string{"question"}},
			Category: "complaint", Priority: "normal", Action: catalogue.DraftReply, Confidence: 0.7,
			Params: json.RawMessage(`{"subject":"Re: your question","body":"Thanks for asking."}`)},
	)
	return sp
}

// emailTurn is turn 1 of an e-mail with the given sender and subject.
func emailTurn(id, from, subject, body string) *wire.TurnSubmitRequest {
	return &wire.TurnSubmitRequest{WorkItemID: id, Turn: 1, Email: &wire.Email{MessageID: id, From: from, Subject: subject, Body: body}}
}

func (c *edgeClient) list(t *testing.T, query url.Values) wire.ApprovalListReply {
	t.Helper()
	r := c.do(http.MethodGet, "/v1/approvals?"+query.Encode(), nil)
	if r.Status != http.StatusOK {
		t.Fatalf("list %s: %d %s", query.Encode(), r.Status, r.Body)
	}
	var rep wire.ApprovalListReply
	if err := json.Unmarshal(r.Body, &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestApprovalRecordExplainsItself: the approval carries why (category,
// priority, confidence, the rule), about what (sender, subject) and to whom.
func TestApprovalRecordExplainsItself(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(reviewSpec("why-a"))
	s.startBrain("r1", nil)
	ea := s.startEdge(a, nil)

	rep := ea.submit(quoteEmail("<why@customer.example>")).reply(t)
	got := ea.approval(rep.Action.ApprovalID).Approval
	want := wire.Assessment{Category: "quote_request", Priority: "high", Confidence: 0.95, Source: "rule", Rule: "quotes"}
	if got.Assessment == nil || *got.Assessment != want {
		t.Errorf("assessment %+v, want %+v", got.Assessment, want)
	}
	if got.Sender != "Jo Bloggs <jo@customer.example>" || got.Subject != "Quote for a new deck please" || got.Recipient != "jo@customer.example" {
		t.Errorf("sender %q subject %q recipient %q", got.Sender, got.Subject, got.Recipient)
	}
	job := ea.submit(emailTurn("<why-job@customer.example>", "Smith & Sons <office@smith.example>", "Roof leak", "Help")).reply(t)
	if g := ea.approval(job.Action.ApprovalID).Approval; g.Recipient != "" || g.Assessment == nil || g.Assessment.Rule != "jobs" {
		t.Errorf("create_job approval: recipient %q (a job is sent to nobody), assessment %+v", g.Recipient, g.Assessment)
	}
}

// TestApprovalQueue: pending approvals come most urgent first, oldest first
// within a priority; a search by sender or subject narrows them; pages
// follow each other by cursor and say where they are in the total.
func TestApprovalQueue(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(reviewSpec("queue-a"))
	s.startBrain("r1", nil)
	ea := s.startEdge(a, nil)

	// Submitted in an order that is not the queue's.
	mails := []struct{ id, from, subject string }{
		{"<q1@x>", "Low Larry <larry@low.example>", "hello there"},
		{"<q2@x>", "Hana High <hana@high.example>", "quote for 50% off_road tyres"},
		{"<q3@x>", "Norm <norm@normal.example>", "a question"},
		{"<q4@x>", "Smith & Sons <office@smith.example>", "leak in the roof"},
		{"<q5@x>", "Hugo High <hugo@high.example>", "another quote"},
	}
	for _, m := range mails {
		ea.submit(emailTurn(m.id, m.from, m.subject, "body")).reply(t)
	}
	ids := func(as []wire.Approval) string {
		var out []string
		for _, a := range as {
			out = append(out, a.WorkItemID)
		}
		return strings.Join(out, " ")
	}

	all := ea.list(t, url.Values{})
	if got, want := ids(all.Approvals), "<q4@x> <q2@x> <q5@x> <q3@x> <q1@x>"; got != want || all.Total != 5 || all.Offset != 0 || all.NextCursor != "" {
		t.Fatalf("queue %s (total %d offset %d next %q), want %s, total 5", got, all.Total, all.Offset, all.NextCursor, want)
	}

	// Pages of two, by cursor.
	var pages []string
	q := url.Values{"limit": {"2"}}
	for i := 0; ; i++ {
		p := ea.list(t, q)
		if p.Total != 5 || p.Offset != 2*i {
			t.Fatalf("page %d: total %d offset %d, want 5 and %d", i, p.Total, p.Offset, 2*i)
		}
		pages = append(pages, ids(p.Approvals))
		if p.NextCursor == "" {
			break
		}
		q.Set("cursor", p.NextCursor)
	}
	if got := strings.Join(pages, " | "); got != "<q4@x> <q2@x> | <q5@x> <q3@x> | <q1@x>" {
		t.Fatalf("pages %s", got)
	}

	for _, tc := range []struct{ query, want string }{
		{"HIGH.example", "<q2@x> <q5@x>"}, // sender, any case
		{"Smith & Sons", "<q4@x>"},        // sender's name
		{"50% off_road", "<q2@x>"},        // LIKE's wildcards are plain characters
		{"quote", "<q2@x> <q5@x>"},        // subject
		{"nothing like this", ""},
	} {
		t.Run("Search"+strings.ReplaceAll(tc.query, " ", ""), func(t *testing.T) {
			p := ea.list(t, url.Values{"q": {tc.query}})
			if got := ids(p.Approvals); got != tc.want || p.Total != len(p.Approvals) {
				t.Errorf("q=%q: %s (total %d), want %s", tc.query, got, p.Total, tc.want)
			}
		})
	}

	// A cursor belongs to its listing.
	first := ea.list(t, url.Values{"limit": {"1"}})
	for _, bad := range []url.Values{
		{"limit": {"1"}, "cursor": {first.NextCursor}, "q": {"quote"}},
		{"limit": {"1"}, "cursor": {first.NextCursor}, "status": {"approved"}},
		{"cursor": {"not-a-cursor"}},
	} {
		if e := ea.do(http.MethodGet, "/v1/approvals?"+bad.Encode(), nil).error(t, http.StatusBadRequest); e.Field != "cursor" {
			t.Errorf("%s: %+v", bad.Encode(), e)
		}
	}

	// Decided approvals: latest decided first; brief lists leave content out.
	for _, id := range []string{all.Approvals[4].ID, all.Approvals[0].ID} {
		if r := ea.decide(id, "reject", map[string]string{"by": "alice", "reason": "no"}); r.Status != http.StatusOK {
			t.Fatalf("reject: %d %s", r.Status, r.Body)
		}
	}
	rejected := ea.list(t, url.Values{"status": {"rejected"}, "brief": {"true"}})
	if got := ids(rejected.Approvals); got != "<q4@x> <q1@x>" || rejected.Approvals[0].Proposed != nil || rejected.Approvals[0].Sender == "" {
		t.Errorf("rejected: %s, brief %s, sender %q", got, rejected.Approvals[0].Proposed, rejected.Approvals[0].Sender)
	}
	if p := ea.list(t, url.Values{}); p.Total != 3 {
		t.Errorf("pending after two rejections: %d", p.Total)
	}
}

// TestEditedJobIsTheJobCreated: an edited create_job is what the next turn
// asks n8n to create, and its external_ref cannot be edited.
func TestEditedJobIsTheJobCreated(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(reviewSpec("job-a"))
	hook := newWebhook(t)
	s.startBrain("r1", fastEvents)
	ea := s.startEdge(a, withWebhook(hook))
	id := "<job@smith.example>"
	rep := ea.submit(emailTurn(id, "Smith & Sons <office@smith.example>", "Leak in the kitchen", "Please come")).reply(t)
	apID := rep.Action.ApprovalID

	changedRef := map[string]string{"title": "Fix kitchen leak", "description": "Ceiling", "external_ref": "job-ref-2"}
	if e := ea.decide(apID, "edit", map[string]any{"by": "alice", "params": changedRef}).error(t, http.StatusBadRequest); e.Field != "edited.external_ref" {
		t.Fatalf("an edit of external_ref: %+v", e)
	}
	// The reference is the brain's, from the item: the edit keeps it.
	edited := map[string]string{"title": "Fix kitchen leak", "description": "Ceiling", "site_address": "1 High St", "external_ref": catalogue.ItemRef(id)}
	if r := ea.decide(apID, "edit", map[string]any{"by": "alice", "params": edited}); r.Status != http.StatusOK {
		t.Fatalf("edit: %d %s", r.Status, r.Body)
	}
	ev := hook.accepted(wire.EventApprovalDecided, id)
	next := ea.submit(later(id, ev.NextTurn, nil)).reply(t)
	if next.Action == nil || next.Action.Name != string(catalogue.CreateJob) {
		t.Fatalf("turn after approval: %+v", next)
	}
	var got map[string]string
	if err := json.Unmarshal(next.Action.Params, &got); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(edited) {
		t.Fatalf("create_job after an edit carries %v, want the edited job %v", got, edited)
	}
}

// TestApprovalListOfLargeDrafts: full content can make a page of approvals
// larger than a NATS message (drafts of up to 20,000 characters). Such a
// page ends early, within wire.MaxAPIReplyBytes, and its cursor goes on:
// every approval is listed once, none is lost, and no page is an error.
func TestApprovalListOfLargeDrafts(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	sp := spec("bigdrafts")
	body := strings.Repeat("€", 19_000) // 57,000 bytes of UTF-8 per draft
	params, _ := json.Marshal(map[string]string{"subject": "Re: quote", "body": body})
	sp.Rules[0].Params = params
	a := s.tenant(sp)
	s.startBrain("r1", nil)
	ea := s.startEdge(a, nil)
	const n = 25 // about 1.4 MB of drafts: more than NATS's 1 MiB max_payload
	for i := range n {
		ea.submit(quoteEmail(fmt.Sprintf("<big-%02d@x>", i))).reply(t)
	}
	seen := map[string]bool{}
	pages := 0
	q := url.Values{"limit": {"200"}}
	for {
		r := ea.do(http.MethodGet, "/v1/approvals?"+q.Encode(), nil)
		if r.Status != http.StatusOK {
			t.Fatalf("page %d: %d %s", pages, r.Status, r.Body)
		}
		if len(r.Body) > wire.MaxAPIReplyBytes {
			t.Fatalf("page %d is %d bytes, more than %d", pages, len(r.Body), wire.MaxAPIReplyBytes)
		}
		var p wire.ApprovalListReply
		if err := json.Unmarshal(r.Body, &p); err != nil {
			t.Fatal(err)
		}
		if p.Total != n || p.Offset != len(seen) || len(p.Approvals) == 0 {
			t.Fatalf("page %d: total %d offset %d with %d approvals, want total %d offset %d", pages, p.Total, p.Offset, len(p.Approvals), n, len(seen))
		}
		for _, ap := range p.Approvals {
			if seen[ap.WorkItemID] {
				t.Fatalf("%s listed twice", ap.WorkItemID)
			}
			seen[ap.WorkItemID] = true
			var got struct{ Body string }
			if err := json.Unmarshal(ap.Proposed, &got); err != nil || got.Body != body {
				t.Fatalf("%s: the draft came back cut or changed (%d characters)", ap.WorkItemID, len([]rune(got.Body)))
			}
		}
		pages++
		if p.NextCursor == "" {
			break
		}
		q.Set("cursor", p.NextCursor)
	}
	if len(seen) != n || pages < 3 {
		t.Fatalf("%d approvals over %d pages, want %d over at least 3 (each page at most %d bytes)", len(seen), pages, n, wire.MaxAPIReplyBytes)
	}
}
