package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"n8nbrain/catalogue"
	"n8nbrain/deploy/devstack"
	"n8nbrain/edge"
	"n8nbrain/registry"
)

// reviewSystem is a real system with the review page on, reviewers alice
// and bob, and a browser.
type reviewSystem struct {
	*system
	tenantID *devstack.Tenant
	edge     *edgeClient
	browser  *browser
}

const (
	alicePassword = "alice's long password"
	bobPassword   = "bob's long password"
)

func newReviewSystem(t *testing.T, id string, mutate func(*edge.Config)) *reviewSystem {
	t.Helper()
	br := newBrowser(t) // first: fails at once without chromium
	s := newSystem(t)
	sp := reviewSpec(id)
	sp.Rules = append(sp.Rules, registry.Rule{Name: "hostile", Match: registry.Match{SubjectKeywords: []string{"hostile"}},
		Category: "complaint", Priority: "high", Action: catalogue.DraftReply, Confidence: 0.6,
		Params: json.RawMessage(`{"subject":"Re: your file","body":"Please open report\u202Efdp.exe\u200b now."}`)})
	tn := s.tenant(sp)
	s.startBrain("r1", fastEvents)
	reviewers := writeReviewers(t, map[string]string{"alice": alicePassword, "bob": bobPassword})
	e := s.startEdge(tn, func(c *edge.Config) {
		c.ReviewersFile = reviewers
		c.ReviewTimeZone = "Australia/Sydney"
		c.ReviewClientIPHeader = "X-Forwarded-For"
		if mutate != nil {
			mutate(c)
		}
	})
	return &reviewSystem{system: s, tenantID: tn, edge: e, browser: br}
}

// submitEmail submits turn 1 of an e-mail and returns its approval id.
func (rs *reviewSystem) submitEmail(t *testing.T, id, from, subject, body string) string {
	t.Helper()
	rep := rs.edge.submit(emailTurn(id, from, subject, body)).reply(t)
	if rep.Action == nil || rep.Action.ApprovalID == "" {
		t.Fatalf("%s: no approval: %+v", id, rep)
	}
	return rep.Action.ApprovalID
}

// approvalRow is an approval as the tenant database holds it.
func (rs *reviewSystem) approvalRow(t *testing.T, id string) (status, by string, edited json.RawMessage, reason string) {
	t.Helper()
	var b, r *string
	err := rs.tenantDB(rs.tenantID).QueryRow(context.Background(),
		`SELECT status, decided_by, edited, reject_reason FROM approvals WHERE id = $1`, id).Scan(&status, &b, &edited, &r)
	if err != nil {
		t.Fatal(err)
	}
	if b != nil {
		by = *b
	}
	if r != nil {
		reason = *r
	}
	return status, by, edited, reason
}

// TestReviewPageInBrowser works the review page as an office reviewer
// would, in headless Chromium: sign in, the list, approve, edit, reject,
// the already-decided and expired cases, Enter that must not approve,
// keyboard-only approval, sign out.
func TestReviewPageInBrowser(t *testing.T) {
	rs := newReviewSystem(t, "browse-a", nil)
	base := rs.edge.base
	jo := rs.submitEmail(t, "<jo@customer.example>", "Jo Bloggs <jo@customer.example>", "Quote for a new deck please", "Hi, could you quote for a deck? Jo")
	job := rs.submitEmail(t, "<leak@smith.example>", "Smith & Sons <office@smith.example>", "Leak in the kitchen", "Water everywhere.")
	low := rs.submitEmail(t, "<hi@low.example>", "Larry <larry@low.example>", "hello from Larry", "Just saying hello.")
	norm := rs.submitEmail(t, "<q@normal.example>", "Norma <norma@normal.example>", "a question about tiles", "Which tiles?")
	sam := rs.submitEmail(t, "<sam@customer.example>", "Sam <sam@customer.example>", "Another quote", "Price for a fence?")

	alice := rs.browser.tab("alice", 1280, 900)

	t.Run("SignIn", func(t *testing.T) {
		alice.do(t, chromedp.Navigate(base+"/review"), chromedp.WaitVisible(css("#name")))
		if loc := alice.location(t); !strings.HasPrefix(loc, "/review/login?next=") {
			t.Fatalf("not signed in: at %s, want the sign-in page", loc)
		}
		alice.do(t,
			chromedp.SendKeys(css("#name"), "alice"),
			chromedp.SendKeys(css("#password"), "wrong password"),
			chromedp.Click(css(`form[action="/review/login"] button`)),
			chromedp.WaitVisible(css("#login-error")),
		)
		alice.wantText(t, "do not match a reviewer")
		alice.do(t, chromedp.Evaluate[chromedp.Void](`document.querySelector("#password").value = ""`))
		alice.signIn(t, base, "alice", alicePassword)
		if loc := alice.location(t); loc != "/review" {
			t.Errorf("after signing in: at %s, want /review", loc)
		}
		cookieFlags := eval[string](t, alice, `document.cookie`)
		if cookieFlags != "" {
			t.Errorf("the session cookie is readable by scripts: %q", cookieFlags)
		}
	})

	t.Run("LinkFromAnotherSite", func(t *testing.T) {
		// The approval_requested e-mail's link, followed from webmail:
		// another site (localhost against the edge's 127.0.0.1). The
		// reviewer signed in above arrives signed in.
		mail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			fmt.Fprintf(w, `<!doctype html><a id="link" href="%s/review/approvals/%s">Review the draft</a>`, base, jo)
		}))
		defer mail.Close()
		webmail := strings.Replace(mail.URL, "127.0.0.1", "localhost", 1)
		alice.do(t, chromedp.Navigate(webmail), chromedp.WaitVisible(css("#link")), chromedp.Click(css("#link")),
			chromedp.WaitVisible(css("main")))
		if loc := alice.location(t); loc != "/review/approvals/"+jo {
			t.Fatalf("the e-mail's link from another site led to %s, want the approval, signed in", loc)
		}
		alice.wantText(t, "Reply to Jo Bloggs")
	})

	t.Run("List", func(t *testing.T) {
		alice.do(t, chromedp.Navigate(base+"/review"), chromedp.WaitVisible(css("ol.queue")))
		summaries := eval[[]string](t, alice, `[...document.querySelectorAll("ol.queue a.what")].map(a => a.textContent)`)
		want := []string{"Create a job for Smith & Sons", "Reply to Jo Bloggs", "Reply to Sam", "Reply to Norma", "Reply to Larry"}
		if strings.Join(summaries, "|") != strings.Join(want, "|") {
			t.Errorf("the list reads %q, want most urgent then oldest: %q", summaries, want)
		}
		if h := eval[string](t, alice, `document.querySelector("header.top").innerText`); !strings.Contains(h, "Signed in as alice") {
			t.Errorf("the header reads %q", h)
		}
		alice.wantText(t, "From Smith & Sons", "office@smith.example", "Subject: Leak in the kitchen",
			"Urgent", "Booking", "High", "Quote request", "Waiting", "Expires in", "Showing 1–5 of 5")
		// Search by sender, then by subject.
		alice.do(t, chromedp.SendKeys(css("#q"), "smith"+kb.Enter))
		alice.waitFor(t, `location.search.includes("q=smith") && document.readyState === "complete"`)
		alice.wantText(t, "Showing 1–1 of 1", "Create a job for Smith & Sons")
		alice.do(t, chromedp.Navigate(base+"/review?q=tiles"), chromedp.WaitVisible(css("#count")))
		alice.wantText(t, "Reply to Norma")
		alice.do(t, chromedp.Navigate(base+"/review?status=approved"), chromedp.WaitVisible(css("main")))
		alice.wantText(t, "There are none")
	})

	t.Run("Approve", func(t *testing.T) {
		alice.do(t, chromedp.Navigate(base+"/review"), chromedp.WaitVisible(css("ol.queue")),
			chromedp.Click(css(`a[href="/review/approvals/`+jo+`"]`)),
			chromedp.WaitVisible(css("#approve-form")))
		alice.wantText(t, "Reply to Jo Bloggs", "Waiting for a decision", "Expires in", "Why this was proposed",
			"Quote request", "High", "your rule “quotes”", "95%", "Hi, could you quote for a deck? Jo",
			"When you approve, this reply is e-mailed to jo@customer.example")
		evidenceOpen := eval[bool](t, alice, `document.querySelector("#evidence").open`)
		if evidenceOpen {
			t.Error("the auditors' evidence (hashes) is open by default")
		}
		alice.do(t, chromedp.Click(css(`#approve-form button[value=approve]`)), chromedp.WaitVisible(css("#done-h")))
		// This edge has no webhook: the page says the workflow hears of it later.
		alice.wantText(t, "Approved", "Your decision is recorded. This edge passes no events to your workflow",
			"your workflow e-mails the reply to jo@customer.example.", "Next")
		if status, by, edited, _ := rs.approvalRow(t, jo); status != "approved" || by != "reviewer:alice" || edited != nil {
			t.Errorf("recorded %s by %s, edited %s; want approved by reviewer:alice as proposed", status, by, edited)
		}
		// The next item is one click away.
		next := eval[string](t, alice, `document.querySelector("#next").getAttribute("href")`)
		if next != "/review/approvals/"+job {
			t.Errorf("next is %s, want the most urgent waiting (%s)", next, job)
		}
	})

	t.Run("EditJob", func(t *testing.T) {
		alice.do(t, chromedp.Click(css("#next")), chromedp.WaitVisible(css("#approve-form")))
		ref := catalogue.ItemRef("<leak@smith.example>") // the brain's, one for each e-mail
		alice.wantText(t, "Create a job for Smith & Sons", "Reference (cannot be changed)", ref, "Set by the brain for this e-mail",
			"a job is created in your job system", ref+". If a job with that reference already exists, no second one is made")
		inputs := eval[int](t, alice, `document.querySelectorAll('[name="p.external_ref"]').length`)
		if inputs != 0 {
			t.Errorf("external_ref is editable: %d form controls", inputs)
		}
		alice.do(t,
			chromedp.Evaluate[chromedp.Void](`document.querySelector("#f-title").value = ""`),
			chromedp.SendKeys(css("#f-title"), "Fix the kitchen leak"),
			chromedp.SendKeys(css("#f-site_address"), "1 High St"),
			chromedp.Click(css(`#approve-form button[value=approve]`)),
			chromedp.WaitVisible(css("#done-h")))
		alice.wantText(t, "Approved with your changes", "your workflow creates the job in your job system.")
		status, by, edited, _ := rs.approvalRow(t, job)
		var p map[string]string
		_ = json.Unmarshal(edited, &p)
		if status != "approved" || by != "reviewer:alice" || p["title"] != "Fix the kitchen leak" || p["site_address"] != "1 High St" || p["external_ref"] != catalogue.ItemRef("<leak@smith.example>") {
			t.Errorf("recorded %s by %s with %s", status, by, edited)
		}
	})

	t.Run("EnterDoesNotApprove", func(t *testing.T) {
		alice.do(t, chromedp.Navigate(base+"/review/approvals/"+sam), chromedp.WaitVisible(css("#f-subject")),
			chromedp.Click(css("#f-subject")),
			chromedp.SendKeys(css("#f-subject"), " (edited)"),
			chromedp.KeyEvent(kb.Enter))
		// Give a submission every chance to happen: a page load would replace the form.
		alice.do(t, chromedp.Sleep(300*time.Millisecond))
		if loc := alice.location(t); loc != "/review/approvals/"+sam {
			t.Errorf("Enter in the subject navigated to %s", loc)
		}
		if status, _, _, _ := rs.approvalRow(t, sam); status != "pending" {
			t.Fatalf("Enter in the subject decided the approval: %s", status)
		}
	})

	t.Run("KeyboardOnly", func(t *testing.T) {
		// From the top of the page, Tab until the approve button has the focus, then Enter.
		alice.do(t, chromedp.Navigate(base+"/review/approvals/"+sam), chromedp.WaitVisible(css("#approve-form")),
			chromedp.Evaluate[chromedp.Void](`document.activeElement.blur()`))
		found := false
		for i := 0; i < 40 && !found; i++ {
			alice.do(t, chromedp.KeyEvent(kb.Tab))
			focused := eval[string](t, alice, `(document.activeElement.value || "") + "/" + getComputedStyle(document.activeElement).outlineStyle`)
			if strings.HasPrefix(focused, "approve/") {
				found = true
				if !strings.HasSuffix(focused, "/solid") {
					t.Errorf("the focused approve button shows no focus outline: %s", focused)
				}
			}
		}
		if !found {
			t.Fatal("Tab never reached the approve button")
		}
		alice.do(t, chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(css("#done-h")))
		if status, by, _, _ := rs.approvalRow(t, sam); status != "approved" || by != "reviewer:alice" {
			t.Errorf("keyboard approval recorded %s by %s", status, by)
		}
	})

	t.Run("Reject", func(t *testing.T) {
		alice.do(t, chromedp.Navigate(base+"/review/approvals/"+low), chromedp.WaitVisible(css("#reject-form")),
			chromedp.Click(css(`#reject-form button[value=reject]`)))
		// The reason is required: the browser keeps the form.
		alice.do(t, chromedp.Sleep(200*time.Millisecond))
		if status, _, _, _ := rs.approvalRow(t, low); status != "pending" {
			t.Fatalf("rejected without a reason: %s", status)
		}
		alice.do(t, chromedp.SendKeys(css("#reason"), "We do not reply to greetings."),
			chromedp.Click(css(`#reject-form button[value=reject]`)),
			chromedp.WaitVisible(css("#done-h")))
		alice.wantText(t, "Rejected", "Nothing will be sent or created")
		if status, by, _, reason := rs.approvalRow(t, low); status != "rejected" || by != "reviewer:alice" || reason != "We do not reply to greetings." {
			t.Errorf("recorded %s by %s because %q", status, by, reason)
		}
	})

	t.Run("AlreadyDecided", func(t *testing.T) {
		bob := rs.browser.tab("bob", 1280, 900)
		bob.signIn(t, base, "bob", bobPassword)
		bob.do(t, chromedp.Navigate(base+"/review/approvals/"+norm), chromedp.WaitVisible(css("#approve-form")))
		alice.do(t, chromedp.Navigate(base+"/review/approvals/"+norm), chromedp.WaitVisible(css("#approve-form")),
			chromedp.Click(css(`#approve-form button[value=approve]`)), chromedp.WaitVisible(css("#done-h")))
		bob.do(t, chromedp.Click(css(`#approve-form button[value=approve]`)), chromedp.WaitVisible(css("#error")))
		bob.wantText(t, "Someone already decided this approval, so your decision was not recorded", "Approved by alice")
		forms := eval[int](t, bob, `document.querySelectorAll("#approve-form").length`)
		if forms != 0 {
			t.Error("the decided approval still offers its form")
		}
		if status, by, _, _ := rs.approvalRow(t, norm); status != "approved" || by != "reviewer:alice" {
			t.Errorf("recorded %s by %s, want alice's approval only", status, by)
		}
	})

	t.Run("Expired", func(t *testing.T) {
		late := rs.submitEmail(t, "<late@customer.example>", "Lee <lee@customer.example>", "quote, late", "Hello")
		alice.do(t, chromedp.Navigate(base+"/review/approvals/"+late), chromedp.WaitVisible(css("#approve-form")))
		// Time runs out while the page is open.
		if _, err := rs.tenantDB(rs.tenantID).Exec(context.Background(),
			`UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = $1`, late); err != nil {
			t.Fatal(err)
		}
		alice.do(t, chromedp.Click(css(`#approve-form button[value=approve]`)), chromedp.WaitVisible(css("#error")))
		alice.wantText(t, "expired before your decision", "nothing was sent")
		if status, _, _, _ := rs.approvalRow(t, late); status == "approved" {
			t.Fatal("an expired approval was approved")
		}
		alice.do(t, chromedp.Navigate(base+"/review/approvals/"+late), chromedp.WaitVisible(css("main h1")))
		alice.wantText(t, "Expired: nobody decided in time")
		forms := eval[int](t, alice, `document.querySelectorAll("#approve-form, #reject-form").length`)
		if forms != 0 {
			t.Error("an expired approval offers its forms")
		}
	})

	t.Run("LocalTimes", func(t *testing.T) {
		// The edge writes Sydney time; the browser shows its own zone.
		ny := rs.browser.tab("new-york", 1280, 900)
		if _, err := chromedp.Call(ny.ctx, emulation.SetTimezoneOverride, emulation.SetTimezoneOverrideParams{TimezoneID: "America/New_York"}); err != nil {
			t.Fatal(err)
		}
		ny.signIn(t, base, "bob", bobPassword)
		ny.do(t, chromedp.Navigate(base+"/review/approvals/"+jo), chromedp.WaitVisible(css("time[data-local]")))
		times := eval[[]map[string]string](t, ny, `[...document.querySelectorAll("time[data-local]")].map(e => ({state: e.dataset.local, text: e.textContent, server: e.title}))`)
		if len(times) == 0 {
			t.Fatal("no times on the page")
		}
		for _, tm := range times {
			if tm["state"] != "browser" || !strings.Contains(tm["server"], "AE") || !strings.Contains(tm["text"], "ST") && !strings.Contains(tm["text"], "DT") {
				t.Errorf("time %v: want the server's Sydney time as its title and New York time shown", tm)
			}
		}
		// The page names its icon, so the browser does not ask for a
		// /favicon.ico that is not there (a 404 in every console). It is
		// loaded as an image, as the browser does: the page's CSP allows
		// images from itself and no fetch.
		icon := eval[string](t, ny, `new Promise(done => { const l = document.querySelector('link[rel="icon"]'); `+
			`if (!l) return done("no icon link"); const i = new Image(); i.onload = () => done("shown"); `+
			`i.onerror = () => done("not an image: " + l.href); i.src = l.href; })`, chromedp.EvalAwaitPromise)
		if icon != "shown" {
			t.Errorf("the page's icon: %s", icon)
		}
		ny.noScriptRan(t)
		ny.noRequestFailed(t)
	})

	t.Run("SignOut", func(t *testing.T) {
		alice.do(t, chromedp.Navigate(base+"/review"), chromedp.WaitVisible(css("header.top")),
			chromedp.Click(css(`header.top form[action="/review/logout"] button`)),
			chromedp.WaitVisible(css("#name")))
		alice.wantText(t, "You are signed out.")
		alice.do(t, chromedp.Navigate(base+"/review/approvals/"+jo), chromedp.WaitVisible(css("#name")))
		if loc := alice.location(t); !strings.HasPrefix(loc, "/review/login") {
			t.Errorf("after signing out, an approval opens at %s", loc)
		}
	})
	alice.noScriptRan(t)
}

// TestReviewPageNarrowAndHostile: at 375 px wide the list's links and the
// decision buttons are on screen; hostile content (script markup, bidi
// overrides, zero-width characters, a 50 KB body) is shown inert and
// visible, and does not push the decision off the page.
func TestReviewPageNarrowAndHostile(t *testing.T) {
	rs := newReviewSystem(t, "hostile-a", nil)
	base := rs.edge.base
	body := "Dear team,\nplease see the attached <img src=x onerror=\"window.__pwned=2\"> report\u202Efdp.exe\u200b today.\n" +
		strings.Repeat("This line pads the e-mail to fifty kilobytes of text for the reviewer. \n", 700)
	if len(body) < 50_000 {
		t.Fatalf("the body is %d bytes", len(body))
	}
	// The intake refuses hidden characters in ids; a display name, subject
	// and body keep them, and the page must show them.
	id := rs.submitEmail(t, "<hostile-gpj.exe@evil.example>", "Mallory \u202Efdp.exe <m@evil.example>",
		`hostile <script>window.__pwned=1</script> file`, body)
	rs.submitEmail(t, "<long@customer.example>", "A Very Long Sender Name That Goes On And On Pty Ltd <accounts-receivable-department@a-very-long-domain-name.example>",
		"quote: "+strings.Repeat("averyveryverylongwordwithoutanyspaces", 4)+strings.Repeat(" and more words", 120), "body")

	narrow := rs.browser.tab("narrow", 375, 740)
	narrow.signIn(t, base, "alice", alicePassword)

	t.Run("List375", func(t *testing.T) {
		narrow.do(t, chromedp.Navigate(base+"/review"), chromedp.WaitVisible(css("ol.queue")))
		boxes := eval[[]map[string]float64](t, narrow, `[...document.querySelectorAll("ol.queue a.what")].map(a => { const r = a.getBoundingClientRect(); return {left: r.left, right: r.right} })`)
		if len(boxes) != 2 {
			t.Fatalf("%d review links, want 2", len(boxes))
		}
		for _, b := range boxes {
			if b["left"] < 0 || b["right"] > 375 {
				t.Errorf("a review link is off screen at 375 px: %v", b)
			}
		}
		scroll := eval[float64](t, narrow, `document.scrollingElement.scrollWidth`)
		if scroll > 375 {
			t.Errorf("the list scrolls sideways at 375 px: %v px wide", scroll)
		}
		// A subject of 1,900 characters takes two lines of its row, not
		// screens of the queue (the approval shows it whole).
		heights := eval[[]float64](t, narrow, `[...document.querySelectorAll("ol.queue > li")].map(li => li.getBoundingClientRect().height)`)
		for _, h := range heights {
			if h > 320 {
				t.Errorf("a row of the queue is %v px high at 375 px: %v", h, heights)
			}
		}
		// The subject's markup is text; the bidi override in the sender is a visible marker.
		narrow.wantText(t, "<script>window.__pwned=1</script>", "Mallory ⟦U+202E right-to-left override⟧fdp.exe")
	})

	t.Run("Approval375", func(t *testing.T) {
		narrow.do(t, chromedp.Navigate(base+"/review/approvals/"+id), chromedp.WaitVisible(css("#approve-form")))
		boxes := eval[[]map[string]float64](t, narrow, `[...document.querySelectorAll("#approve-form button[value=approve], #reject-form button[value=reject]")].map(b => { const r = b.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top + scrollY} })`)
		if len(boxes) != 2 {
			t.Fatalf("%d decision buttons, want 2", len(boxes))
		}
		for _, b := range boxes {
			if b["left"] < 0 || b["right"] > 375 {
				t.Errorf("a decision button is off screen at 375 px: %v", b)
			}
		}
		scroll := eval[float64](t, narrow, `document.scrollingElement.scrollWidth`)
		if scroll > 375 {
			t.Errorf("the approval scrolls sideways at 375 px: %v px wide", scroll)
		}
	})

	wide := rs.browser.tab("wide", 1280, 900)
	wide.signIn(t, base, "alice", alicePassword)

	t.Run("HostileContent", func(t *testing.T) {
		wide.do(t, chromedp.Navigate(base+"/review/approvals/"+id), chromedp.WaitVisible(css("#approve-form")))
		pwned := eval[string](t, wide, `typeof window.__pwned`)
		if pwned != "undefined" {
			t.Fatalf("injected script ran: window.__pwned is %s", pwned)
		}
		injected := eval[int](t, wide, `document.querySelectorAll("main script, main img, main [onerror]").length`)
		if injected != 0 {
			t.Errorf("%d injected elements in the page", injected)
		}
		wide.wantText(t, "<script>window.__pwned=1</script>", `<img src=x onerror="window.__pwned=2">`,
			"report⟦U+202E right-to-left override⟧fdp.exe⟦U+200B zero-width space⟧ today",
			"Hidden characters.", "Show the rest of the e-mail")
		markers := eval[[]string](t, wide, `[...document.querySelectorAll(".hidden-char")].map(e => e.textContent)`)
		if len(markers) < 3 {
			t.Errorf("hidden characters shown as %d markers: %q", len(markers), markers)
		}
		// The proposed reply's hidden characters are markers in the form too.
		draft := eval[string](t, wide, `document.querySelector("#f-body").value`)
		if !strings.Contains(draft, "report⟦U+202E right-to-left override⟧fdp.exe⟦U+200B zero-width space⟧") {
			t.Errorf("the reply's hidden characters are not visible in the form: %q", draft)
		}
		// The evidence opens (the intake refuses such characters in ids, so
		// the message id is plain there).
		wide.do(t, chromedp.Click(css("#evidence summary")))
		wide.wantText(t, "hostile-gpj.exe@evil.example")

		// 50 KB are collapsed: the decision is within reach, the rest one click away.
		layout := eval[map[string]any](t, wide, `({open: document.querySelector("#email-rest").open, top: document.querySelector("#approve-form button[value=approve]").getBoundingClientRect().top + scrollY})`)
		if layout["open"] != false {
			t.Error("the long e-mail is not collapsed")
		}
		if top, _ := layout["top"].(float64); top > 3000 {
			t.Errorf("the approve button is %v px down the page", top)
		}
		wide.do(t, chromedp.Click(css("#email-rest summary")))
		var open bool
		var shown int
		open = eval[bool](t, wide, `document.querySelector("#email-rest").open`)
		shown = eval[int](t, wide, `document.querySelector("#email-rest pre").innerText.length`)
		if !open || shown < 45_000 {
			t.Errorf("expanding the e-mail: open %v, %d characters shown", open, shown)
		}

		// Approved as shown, the reply keeps its real characters: what was
		// approved is exactly what was proposed.
		wide.do(t, chromedp.Click(css(`#approve-form button[value=approve]`)), chromedp.WaitVisible(css("#done-h")))
		if status, _, edited, _ := rs.approvalRow(t, id); status != "approved" || edited != nil {
			t.Errorf("recorded %s with edit %s, want approved as proposed", status, edited)
		}
		wide.noScriptRan(t)
		narrow.noScriptRan(t)
	})

	t.Run("Headers", func(t *testing.T) {
		res, err := http.Get(base + "/review/login")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		csp := res.Header.Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'none'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'", "form-action 'self'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("CSP %q lacks %q", csp, want)
			}
		}
		if strings.Contains(csp, "unsafe-inline") {
			t.Errorf("CSP allows inline code: %q", csp)
		}
	})
}

// TestReviewSignInThrottle: guessing passwords is throttled per account
// and per address, before bcrypt, as the README documents (an account: 5
// failures, then one every 30 s; an address: 20, then one every 10 s),
// each refusal a 429 with Retry-After; and a reviewer signing in from
// elsewhere while a guesser hammers the page is not slowed: the median of
// their sign-in and list load under attack stays within 3× + 200 ms of the
// median in peace.
func TestReviewSignInThrottle(t *testing.T) {
	rs := newReviewSystem(t, "throttle-a", nil)
	base := rs.edge.base
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	login := func(ctx context.Context, name, from string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/review/login",
			strings.NewReader(url.Values{"name": {name}, "password": {"guess"}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		req.Header.Set("X-Forwarded-For", from)
		res, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res, nil
	}
	guess := func(name, from string) *http.Response {
		t.Helper()
		res, err := login(context.Background(), name, from)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// retryAfter is a refusal's Retry-After in seconds, 0 when missing or not a whole number.
	retryAfter := func(res *http.Response) int {
		n, err := strconv.Atoi(res.Header.Get("Retry-After"))
		if err != nil {
			return 0
		}
		return n
	}
	// burst makes n+3 failed sign-ins and wants n answered 401, then 429s
	// whose Retry-After is at most one refill interval.
	burst := func(what string, n int, every time.Duration, name, from func(i int) string) {
		t.Helper()
		var got []string
		ok := true
		for i := 0; i < n+3; i++ {
			res := guess(name(i), from(i))
			switch {
			case i < n && res.StatusCode == http.StatusUnauthorized:
				got = append(got, "401")
			case i >= n && res.StatusCode == http.StatusTooManyRequests:
				ra := retryAfter(res)
				if ra < 1 || ra > int(every.Seconds()) {
					ok = false
				}
				got = append(got, fmt.Sprintf("429 (Retry-After %q)", res.Header.Get("Retry-After")))
			default:
				ok = false
				got = append(got, fmt.Sprintf("%d (Retry-After %q)", res.StatusCode, res.Header.Get("Retry-After")))
			}
		}
		if !ok {
			t.Errorf("%s: %s; want %d refused with 401, then 429 with a Retry-After of 1 to %d seconds", what, strings.Join(got, ", "), n, int(every.Seconds()))
		}
	}
	burst("guesses at alice from 8 addresses", 5, 30*time.Second,
		func(int) string { return "alice" }, func(i int) string { return fmt.Sprintf("198.51.100.%d", i) })
	burst("guesses at 23 names from one address", 20, 10*time.Second,
		func(i int) string { return fmt.Sprintf("user%d", i) }, func(int) string { return "203.0.113.7" })

	// Bob signs in and opens the list, in peace and while a guesser sends
	// failed sign-ins for alice as fast as one connection can, in turns so
	// that both see the same machine; medians, since the machine is shared.
	work := func(name string) time.Duration {
		tb := rs.browser.tab(name, 1280, 900)
		start := time.Now()
		tb.signIn(t, base, "bob", bobPassword)
		tb.do(t, chromedp.Navigate(base+"/review"), chromedp.WaitVisible(css("main h1")))
		return time.Since(start)
	}
	// attack guesses at alice until stopped; started reports the first
	// refusal, and the returned function stops it and returns how many were
	// refused. Alice's bucket gains one attempt every 30 s, so a slow run
	// may see that many answered 401; every other guess is a 429.
	burstDone := time.Now()
	attack := func() (started <-chan struct{}, stop func() int) {
		ctx, cancel := context.WithCancel(context.Background())
		first := make(chan struct{})
		var refused, allowed int
		var wrong []string
		done := make(chan struct{})
		go func() {
			defer close(done)
			for ctx.Err() == nil {
				res, err := login(ctx, "alice", "192.0.2.66")
				switch {
				case err != nil:
					return // stopped
				case res.StatusCode == http.StatusTooManyRequests && retryAfter(res) >= 1:
					if refused++; refused == 1 {
						close(first)
					}
				case res.StatusCode == http.StatusUnauthorized:
					allowed++
				default:
					wrong = append(wrong, fmt.Sprintf("%d (Retry-After %q)", res.StatusCode, res.Header.Get("Retry-After")))
				}
			}
		}()
		return first, func() int {
			cancel()
			<-done
			if len(wrong) > 0 {
				t.Errorf("guesses at alice during the attack answered otherwise than 429 with Retry-After: %d, e.g. %s", len(wrong), wrong[0])
			}
			if refills := int(time.Since(burstDone)/(30*time.Second)) + 1; allowed > refills {
				t.Errorf("%d guesses at alice were tried during the attack, more than the %d her bucket regained", allowed, refills)
			}
			return refused
		}
	}
	const rounds = 5
	var quiet, attacked []time.Duration
	total := 0
	for i := 0; i < rounds; i++ {
		quiet = append(quiet, work(fmt.Sprintf("bob-quiet-%d", i)))
		started, stop := attack()
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			stop()
			t.Fatal("the guesser got no answer in 10 s")
		}
		attacked = append(attacked, work(fmt.Sprintf("bob-attacked-%d", i)))
		n := stop()
		if n == 0 {
			t.Errorf("round %d: no guesses were refused while bob signed in", i)
		}
		total += n
	}
	median := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	mq, ma := median(quiet), median(attacked)
	var attackTime time.Duration
	for _, d := range attacked {
		attackTime += d
	}
	t.Logf("bob signed in and loaded the list in %s (median of %d) in peace, %s while guesses were refused (%d, %.0f a second); all: %v / %v",
		mq.Round(time.Millisecond), rounds, ma.Round(time.Millisecond), total, float64(total)/attackTime.Seconds(), quiet, attacked)
	if bound := 3*mq + 200*time.Millisecond; ma > bound {
		t.Errorf("the guessing slowed bob: median %s under attack, more than 3 × %s + 200 ms = %s", ma.Round(time.Millisecond), mq.Round(time.Millisecond), bound.Round(time.Millisecond))
	}
}

// TestReviewListLoadsTwoHundred measures the list with 200 approvals
// pending, in the browser, and pages through them.
func TestReviewListLoadsTwoHundred(t *testing.T) {
	rs := newReviewSystem(t, "load-a", nil)
	base := rs.edge.base
	var wg sync.WaitGroup
	ids := make(chan int, 200)
	for i := 0; i < 200; i++ {
		ids <- i
	}
	close(ids)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ids {
				rs.submitEmail(t, fmt.Sprintf("<load-%d@customer.example>", i), fmt.Sprintf("Customer %d <c%d@customer.example>", i, i),
					fmt.Sprintf("quote number %d", i), "Please quote.")
			}
		}()
	}
	wg.Wait()
	tb := rs.browser.tab("load", 1280, 900)
	tb.signIn(t, base, "alice", alicePassword)
	var timings []string
	seen := 0
	next := base + "/review"
	for page := 1; next != ""; page++ {
		tb.do(t, chromedp.Navigate(next), chromedp.WaitVisible(css("#count")))
		m := eval[map[string]float64](t, tb, `(() => { const n = performance.getEntriesByType("navigation")[0]; return {response: n.responseEnd - n.requestStart, ready: n.domContentLoadedEventEnd - n.startTime, rows: document.querySelectorAll("ol.queue > li").length} })()`)
		seen += int(m["rows"])
		timings = append(timings, fmt.Sprintf("page %d: %d rows, server %.0f ms, ready %.0f ms", page, int(m["rows"]), m["response"], m["ready"]))
		next = eval[string](t, tb, `(document.querySelector('nav.pager a[href*="cursor="]') || {}).href || ""`)
	}
	if seen != 200 {
		t.Errorf("paged through %d approvals, want 200", seen)
	}
	tb.wantText(t, "of 200")
	t.Logf("200 pending approvals: %s", strings.Join(timings, "; "))
	// The whole queue as n8n would read it: one call.
	start := time.Now()
	r := rs.edge.do(http.MethodGet, "/v1/approvals?limit=200&brief=true", nil)
	t.Logf("GET /v1/approvals?limit=200&brief=true: %d in %s (%d bytes)", r.Status, time.Since(start).Round(time.Millisecond), len(r.Body))
}
