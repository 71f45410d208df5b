package edge

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"

	"n8nbrain/catalogue"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// The review page: a human reads the e-mail and the proposed content of an
// approval, then approves, edits and approves, or rejects it (DESIGN §6).
// Server-rendered, no JavaScript. Reviewers sign in with HTTP Basic against
// EDGE_REVIEWERS_FILE; the decision is recorded as "reviewer:<name>".
//
// CSRF: each form carries HMAC-SHA256(key, reviewer, approval id), with the
// key derived from the edge's bearer token by HKDF. Deriving it (rather than
// drawing it at start) keeps a page loaded before a restart usable after it,
// and the token is a secret only n8n and the edge hold. A POST must also
// come from the page itself: Sec-Fetch-Site, when sent, must be same-origin,
// and Origin, when sent, must be this host (see crossSite for Origin null).

//go:embed review/*.html
var reviewFS embed.FS

var reviewTemplates = template.Must(template.New("review").Funcs(template.FuncMap{
	"when":  formatTime,
	"whenp": func(t *time.Time) string { return formatTime(*t) },
}).ParseFS(reviewFS, "review/*.html"))

func formatTime(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 UTC") }

const (
	// reviewListLimit is how many pending approvals the list shows.
	reviewListLimit = 200
	// csrfInfo is the HKDF info of the CSRF key; a new version changes it.
	csrfInfo = "n8nbrain edge review csrf v1"
)

// reviewerName is the shape of a reviewer's name in EDGE_REVIEWERS_FILE.
var reviewerName = regexp.MustCompile(`^[a-z0-9._-]{1,64}$`)

// reviewers are the accounts of the review page.
type reviewers struct {
	hashes map[string][]byte
	// dummy is compared for an unknown name, at the highest cost in the
	// file, so that the time of a refusal does not tell which names exist.
	dummy []byte
	// slots bounds concurrent bcrypt comparisons: each is deliberately slow.
	slots chan struct{}
}

// loadReviewers reads and checks a reviewers file: "name:<bcrypt hash>" a
// line, blank lines and # comments ignored.
func loadReviewers(path string) (*reviewers, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("EDGE_REVIEWERS_FILE: %w", err)
	}
	defer f.Close()
	rv := &reviewers{hashes: map[string][]byte{}, slots: make(chan struct{}, runtime.GOMAXPROCS(0))}
	maxCost := bcrypt.MinCost
	var errs []error
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, hash, ok := strings.Cut(line, ":")
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("line %d: want name:<bcrypt hash>", n))
			continue
		case !reviewerName.MatchString(name):
			errs = append(errs, fmt.Errorf("line %d: reviewer name %q: want 1 to 64 of a-z 0-9 . _ -", n, name))
			continue
		case rv.hashes[name] != nil:
			errs = append(errs, fmt.Errorf("line %d: reviewer %q is listed twice", n, name))
			continue
		}
		cost, err := bcrypt.Cost([]byte(hash))
		if err != nil {
			// Never the hash itself in the message.
			errs = append(errs, fmt.Errorf("line %d: reviewer %q: the hash is not a bcrypt hash (%v)", n, name, err))
			continue
		}
		maxCost = max(maxCost, cost)
		rv.hashes[name] = []byte(hash)
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 && len(rv.hashes) == 0 {
		errs = append(errs, errors.New("it lists no reviewers"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("EDGE_REVIEWERS_FILE %s: %w", path, err)
	}
	rv.dummy, err = bcrypt.GenerateFromPassword([]byte(rand.Text()), maxCost)
	if err != nil {
		return nil, fmt.Errorf("reviewers: dummy hash: %w", err)
	}
	return rv, nil
}

// check reports whether name and password are a reviewer's. It always
// runs one bcrypt comparison, for unknown names too.
func (rv *reviewers) check(ctx context.Context, name, password string) bool {
	hash, known := rv.hashes[name]
	if !known {
		hash = rv.dummy
	}
	select {
	case rv.slots <- struct{}{}:
		defer func() { <-rv.slots }()
	case <-ctx.Done():
		return false
	}
	ok := bcrypt.CompareHashAndPassword(hash, []byte(password)) == nil
	return ok && known
}

// csrfKey derives the review page's CSRF key from the bearer token.
func csrfKey(token string) []byte {
	key, err := hkdf.Key(sha256.New, []byte(token), nil, csrfInfo, sha256.Size)
	if err != nil { // cannot happen: the length is far below HKDF's limit
		panic(err)
	}
	return key
}

// csrfToken binds a form to the reviewer who loaded it and the approval.
func csrfToken(key []byte, reviewer, approvalID string) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(reviewer))
	mac.Write([]byte{0})
	mac.Write([]byte(approvalID))
	return hex.EncodeToString(mac.Sum(nil))
}

type reviewerKey struct{}

// reviewerOf is the signed-in reviewer of a request past requireReviewer.
func reviewerOf(ctx context.Context) string {
	name, _ := ctx.Value(reviewerKey{}).(string)
	return name
}

// requireReviewer sets the review page's security headers, answers 404
// when the review page is off and 401 without a reviewer's credentials.
func requireReviewer(d deps, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		if d.reviewers == nil {
			annotate(r.Context(), slog.String("error_code", string(wire.CodeNotFound)))
			writeText(w, http.StatusNotFound, "The review page is off: this edge has no reviewers (EDGE_REVIEWERS_FILE is not set).\n")
			return
		}
		name, password, ok := r.BasicAuth()
		if !ok || !d.reviewers.check(r.Context(), name, password) {
			annotate(r.Context(), slog.String("error_code", string(wire.CodeUnauthorized)))
			h.Set("WWW-Authenticate", `Basic realm="review"`)
			writeText(w, http.StatusUnauthorized, "Sign in with a reviewer's name and password.\n")
			return
		}
		annotate(r.Context(), slog.String("reviewer", name))
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), reviewerKey{}, name)))
	})
}

// page is what every review page shows in its header.
type page struct {
	Title    string
	Reviewer string
}

type listPage struct {
	page
	Approvals []wire.Approval
	More      bool
}

// handleReviewList shows the pending approvals.
func handleReviewList(d deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := page{Title: "Pending approvals", Reviewer: reviewerOf(r.Context())}
		var rep wire.ApprovalListReply
		err := callJSON(r.Context(), d.brain, subjects.APIApprovalList,
			wire.ApprovalListRequest{Status: wire.ApprovalStatusPending, Limit: reviewListLimit}, &rep)
		if err != nil {
			renderReviewError(w, r, p, err)
			return
		}
		render(w, r, http.StatusOK, "list", listPage{page: p, Approvals: rep.Approvals, More: len(rep.Approvals) >= reviewListLimit})
	})
}

// approvalPage is the page of one approval.
type approvalPage struct {
	page
	A        wire.Approval
	Email    *wire.Email
	Proposed content
	Edited   *content
	// Open: the approval can still be decided; the forms are shown.
	Open    bool
	Expired bool
	CSRF    string
	Error   string
	Form    reviewForm
}

// content is proposed or edited parameters: a draft for draft_reply, the
// parameters as indented JSON for other actions.
type content struct {
	Draft *draft
	JSON  string
}

type draft struct {
	Subject string `json:"subject"`
	Body    string `json:"body"`
	Tone    string `json:"tone,omitempty"`
}

// reviewForm is what the edit and reject forms show.
type reviewForm struct {
	Subject, Body, Params, Reason string
}

func newApprovalPage(d deps, reviewer string, rep wire.ApprovalGetReply) approvalPage {
	a := rep.Approval
	now := time.Now()
	p := approvalPage{
		page:     page{Title: a.Action + " " + a.ID, Reviewer: reviewer},
		A:        a,
		Email:    rep.Email,
		Proposed: contentOf(a.Action, a.Proposed),
		Expired:  a.Status == wire.ApprovalStatusExpired || (a.Status == wire.ApprovalStatusPending && !now.Before(a.ExpiresAt)),
	}
	if len(a.Edited) > 0 {
		c := contentOf(a.Action, a.Edited)
		p.Edited = &c
	}
	p.Open = a.Status == wire.ApprovalStatusPending && !p.Expired
	if p.Open {
		p.CSRF = csrfToken(d.csrfKey, reviewer, a.ID)
		if dr := p.Proposed.Draft; dr != nil {
			p.Form.Subject, p.Form.Body = dr.Subject, dr.Body
		} else {
			p.Form.Params = p.Proposed.JSON
		}
	}
	return p
}

func contentOf(action string, params json.RawMessage) content {
	if action == string(catalogue.DraftReply) {
		var dr draft
		if err := json.Unmarshal(params, &dr); err == nil {
			return content{Draft: &dr}
		}
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, params, "", "  "); err != nil {
		return content{JSON: string(params)}
	}
	return content{JSON: buf.String()}
}

// handleReviewApproval shows one approval, with the forms while it is open.
func handleReviewApproval(d deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reviewer := reviewerOf(r.Context())
		id, ok := reviewApprovalID(w, r, reviewer)
		if !ok {
			return
		}
		var rep wire.ApprovalGetReply
		if err := callJSON(r.Context(), d.brain, subjects.APIApprovalGet, wire.ApprovalGetRequest{ApprovalID: id}, &rep); err != nil {
			renderReviewError(w, r, page{Title: "Approval", Reviewer: reviewer}, err)
			return
		}
		render(w, r, http.StatusOK, "approval", newApprovalPage(d, reviewer, rep))
	})
}

// handleReviewDecide records a reviewer's decision from the page's forms:
// decision (approve, edit, reject), subject and body or params, reason,
// csrf. It redirects back to the approval, or shows it with the error.
func handleReviewDecide(d deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reviewer := reviewerOf(r.Context())
		id, ok := reviewApprovalID(w, r, reviewer)
		if !ok {
			return
		}
		if why := crossSite(r); why != "" {
			annotate(r.Context(), slog.String("error_code", string(wire.CodeForbidden)), slog.String("error_reason", why))
			renderMessage(w, r, http.StatusForbidden, page{Title: "Refused", Reviewer: reviewer},
				"This form was not sent from the review page, so nothing was changed. Reload the approval and decide again.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, wire.MaxAPIBytes)
		if err := r.ParseForm(); err != nil {
			status, msg := http.StatusBadRequest, "The form could not be read."
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				status, msg = http.StatusRequestEntityTooLarge, "The form is larger than "+strconv.Itoa(wire.MaxAPIBytes)+" bytes."
			}
			renderMessage(w, r, status, page{Title: "Refused", Reviewer: reviewer}, msg)
			return
		}
		form := r.PostForm
		want := csrfToken(d.csrfKey, reviewer, id)
		if !hmac.Equal([]byte(form.Get("csrf")), []byte(want)) {
			annotate(r.Context(), slog.String("error_code", string(wire.CodeForbidden)), slog.String("error_reason", "csrf"))
			renderMessage(w, r, http.StatusForbidden, page{Title: "Refused", Reviewer: reviewer},
				"This form has expired or was not issued to you, so nothing was changed. Reload the approval and decide again.")
			return
		}

		var rep wire.ApprovalGetReply
		if err := callJSON(r.Context(), d.brain, subjects.APIApprovalGet, wire.ApprovalGetRequest{ApprovalID: id}, &rep); err != nil {
			renderReviewError(w, r, page{Title: "Approval", Reviewer: reviewer}, err)
			return
		}
		p := newApprovalPage(d, reviewer, rep)
		submitted := reviewForm{
			Subject: form.Get("subject"),
			Body:    normalizeNewlines(form.Get("body")),
			Params:  form.Get("params"),
			Reason:  normalizeNewlines(strings.TrimSpace(form.Get("reason"))),
		}
		req, problem := decideFromForm(rep.Approval, reviewer, form.Get("decision"), submitted)
		if problem != "" {
			annotate(r.Context(), slog.String("error_code", string(wire.CodeInvalid)))
			p.Error, p.Form = problem, mergeForm(p.Form, submitted)
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
				p = newApprovalPage(d, reviewer, now)
			}
			p.Error, p.Form = reviewMessage(e), mergeForm(p.Form, submitted)
			render(w, r, httpStatus(e), "approval", p)
			return
		}
		http.Redirect(w, r, "/review/approvals/"+id, http.StatusSeeOther)
	})
}

// decideFromForm builds the decision of a form, or says what is wrong
// with it, in words for the reviewer.
func decideFromForm(a wire.Approval, reviewer, decision string, f reviewForm) (wire.ApprovalDecideRequest, string) {
	req := wire.ApprovalDecideRequest{ApprovalID: a.ID, Decision: wire.ApprovalDecision(decision), By: "reviewer:" + reviewer}
	switch req.Decision {
	case wire.DecisionApprove:
	case wire.DecisionEdit:
		if a.Action == string(catalogue.DraftReply) {
			subject := strings.TrimSpace(f.Subject)
			switch {
			case subject == "" || strings.TrimSpace(f.Body) == "":
				return req, "An edited reply needs a subject and a body."
			case strings.ContainsAny(subject, "\r\n") || hasControl(subject):
				return req, "The subject must be one line of text."
			}
			edited := draft{Subject: subject, Body: f.Body}
			if proposed := contentOf(a.Action, a.Proposed).Draft; proposed != nil {
				edited.Tone = proposed.Tone
			}
			req.Edited, _ = json.Marshal(edited) // strings only: cannot fail
		} else {
			params := bytes.TrimSpace([]byte(f.Params))
			var obj map[string]json.RawMessage
			if len(params) == 0 || params[0] != '{' || json.Unmarshal(params, &obj) != nil {
				return req, "The edited parameters must be a JSON object."
			}
			req.Edited = params
		}
	case wire.DecisionReject:
		switch {
		case f.Reason == "":
			return req, "A rejection needs a reason."
		case len(f.Reason) > maxReasonBytes:
			return req, "The reason is longer than " + strconv.Itoa(maxReasonBytes) + " bytes."
		}
		req.Reason = f.Reason
	default:
		return req, "Choose approve, edit or reject."
	}
	if err := req.Validate(); err != nil {
		return req, wire.ErrorOf(err).Message
	}
	return req, ""
}

// mergeForm keeps what the reviewer typed over the prefilled values.
func mergeForm(prefill, submitted reviewForm) reviewForm {
	for _, f := range []struct{ dst, src *string }{
		{&prefill.Subject, &submitted.Subject}, {&prefill.Body, &submitted.Body},
		{&prefill.Params, &submitted.Params}, {&prefill.Reason, &submitted.Reason},
	} {
		if *f.src != "" {
			*f.dst = *f.src
		}
	}
	return prefill
}

// reviewMessage says what a brain error means for the reviewer.
func reviewMessage(e *wire.Error) string {
	switch e.Reason {
	case wire.ReasonAlreadyResolved:
		return "This approval was already resolved, so your decision was not recorded."
	case wire.ReasonApprovalExpired:
		return "This approval has expired, so your decision was not recorded: the item went back to a human."
	}
	if e.Code == wire.CodeUnavailable {
		return "The brain is not answering right now; nothing was recorded. Try again in a moment."
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
// null is refused there, the CSRF token being checked in any case.
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
		u, err := url.Parse(origin)
		if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
			return "origin"
		}
	}
	return ""
}

// reviewApprovalID reads the {id} of a review route and answers 400
// unless it is a UUID.
func reviewApprovalID(w http.ResponseWriter, r *http.Request, reviewer string) (string, bool) {
	id := r.PathValue("id")
	if !validUUID(id) {
		annotate(r.Context(), slog.String("error_code", string(wire.CodeInvalid)))
		renderMessage(w, r, http.StatusBadRequest, page{Title: "No such approval", Reviewer: reviewer},
			"That is not an approval id. Open approvals from the list.")
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
	title := "Something went wrong"
	if e.Code == wire.CodeNotFound {
		title = "No such approval"
	}
	p.Title = title
	renderMessage(w, r, httpStatus(e), p, reviewMessage(e))
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
