package edge

import (
	"context"
	"encoding/json"
	"html"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"n8nbrain/subjects"
	"n8nbrain/wire"
)

const (
	reviewer         = "alice"
	reviewerPassword = "correct horse battery staple"
)

// writeReviewers writes a reviewers file with alice and bob, at bcrypt's
// lowest cost so the tests stay fast.
func writeReviewers(t *testing.T) string {
	t.Helper()
	line := func(name, password string) string {
		h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
		must(t, err)
		return name + ":" + string(h) + "\n"
	}
	p := filepath.Join(t.TempDir(), "reviewers")
	must(t, os.WriteFile(p, []byte("# reviewers of client-zero\n\n"+line(reviewer, reviewerPassword)+line("bob", "bobs password")), 0o600))
	return p
}

// reviewEdge is an edge with the review page on and a fake brain.
func reviewEdge(t *testing.T) (*testEdge, *fakeAPI) {
	t.Helper()
	n := startNATS(t, false)
	fa := startFakeAPI(t, n, answerAPI)
	e := startEdge(t, n, func(c *Config) { c.ReviewersFile = writeReviewers(t) })
	return e, fa
}

// browserSession is a browser of the review page: a cookie jar, no
// redirects followed, the headers Chromium sends on the page's own forms.
type browserSession struct {
	e      *testEdge
	client *http.Client
}

func (e *testEdge) browser(t *testing.T) *browserSession {
	t.Helper()
	jar, err := cookiejar.New(nil)
	must(t, err)
	return &browserSession{e: e, client: &http.Client{
		Jar: jar, Timeout: e.client.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// signedIn is a browser in which alice signed in.
func (e *testEdge) signedIn(t *testing.T) *browserSession {
	t.Helper()
	b := e.browser(t)
	if r := b.login(t, reviewer, reviewerPassword, "/review"); r.status != http.StatusSeeOther || r.header.Get("Location") != "/review" {
		t.Fatalf("sign in: status %d Location %q body %s", r.status, r.header.Get("Location"), r.body)
	}
	return b
}

func (b *browserSession) login(t *testing.T, name, password, next string) response {
	t.Helper()
	return b.do(t, http.MethodPost, "/review/login", url.Values{"name": {name}, "password": {password}, "next": {next}}, nil)
}

// do sends a request; header entries with "" remove a header.
func (b *browserSession) do(t *testing.T, method, path string, form url.Values, header map[string]string) response {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.e.url+path, body)
	must(t, err)
	if form != nil {
		// What Chromium sends for a form of a page served with
		// Referrer-Policy: no-referrer.
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		req.Header.Set("Origin", "null")
	}
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := b.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	must(t, err)
	return response{status: resp.StatusCode, header: resp.Header, body: rb}
}

func (b *browserSession) get(t *testing.T, path string) response {
	t.Helper()
	return b.do(t, http.MethodGet, path, nil, nil)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`)

// withSession is the status of GET /review with only the session a
// Set-Cookie header gave (redirects not followed): 200 while the server
// holds it, 303 to the sign-in page once it ended.
func (e *testEdge) withSession(t *testing.T, setCookie string) int {
	t.Helper()
	name, value, _ := strings.Cut(strings.Split(setCookie, ";")[0], "=")
	req, err := http.NewRequest(http.MethodGet, e.url+"/review", nil)
	must(t, err)
	req.AddCookie(&http.Cookie{Name: name, Value: value})
	res, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	must(t, err)
	res.Body.Close()
	return res.StatusCode
}

// csrfOf loads an approval's page and returns its forms' token.
func (b *browserSession) csrfOf(t *testing.T, id string) string {
	t.Helper()
	r := b.get(t, "/review/approvals/"+id)
	// The first token on the page is the sign-out form's; the decision forms follow.
	m := csrfField.FindAllSubmatch(r.body, -1)
	if r.status != 200 || len(m) < 2 {
		t.Fatalf("approval page: status %d, no form token in\n%s", r.status, r.body)
	}
	return string(m[1][1])
}

func checkReviewHeaders(t *testing.T, r response) {
	t.Helper()
	for k, want := range map[string]string{
		"Content-Security-Policy": reviewCSP,
		"X-Content-Type-Options":  "nosniff",
		"Referrer-Policy":         "no-referrer",
		"Cache-Control":           "no-store",
		"X-Frame-Options":         "DENY",
	} {
		if got := r.header.Get(k); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
	if strings.Contains(reviewCSP, "unsafe") {
		t.Errorf("the CSP allows unsafe code: %s", reviewCSP)
	}
}

func TestReviewSignIn(t *testing.T) {
	t.Parallel()
	e, fa := reviewEdge(t)
	id := testUUID(11)

	t.Run("NotSignedIn", func(t *testing.T) {
		b := e.browser(t)
		r := b.get(t, "/review/approvals/"+id+"?done=1")
		if r.status != http.StatusSeeOther || r.header.Get("Location") != "/review/login?next="+url.QueryEscape("/review/approvals/"+id+"?done=1") {
			t.Errorf("status %d Location %q, want 303 to the sign-in page and back", r.status, r.header.Get("Location"))
		}
		checkReviewHeaders(t, r)
		if r := b.do(t, http.MethodPost, "/review/approvals/"+id, url.Values{"decision": {"approve"}}, nil); r.status != http.StatusUnauthorized ||
			!strings.Contains(string(r.body), "nothing was recorded") {
			t.Errorf("a post without a session: status %d body %s", r.status, r.body)
		}
		// HTTP Basic and the bearer token are not sessions.
		for _, auth := range []string{basic(reviewer, reviewerPassword), "Bearer " + testToken} {
			if r := b.do(t, http.MethodGet, "/review", nil, map[string]string{"Authorization": auth}); r.status != http.StatusSeeOther {
				t.Errorf("Authorization %q: status %d", auth[:6], r.status)
			}
		}
		r = b.get(t, "/review/login")
		if r.status != 200 || !strings.Contains(string(r.body), `name="password"`) {
			t.Errorf("the sign-in page: %d %s", r.status, r.body)
		}
		checkReviewHeaders(t, r)
	})

	t.Run("WrongPassword", func(t *testing.T) {
		for _, tc := range []struct{ name, password string }{
			{reviewer, "wrong"}, {"mallory", reviewerPassword}, {"bob", reviewerPassword}, {"Not A Name!", "x"},
		} {
			b := e.browser(t)
			r := b.login(t, tc.name, tc.password, "/review")
			if r.status != http.StatusUnauthorized || !strings.Contains(string(r.body), "do not match a reviewer") {
				t.Errorf("%s/%s: status %d body %s", tc.name, tc.password, r.status, r.body)
			}
			if len(r.header.Values("Set-Cookie")) != 0 {
				t.Errorf("a failed sign-in set a cookie: %v", r.header.Values("Set-Cookie"))
			}
		}
	})

	t.Run("SignInAndOut", func(t *testing.T) {
		b := e.browser(t)
		r := b.login(t, "Alice", reviewerPassword, "/review/approvals/"+id) // names ignore case
		if r.status != http.StatusSeeOther || r.header.Get("Location") != "/review/approvals/"+id {
			t.Fatalf("sign in: %d %q", r.status, r.header.Get("Location"))
		}
		c := r.header.Get("Set-Cookie")
		for _, want := range []string{"review-session=", "Path=/review", "HttpOnly", "SameSite=Lax"} {
			if !strings.Contains(c, want) {
				t.Errorf("session cookie %q lacks %s", c, want)
			}
		}
		if strings.Contains(c, "Secure") {
			t.Errorf("plain HTTP without EDGE_REVIEW_SECURE_COOKIE: %q", c)
		}
		page := b.get(t, "/review")
		if page.status != 200 || !strings.Contains(string(page.body), "Signed in as alice") {
			t.Fatalf("list: %d %s", page.status, page.body)
		}
		next(t, fa.calls, "approval.list")
		token := csrfField.FindSubmatch(page.body)
		if token == nil {
			t.Fatal("no sign-out form")
		}
		// Sign-out needs its form's token.
		if r := b.do(t, http.MethodPost, "/review/logout", url.Values{"csrf": {strings.Repeat("0", 64)}}, nil); r.status != http.StatusForbidden {
			t.Errorf("sign-out with a forged token: %d", r.status)
		}
		r = b.do(t, http.MethodPost, "/review/logout", url.Values{"csrf": {string(token[1])}}, nil)
		if r.status != http.StatusSeeOther || r.header.Get("Location") != "/review/login?signed_out=1" || !strings.Contains(r.header.Get("Set-Cookie"), "Max-Age=0") {
			t.Fatalf("sign-out: %d %q %q", r.status, r.header.Get("Location"), r.header.Get("Set-Cookie"))
		}
		// The old cookie is dead on the server too.
		if status := e.withSession(t, c); status != http.StatusSeeOther {
			t.Errorf("the signed-out session still works: %d", status)
		}
	})

	t.Run("SignInAgainEndsTheOldSession", func(t *testing.T) {
		// A browser that signs in again (another reviewer at the same
		// computer, or the same one): the session its cookie held must not
		// stay alive on the server, where Sign out could no longer end it.
		b := e.browser(t)
		first := b.login(t, reviewer, reviewerPassword, "/review")
		if r := b.login(t, reviewer, reviewerPassword, "/review"); r.status != http.StatusSeeOther {
			t.Fatalf("second sign-in: %d", r.status)
		}
		if status := e.withSession(t, first.header.Get("Set-Cookie")); status != http.StatusSeeOther {
			t.Errorf("the replaced session still works: %d", status)
		}
	})

	t.Run("NextMayNotLeaveTheReviewPage", func(t *testing.T) {
		for _, next := range []string{"/review/../v1/approvals", "/review/..%2F..%2Fhealthz", "/review/./x/../../healthz"} {
			b := e.browser(t)
			if r := b.login(t, reviewer, reviewerPassword, next); r.header.Get("Location") != "/review" {
				t.Errorf("next %q: Location %q, want /review", next, r.header.Get("Location"))
			}
		}
	})

	t.Run("CrossSiteSignIn", func(t *testing.T) {
		b := e.browser(t)
		r := b.do(t, http.MethodPost, "/review/login", url.Values{"name": {reviewer}, "password": {reviewerPassword}},
			map[string]string{"Sec-Fetch-Site": "cross-site"})
		if r.status != http.StatusForbidden || len(r.header.Values("Set-Cookie")) != 0 {
			t.Errorf("a cross-site sign-in: %d", r.status)
		}
	})

	t.Run("SecureCookie", func(t *testing.T) {
		n := startNATS(t, false)
		se := startEdge(t, n, func(c *Config) { c.ReviewersFile = writeReviewers(t); c.ReviewSecureCookie = true })
		r := se.browser(t).login(t, reviewer, reviewerPassword, "")
		if c := r.header.Get("Set-Cookie"); !strings.HasPrefix(c, "__Secure-review-session=") || !strings.Contains(c, "Secure") {
			t.Errorf("with EDGE_REVIEW_SECURE_COOKIE: %q", c)
		}
	})
	fa.none(t, "signing in and out")
}

func basic(name, password string) string {
	req, _ := http.NewRequest("GET", "/", nil)
	req.SetBasicAuth(name, password)
	return req.Header.Get("Authorization")
}

// TestReviewSignInThrottled: after the account's burst of failures, even
// the right password waits, and no bcrypt runs for a refused attempt.
func TestReviewSignInThrottled(t *testing.T) {
	t.Parallel()
	// The handler alone: signing in calls no brain, and the test reads
	// how often bcrypt ran.
	rv, err := loadReviewers(writeReviewers(t))
	must(t, err)
	auth := &reviewAuth{reviewers: rv, sessions: newSessions(time.Hour, time.Now), throttle: newLoginThrottle(time.Now)}
	srv := httptest.NewServer(newHandler(deps{auth: auth, csrfKey: csrfKey(testToken), logger: slog.New(slog.DiscardHandler),
		clock: &reviewClock{loc: time.UTC, now: time.Now}}))
	t.Cleanup(srv.Close)
	e := &testEdge{url: srv.URL, client: &http.Client{Timeout: 10 * time.Second}}
	b := e.browser(t)
	for i := range int(accountBucket.burst) {
		if r := b.login(t, "bob", "guess", ""); r.status != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d", i, r.status)
		}
	}
	before := auth.reviewers.compared.Load()
	for range 3 {
		r := b.login(t, "bob", "bobs password", "")
		if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" ||
			!strings.Contains(html.UnescapeString(string(r.body)), "Too many failed sign-ins for this name, from this computer or another.") {
			t.Fatalf("after 5 failures: %d %q %s", r.status, r.header.Get("Retry-After"), r.body)
		}
	}
	if got := auth.reviewers.compared.Load(); got != before {
		t.Errorf("throttled attempts ran bcrypt %d times", got-before)
	}
	// Alice, from the same address, is not held up by bob's lockout.
	if r := b.login(t, reviewer, reviewerPassword, ""); r.status != http.StatusSeeOther {
		t.Errorf("alice: %d", r.status)
	}
	// The address's own attempts run out too (names no reviewer can have
	// count against it only): that message speaks of this computer alone.
	var last response
	for range int(addressBucket.burst) {
		if last = b.login(t, "Not A Name!", "guess", ""); last.status == http.StatusTooManyRequests {
			break
		}
	}
	if page := html.UnescapeString(string(last.body)); last.status != http.StatusTooManyRequests ||
		!strings.Contains(page, "Too many failed sign-ins from this computer.") || strings.Contains(page, "this name") {
		t.Errorf("the address's attempts spent: %d %s", last.status, page)
	}
}

func TestLoginThrottle(t *testing.T) {
	t.Parallel()
	now := timeAt(0)
	th := newLoginThrottle(func() time.Time { return now })
	for i := range 5 {
		if w, _ := th.take("alice", "10.0.0.1"); w != 0 {
			t.Fatalf("attempt %d throttled for %s", i, w)
		}
	}
	if w, _ := th.take("alice", "10.0.0.2"); w != accountBucket.every {
		t.Errorf("sixth attempt at alice from another address: wait %s, want %s", w, accountBucket.every)
	}
	now = now.Add(accountBucket.every)
	if w, _ := th.take("alice", "10.0.0.3"); w != 0 {
		t.Errorf("after %s: wait %s", accountBucket.every, w)
	}
	if w, _ := th.take("alice", "10.0.0.3"); w == 0 {
		t.Error("one attempt came back, not two")
	}
	// A success forgets the account's failures.
	th.succeeded("alice", "10.0.0.3")
	if w, _ := th.take("alice", "10.0.0.3"); w != 0 {
		t.Errorf("after a success: wait %s", w)
	}
	// Per address: twenty attempts over any names.
	for i := range 20 {
		if w, _ := th.take("user"+strconv.Itoa(i), "192.0.2.1"); w != 0 {
			t.Fatalf("address attempt %d: wait %s", i, w)
		}
	}
	if w, _ := th.take("someone", "192.0.2.1"); w == 0 {
		t.Error("the address's 21st attempt went through")
	}
	if w, _ := th.take("", "192.0.2.2"); w != 0 {
		t.Errorf("another address is held up: %s", w)
	}
	// The tables stay bounded.
	for i := range maxThrottleKeys + 10 {
		_, _ = th.take("", "198.18."+strconv.Itoa(i/256)+"."+strconv.Itoa(i%256))
	}
	if len(th.addresses) > maxThrottleKeys {
		t.Errorf("%d addresses held, the bound is %d", len(th.addresses), maxThrottleKeys)
	}
}

func TestSessions(t *testing.T) {
	t.Parallel()
	now := timeAt(0)
	s := newSessions(time.Hour, func() time.Time { return now })
	tok := s.start("alice")
	if se, ok := s.get(tok); !ok || se.reviewer != "alice" {
		t.Fatalf("fresh session: %+v %v", se, ok)
	}
	if _, ok := s.get(tok + "x"); ok {
		t.Error("a wrong token is a session")
	}
	// Used every 50 minutes, it lives until its 12 hours are up.
	for i := 0; i < 14; i++ {
		now = now.Add(50 * time.Minute)
		_, ok := s.get(tok)
		if want := now.Sub(timeAt(0)) < sessionMaxAge; ok != want {
			t.Fatalf("at %s: live %v, want %v", now.Sub(timeAt(0)), ok, want)
		}
	}
	idle := s.start("bob")
	now = now.Add(time.Hour)
	if _, ok := s.get(idle); ok {
		t.Error("a session idle for an hour is live")
	}
	ended := s.start("bob")
	se, _ := s.get(ended)
	s.end(se.key)
	if _, ok := s.get(ended); ok {
		t.Error("an ended session is live")
	}
}

func timeAt(sec int) time.Time { return time.Date(2026, 3, 1, 9, 0, sec, 0, time.UTC) }

func TestClientAddress(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		remote, header, xff, want string
	}{
		{"192.0.2.7:5555", "", "203.0.113.1", "192.0.2.7"},
		{"192.0.2.7:5555", "X-Forwarded-For", "203.0.113.1, 198.51.100.2", "198.51.100.2"},
		{"192.0.2.7:5555", "X-Forwarded-For", "", "192.0.2.7"},
		{"[2001:db8:1:2:3:4:5:6]:443", "", "", "2001:db8:1:2::/64"},
		{"[::ffff:192.0.2.9]:1", "", "", "192.0.2.9"},
	} {
		r := httptest.NewRequest(http.MethodPost, "/review/login", nil)
		r.RemoteAddr = tc.remote
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		if got := clientAddress(r, tc.header); got != tc.want {
			t.Errorf("%s %s=%q: %q, want %q", tc.remote, tc.header, tc.xff, got, tc.want)
		}
	}
}

func TestLocalNext(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                              "/review",
		"/review":                       "/review",
		"/review/approvals/x?done=1":    "/review/approvals/x?done=1",
		"/review?status=approved&q=a b": "/review?status=approved&q=a b",
		"https://evil.example/review":   "/review",
		"//evil.example/review":         "/review",
		"/\\evil.example":               "/review",
		"/v1/approvals":                 "/review",
		"/reviewer":                     "/review",
		"/review/login?next=/x":         "/review",
		"javascript:alert(1)":           "/review",
	} {
		if got := localNext(in); got != want {
			t.Errorf("localNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestReviewOff(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	e := startEdge(t, n, nil)
	b := e.browser(t)
	for _, path := range []string{"/review", "/review/login", "/review/approvals/" + testUUID(1), "/review/x"} {
		r := b.get(t, path)
		if r.status != http.StatusNotFound || !strings.Contains(string(r.body), "EDGE_REVIEWERS_FILE") {
			t.Errorf("GET %s with the review page off: status %d body %s; want 404 saying why", path, r.status, r.body)
		}
	}
	e.logs.waitFor(t, "review page off")
}

func TestReviewAssets(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	e := startEdge(t, n, nil)
	b := e.browser(t)
	for name, ctype := range map[string]string{"review.css": "text/css", "review.js": "text/javascript", "icon.svg": "image/svg+xml"} {
		r := b.get(t, assetURL(name))
		if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), ctype) || r.header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: %d %q", name, r.status, r.header.Get("Content-Type"))
		}
	}
	if r := b.get(t, "/review/assets/nope.js"); r.status != 404 {
		t.Errorf("a missing asset: %d", r.status)
	}
}

func TestReviewPages(t *testing.T) {
	t.Parallel()
	e, fa := reviewEdge(t)
	b := e.signedIn(t)

	t.Run("List", func(t *testing.T) {
		r := b.get(t, "/review")
		if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/html") {
			t.Fatalf("status %d Content-Type %q", r.status, r.header.Get("Content-Type"))
		}
		checkReviewHeaders(t, r)
		page := string(r.body)
		for _, want := range []string{
			`href="/review/approvals/` + testUUID(1) + `"`, `href="/review/approvals/` + testUUID(2) + `"`,
			"Reply to Customer", "customer@example.com", "Quote for a new &lt;b&gt;hot water&lt;/b&gt; system",
			"High", "Quote request", "Waiting 1 min", "Expires in 23 h", "Showing 1–2 of 2", "Signed in as alice",
		} {
			if !strings.Contains(page, want) {
				t.Errorf("the list lacks %q:\n%s", want, page)
			}
		}
		c := next(t, fa.calls, "approval.list")
		var req wire.ApprovalListRequest
		must(t, wire.DecodeAPI(c.Body, &req))
		if req.Status != wire.ApprovalStatusPending || req.Limit != reviewPageSize || !req.Brief || req.Query != "" {
			t.Errorf("the list asked for %+v", req)
		}
		b.get(t, "/review?status=rejected&q=smith")
		must(t, wire.DecodeAPI(next(t, fa.calls, "approval.list").Body, &req))
		if req.Status != wire.ApprovalStatusRejected || req.Query != "smith" {
			t.Errorf("the filtered list asked for %+v", req)
		}
	})

	t.Run("Approval", func(t *testing.T) {
		id := testUUID(12)
		r := b.get(t, "/review/approvals/"+id)
		if r.status != 200 {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
		checkReviewHeaders(t, r)
		page := string(r.body)
		if strings.Contains(page, "<script>alert") || strings.Contains(page, "<b>hot water</b>") {
			t.Errorf("the e-mail's markup reached the page unescaped:\n%s", page)
		}
		a := sampleApproval(id)
		for _, want := range []string{
			"Reply to Customer", "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;", "Tom &amp; Jerry",
			"Quote for a new &lt;b&gt;hot water&lt;/b&gt; system", "Customer &lt;customer@example.com&gt;",
			"Why this was proposed", "the AI model", "82%", "Quote request",
			"e-mailed to customer@example.com", "Approve and send the reply",
			`value="Re: Quote for a new hot water system"`, "we can quote on Tuesday.", a.ProposedSHA256,
			`name="decision" value="approve"`, `name="decision" value="reject"`, `name="reason"`,
			`<select id="f-tone" name="p.tone"`, `<option value="friendly" selected>`,
		} {
			if !strings.Contains(page, want) {
				t.Errorf("the page lacks %q", want)
			}
		}
		// Enter in a field must not send the decision: the form's first
		// submit button is disabled (HTML implicit submission).
		form := page[strings.Index(page, `<form id="approve-form"`):]
		if first := regexp.MustCompile(`<button[^>]*>`).FindString(form); !strings.Contains(first, "disabled") {
			t.Errorf("the decision form's first button is %s, want a disabled one", first)
		}
		if c := next(t, fa.calls, "approval.get"); c.approvalID() != id {
			t.Errorf("the page asked for %s", c.Body)
		}
	})

	t.Run("Decided", func(t *testing.T) {
		r := b.get(t, "/review/approvals/"+idDecided)
		page := string(r.body)
		if r.status != 200 || strings.Contains(page, `id="approve-form"`) || strings.Contains(page, `id="reject-form"`) {
			t.Fatalf("status %d; a decided approval must show no decision forms:\n%s", r.status, page)
		}
		for _, want := range []string{"Approved with changes by bob", "Edited by Bob", "with the reviewer's changes", "Next"} {
			if !strings.Contains(page, want) {
				t.Errorf("the decided approval's page lacks %q", want)
			}
		}
		next(t, fa.calls, "approval.get")
		next(t, fa.calls, "approval.list") // the next pending item
	})

	t.Run("PastExpiry", func(t *testing.T) {
		r := b.get(t, "/review/approvals/"+idPastExpiry)
		page := string(r.body)
		if r.status != 200 || strings.Contains(page, `id="approve-form"`) || !strings.Contains(page, "Expired: nobody decided in time") {
			t.Errorf("status %d; an approval past its expiry must say so and show no forms:\n%s", r.status, page)
		}
		next(t, fa.calls, "approval.get")
		next(t, fa.calls, "approval.list")
	})

	t.Run("NotFound", func(t *testing.T) {
		r := b.get(t, "/review/approvals/"+idNotFound)
		if r.status != 404 || !strings.Contains(string(r.body), "No such approval") {
			t.Errorf("status %d body %s", r.status, r.body)
		}
		next(t, fa.calls, "approval.get")
		if r := b.get(t, "/review/approvals/nope"); r.status != 400 {
			t.Errorf("a bad id: status %d", r.status)
		}
	})

	t.Run("TrailingSlash", func(t *testing.T) {
		if r := b.get(t, "/review/"); r.status != http.StatusMovedPermanently || r.header.Get("Location") != "/review" {
			t.Errorf("/review/: status %d Location %q, want 301 to /review", r.status, r.header.Get("Location"))
		}
	})

	t.Run("NoSuchPage", func(t *testing.T) {
		for _, path := range []string{"/review/approval/" + idNotFound, "/review/approvals", "/review/x/y"} {
			r := b.get(t, path)
			if r.status != http.StatusNotFound || !strings.HasPrefix(r.header.Get("Content-Type"), "text/html") ||
				!strings.Contains(string(r.body), "No such page") || !strings.Contains(string(r.body), `href="/review"`) {
				t.Errorf("GET %s: status %d Content-Type %q body %s; want the review page's 404", path, r.status, r.header.Get("Content-Type"), r.body)
			}
			checkReviewHeaders(t, r)
		}
	})
}

func TestReviewDecide(t *testing.T) {
	t.Parallel()
	e, fa := reviewEdge(t)
	b := e.signedIn(t)

	post := func(t *testing.T, id string, form url.Values) response {
		t.Helper()
		r := b.do(t, http.MethodPost, "/review/approvals/"+id, form, nil)
		if r.status != http.StatusSeeOther || r.header.Get("Location") != "/review/approvals/"+id+"?done=1" {
			t.Fatalf("status %d Location %q, want 303 to the confirmation; body %s", r.status, r.header.Get("Location"), r.body)
		}
		checkReviewHeaders(t, r)
		return r
	}
	// decided returns the decision that reached the brain, after the
	// approval.get of the page and of the post.
	decided := func(t *testing.T, id string) wire.ApprovalDecideRequest {
		t.Helper()
		for range 2 {
			if c := next(t, fa.calls, "approval.get"); c.Method != subjects.APIApprovalGet {
				t.Fatalf("the brain got %s, want approval.get", c.Method)
			}
		}
		req := next(t, fa.calls, "approval.decide").decide(t)
		if req.ApprovalID != id || req.By != "reviewer:alice" {
			t.Errorf("the brain got %+v, want approval %s by reviewer:alice", req, id)
		}
		return req
	}
	proposedForm := func(token string) url.Values {
		return url.Values{"decision": {"approve"}, "csrf": {token},
			"p.subject": {"Re: Quote for a new hot water system"}, "p.body": {"Hello,\r\nwe can quote on Tuesday.\r\nRegards"}}
	}

	t.Run("ApproveUnchanged", func(t *testing.T) {
		id := testUUID(21)
		post(t, id, proposedForm(b.csrfOf(t, id)))
		if req := decided(t, id); req.Decision != wire.DecisionApprove || req.Edited != nil {
			t.Errorf("the brain got %+v, want approve as proposed", req)
		}
	})

	t.Run("Edit", func(t *testing.T) {
		id := testUUID(22)
		f := proposedForm(b.csrfOf(t, id))
		f.Set("p.subject", "Re: Your quote")
		f.Set("p.body", "Hello,\r\nTuesday at 9 works.\r\n<b>Bob</b> ⟦U+202E right-to-left override⟧")
		f.Set("p.tone", "formal")
		post(t, id, f)
		req := decided(t, id)
		want := `{"body":"Hello,\nTuesday at 9 works.\n\u003cb\u003eBob\u003c/b\u003e ` + "\u202e" + `","subject":"Re: Your quote","tone":"formal"}`
		if req.Decision != wire.DecisionEdit || string(req.Edited) != want {
			t.Errorf("the brain got %s %s, want edit with %s", req.Decision, req.Edited, want)
		}
	})

	t.Run("EditAtTheCatalogueLimit", func(t *testing.T) {
		// 20,000 characters of 4 bytes: 240 KB once percent-encoded, a
		// draft the catalogue allows; the form carries it.
		id := testUUID(28)
		body := strings.Repeat("😀", 20_000)
		f := proposedForm(b.csrfOf(t, id))
		f.Set("p.body", body)
		post(t, id, f)
		req := decided(t, id)
		var got struct{ Body string }
		if err := json.Unmarshal(req.Edited, &got); req.Decision != wire.DecisionEdit || err != nil || got.Body != body {
			t.Errorf("the brain got %s with a body of %d characters, want edit with all %d", req.Decision, len([]rune(got.Body)), 20_000)
		}
	})

	t.Run("Reject", func(t *testing.T) {
		id := testUUID(23)
		post(t, id, url.Values{"decision": {"reject"}, "csrf": {b.csrfOf(t, id)}, "reason": {"  already answered by phone \r\n"}})
		if req := decided(t, id); req.Decision != wire.DecisionReject || req.Reason != "already answered by phone" {
			t.Errorf("the brain got %+v", req)
		}
	})

	t.Run("Confirmation", func(t *testing.T) {
		// The fake brain's record says bob decided idDecided: alice gets no confirmation for it.
		r := b.get(t, "/review/approvals/"+idDecided+"?done=1")
		if strings.Contains(string(r.body), `id="done-h"`) {
			t.Error("a confirmation of somebody else's decision")
		}
		next(t, fa.calls, "approval.get")
		next(t, fa.calls, "approval.list")
	})

	t.Run("OlderBrowser", func(t *testing.T) {
		// No Fetch Metadata; the Origin is this host.
		id := testUUID(26)
		f := proposedForm(b.csrfOf(t, id))
		r := b.do(t, http.MethodPost, "/review/approvals/"+id, f, map[string]string{"Sec-Fetch-Site": "", "Origin": e.url})
		if r.status != http.StatusSeeOther {
			t.Fatalf("status %d, want 303; body %s", r.status, r.body)
		}
		decided(t, id)
	})

	t.Run("AlreadyResolved", func(t *testing.T) {
		token := b.csrfOf(t, idResolved)
		next(t, fa.calls, "approval.get")
		r := b.do(t, http.MethodPost, "/review/approvals/"+idResolved, proposedForm(token), nil)
		if r.status != http.StatusConflict || !strings.Contains(string(r.body), "Someone already decided this approval") {
			t.Errorf("status %d, want 409 and the page saying it is already decided:\n%s", r.status, r.body)
		}
		checkReviewHeaders(t, r)
		for _, m := range []string{subjects.APIApprovalGet, subjects.APIApprovalDecide, subjects.APIApprovalGet} {
			if c := next(t, fa.calls, m); c.Method != m {
				t.Errorf("the brain got %s, want %s", c.Method, m)
			}
		}
	})

	t.Run("RejectWithoutReason", func(t *testing.T) {
		id := testUUID(24)
		token := b.csrfOf(t, id)
		next(t, fa.calls, "approval.get")
		r := b.do(t, http.MethodPost, "/review/approvals/"+id, url.Values{"decision": {"reject"}, "csrf": {token}, "reason": {"  "}}, nil)
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "needs a reason") {
			t.Errorf("status %d body %s, want 400 asking for a reason", r.status, r.body)
		}
		next(t, fa.calls, "approval.get")
	})

	t.Run("EditKeepsTypedText", func(t *testing.T) {
		id := testUUID(25)
		token := b.csrfOf(t, id)
		next(t, fa.calls, "approval.get")
		f := proposedForm(token)
		f.Set("p.subject", "two\nlines")
		f.Set("p.body", "my careful <edit>")
		r := b.do(t, http.MethodPost, "/review/approvals/"+id, f, nil)
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), html.EscapeString("my careful <edit>")) ||
			!strings.Contains(string(r.body), "Subject must be one line") {
			t.Errorf("status %d, want 400 with the typed body kept:\n%s", r.status, r.body)
		}
		next(t, fa.calls, "approval.get")
	})

	t.Run("EditBreaksSchema", func(t *testing.T) {
		id := testUUID(27)
		token := b.csrfOf(t, id)
		next(t, fa.calls, "approval.get")
		f := proposedForm(token)
		f.Set("p.subject", strings.Repeat("x", 301))
		r := b.do(t, http.MethodPost, "/review/approvals/"+id, f, nil)
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "Subject is longer than 300 characters.") {
			t.Errorf("status %d, want 400 naming the field:\n%s", r.status, r.body)
		}
		next(t, fa.calls, "approval.get")
	})

	id := testUUID(30)
	token := b.csrfOf(t, id)
	next(t, fa.calls, "approval.get")
	for _, tc := range []struct {
		name   string
		form   url.Values
		header map[string]string
	}{
		{"NoCSRF", url.Values{"decision": {"approve"}}, nil},
		{"WrongCSRF", url.Values{"decision": {"approve"}, "csrf": {strings.Repeat("0", 64)}}, nil},
		{"OtherApprovalsCSRF", url.Values{"decision": {"approve"}, "csrf": {b.csrfOf(t, testUUID(31))}}, nil},
		{"CrossSite", url.Values{"decision": {"approve"}, "csrf": {token}}, map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"SameSite", url.Values{"decision": {"approve"}, "csrf": {token}}, map[string]string{"Sec-Fetch-Site": "same-site"}},
		{"ForeignOrigin", url.Values{"decision": {"approve"}, "csrf": {token}},
			map[string]string{"Sec-Fetch-Site": "", "Origin": "https://evil.example"}},
		{"NullOriginWithoutFetchMetadata", url.Values{"decision": {"approve"}, "csrf": {token}}, map[string]string{"Sec-Fetch-Site": "", "Origin": "null"}},
		{"SameOriginForeignOrigin", url.Values{"decision": {"approve"}, "csrf": {token}},
			map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "https://evil.example"}},
		// No browser sends an Origin with more than scheme, host and port.
		{"OriginWithUserinfo", url.Values{"decision": {"approve"}, "csrf": {token}},
			map[string]string{"Sec-Fetch-Site": "", "Origin": "http://evil.example@" + strings.TrimPrefix(e.url, "http://")}},
		{"OriginWithPath", url.Values{"decision": {"approve"}, "csrf": {token}},
			map[string]string{"Sec-Fetch-Site": "", "Origin": e.url + "/review"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := b.do(t, http.MethodPost, "/review/approvals/"+id, tc.form, tc.header)
			if r.status != http.StatusForbidden {
				t.Errorf("status %d, want 403; body %s", r.status, r.body)
			}
			checkReviewHeaders(t, r)
		})
	}
	next(t, fa.calls, "approval.get") // of OtherApprovalsCSRF's page
	fa.none(t, "a refused post")

	// Another session's token is not this one's, even for the same reviewer.
	other := e.signedIn(t)
	otherToken := other.csrfOf(t, id)
	next(t, fa.calls, "approval.get")
	if r := b.do(t, http.MethodPost, "/review/approvals/"+id, url.Values{"decision": {"approve"}, "csrf": {otherToken}}, nil); r.status != 403 {
		t.Errorf("a token of another session: status %d, want 403", r.status)
	}
	fa.none(t, "a post with another session's token")
}

// TestReviewConfirmationSaysWhatHappensNext: once alice approved, the page
// says her workflow now sends the reply only where this edge delivers the
// brain's events to n8n; without a webhook it says that nothing happens
// until an edge that does delivers the decision.
func TestReviewConfirmationSaysWhatHappensNext(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	startFakeAPI(t, n, answerAPI)
	for _, tc := range []struct {
		name        string
		webhook     bool
		want, avoid string
	}{
		{"WithWebhook", true, "Your workflow now e-mails the reply to customer@example.com.", "EDGE_WEBHOOK_URL"},
		{"WithoutWebhook", false, "This edge passes no events to your workflow (EDGE_WEBHOOK_URL is not set), so nothing happens yet: " +
			"once an edge that does delivers the decision, your workflow e-mails the reply to customer@example.com.", "Your workflow now"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e *testEdge
			if tc.webhook {
				e = webhookEdge(t, n, startFakeN8N(t, always(200)), func(c *Config) { c.ReviewersFile = writeReviewers(t) })
			} else {
				e = startEdge(t, n, func(c *Config) { c.ReviewersFile = writeReviewers(t) })
			}
			r := e.signedIn(t).get(t, "/review/approvals/"+idAliceApproved+"?done=1")
			page := html.UnescapeString(string(r.body))
			if r.status != 200 || !strings.Contains(page, `id="done-h"`) {
				t.Fatalf("status %d; want alice's confirmation:\n%s", r.status, page)
			}
			if !strings.Contains(page, tc.want) || strings.Contains(page, tc.avoid) {
				t.Errorf("the confirmation does not say %q, or says %q:\n%s", tc.want, tc.avoid, page)
			}
		})
	}
}

// TestReviewOutageSaysWhatItMeans: while the brain or the tenant's
// database does not answer, a page only looked at says it cannot be shown
// (not that nothing was recorded), and a decision says it was not recorded;
// one whose approval could not even be read says the typed text is one page
// back.
func TestReviewOutageSaysWhatItMeans(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	var down atomic.Bool
	startFakeAPI(t, n, func(c apiCall) apiAnswer {
		if down.Load() {
			return apiAnswer{Error: &wire.Error{Code: wire.CodeUnavailable, RetryAfter: 2,
				Message: "the tenant's database did not answer this call (restarting, out of connections or briefly locked); retry shortly"}}
		}
		return answerAPI(c)
	})
	e := startEdge(t, n, func(c *Config) { c.ReviewersFile = writeReviewers(t) })
	b := e.signedIn(t)
	id := testUUID(31)
	token := b.csrfOf(t, id)
	down.Store(true)
	for _, tc := range []struct {
		name        string
		do          func() response
		want, want2 string
	}{
		{"List", func() response { return b.get(t, "/review") }, "This cannot be shown right now: the brain or your database is not answering.", ""},
		{"Approval", func() response { return b.get(t, "/review/approvals/"+id) }, "This cannot be shown right now", ""},
		{"Decide", func() response {
			return b.do(t, http.MethodPost, "/review/approvals/"+id, url.Values{"decision": {"approve"}, "csrf": {token},
				"p.subject": {"Re: Quote"}, "p.body": {"Edited"}}, nil)
		}, "Your decision was not recorded: the brain or your database is not answering right now.", "What you typed is not lost: go back with your browser's Back button"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.do()
			page := html.UnescapeString(string(r.body))
			if r.status != http.StatusServiceUnavailable || !strings.Contains(page, tc.want) || !strings.Contains(page, tc.want2) {
				t.Errorf("status %d, want 503 saying %q %q:\n%s", r.status, tc.want, tc.want2, page)
			}
			if tc.name != "Decide" && strings.Contains(page, "recorded") {
				t.Errorf("a page only looked at speaks of recording:\n%s", page)
			}
			checkReviewHeaders(t, r)
		})
	}
}

func TestLoadReviewers(t *testing.T) {
	t.Parallel()
	hash, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	must(t, err)
	h := string(hash)
	for _, tc := range []struct {
		name    string
		file    string
		wantErr string
	}{
		{"Valid", "# comment\n\n  alice:" + h + "  \nbob.smith_2-x:" + h + "\n", ""},
		{"Empty", "# nobody yet\n", "no reviewers"},
		{"NoColon", "alice\n", "line 1"},
		{"UppercaseName", "Alice:" + h + "\n", "reviewer name"},
		{"LongName", strings.Repeat("a", 65) + ":" + h + "\n", "reviewer name"},
		{"NotBcrypt", "alice:" + "$1$plainmd5$abc" + "\n", "not a bcrypt hash"},
		{"Twice", "alice:" + h + "\nalice:" + h + "\n", "listed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := filepath.Join(t.TempDir(), "reviewers")
			must(t, os.WriteFile(p, []byte(tc.file), 0o600))
			rv, err := loadReviewers(p)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), h) {
					t.Errorf("the error shows the hash: %v", err)
				}
				return
			}
			must(t, err)
			ctx := context.Background()
			if !rv.check(ctx, "alice", "pw") || !rv.check(ctx, "bob.smith_2-x", "pw") || rv.check(ctx, "alice", "px") || rv.check(ctx, "carol", "pw") {
				t.Errorf("check does not match the file")
			}
		})
	}

	// A bad file stops the edge at start.
	p := filepath.Join(t.TempDir(), "reviewers")
	must(t, os.WriteFile(p, []byte("alice:nothash\n"), 0o600))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	err = Serve(context.Background(), ln, Config{NATSURL: "nats://127.0.0.1:1", CredsFile: "x", Token: testToken, ReviewersFile: p}, nil)
	if err == nil || !strings.Contains(err.Error(), "EDGE_REVIEWERS_FILE") {
		t.Errorf("Serve with a bad reviewers file: %v", err)
	}
}

// draftEdge is a review edge whose fake brain answers approval.get for the
// ids in drafts with a pending draft_reply changed by its function, and
// everything else as answerAPI does.
func draftEdge(t *testing.T, drafts map[string]func(*wire.Approval, *wire.Email)) (*testEdge, *fakeAPI) {
	t.Helper()
	n := startNATS(t, false)
	fa := startFakeAPI(t, n, func(c apiCall) apiAnswer {
		if f, ok := drafts[c.approvalID()]; ok && c.Method == subjects.APIApprovalGet {
			a, e := sampleApproval(c.approvalID()), sampleEmail()
			f(&a, e)
			a.ProposedSHA256 = wire.ContentSHA256(a.Proposed)
			return apiAnswer{Reply: wire.ApprovalGetReply{Approval: a, Email: e}}
		}
		return answerAPI(c)
	})
	return startEdge(t, n, func(c *Config) { c.ReviewersFile = writeReviewers(t) }), fa
}

func draft(subject, body string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"subject": subject, "body": body, "tone": "friendly"})
	return b
}

var (
	bodyFieldRe    = regexp.MustCompile(`(?s)<textarea id="f-body" name="p.body"[^>]*>\n(.*?)</textarea>`)
	subjectFieldRe = regexp.MustCompile(`<input type="text" id="f-subject" name="p.subject" value="([^"]*)"`)
	approveTokenRe = regexp.MustCompile(`(?s)id="approve-form".*?name="csrf" value="([0-9a-f]{64})"`)
)

// unchangedForm is the approve form as a browser sends it when the
// reviewer changes nothing: the fields as the page wrote them, newlines
// as CRLF.
func unchangedForm(t *testing.T, page string) url.Values {
	t.Helper()
	body, subject, token := bodyFieldRe.FindStringSubmatch(page), subjectFieldRe.FindStringSubmatch(page), approveTokenRe.FindStringSubmatch(page)
	if body == nil || subject == nil || token == nil {
		t.Fatalf("no approve form in the page:\n%.2000s", page)
	}
	crlf := strings.ReplaceAll(html.UnescapeString(body[1]), "\n", "\r\n")
	return url.Values{"decision": {"approve"}, "csrf": {token[1]}, "p.subject": {html.UnescapeString(subject[1])},
		"p.body": {crlf}, "p.tone": {"friendly"}}
}

// What the form shows is what it sends back: a draft approved unchanged
// is approved as proposed, whatever it holds. Text shaped like a marker
// stays text (it used to become the hidden character it named, recorded
// as the reviewer's edit); a draft whose every character is hidden still
// fits the form; characters that render as nothing are all marked.
func TestReviewFormSendsBackWhatItShows(t *testing.T) {
	t.Parallel()
	const (
		idLiteral = iota + 801
		idControls
		idAllHidden
		idSmuggled
		idNames
		idLineBreak
	)
	smuggled := "OK\U000E0158\U000E0159\u17B4\u2800\u180B thanks ❤\uFE0F"
	allHidden := strings.Repeat("\uFEFF", 20_000)
	drafts := map[string]func(*wire.Approval, *wire.Email){
		testUUID(idLiteral): func(a *wire.Approval, _ *wire.Email) {
			a.Proposed = draft("Re: refund", "Your form: refund⟦U+202E see attached⟧fdp.exe\nand ⟦U+E0049⟧ thanks")
		},
		testUUID(idControls): func(a *wire.Approval, _ *wire.Email) {
			a.Proposed = draft("Re: a⟦U+2028⟧Bcc: x@evil.example", "Hi\n.⟦U+000D⟧\nMAIL FROM:<x@evil.example>⟦U+001B⟧[2J")
		},
		testUUID(idAllHidden): func(a *wire.Approval, _ *wire.Email) {
			a.Proposed = draft(strings.Repeat("\u180E", 300), allHidden)
		},
		testUUID(idSmuggled): func(a *wire.Approval, _ *wire.Email) { a.Proposed = draft("Re: x", smuggled) },
		testUUID(idNames): func(a *wire.Approval, m *wire.Email) {
			a.Sender, a.Recipient = "Mallory \u202Efdp.exe <m@evil.example>", "boss@\u202Emoc.elpmaxe"
			m.From = a.Sender
		},
		testUUID(idLineBreak): func(a *wire.Approval, _ *wire.Email) { a.Proposed = draft("Re: a\u2028b", "Hello") },
	}
	e, fa := draftEdge(t, drafts)
	b := e.signedIn(t)
	page := func(t *testing.T, id int) string {
		t.Helper()
		r := b.get(t, "/review/approvals/"+testUUID(id))
		next(t, fa.calls, "approval.get")
		return string(r.body)
	}
	approveUnchanged := func(t *testing.T, id int) wire.ApprovalDecideRequest {
		t.Helper()
		f := unchangedForm(t, page(t, id))
		r := b.do(t, http.MethodPost, "/review/approvals/"+testUUID(id), f, nil)
		if r.status != http.StatusSeeOther {
			t.Fatalf("the unchanged form (%d bytes, limit %d): status %d %.500s", len(f.Encode()), maxDecideForm, r.status, r.body)
		}
		next(t, fa.calls, "approval.get")
		return next(t, fa.calls, "approval.decide").decide(t)
	}

	for _, tc := range []struct {
		name string
		id   int
	}{{"LiteralMarkerStaysText", idLiteral}, {"LiteralControlMarkersStayText", idControls}, {"EveryCharacterHidden", idAllHidden}, {"Smuggled", idSmuggled}} {
		t.Run(tc.name, func(t *testing.T) {
			if req := approveUnchanged(t, tc.id); req.Decision != wire.DecisionApprove || req.Edited != nil {
				t.Errorf("an unchanged form reached the brain as %s %s, want approve as proposed", req.Decision, req.Edited)
			}
		})
	}

	t.Run("LiteralMarkerIsShownAsText", func(t *testing.T) {
		p := html.UnescapeString(strings.NewReplacer(`<span class="hidden-char">`, "", "</span>", "").Replace(page(t, idLiteral)))
		if !strings.Contains(p, "refund⟦U+27E6 bracket as written⟧U+202E see attached⟧fdp.exe") || !strings.Contains(p, "Hidden characters.") {
			t.Errorf("the page does not show the draft's ⟦ as written in the form, with the notice:\n%.3000s", p)
		}
	})
	t.Run("SmuggledCharactersAreMarked", func(t *testing.T) {
		p := page(t, idSmuggled)
		for _, r := range "\U000E0158\U000E0159\u17B4\u2800\u180B" {
			if strings.ContainsRune(p, r) {
				t.Errorf("the page holds %U as it is", r)
			}
		}
		if !strings.Contains(p, "Hidden characters.") || !strings.Contains(p, "❤\uFE0F") {
			t.Errorf("no notice, or an emoji's presentation selector marked:\n%.3000s", p)
		}
	})
	t.Run("TitleAndEffectAreMarked", func(t *testing.T) {
		p := page(t, idNames)
		title := html.UnescapeString(regexp.MustCompile(`<title>[^<]*</title>`).FindString(p))
		effect := html.UnescapeString(regexp.MustCompile(`<p class="effect" id="approve-effect">[^<]*`).FindString(p))
		if strings.ContainsRune(title, 0x202E) || strings.ContainsRune(effect, 0x202E) || !strings.Contains(effect, "⟦U+202E") {
			t.Errorf("title %+q, effect %+q: a raw U+202E, or no marker", title, effect)
		}
	})
	t.Run("ANewLineBreakInALineIsRefused", func(t *testing.T) {
		// A subject is one line (the catalogue's rule): proposed with a
		// line break (an approval from before the rule), it cannot be
		// approved as it is, and the reviewer's one-line subject is an edit.
		f := unchangedForm(t, page(t, idLineBreak))
		r := b.do(t, http.MethodPost, "/review/approvals/"+testUUID(idLineBreak), f, nil)
		next(t, fa.calls, "approval.get")
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "Subject must be one line (no line breaks).") {
			t.Errorf("the proposed subject with a line break approved as it is: status %d", r.status)
		}
		fa.none(t, "after a refused subject")
		f.Set("p.subject", "Re: a b")
		if r := b.do(t, http.MethodPost, "/review/approvals/"+testUUID(idLineBreak), f, nil); r.status != http.StatusSeeOther {
			t.Fatalf("the subject made one line: status %d %.500s", r.status, r.body)
		}
		next(t, fa.calls, "approval.get")
		if req := next(t, fa.calls, "approval.decide").decide(t); req.Decision != wire.DecisionEdit || !strings.Contains(string(req.Edited), `"subject":"Re: a b"`) {
			t.Errorf("the brain got %s %s, want the one-line subject as an edit", req.Decision, req.Edited)
		}
		for _, lb := range []string{"⟦U+2028⟧", "⟦U+0085⟧", "⟦U+000B⟧"} {
			f := unchangedForm(t, page(t, idLiteral))
			f.Set("p.subject", "Re: refund"+lb+"Bcc: x@evil.example")
			r := b.do(t, http.MethodPost, "/review/approvals/"+testUUID(idLiteral), f, nil)
			next(t, fa.calls, "approval.get")
			if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "must be one line") {
				t.Errorf("a subject with %s: status %d", lb, r.status)
			}
			fa.none(t, "after a refused subject")
		}
	})
}
