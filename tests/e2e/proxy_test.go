//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// proxy stands on both of n8n's wires to the edge: n8n reaches the edge
// through it (the settings' edge_url), and the edge delivers events to n8n
// through it (EDGE_WEBHOOK_URL). It forwards every request unchanged and
// records what passed, so a test can count what n8n sent and see what each
// side answered; a rule makes it answer in the other side's place, lose an
// answer on the way back, or hold a request until the test releases it.
type proxy struct {
	t         *testing.T
	url       string
	edge, n8n string
	client    *http.Client

	mu    sync.Mutex
	log   []exchange
	rules []*rule
}

// exchange is one request through the proxy and its answer.
type exchange struct {
	Method, Path string
	// POST /v1/turns: what the request asked for.
	WorkItemID string
	Turn       int
	Outcome    string
	Detail     string
	// An event delivery to n8n's webhook.
	EventID, EventKind string
	// Upstream is what the other side answered (0: it was not asked, or
	// did not answer); Answered is what the caller got.
	Upstream, Answered int
	Body               string
}

// rule changes what the proxy does with the requests it matches, Times of
// them (or every one, when Times is 0).
type rule struct {
	Match func(exchange) bool
	Times int
	// Status, without AfterForward: answer this instead of asking the
	// other side, with Retry-After when set.
	Status     int
	RetryAfter string
	// AfterForward: the other side gets the request and answers; the
	// caller gets Status instead (an answer lost on the way back).
	AfterForward bool
	// Hold: the request waits until release is called; held is closed
	// when the first one arrives.
	Hold bool

	used    int
	held    chan struct{}
	release chan struct{}
}

func newProxy(t *testing.T, edgeURL, n8nURL string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, url: "http://" + ln.Addr().String(), edge: edgeURL, n8n: n8nURL,
		client: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(done) }()
	t.Cleanup(func() {
		p.mu.Lock()
		for _, r := range p.rules {
			r.releaseOnce()
		}
		p.mu.Unlock()
		_ = srv.Close()
		<-done
	})
	return p
}

// add installs a rule; the rules are tried in the order they were added.
func (p *proxy) add(r *rule) *rule {
	r.held, r.release = make(chan struct{}), make(chan struct{})
	p.mu.Lock()
	p.rules = append(p.rules, r)
	p.mu.Unlock()
	return r
}

func (r *rule) releaseOnce() {
	select {
	case <-r.release:
	default:
		close(r.release)
	}
}

// waitHeld waits for a held request to arrive.
func (r *rule) waitHeld(t *testing.T, d time.Duration, what string) {
	t.Helper()
	select {
	case <-r.held:
	case <-time.After(d):
		t.Fatalf("timed out after %s waiting for %s to be held", d, what)
	}
}

func (p *proxy) exchanges() []exchange {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]exchange(nil), p.log...)
}

// since returns the exchanges after the first n.
func (p *proxy) since(n int) []exchange {
	return p.exchanges()[n:]
}

func (p *proxy) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.log)
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ex := exchange{Method: r.Method, Path: r.URL.Path}
	upstream := p.edge
	if strings.HasPrefix(r.URL.Path, "/webhook/") {
		upstream = p.n8n
		var ev struct {
			EventID    string `json:"event_id"`
			Kind       string `json:"kind"`
			WorkItemID string `json:"work_item_id"`
		}
		_ = json.Unmarshal(body, &ev)
		ex.EventID, ex.EventKind, ex.WorkItemID = ev.EventID, ev.Kind, ev.WorkItemID
	} else if r.Method == http.MethodPost && r.URL.Path == "/v1/turns" {
		var req struct {
			WorkItemID   string `json:"work_item_id"`
			Turn         int    `json:"turn"`
			LatestResult *struct {
				Outcome string `json:"outcome"`
				Detail  string `json:"detail"`
			} `json:"latest_result"`
		}
		_ = json.Unmarshal(body, &req)
		ex.WorkItemID, ex.Turn = req.WorkItemID, req.Turn
		if req.LatestResult != nil {
			ex.Outcome, ex.Detail = req.LatestResult.Outcome, req.LatestResult.Detail
		}
	}

	var match *rule
	p.mu.Lock()
	for _, rl := range p.rules {
		if (rl.Times == 0 || rl.used < rl.Times) && rl.Match(ex) {
			rl.used++
			match = rl
			break
		}
	}
	p.mu.Unlock()

	if match != nil && match.Hold {
		select {
		case <-match.held:
		default:
			close(match.held)
		}
		select {
		case <-match.release:
		case <-r.Context().Done():
			return
		}
	}
	if match != nil && match.Status != 0 && !match.AfterForward {
		if match.RetryAfter != "" {
			w.Header().Set("Retry-After", match.RetryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		msg := `{"error":{"code":"unavailable","message":"injected by the e2e proxy"}}`
		w.WriteHeader(match.Status)
		_, _ = io.WriteString(w, msg)
		ex.Answered, ex.Body = match.Status, msg
		p.record(ex)
		return
	}

	out, err := http.NewRequestWithContext(r.Context(), r.Method, upstream+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	for k, vs := range r.Header {
		switch http.CanonicalHeaderKey(k) {
		case "Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length":
			continue
		}
		out.Header[k] = vs
	}
	resp, err := p.client.Do(out)
	if err != nil {
		ex.Answered = http.StatusBadGateway
		p.record(ex)
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	ex.Upstream, ex.Body = resp.StatusCode, string(answer[:min(len(answer), 4096)])
	if match != nil && match.AfterForward {
		// The other side did the work; its answer is lost on the way back.
		ex.Answered = match.Status
		p.record(ex)
		http.Error(w, "answer lost by the e2e proxy", match.Status)
		return
	}
	for k, vs := range resp.Header {
		switch http.CanonicalHeaderKey(k) {
		case "Connection", "Keep-Alive", "Transfer-Encoding", "Content-Length":
			continue
		}
		w.Header()[k] = vs
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer)
	ex.Answered = resp.StatusCode
	p.record(ex)
}

func (p *proxy) record(ex exchange) {
	p.mu.Lock()
	p.log = append(p.log, ex)
	p.mu.Unlock()
}

// turnPosts are the POST /v1/turns among exs, for a work item.
func turnPosts(exs []exchange, workItem string) []exchange {
	var out []exchange
	for _, ex := range exs {
		if ex.Method == http.MethodPost && ex.Path == "/v1/turns" && ex.WorkItemID == workItem {
			out = append(out, ex)
		}
	}
	return out
}

// deliveries are the event deliveries among exs of a kind, for a work item.
func deliveries(exs []exchange, kind, workItem string) []exchange {
	var out []exchange
	for _, ex := range exs {
		if strings.HasPrefix(ex.Path, "/webhook/") && ex.EventKind == kind && ex.WorkItemID == workItem {
			out = append(out, ex)
		}
	}
	return out
}
