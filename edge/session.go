package edge

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"n8nbrain/wire"
)

// Reviewers sign in with a form (name and password from
// EDGE_REVIEWERS_FILE, bcrypt) and get a session: a random token in a
// cookie (HttpOnly, SameSite=Lax, Secure over TLS or when
// EDGE_REVIEW_SECURE_COOKIE says the page is reached through HTTPS), held
// in memory here with an idle and an absolute expiry. Signing out ends it
// on the server. An edge restart signs everyone out.
//
// Lax, not Strict: reviewers reach an approval from the link in the
// approval_requested e-mail, opened in webmail, another site, and a Strict
// cookie is not sent on that navigation (the page asked them to sign in
// at every link). What Lax adds is the cookie on a top-level GET from
// another site, and no GET here changes anything; every POST is refused
// unless it comes from the page itself (crossSite) and carries a token
// bound to the session.
//
// Failed sign-ins are throttled per account name and per client address by
// token buckets checked before bcrypt runs: a throttled attempt costs no
// bcrypt and waits for nothing, so guessing neither slows other reviewers
// nor gets more tries by sending more requests.

const (
	// sessionMaxAge ends a session however active it is.
	sessionMaxAge = 12 * time.Hour
	// maxSessions bounds the sessions held; the least recently used go first.
	maxSessions = 10_000
	// maxThrottleKeys bounds each throttle's table.
	maxThrottleKeys = 10_000
	// maxLoginFormBytes bounds the sign-in form.
	maxLoginFormBytes = 4 << 10
)

// Sign-in throttles: a burst of attempts, then one more every interval.
// An account allows 5 failures, then one every 30 s; an address 20, then one
// every 10 s (an office shares one address).
var (
	accountBucket = bucketRule{burst: 5, every: 30 * time.Second}
	addressBucket = bucketRule{burst: 20, every: 10 * time.Second}
)

// session is one signed-in reviewer.
type session struct {
	reviewer string
	// key identifies the session without its token: SHA-256 of the token.
	key     [sha256.Size]byte
	created time.Time
	seen    time.Time
}

// sessions are the review page's sessions, in memory.
type sessions struct {
	idle time.Duration
	now  func() time.Time

	mu    sync.Mutex
	byKey map[[sha256.Size]byte]*session
}

func newSessions(idle time.Duration, now func() time.Time) *sessions {
	return &sessions{idle: idle, now: now, byKey: map[[sha256.Size]byte]*session{}}
}

// start opens a session for reviewer and returns its token.
func (s *sessions) start(reviewer string) string {
	token := rand.Text() + rand.Text() // 52 base32 characters, 260 bits
	now := s.now()
	se := &session{reviewer: reviewer, key: sha256.Sum256([]byte(token)), created: now, seen: now}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.byKey) >= maxSessions {
		s.pruneLocked(now)
	}
	if len(s.byKey) >= maxSessions {
		var oldest *session
		for _, o := range s.byKey {
			if oldest == nil || o.seen.Before(oldest.seen) {
				oldest = o
			}
		}
		delete(s.byKey, oldest.key)
	}
	s.byKey[se.key] = se
	return token
}

// get returns the live session of a token and marks it used.
func (s *sessions) get(token string) (session, bool) {
	if token == "" || len(token) > 128 {
		return session{}, false
	}
	key := sha256.Sum256([]byte(token))
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	se, ok := s.byKey[key]
	if !ok {
		return session{}, false
	}
	if s.expired(se, now) {
		delete(s.byKey, key)
		return session{}, false
	}
	se.seen = now
	return *se, true
}

// end ends a session; ending one that is gone is harmless.
func (s *sessions) end(key [sha256.Size]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byKey, key)
}

func (s *sessions) expired(se *session, now time.Time) bool {
	return now.Sub(se.seen) >= s.idle || now.Sub(se.created) >= sessionMaxAge
}

func (s *sessions) pruneLocked(now time.Time) {
	for k, se := range s.byKey {
		if s.expired(se, now) {
			delete(s.byKey, k)
		}
	}
}

// bucketRule is a token bucket's shape.
type bucketRule struct {
	burst float64
	every time.Duration
}

type bucket struct {
	tokens float64
	at     time.Time
}

// refill brings b's tokens up to now.
func (r bucketRule) refill(b *bucket, now time.Time) {
	b.tokens = math.Min(r.burst, b.tokens+float64(now.Sub(b.at))/float64(r.every))
	b.at = now
}

// wait is how long until b holds a whole token.
func (r bucketRule) wait(b *bucket) time.Duration {
	if b.tokens >= 1 {
		return 0
	}
	return time.Duration((1 - b.tokens) * float64(r.every))
}

// loginThrottle limits sign-in attempts per account name and per address.
type loginThrottle struct {
	now func() time.Time

	mu        sync.Mutex
	accounts  map[string]*bucket
	addresses map[string]*bucket
}

func newLoginThrottle(now func() time.Time) *loginThrottle {
	return &loginThrottle{now: now, accounts: map[string]*bucket{}, addresses: map[string]*bucket{}}
}

// take spends one attempt of the account (when named) and of the address,
// or, when either has none left, spends nothing and says how long to wait
// and whether the account's attempts are what ran out (the name is being
// guessed, perhaps from elsewhere) rather than only the address's.
func (t *loginThrottle) take(account, address string) (wait time.Duration, byAccount bool) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	addr := t.bucketLocked(t.addresses, addressBucket, address, now)
	wait = addressBucket.wait(addr)
	var acc *bucket
	if account != "" {
		acc = t.bucketLocked(t.accounts, accountBucket, account, now)
		if w := accountBucket.wait(acc); w > 0 {
			wait, byAccount = max(wait, w), true
		}
	}
	if wait > 0 {
		return wait, byAccount
	}
	addr.tokens--
	if acc != nil {
		acc.tokens--
	}
	return 0, false
}

// succeeded forgets the account's failures and gives the address its
// attempt back: only failures count.
func (t *loginThrottle) succeeded(account, address string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.accounts, account)
	if b, ok := t.addresses[address]; ok {
		b.tokens = math.Min(addressBucket.burst, b.tokens+1)
	}
}

// bucketLocked returns the bucket of key, refilled, making room for it when
// the table is full: first by dropping full buckets (they remember
// nothing), then any.
func (t *loginThrottle) bucketLocked(m map[string]*bucket, r bucketRule, key string, now time.Time) *bucket {
	if b, ok := m[key]; ok {
		r.refill(b, now)
		return b
	}
	if len(m) >= maxThrottleKeys {
		for k, b := range m {
			if r.refill(b, now); b.tokens >= r.burst {
				delete(m, k)
			}
		}
		for k := range m {
			if len(m) < maxThrottleKeys {
				break
			}
			delete(m, k)
		}
	}
	b := &bucket{tokens: r.burst, at: now}
	m[key] = b
	return b
}

// clientAddress is the address a sign-in is throttled by: the connection's
// peer, or the last entry of ipHeader when the edge is configured to sit
// behind a proxy that sets it. IPv6 addresses count per /64, the block one
// client usually holds.
func clientAddress(r *http.Request, ipHeader string) string {
	raw := r.RemoteAddr
	if host, _, err := net.SplitHostPort(raw); err == nil {
		raw = host
	}
	if ipHeader != "" {
		if v := r.Header.Values(ipHeader); len(v) > 0 {
			parts := strings.Split(v[len(v)-1], ",")
			raw = strings.TrimSpace(parts[len(parts)-1])
		}
	}
	ip, err := netip.ParseAddr(raw)
	if err != nil {
		if len(raw) > 64 {
			raw = raw[:64]
		}
		return "?" + raw
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// reviewAuth is what the review page's sign-in needs.
type reviewAuth struct {
	reviewers *reviewers
	sessions  *sessions
	throttle  *loginThrottle
	// secureCookie: the page is reached over HTTPS through a proxy.
	secureCookie bool
	ipHeader     string
}

// cookieName is the session cookie's name; the __Secure- prefix makes
// browsers refuse it unless it is Secure and set over HTTPS.
func (a *reviewAuth) cookieName(r *http.Request) string {
	if a.secure(r) {
		return "__Secure-review-session"
	}
	return "review-session"
}

func (a *reviewAuth) secure(r *http.Request) bool { return a.secureCookie || r.TLS != nil }

func (a *reviewAuth) setCookie(w http.ResponseWriter, r *http.Request, token string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: a.cookieName(r), Value: token, Path: "/review", MaxAge: maxAge,
		HttpOnly: true, Secure: a.secure(r), SameSite: http.SameSiteLaxMode,
	})
}

// current is the request's live session.
func (a *reviewAuth) current(r *http.Request) (session, bool) {
	c, err := r.Cookie(a.cookieName(r))
	if err != nil {
		return session{}, false
	}
	return a.sessions.get(c.Value)
}

type sessionKey struct{}

// sessionOf is the session of a request past requireReviewer.
func sessionOf(ctx context.Context) session {
	se, _ := ctx.Value(sessionKey{}).(session)
	return se
}

// reviewerOf is the signed-in reviewer of a request past requireReviewer.
func reviewerOf(ctx context.Context) string { return sessionOf(ctx).reviewer }

// formToken binds a form to the session that loaded it and to what it
// does (an approval's id, "logout"): a form from another session, or for
// another approval, is refused.
func formToken(key []byte, se session, purpose string) string {
	mac := hmac.New(sha256.New, key)
	mac.Write(se.key[:])
	mac.Write([]byte{0})
	mac.Write([]byte(purpose))
	return hex.EncodeToString(mac.Sum(nil))
}

// reviewHeaders are the security headers of every review page answer.
// Styles and the one script are files of the edge itself; nothing inline
// runs, nothing loads from elsewhere, nothing frames the page.
func reviewHeaders(h http.Header) {
	h.Set("Content-Security-Policy", reviewCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Frame-Options", "DENY")
}

const reviewCSP = "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// reviewPage sets the review page's security headers and answers 404,
// saying why, when the review page is off; every page of it goes through
// it (its assets and the trailing-slash redirect need neither).
func reviewPage(d deps, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reviewHeaders(w.Header())
		if d.auth == nil {
			reviewOff(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// requireReviewer is a reviewPage that sends a request without a live
// session to the sign-in page (a GET) or refuses it (anything else).
func requireReviewer(d deps, next http.Handler) http.Handler {
	return reviewPage(d, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		se, ok := d.auth.current(r)
		if !ok {
			annotate(r.Context(), slog.String("error_code", string(wire.CodeUnauthorized)))
			if r.Method == http.MethodGet {
				http.Redirect(w, r, "/review/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			renderMessage(w, r, http.StatusUnauthorized, page{Title: "Signed out"},
				"You are not signed in (or your session ended), so nothing was recorded. Sign in and decide again.")
			return
		}
		annotate(r.Context(), slog.String("reviewer", se.reviewer))
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, se)))
	}))
}

func reviewOff(w http.ResponseWriter, r *http.Request) {
	annotate(r.Context(), slog.String("error_code", string(wire.CodeNotFound)))
	writeText(w, http.StatusNotFound, "The review page is off: this edge has no reviewers (EDGE_REVIEWERS_FILE is not set).\n")
}

// handleReviewNotFound answers an address under the review page that is
// none of its pages (a mistyped or truncated link) with a page that says
// so and leads to the approvals. It shows nothing of the tenant's, so it
// needs no session.
func handleReviewNotFound() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		annotate(r.Context(), slog.String("error_code", string(wire.CodeNotFound)))
		renderMessage(w, r, http.StatusNotFound, page{Title: "No such page"},
			"There is no page of the approvals at this address: the link may be mistyped or cut short.")
	})
}

type loginPage struct {
	page
	Next   string
	Name   string
	Error  string
	Notice string
}

// localNext is a sign-in's destination: a path of the review page, or the
// list.
func localNext(next string) string {
	u, err := url.Parse(next)
	if err == nil && u.Path != path.Clean(u.Path) {
		// "/review/../v1/…": http.Redirect cleans it to a path outside the page.
		return "/review"
	}
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || strings.HasPrefix(next, "//") ||
		strings.ContainsAny(next, "\\\r\n") || (u.Path != "/review" && !strings.HasPrefix(u.Path, "/review/")) ||
		strings.HasPrefix(u.Path, "/review/login") {
		return "/review"
	}
	return next
}

// handleLoginForm shows the sign-in form.
func handleLoginForm(d deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		next := localNext(q.Get("next"))
		if _, ok := d.auth.current(r); ok {
			http.Redirect(w, r, next, http.StatusSeeOther)
			return
		}
		p := loginPage{page: page{Title: "Sign in"}, Next: next}
		if q.Has("signed_out") {
			p.Notice = "You are signed out."
		}
		render(w, r, http.StatusOK, "login", p)
	})
}

// handleLogin signs a reviewer in: throttled before bcrypt, then a new
// session and back to where they were going.
func handleLogin(d deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := loginPage{page: page{Title: "Sign in"}, Next: "/review"}
		if why := crossSite(r); why != "" {
			annotate(r.Context(), slog.String("error_code", string(wire.CodeForbidden)), slog.String("error_reason", why))
			p.Error = "This sign-in did not come from the sign-in page, so it was refused. Open the review page and sign in there."
			render(w, r, http.StatusForbidden, "login", p)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxLoginFormBytes)
		if err := r.ParseForm(); err != nil {
			p.Error = "The sign-in form could not be read. Reload the page and try again."
			render(w, r, http.StatusBadRequest, "login", p)
			return
		}
		name, password := strings.TrimSpace(r.PostForm.Get("name")), r.PostForm.Get("password")
		p.Next, p.Name = localNext(r.PostForm.Get("next")), name
		account := strings.ToLower(name)
		if !reviewerName.MatchString(account) {
			account = "" // cannot be a reviewer: counted against the address only
		}
		address := clientAddress(r, d.auth.ipHeader)
		if wait, byAccount := d.auth.throttle.take(account, address); wait > 0 {
			secs := int(math.Ceil(wait.Seconds()))
			annotate(r.Context(), slog.String("error_code", string(wire.CodeRateLimited)))
			w.Header().Set("Retry-After", strconv.Itoa(secs))
			p.Error = "Too many failed sign-ins from this computer. Wait " + waitWords(secs) + ", then try again."
			if byAccount {
				p.Error = "Too many failed sign-ins for this name, from this computer or another. Wait " + waitWords(secs) +
					", then try again. If they were not yours, tell whoever runs the review page: someone may be guessing this name's password."
			}
			render(w, r, http.StatusTooManyRequests, "login", p)
			return
		}
		if account == "" || !d.auth.reviewers.check(r.Context(), account, password) {
			annotate(r.Context(), slog.String("error_code", string(wire.CodeUnauthorized)))
			p.Error = "That name and password do not match a reviewer. Check them and try again."
			render(w, r, http.StatusUnauthorized, "login", p)
			return
		}
		d.auth.throttle.succeeded(account, address)
		// A sign-in replaces the browser's session: the one its cookie still
		// names (signed in again from a link, another reviewer at the same
		// browser) ends here, so no session outlives the cookie that held it
		// and Sign out ends what the browser had.
		if c, err := r.Cookie(d.auth.cookieName(r)); err == nil && c.Value != "" && len(c.Value) <= 128 {
			d.auth.sessions.end(sha256.Sum256([]byte(c.Value)))
		}
		d.auth.setCookie(w, r, d.auth.sessions.start(account), int(sessionMaxAge.Seconds()))
		annotate(r.Context(), slog.String("reviewer", account))
		http.Redirect(w, r, p.Next, http.StatusSeeOther)
	})
}

func waitWords(secs int) string {
	if secs < 90 {
		return strconv.Itoa(secs) + " seconds"
	}
	return strconv.Itoa((secs+59)/60) + " minutes"
}

// handleLogout ends the session and clears its cookie.
func handleLogout(d deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		se := sessionOf(r.Context())
		if why := crossSite(r); why != "" {
			annotate(r.Context(), slog.String("error_code", string(wire.CodeForbidden)), slog.String("error_reason", why))
			renderMessage(w, r, http.StatusForbidden, page{Title: "Refused", Reviewer: se.reviewer},
				"This sign-out did not come from the review page. Use the Sign out button.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxLoginFormBytes)
		if err := r.ParseForm(); err != nil || !hmac.Equal([]byte(r.PostForm.Get("csrf")), []byte(formToken(d.csrfKey, se, "logout"))) {
			annotate(r.Context(), slog.String("error_code", string(wire.CodeForbidden)), slog.String("error_reason", "csrf"))
			renderMessage(w, r, http.StatusForbidden, page{Title: "Refused", Reviewer: se.reviewer},
				"This sign-out form has expired. Reload the page and use the Sign out button.")
			return
		}
		d.auth.sessions.end(se.key)
		d.auth.setCookie(w, r, "", -1)
		http.Redirect(w, r, "/review/login?signed_out=1", http.StatusSeeOther)
	})
}
