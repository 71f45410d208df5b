package tests

// A model server (or a proxy in front of it) that lies or misbehaves in
// ways the model stage's own tests do not cover: it hangs, it redirects,
// it echoes the prompt where a name belongs.

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"n8nbrain/brain"
	"n8nbrain/internal/ollamafake"
	"n8nbrain/wire"
)

// A model that accepts every call and never answers (a wedged GPU): every
// call times out. With the breaker's window left to its default, it sees
// enough of them to open, concurrency and min calls as shipped (2 and 5),
// so later items escalate at once instead of each waiting out a timeout.
// (The window used to default to 30s against the shipped 60s timeout, so
// it could never hold 5 finished calls: model.TestBreakerWindowHoldsTheMinCalls.)
func TestHangingModelOpensTheBreaker(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(modelSpec("hang"))
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	fake := ollamafake.New(t, func(*api.ChatRequest) ollamafake.Reply {
		return ollamafake.Reply{Wait: release, Content: goodClassify}
	})
	_, ops := s.startModelBrain("r1", fake, func(c *brain.Config) {
		// The shipped 60s timeout scaled down 30×; the window is derived
		// from it (8s here, 240s as shipped).
		c.TurnTimeout = 10 * time.Second
		c.Model.Timeout = 2 * time.Second
		c.Model.BreakerCoolDown = time.Minute
	})
	ea := s.startEdge(a, nil)

	var wg sync.WaitGroup
	jobs := make(chan int)
	for range 4 {
		wg.Go(func() {
			for i := range jobs {
				if res, err := ea.trySubmit(pergola(fmt.Sprintf("<hang-%d@x>", i))); err != nil || res.Status != http.StatusOK {
					t.Errorf("item %d: %v %d %s", i, err, res.Status, res.Body)
				}
			}
		})
	}
	for i := range 12 {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	timeouts := labelled(t, ops, fmt.Sprintf(`brain_model_calls_total{outcome="timeout",tenant=%q}`, a.ID))
	if timeouts < 5 {
		t.Fatalf("only %d timed-out calls: the scenario did not run", timeouts)
	}
	if labelled(t, ops, "brain_model_breaker_open") != 1 {
		t.Fatalf("after %d timed-out calls (every call failed, min calls 5) the breaker is still closed", timeouts)
	}
	before := fake.Calls()
	start := time.Now()
	rep := ea.submit(pergola("<hang-after@x>")).reply(t)
	if rep.Status != wire.WorkItemStatusEscalated || rep.Reason != "model_unavailable" || fake.Calls() != before || time.Since(start) > time.Second {
		t.Fatalf("after the run of timeouts: %s in %s, %d new calls", mustJSON(t, rep), time.Since(start), fake.Calls()-before)
	}
}

// A model server that answers /api/chat with a 307 to another host: the
// prompt (the e-mail) is not sent there, and no more HTTP calls are made
// than the ledger records.
func TestModelRedirectIsNotFollowed(t *testing.T) {
	t.Parallel()
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		http.Redirect(w, r, r.URL.Path, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(other.Close)
	var chats atomic.Int32
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/version" {
			_, _ = w.Write([]byte(`{"version":"0.17.4"}`))
			return
		}
		chats.Add(1)
		http.Redirect(w, r, other.URL+"/api/chat", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(model.Close)
	s := newSystem(t)
	a := s.tenant(modelSpec("redirect"))
	s.startBrain("r1", func(c *brain.Config) {
		c.Model = brain.ModelConfig{URL: model.URL, Name: testModel, RetryDelay: 5 * time.Millisecond}
	})
	ea := s.startEdge(a, nil)
	req := pergola("<redirect@customer.example>")
	rep := ea.submit(req).reply(t)
	if rep.Status != wire.WorkItemStatusEscalated || rep.Reason != "model_unavailable" {
		t.Fatalf("decision %s", mustJSON(t, rep))
	}
	rows := ledger(t, s.tenantDB(a), req.WorkItemID)
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the prompt was POSTed %d times to the host the redirect named", n)
	}
	if int(chats.Load()) != len(rows) {
		t.Fatalf("%d chat calls reached the model server, the ledger records %d", chats.Load(), len(rows))
	}
}

// A lying server that echoes the prompt in the answer's "model" field: the
// answer is refused (another model than asked), and what it named does not
// reach the logs, since it carries the e-mail.
func TestWrongModelNameEchoingThePromptIsNotLogged(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(modelSpec("echo-name"))
	fake := ollamafake.New(t, func(req *api.ChatRequest) ollamafake.Reply {
		e, _ := emailOf(req)
		return ollamafake.Reply{Content: goodClassify, Model: e.Subject + " " + e.Body}
	})
	s.startModelBrain("r1", fake, breakerOff)
	ea := s.startEdge(a, nil)
	req := pergola("<echo-name@customer.example>")
	rep := ea.submit(req).reply(t)
	if rep.Status != wire.WorkItemStatusEscalated || rep.Reason != "model_unavailable" {
		t.Fatalf("decision %s", mustJSON(t, rep))
	}
	if !strings.Contains(s.logs.String(), "another model than asked") {
		t.Fatal("no log line says the server answered with another model")
	}
	assertNoEmailInLogs(t, s, req.Email)
}
