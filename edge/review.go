package edge

import (
	"bytes"
	"crypto/hmac"
	"embed"
	"encoding/json"
	"errors"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"n8nbrain/catalogue"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// The review page: office staff read the e-mail, why the brain proposed an
// action and what approving it will do, then approve it (as proposed or
// changed in a form typed from the catalogue) or reject it (DESIGN §6).
// Server-rendered HTML under a strict CSP; one small script only turns
// times into the browser's own time zone. Decisions are recorded as
// "reviewer:<name>".
//
// Forms: each carries a token bound to the session and the approval
// (formToken), and a POST must come from the page itself (crossSite). The
// decision form cannot be sent by pressing Enter in a field: its first
// submit button is disabled, which the HTML standard makes stop implicit
// submission; only the buttons decide.

//go:embed review/*.html review/assets/*
var reviewFS embed.FS

var reviewTemplates = template.Must(template.New("review").Funcs(template.FuncMap{
	"visible": visible,
	"marked":  marked,
	"asset":   assetURL,
}).ParseFS(reviewFS, "review/*.html"))

const (
	// reviewPageSize is how many approvals a page of the list shows.
	reviewPageSize = 50
)

// page is what every review page shows in its header.
type page struct {
	Title    string
	Reviewer string
	// LogoutCSRF is the sign-out form's token; empty when signed out.
	LogoutCSRF string
}

func pageFor(d deps, r *http.Request, title string) page {
	se := sessionOf(r.Context())
	p := page{Title: title, Reviewer: se.reviewer}
	if se.reviewer != "" {
		p.LogoutCSRF = formToken(d.csrfKey, se, "logout")
	}
	return p
}

// statusChoices are the list's status filter, in the order offered.
var statusChoices = []struct {
	Value wire.ApprovalStatus
	Label string
}{
	{wire.ApprovalStatusPending, "Waiting for a decision"},
	{wire.ApprovalStatusApproved, "Approved"},
	{wire.ApprovalStatusRejected, "Rejected"},
	{wire.ApprovalStatusExpired, "Expired"},
	{wire.ApprovalStatusSuperseded, "Handled outside"},
}

type listPage struct {
	page
	Status  wire.ApprovalStatus
	Query   string
	Choices []statusChoice
	Rows    []listRow
	Total   int
	From    int
	To      int
	NextURL string
	// FirstURL is set on pages after the first.
	FirstURL string
	Error    string
}

type statusChoice struct {
	Value    wire.ApprovalStatus
	Label    string
	Selected bool
}

// listRow is one approval in the list.
type listRow struct {
	ID         string
	Summary    string
	SenderName string
	SenderAddr string
	Subject    string
	Category   string
	Priority   string
	Urgency    string // a class: urgent, high, normal, low, none
	Created    timeView
	Expires    timeView
	Waiting    string // how long it has waited: "3 h"
	Pending    bool
	Expired    bool
	Outcome    string
}

// handleReviewList shows a page of approvals: pending ones by default,
// most urgent first, filterable by status and searchable by sender or
// subject.
func handleReviewList(d deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := listPage{page: pageFor(d, r, "Approvals"), Status: wire.ApprovalStatusPending}
		q := r.URL.Query()
		req := wire.ApprovalListRequest{Status: wire.ApprovalStatusPending, Limit: reviewPageSize, Brief: true}
		if v := q.Get("status"); v != "" {
			if !validStatus(wire.ApprovalStatus(v)) {
				p.Error = "Choose one of the statuses offered."
			} else {
				req.Status = wire.ApprovalStatus(v)
			}
		}
		p.Status = req.Status
		if v := strings.TrimSpace(q.Get("q")); v != "" {
			if len(v) > wire.MaxApprovalQueryBytes || hasControl(v) {
				p.Error = "Search for at most " + strconv.Itoa(wire.MaxApprovalQueryBytes) + " characters of a sender or subject."
			} else {
				req.Query = v
			}
		}
		p.Query = req.Query
		if v := q.Get("cursor"); v != "" && len(v) <= maxCursorBytes {
			req.Cursor = v
		}
		for _, c := range statusChoices {
			p.Choices = append(p.Choices, statusChoice{Value: c.Value, Label: c.Label, Selected: c.Value == p.Status})
		}
		var rep wire.ApprovalListReply
		err := callJSON(r.Context(), d.brain, subjects.APIApprovalList, req, &rep)
		if e := wire.ErrorOf(err); err != nil && e.Field == "cursor" {
			// A stale or foreign cursor: start from the first page.
			req.Cursor = ""
			err = callJSON(r.Context(), d.brain, subjects.APIApprovalList, req, &rep)
		}
		if err != nil {
			renderReviewError(w, r, p.page, err)
			return
		}
		if req.Status == wire.ApprovalStatusPending && req.Query == "" {
			p.Title = "Waiting for a decision"
		}
		p.Total = rep.Total
		if n := len(rep.Approvals); n > 0 {
			p.From, p.To = rep.Offset+1, rep.Offset+n
		}
		listURL := func(cursor string) string {
			v := url.Values{}
			if p.Status != wire.ApprovalStatusPending {
				v.Set("status", string(p.Status))
			}
			if p.Query != "" {
				v.Set("q", p.Query)
			}
			if cursor != "" {
				v.Set("cursor", cursor)
			}
			if len(v) == 0 {
				return "/review"
			}
			return "/review?" + v.Encode()
		}
		if rep.NextCursor != "" {
			p.NextURL = listURL(rep.NextCursor)
		}
		if rep.Offset > 0 {
			p.FirstURL = listURL("")
		}
		for _, a := range rep.Approvals {
			p.Rows = append(p.Rows, d.listRow(a))
		}
		render(w, r, http.StatusOK, "list", p)
	})
}

func (d deps) listRow(a wire.Approval) listRow {
	name, addr := person(a.Sender)
	row := listRow{
		ID: a.ID, Summary: summary(a), SenderName: name, SenderAddr: addr, Subject: a.Subject,
		Created: d.clock.view(a.CreatedAt), Expires: d.clock.view(a.ExpiresAt),
		Pending: a.Status == wire.ApprovalStatusPending, Urgency: "none", Priority: "No priority",
		Waiting: span(d.clock.now().Sub(a.CreatedAt)),
	}
	if as := a.Assessment; as != nil {
		row.Category = words(as.Category)
		if as.Priority != "" {
			row.Priority, row.Urgency = words(as.Priority), as.Priority
		}
	}
	row.Expired = row.Pending && !d.clock.now().Before(a.ExpiresAt)
	row.Outcome = outcomeWords(a)
	return row
}

// summary says what an approval proposes, in words: "Reply to Jo Bloggs",
// "Create a job for Smith & Sons".
func summary(a wire.Approval) string {
	name, _ := person(a.Sender)
	switch catalogue.Name(a.Action) {
	case catalogue.DraftReply:
		if name != "" {
			return "Reply to " + name
		}
	case catalogue.CreateJob:
		if name != "" {
			return "Create a job for " + name
		}
	}
	if f, ok := catalogue.FormOf(catalogue.Version(a.CatalogueVersion), catalogue.Name(a.Action)); ok {
		return f.Title
	}
	return words(a.Action)
}

// outcomeWords says where a decided approval stands.
func outcomeWords(a wire.Approval) string {
	by := strings.TrimPrefix(strings.TrimPrefix(a.DecidedBy, "reviewer:"), "n8n:")
	switch a.Status {
	case wire.ApprovalStatusApproved:
		if len(a.Edited) > 0 || a.EditedSHA256 != "" {
			return "Approved with changes by " + by
		}
		return "Approved by " + by
	case wire.ApprovalStatusRejected:
		return "Rejected by " + by
	case wire.ApprovalStatusExpired:
		return "Expired: nobody decided in time"
	case wire.ApprovalStatusSuperseded:
		return "Handled outside the review page"
	}
	return "Waiting for a decision"
}

// approvalPage is the page of one approval.
type approvalPage struct {
	page
	ID       string
	Summary  string
	Action   string // the action in words
	Status   wire.ApprovalStatus
	State    string // where it stands, in words
	Open     bool
	Expired  bool
	Created  timeView
	Expires  timeView
	Decided  *timeView
	Reason   string
	Category string
	Priority string
	Urgency  string
	Source   string
	Sure     string // confidence, "95%"

	Email       *emailView
	HiddenCount int

	Fields        []fieldView // the decision form, while open
	Shown         []fieldView // what was proposed (and approved), once decided
	Edited        []fieldView
	ApproveLabel  string
	ApproveEffect string
	RejectEffect  string
	Recipient     string

	Evidence evidence
	CSRF     string
	Error    string
	FormErr  map[string]string
	Reject   string // the reason typed so far

	Done *doneView
	Next *nextView
}

type emailView struct {
	From     string
	To       string
	Subject  string
	Received *timeView
	Preview  string
	Rest     string
	Size     string
}

// fieldView is one parameter on the page: in the form or shown.
type fieldView struct {
	ID        string // the control's id: f-<param>
	Name      string // the form field's name: p.<param>
	Label     string
	Help      string
	Input     string
	ReadOnly  bool
	Required  bool
	MaxLength int
	Value     string
	Options   []string
	Error     string
}

type evidence struct {
	ApprovalID       string
	WorkItemID       string
	Turn             int
	CatalogueVersion int
	Action           string
	Mode             string
	ProposedSHA256   string
	EditedSHA256     string
	ApprovedSHA256   string
	DecidedBy        string
}

type doneView struct {
	Headline string
	Text     string
}

type nextView struct {
	ID       string
	Summary  string
	Priority string
	Subject  string
	Waiting  int
}

func (d deps) approvalPage(r *http.Request, rep wire.ApprovalGetReply) approvalPage {
	a := rep.Approval
	now := d.clock.now()
	form, _ := catalogue.FormOf(catalogue.Version(a.CatalogueVersion), catalogue.Name(a.Action))
	p := approvalPage{
		page: pageFor(d, r, summary(a)), ID: a.ID, Summary: summary(a), Action: form.Title, Status: a.Status,
		Created: d.clock.view(a.CreatedAt), Expires: d.clock.view(a.ExpiresAt),
		Reason: a.RejectReason, Recipient: a.Recipient, State: outcomeWords(a),
		Priority: "No priority", Urgency: "none",
		Evidence: evidence{ApprovalID: a.ID, WorkItemID: a.WorkItemID, Turn: a.Turn, CatalogueVersion: a.CatalogueVersion,
			Action: a.Action, ProposedSHA256: a.ProposedSHA256, EditedSHA256: a.EditedSHA256,
			ApprovedSHA256: a.ApprovedSHA256, DecidedBy: a.DecidedBy},
	}
	if p.Action == "" {
		p.Action = words(a.Action)
	}
	switch a.Proof {
	case wire.ProofExactText:
		p.Evidence.Mode = "Sent by your workflow after approval; this record proves the exact content approved."
	case wire.ProofProposalOnly:
		p.Evidence.Mode = "Placed in your mailbox for a person to send; this record proves only what was proposed."
	}
	p.Expired = a.Status == wire.ApprovalStatusExpired || (a.Status == wire.ApprovalStatusPending && !now.Before(a.ExpiresAt))
	p.Open = a.Status == wire.ApprovalStatusPending && !p.Expired
	if p.Expired && a.Status == wire.ApprovalStatusPending {
		p.State = "Expired: nobody decided in time"
	}
	if a.DecidedAt != nil {
		tv := d.clock.view(*a.DecidedAt)
		p.Decided = &tv
	}
	if as := a.Assessment; as != nil {
		p.Category = words(as.Category)
		if as.Priority != "" {
			p.Priority, p.Urgency = words(as.Priority), as.Priority
		}
		switch as.Source {
		case "rule":
			p.Source = "your rule “" + as.Rule + "”"
			if as.Rule == "" {
				p.Source = "one of your rules"
			}
		case "model":
			p.Source = "the AI model"
		case "none":
			p.Source = "nothing: no rule matched and no model was asked"
		default:
			p.Source = "an earlier step"
		}
		p.Sure = strconv.Itoa(int(as.Confidence*100+0.5)) + "%"
	}
	if e := rep.Email; e != nil {
		ev := &emailView{From: e.From, To: strings.Join(e.To, ", "), Subject: e.Subject}
		if e.ReceivedAt != nil {
			tv := d.clock.view(*e.ReceivedAt)
			ev.Received = &tv
		}
		body := normalizeNewlines(e.Body)
		ev.Preview, ev.Rest = splitPreview(body)
		if ev.Rest != "" {
			ev.Size = strconv.Itoa(len([]rune(ev.Rest))) + " more characters"
		}
		p.Email = ev
		p.HiddenCount += hiddenCount(e.From) + hiddenCount(e.Subject) + hiddenCount(e.Body) + hiddenCount(ev.To)
	}
	proposed := paramValues(a.Proposed)
	p.HiddenCount += hiddenCount(a.WorkItemID)
	for _, vals := range []map[string]string{proposed, paramValues(a.Edited)} {
		for _, v := range vals {
			p.HiddenCount += hiddenCount(v)
		}
	}

	if p.Open {
		se := sessionOf(r.Context())
		p.CSRF = formToken(d.csrfKey, se, a.ID)
		p.Fields = formFields(form, proposed)
		p.ApproveLabel, p.ApproveEffect = approveWords(a, proposed)
		p.RejectEffect = "Nothing is sent or created. The e-mail goes back to your team to handle by hand."
	} else {
		p.Shown = formFields(form, proposed)
		if len(a.Edited) > 0 {
			p.Edited = formFields(form, paramValues(a.Edited))
		}
	}
	return p
}

// paramValues reads parameters as strings for the page: strings as they
// are, anything else as its JSON.
func paramValues(raw json.RawMessage) map[string]string {
	var m map[string]json.RawMessage
	out := map[string]string{}
	if json.Unmarshal(raw, &m) != nil {
		return out
	}
	for k, v := range m {
		var s string
		if json.Unmarshal(v, &s) == nil {
			out[k] = s
		} else {
			out[k] = string(v)
		}
	}
	return out
}

func formFields(f catalogue.Form, values map[string]string) []fieldView {
	out := make([]fieldView, 0, len(f.Fields))
	for _, fd := range f.Fields {
		v, ok := values[fd.Param.Name]
		if !ok && fd.ReadOnly {
			continue
		}
		out = append(out, fieldView{
			ID: "f-" + fd.Param.Name, Name: "p." + fd.Param.Name, Label: fd.Label, Help: fd.Help, Input: string(fd.Input),
			ReadOnly: fd.ReadOnly, Required: fd.Param.Required, MaxLength: fd.Param.MaxLength,
			Value: v, Options: fd.Param.Enum,
		})
	}
	return out
}

// approveWords are the approve button's label and what approving does.
func approveWords(a wire.Approval, params map[string]string) (label, effect string) {
	to := marked(a.Recipient)
	if to == "" {
		to = "the sender"
	}
	switch catalogue.Name(a.Action) {
	case catalogue.DraftReply:
		if a.ApprovalMode == "mailbox" {
			return "Approve the draft", "When you approve, this reply is put in your mailbox as a draft to " + to +
				". Someone then sends it from the mailbox."
		}
		return "Approve and send the reply", "When you approve, this reply is e-mailed to " + to +
			", exactly as it stands above, with any changes you made."
	case catalogue.CreateJob:
		return "Approve and create the job", "When you approve, a job is created in your job system with the details above and the reference " +
			marked(params["external_ref"]) + ". If a job with that reference already exists, no second one is made."
	}
	desc := ""
	if act, ok := catalogue.Lookup(catalogue.Version(a.CatalogueVersion), catalogue.Name(a.Action)); ok {
		desc = act.Description
	}
	return "Approve", "When you approve, this happens: " + desc
}

// doneWords confirm a decision the reviewer just made. An approval is
// carried out by the tenant's workflow once an edge delivers its event;
// delivering says whether this edge does (EDGE_WEBHOOK_URL set), so that
// the page does not promise what will not happen here.
func doneWords(a wire.Approval, delivering bool) *doneView {
	edited := len(a.Edited) > 0
	switch a.Status {
	case wire.ApprovalStatusRejected:
		return &doneView{Headline: "Rejected", Text: "Nothing will be sent or created. The e-mail is back with your team to handle by hand."}
	case wire.ApprovalStatusApproved:
		head := "Approved"
		if edited {
			head = "Approved with your changes"
		}
		// what happens next: the sentence's verb phrase, after "Your workflow now".
		next := "carries it out"
		switch catalogue.Name(a.Action) {
		case catalogue.DraftReply:
			next = "e-mails the reply to " + marked(a.Recipient)
			if a.ApprovalMode == "mailbox" {
				next = "puts the draft in your mailbox, for someone to send to " + marked(a.Recipient)
			}
		case catalogue.CreateJob:
			next = "creates the job in your job system"
		}
		if !delivering {
			return &doneView{Headline: head, Text: "Your decision is recorded. This edge passes no events to your workflow " +
				"(EDGE_WEBHOOK_URL is not set), so nothing happens yet: once an edge that does delivers the decision, your workflow " +
				next + "."}
		}
		return &doneView{Headline: head, Text: "Your workflow now " + next + "."}
	}
	return nil
}

// nextPending is the approval to decide next, and how many are waiting.
func (d deps) nextPending(r *http.Request, except string) *nextView {
	var rep wire.ApprovalListReply
	req := wire.ApprovalListRequest{Status: wire.ApprovalStatusPending, Limit: 2, Brief: true}
	if err := callJSON(r.Context(), d.brain, subjects.APIApprovalList, req, &rep); err != nil {
		return nil
	}
	for _, a := range rep.Approvals {
		if a.ID == except {
			continue
		}
		n := &nextView{ID: a.ID, Summary: summary(a), Subject: a.Subject, Waiting: rep.Total, Priority: "No priority"}
		if as := a.Assessment; as != nil && as.Priority != "" {
			n.Priority = words(as.Priority)
		}
		return n
	}
	return &nextView{}
}

// handleReviewApproval shows one approval, with the decision form while it
// is open; ?done=1 after a decision confirms it and offers the next one.
func handleReviewApproval(d deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := reviewApprovalID(w, r, d)
		if !ok {
			return
		}
		var rep wire.ApprovalGetReply
		if err := callJSON(r.Context(), d.brain, subjects.APIApprovalGet, wire.ApprovalGetRequest{ApprovalID: id}, &rep); err != nil {
			renderReviewError(w, r, pageFor(d, r, "Approval"), err)
			return
		}
		p := d.approvalPage(r, rep)
		if r.URL.Query().Get("done") == "1" && rep.Approval.DecidedBy == "reviewer:"+reviewerOf(r.Context()) {
			p.Done = doneWords(rep.Approval, d.delivering)
		}
		if !p.Open {
			p.Next = d.nextPending(r, id)
		}
		render(w, r, http.StatusOK, "approval", p)
	})
}

// maxDecideForm bounds the approve/edit/reject form. It posts every
// editable parameter of the draft as the page wrote it, percent-encoded,
// each hidden character as its marker: a draft of the catalogue's longest
// fields, every character hidden, must still come back (1.1 MB as
// catalogue version 1 stands: a draft_reply's 20,320 characters at 53
// bytes each), with room for the rest of the form.
var maxDecideForm = decideFormLimit()

func decideFormLimit() int {
	// The most a character can take in the form: a marker, or a
	// character of 4 bytes (12 percent-encoded), or a newline (CRLF).
	perChar := 12
	for r := range hiddenNames {
		perChar = max(perChar, len(url.QueryEscape(marker(r))))
	}
	for _, r := range []rune{0x1F, 0x10FFFF} { // the longest unnamed markers
		perChar = max(perChar, len(url.QueryEscape(marker(r))))
	}
	most := 0
	for _, v := range catalogue.Versions() {
		c, _ := catalogue.Get(v)
		for _, a := range c.Actions {
			f, ok := catalogue.FormOf(v, a.Name)
			if !ok {
				continue
			}
			chars := 0
			for _, fd := range f.Fields {
				if !fd.ReadOnly {
					chars += max(fd.Param.MaxLength, 20)
				}
			}
			most = max(most, chars)
		}
	}
	return most*perChar + 64<<10
}

// handleReviewDecide records a reviewer's decision: decision=approve with
// the form's fields (unchanged: approve as proposed; changed: edit and
// approve), or decision=reject with a reason. It redirects to the
// confirmation, or shows the approval again with what is wrong.
func handleReviewDecide(d deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		se := sessionOf(r.Context())
		id, ok := reviewApprovalID(w, r, d)
		if !ok {
			return
		}
		if why := crossSite(r); why != "" {
			annotate(r.Context(), slog.String("error_code", string(wire.CodeForbidden)), slog.String("error_reason", why))
			renderMessage(w, r, http.StatusForbidden, pageFor(d, r, "Refused"),
				"This form was not sent from the review page, so nothing was changed. Reload the approval and decide again.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, int64(maxDecideForm))
		if err := r.ParseForm(); err != nil {
			status, msg := http.StatusBadRequest, "The form could not be read."
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				status, msg = http.StatusRequestEntityTooLarge, "The form is larger than "+strconv.Itoa(maxDecideForm)+" bytes."
			}
			renderMessage(w, r, status, pageFor(d, r, "Refused"), msg)
			return
		}
		form := r.PostForm
		if !hmac.Equal([]byte(form.Get("csrf")), []byte(formToken(d.csrfKey, se, id))) {
			annotate(r.Context(), slog.String("error_code", string(wire.CodeForbidden)), slog.String("error_reason", "csrf"))
			renderMessage(w, r, http.StatusForbidden, pageFor(d, r, "Refused"),
				"This form has expired or was not issued to you, so nothing was changed. Reload the approval and decide again.")
			return
		}

		var rep wire.ApprovalGetReply
		if err := callJSON(r.Context(), d.brain, subjects.APIApprovalGet, wire.ApprovalGetRequest{ApprovalID: id}, &rep); err != nil {
			// Without the approval there is no form to put the typed
			// text back into; the browser still holds it one page back.
			e := noteError(r.Context(), err)
			msg := reviewMessage(e, true)
			if e.Code == wire.CodeUnavailable {
				msg += " What you typed is not lost: go back with your browser's Back button and send it again."
			}
			renderMessage(w, r, httpStatus(e), errorPage(pageFor(d, r, "Approval"), e), msg)
			return
		}
		p := d.approvalPage(r, rep)
		req, problem, fieldErrs := decideFromForm(rep.Approval, se.reviewer, form)
		if problem != "" {
			annotate(r.Context(), slog.String("error_code", string(wire.CodeInvalid)))
			p.Error, p.FormErr = problem, fieldErrs
			keepTyped(&p, form)
			render(w, r, http.StatusBadRequest, "approval", p)
			return
		}
		annotate(r.Context(), slog.String("decision", string(req.Decision)))
		var decided wire.ApprovalDecideReply
		if err := callJSON(r.Context(), d.brain, subjects.APIApprovalDecide, req, &decided); err != nil {
			e := noteError(r.Context(), err)
			// Show the approval as it is now: who decided it, if someone did.
			var now wire.ApprovalGetReply
			if callJSON(r.Context(), d.brain, subjects.APIApprovalGet, wire.ApprovalGetRequest{ApprovalID: id}, &now) == nil {
				p = d.approvalPage(r, now)
			}
			p.Error = reviewMessage(e, true)
			if p.Open {
				keepTyped(&p, form)
			} else {
				p.Next = d.nextPending(r, id)
			}
			render(w, r, httpStatus(e), "approval", p)
			return
		}
		http.Redirect(w, r, "/review/approvals/"+id+"?done=1", http.StatusSeeOther)
	})
}

// keepTyped puts what the reviewer typed back into the form.
func keepTyped(p *approvalPage, form url.Values) {
	for i, f := range p.Fields {
		if !f.ReadOnly && form.Has(f.Name) {
			p.Fields[i].Value = unmarked(normalizeNewlines(form.Get(f.Name)))
		}
		if e := p.FormErr[f.Name]; e != "" {
			p.Fields[i].Error = e
		}
	}
	p.Reject = normalizeNewlines(form.Get("reason"))
}

// decideFromForm builds the decision of a form, or says what is wrong with
// it in words for the reviewer (and per field, by form field name).
func decideFromForm(a wire.Approval, reviewer string, form url.Values) (wire.ApprovalDecideRequest, string, map[string]string) {
	req := wire.ApprovalDecideRequest{ApprovalID: a.ID, Decision: wire.ApprovalDecision(form.Get("decision")), By: "reviewer:" + reviewer}
	switch req.Decision {
	case wire.DecisionApprove:
		edited, problem, fieldErrs := editedParams(a, form)
		if problem != "" {
			return req, problem, fieldErrs
		}
		if edited != nil {
			req.Decision, req.Edited = wire.DecisionEdit, edited
		}
	case wire.DecisionReject:
		req.Reason = normalizeNewlines(strings.TrimSpace(form.Get("reason")))
		switch {
		case req.Reason == "":
			return req, "A rejection needs a reason: say why in the box under Reject.", map[string]string{"reason": "Say why you reject it."}
		case len(req.Reason) > maxReasonBytes:
			return req, "The reason is longer than " + strconv.Itoa(maxReasonBytes) + " bytes.", nil
		}
	default:
		return req, "Choose Approve or Reject.", nil
	}
	if err := req.Validate(); err != nil {
		return req, wire.ErrorOf(err).Message, nil
	}
	return req, "", nil
}

// editedParams reads the decision form's fields into parameters. It
// returns nil when they equal what was proposed (an approval as proposed),
// the edited parameters otherwise. Read-only parameters always keep their
// proposed value, whatever the form says.
func editedParams(a wire.Approval, form url.Values) (json.RawMessage, string, map[string]string) {
	act, ok := catalogue.Lookup(catalogue.Version(a.CatalogueVersion), catalogue.Name(a.Action))
	f, fok := catalogue.FormOf(catalogue.Version(a.CatalogueVersion), catalogue.Name(a.Action))
	if !ok || !fok {
		return nil, "", nil // nothing to edit: approve as proposed
	}
	var proposed map[string]json.RawMessage
	if err := json.Unmarshal(a.Proposed, &proposed); err != nil {
		return nil, "", nil
	}
	out := map[string]json.RawMessage{}
	for k, v := range proposed {
		out[k] = v
	}
	for _, fd := range f.Fields {
		name := "p." + fd.Param.Name
		if fd.ReadOnly || !form.Has(name) {
			continue
		}
		v := unmarked(normalizeNewlines(form.Get(name)))
		switch fd.Param.Type {
		case catalogue.TypeString:
			var was string
			_ = json.Unmarshal(proposed[fd.Param.Name], &was)
			// What the catalogue took as proposed may be approved as it is;
			// a change may not break the line.
			if fd.Input == catalogue.InputLine && v != was && strings.ContainsAny(v, catalogue.LineBreaks) {
				return nil, fd.Label + " must be one line.", map[string]string{name: "Use one line."}
			}
			if v == "" && !fd.Param.Required {
				delete(out, fd.Param.Name)
				continue
			}
			out[fd.Param.Name], _ = json.Marshal(v)
		case catalogue.TypeInteger:
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return nil, fd.Label + " must be a whole number.", map[string]string{name: "Enter a whole number."}
			}
			out[fd.Param.Name], _ = json.Marshal(n)
		case catalogue.TypeBoolean:
			// The form sends "false" from a hidden field, then "on" when checked.
			out[fd.Param.Name], _ = json.Marshal(slices.Contains(form[name], "on"))
		}
	}
	raw, _ := json.Marshal(out) // raw JSON values and strings: cannot fail
	edited, err := act.ValidateParams(raw)
	if err != nil {
		var pe *catalogue.ParamError
		if errors.As(err, &pe) && pe.Param != "" {
			label := pe.Param
			for _, fd := range f.Fields {
				if fd.Param.Name == pe.Param {
					label = fd.Label
				}
			}
			msg := label + " " + pe.Problem + "."
			return nil, msg, map[string]string{"p." + pe.Param: msg}
		}
		return nil, "The changes are not valid: " + err.Error(), nil
	}
	if canon, err := act.ValidateParams(a.Proposed); err == nil && bytes.Equal(canon, edited) {
		return nil, "", nil
	}
	return edited, "", nil
}

// reviewMessage says what a brain error means for the reviewer, who was
// deciding (a decision was sent) or only looking.
func reviewMessage(e *wire.Error, deciding bool) string {
	switch e.Reason {
	case wire.ReasonAlreadyResolved:
		return "Someone already decided this approval, so your decision was not recorded. What happened is shown below."
	case wire.ReasonApprovalExpired:
		return "This approval expired before your decision, so it was not recorded: nothing was sent, and the e-mail went back to your team."
	}
	if e.Code == wire.CodeUnavailable {
		// The edge, the brain or the tenant's database: the page cannot
		// tell a reviewer more than that it is passing.
		if deciding {
			return "Your decision was not recorded: the brain or your database is not answering right now. Try again in a moment."
		}
		return "This cannot be shown right now: the brain or your database is not answering. Try again in a moment."
	}
	return e.Message
}

// crossSite says why a POST did not come from the review page itself, or
// returns "" when it did (as far as the browser tells).
//
// Sec-Fetch-Site, when sent, decides. The review page is served with
// Referrer-Policy: no-referrer, under which browsers send the page's own
// form posts with "Origin: null" (Fetch, "append a request Origin header"),
// so a same-origin post may carry Origin null and nothing else. Without
// Sec-Fetch-Site (older browsers), an Origin, when sent, must be this host;
// null is refused there, the form token being checked in any case.
func crossSite(r *http.Request) string {
	origin := r.Header.Get("Origin")
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" {
		if site != "same-origin" {
			return "sec_fetch_site"
		}
		if origin == "null" {
			return ""
		}
	}
	if origin != "" {
		// An origin is a scheme, a host and a port, nothing else.
		u, err := url.Parse(origin)
		if err != nil || u.Host == "" || u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" ||
			!strings.EqualFold(u.Host, r.Host) {
			return "origin"
		}
	}
	return ""
}

// reviewApprovalID reads the {id} of a review route and answers 400
// unless it is a UUID.
func reviewApprovalID(w http.ResponseWriter, r *http.Request, d deps) (string, bool) {
	id := r.PathValue("id")
	if !validUUID(id) {
		annotate(r.Context(), slog.String("error_code", string(wire.CodeInvalid)))
		renderMessage(w, r, http.StatusBadRequest, pageFor(d, r, "No such approval"),
			"That is not an approval's address. Open approvals from the list.")
		return "", false
	}
	annotate(r.Context(), slog.String("approval_id", id))
	return id, true
}

func normalizeNewlines(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "\r\n", "\n"), "\r", "\n")
}

// renderReviewError shows a brain error as a page with its status.
func renderReviewError(w http.ResponseWriter, r *http.Request, p page, err error) {
	e := noteError(r.Context(), err)
	renderMessage(w, r, httpStatus(e), errorPage(p, e), reviewMessage(e, false))
}

// errorPage is p titled for error e.
func errorPage(p page, e *wire.Error) page {
	p.Title = "Something went wrong"
	if e.Code == wire.CodeNotFound {
		p.Title = "No such approval"
	}
	return p
}

type messagePage struct {
	page
	Message string
}

func renderMessage(w http.ResponseWriter, r *http.Request, status int, p page, msg string) {
	render(w, r, status, "message", messagePage{page: p, Message: msg})
}

// render executes a template into a buffer first, so a template error is
// a clean 500 and never half a page.
func render(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	var buf bytes.Buffer
	if err := reviewTemplates.ExecuteTemplate(&buf, name, data); err != nil {
		annotate(r.Context(), slog.String("error_code", string(wire.CodeInternal)), slog.String("error", err.Error()))
		writeText(w, http.StatusInternalServerError, "The page could not be rendered.\n")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func writeText(w http.ResponseWriter, status int, text string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(text)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(text))
}
