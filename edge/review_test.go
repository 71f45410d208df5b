package edge

import (
	"context"
	"html"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

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

// review sends a browser-like request to the review page as alice; it
// does not follow redirects. header entries with "" remove a header.
func (e *testEdge) review(t *testing.T, method, path string, form url.Values, header map[string]string) response {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, e.url+path, body)
	must(t, err)
	req.SetBasicAuth(reviewer, reviewerPassword)
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
	client := &http.Client{
		Timeout:       e.client.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(t, err)
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`)

// csrfOf loads an approval's page and returns its forms' CSRF token.
func (e *testEdge) csrfOf(t *testing.T, id string) string {
	t.Helper()
	r := e.review(t, http.MethodGet, "/review/approvals/"+id, nil, nil)
	m := csrfField.FindSubmatch(r.body)
	if r.status != 200 || m == nil {
		t.Fatalf("approval page: status %d, no CSRF token in\n%s", r.status, r.body)
	}
	return string(m[1])
}

func checkReviewHeaders(t *testing.T, r response) {
	t.Helper()
	for k, want := range map[string]string{
		"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
		"X-Content-Type-Options":  "nosniff",
		"Referrer-Policy":         "no-referrer",
		"Cache-Control":           "no-store",
	} {
		if got := r.header.Get(k); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
}

func TestReviewAuth(t *testing.T) {
	t.Parallel()
	e, fa := reviewEdge(t)
	id := testUUID(11)
	for _, tc := range []struct {
		name   string
		method string
		path   string
		header map[string]string
	}{
		{"NoAuth", "GET", "/review", map[string]string{"Authorization": ""}},
		{"WrongPassword", "GET", "/review", map[string]string{"Authorization": basic(reviewer, "wrong")}},
		{"UnknownUser", "GET", "/review", map[string]string{"Authorization": basic("mallory", reviewerPassword)}},
		{"OtherUsersPassword", "GET", "/review/approvals/" + id, map[string]string{"Authorization": basic("bob", reviewerPassword)}},
		{"BearerToken", "GET", "/review", map[string]string{"Authorization": "Bearer " + testToken}},
		{"PostNoAuth", "POST", "/review/approvals/" + id, map[string]string{"Authorization": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var form url.Values
			if tc.method == "POST" {
				form = url.Values{"decision": {"approve"}}
			}
			r := e.review(t, tc.method, tc.path, form, tc.header)
			if r.status != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401; body %s", r.status, r.body)
			}
			if got := r.header.Get("WWW-Authenticate"); got != `Basic realm="review"` {
				t.Errorf("WWW-Authenticate %q", got)
			}
			checkReviewHeaders(t, r)
		})
	}
	t.Cleanup(func() { fa.none(t, "an unauthenticated request") })

	// bob signs in with his own password.
	if r := e.review(t, "GET", "/review", nil, map[string]string{"Authorization": basic("bob", "bobs password")}); r.status != 200 {
		t.Errorf("bob: status %d", r.status)
	}
	next(t, fa.calls, "approval.list")
}

func basic(name, password string) string {
	req, _ := http.NewRequest("GET", "/", nil)
	req.SetBasicAuth(name, password)
	return req.Header.Get("Authorization")
}

func TestReviewOff(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	e := startEdge(t, n, nil)
	for _, path := range []string{"/review", "/review/approvals/" + testUUID(1)} {
		r := e.review(t, http.MethodGet, path, nil, nil)
		if r.status != http.StatusNotFound || !strings.Contains(string(r.body), "EDGE_REVIEWERS_FILE") {
			t.Errorf("GET %s with the review page off: status %d body %s; want 404 saying why", path, r.status, r.body)
		}
	}
	e.logs.waitFor(t, "review page off")
}

func TestReviewPages(t *testing.T) {
	t.Parallel()
	e, fa := reviewEdge(t)

	t.Run("List", func(t *testing.T) {
		r := e.review(t, http.MethodGet, "/review", nil, nil)
		if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/html") {
			t.Fatalf("status %d Content-Type %q", r.status, r.header.Get("Content-Type"))
		}
		checkReviewHeaders(t, r)
		page := string(r.body)
		for _, want := range []string{
			`href="/review/approvals/` + testUUID(1) + `"`, `href="/review/approvals/` + testUUID(2) + `"`,
			"&lt;CAF=wi-review@mail.example&gt;", "draft_reply", "Signed in as alice",
		} {
			if !strings.Contains(page, want) {
				t.Errorf("the list lacks %q:\n%s", want, page)
			}
		}
		c := next(t, fa.calls, "approval.list")
		var req wire.ApprovalListRequest
		must(t, wire.DecodeAPI(c.Body, &req))
		if req.Status != wire.ApprovalStatusPending {
			t.Errorf("the list asked for %+v", req)
		}
	})

	t.Run("Approval", func(t *testing.T) {
		id := testUUID(12)
		r := e.review(t, http.MethodGet, "/review/approvals/"+id, nil, nil)
		if r.status != 200 {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
		checkReviewHeaders(t, r)
		page := string(r.body)
		if strings.Contains(page, "<script>") || strings.Contains(page, "<b>hot water</b>") {
			t.Errorf("the e-mail's markup reached the page unescaped:\n%s", page)
		}
		a := sampleApproval(id)
		for _, want := range []string{
			"&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;", "Tom &amp; Jerry", "Quote for a new &lt;b&gt;hot water&lt;/b&gt; system",
			"Customer &lt;customer@example.com&gt;",
			"Re: Quote for a new hot water system", "we can quote on Tuesday.", a.ProposedSHA256, "friendly",
			`name="decision" value="approve"`, `name="decision" value="edit"`, `name="decision" value="reject"`,
			`name="subject" value="Re: Quote for a new hot water system"`, `name="reason"`,
		} {
			if !strings.Contains(page, want) {
				t.Errorf("the page lacks %q", want)
			}
		}
		if c := next(t, fa.calls, "approval.get"); c.approvalID() != id {
			t.Errorf("the page asked for %s", c.Body)
		}
	})

	t.Run("Decided", func(t *testing.T) {
		r := e.review(t, http.MethodGet, "/review/approvals/"+idDecided, nil, nil)
		page := string(r.body)
		if r.status != 200 || strings.Contains(page, "<form") {
			t.Fatalf("status %d; a decided approval must show no forms:\n%s", r.status, page)
		}
		for _, want := range []string{"reviewer:bob", "Decided at", "Edited by Bob", "status-approved", "nothing to decide"} {
			if !strings.Contains(page, want) {
				t.Errorf("the decided approval's page lacks %q", want)
			}
		}
		next(t, fa.calls, "approval.get")
	})

	t.Run("PastExpiry", func(t *testing.T) {
		r := e.review(t, http.MethodGet, "/review/approvals/"+idPastExpiry, nil, nil)
		page := string(r.body)
		if r.status != 200 || strings.Contains(page, "<form") || !strings.Contains(page, "(expired)") {
			t.Errorf("status %d; an approval past its expiry must say so and show no forms:\n%s", r.status, page)
		}
		next(t, fa.calls, "approval.get")
	})

	t.Run("NotFound", func(t *testing.T) {
		r := e.review(t, http.MethodGet, "/review/approvals/"+idNotFound, nil, nil)
		if r.status != 404 || !strings.Contains(string(r.body), "No such approval") {
			t.Errorf("status %d body %s", r.status, r.body)
		}
		next(t, fa.calls, "approval.get")
		if r := e.review(t, http.MethodGet, "/review/approvals/nope", nil, nil); r.status != 400 {
			t.Errorf("a bad id: status %d", r.status)
		}
	})
}

func TestReviewDecide(t *testing.T) {
	t.Parallel()
	e, fa := reviewEdge(t)

	post := func(t *testing.T, id string, form url.Values) response {
		t.Helper()
		r := e.review(t, http.MethodPost, "/review/approvals/"+id, form, nil)
		if r.status != http.StatusSeeOther || r.header.Get("Location") != "/review/approvals/"+id {
			t.Fatalf("status %d Location %q, want 303 back to the approval; body %s", r.status, r.header.Get("Location"), r.body)
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

	t.Run("Approve", func(t *testing.T) {
		id := testUUID(21)
		post(t, id, url.Values{"decision": {"approve"}, "csrf": {e.csrfOf(t, id)}})
		if req := decided(t, id); req.Decision != wire.DecisionApprove || req.Edited != nil {
			t.Errorf("the brain got %+v", req)
		}
	})

	t.Run("EditDraft", func(t *testing.T) {
		id := testUUID(22)
		post(t, id, url.Values{"decision": {"edit"}, "csrf": {e.csrfOf(t, id)},
			"subject": {"Re: Your quote"}, "body": {"Hello,\r\nTuesday at 9 works.\r\n<b>Bob</b>"}})
		req := decided(t, id)
		want := `{"subject":"Re: Your quote","body":"Hello,\nTuesday at 9 works.\n\u003cb\u003eBob\u003c/b\u003e","tone":"friendly"}`
		if req.Decision != wire.DecisionEdit || string(req.Edited) != want {
			t.Errorf("the brain got %s %s, want edit with %s", req.Decision, req.Edited, want)
		}
	})

	t.Run("Reject", func(t *testing.T) {
		id := testUUID(23)
		post(t, id, url.Values{"decision": {"reject"}, "csrf": {e.csrfOf(t, id)}, "reason": {"  already answered by phone \r\n"}})
		if req := decided(t, id); req.Decision != wire.DecisionReject || req.Reason != "already answered by phone" {
			t.Errorf("the brain got %+v", req)
		}
	})

	t.Run("OlderBrowser", func(t *testing.T) {
		// No Fetch Metadata; the Origin is this host.
		id := testUUID(26)
		token := e.csrfOf(t, id)
		r := e.review(t, http.MethodPost, "/review/approvals/"+id, url.Values{"decision": {"approve"}, "csrf": {token}},
			map[string]string{"Sec-Fetch-Site": "", "Origin": e.url})
		if r.status != http.StatusSeeOther {
			t.Fatalf("status %d, want 303; body %s", r.status, r.body)
		}
		decided(t, id)
	})

	t.Run("AlreadyResolved", func(t *testing.T) {
		token := e.csrfOf(t, idResolved)
		next(t, fa.calls, "approval.get")
		r := e.review(t, http.MethodPost, "/review/approvals/"+idResolved, url.Values{"decision": {"approve"}, "csrf": {token}}, nil)
		if r.status != http.StatusConflict || !strings.Contains(string(r.body), "already resolved") {
			t.Errorf("status %d, want 409 and the page saying it is already resolved:\n%s", r.status, r.body)
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
		token := e.csrfOf(t, id)
		next(t, fa.calls, "approval.get")
		r := e.review(t, http.MethodPost, "/review/approvals/"+id, url.Values{"decision": {"reject"}, "csrf": {token}, "reason": {"  "}}, nil)
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "needs a reason") {
			t.Errorf("status %d body %s, want 400 asking for a reason", r.status, r.body)
		}
		next(t, fa.calls, "approval.get")
	})

	t.Run("EditKeepsTypedText", func(t *testing.T) {
		id := testUUID(25)
		token := e.csrfOf(t, id)
		next(t, fa.calls, "approval.get")
		r := e.review(t, http.MethodPost, "/review/approvals/"+id, url.Values{"decision": {"edit"}, "csrf": {token},
			"subject": {"two\nlines"}, "body": {"my careful <edit>"}}, nil)
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), html.EscapeString("my careful <edit>")) {
			t.Errorf("status %d, want 400 with the typed body kept:\n%s", r.status, r.body)
		}
		next(t, fa.calls, "approval.get")
	})

	id := testUUID(30)
	token := e.csrfOf(t, id)
	next(t, fa.calls, "approval.get")
	for _, tc := range []struct {
		name   string
		form   url.Values
		header map[string]string
	}{
		{"NoCSRF", url.Values{"decision": {"approve"}}, nil},
		{"WrongCSRF", url.Values{"decision": {"approve"}, "csrf": {strings.Repeat("0", 64)}}, nil},
		{"OtherApprovalsCSRF", url.Values{"decision": {"approve"}, "csrf": {e.csrfOf(t, testUUID(31))}}, nil},
		{"CrossSite", url.Values{"decision": {"approve"}, "csrf": {token}}, map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"SameSite", url.Values{"decision": {"approve"}, "csrf": {token}}, map[string]string{"Sec-Fetch-Site": "same-site"}},
		{"ForeignOrigin", url.Values{"decision": {"approve"}, "csrf": {token}},
			map[string]string{"Sec-Fetch-Site": "", "Origin": "https://evil.example"}},
		{"NullOriginWithoutFetchMetadata", url.Values{"decision": {"approve"}, "csrf": {token}}, map[string]string{"Sec-Fetch-Site": "", "Origin": "null"}},
		{"SameOriginForeignOrigin", url.Values{"decision": {"approve"}, "csrf": {token}},
			map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "https://evil.example"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.review(t, http.MethodPost, "/review/approvals/"+id, tc.form, tc.header)
			if r.status != http.StatusForbidden {
				t.Errorf("status %d, want 403; body %s", r.status, r.body)
			}
			checkReviewHeaders(t, r)
		})
	}
	next(t, fa.calls, "approval.get") // of OtherApprovalsCSRF's page
	fa.none(t, "a refused post")

	// bob's token is not alice's.
	bobToken := csrfToken(csrfKey(testToken), "bob", id)
	if r := e.review(t, http.MethodPost, "/review/approvals/"+id, url.Values{"decision": {"approve"}, "csrf": {bobToken}}, nil); r.status != 403 {
		t.Errorf("alice posting bob's token: status %d, want 403", r.status)
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
