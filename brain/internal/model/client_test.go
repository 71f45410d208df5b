package model

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"n8nbrain/internal/ollamafake"
)

func newClient(t *testing.T, url string, mutate func(*Config)) *Client {
	t.Helper()
	cfg := Config{URL: url, Timeout: 2 * time.Second, RetryDelay: time.Millisecond}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var chatReq = Request{
	Model:    "m",
	Messages: []Message{{Role: RoleSystem, Content: "sys"}, {Role: RoleUser, Content: "secret email body"}},
	Format:   json.RawMessage(`{"type":"object"}`),
	Options:  map[string]any{"temperature": 0, "num_predict": 16},
}

func TestChat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		replies   []ollamafake.Reply // per call; the last repeats
		wantErr   ErrorKind          // "" for success
		wantCalls []Outcome
	}{
		{"OK", []ollamafake.Reply{{Content: `{"a":1}`, PromptTokens: 11, OutputTokens: 7}}, "", []Outcome{OutcomeOK}},
		{"ServerErrorRetriedOnceThenOK", []ollamafake.Reply{{Status: 500}, {Content: `{}`}}, "", []Outcome{OutcomeError, OutcomeOK}},
		{"ServerErrorTwice", []ollamafake.Reply{{Status: 503, Error: "server busy secret email body"}}, KindStatus, []Outcome{OutcomeError, OutcomeError}},
		{"NotFoundNotRetried", []ollamafake.Reply{{Status: 404, Error: "model 'm' not found"}}, KindStatus, []Outcome{OutcomeError}},
		{"TransportErrorRetried", []ollamafake.Reply{{Hijack: true}, {Content: `{}`}}, "", []Outcome{OutcomeError, OutcomeOK}},
		{"TransportErrorTwice", []ollamafake.Reply{{Hijack: true}}, KindTransport, []Outcome{OutcomeError, OutcomeError}},
		// A server that answers with another model than asked is not
		// believed, nor asked again; the implicit :latest tag is no swap.
		{"AnotherModelNotUsed", []ollamafake.Reply{{Content: `{"a":1}`, Model: "cheaper-model"}}, KindWrongModel, []Outcome{OutcomeError}},
		{"LatestTagIsTheSameModel", []ollamafake.Reply{{Content: `{}`, Model: "m:latest"}}, "", []Outcome{OutcomeOK}},
		// Busy: asked again once, after the wait the server asked for
		// (TestChatWaitsTheRetryAfter), unless it is longer than a turn
		// can wait.
		{"TooManyRequestsRetriedOnce", []ollamafake.Reply{{Status: 429, RetryAfter: "0"}, {Content: `{}`}}, "", []Outcome{OutcomeError, OutcomeOK}},
		{"TooManyRequestsTwice", []ollamafake.Reply{{Status: 429}}, KindStatus, []Outcome{OutcomeError, OutcomeError}},
		{"RetryAfterTooLongNotWaitedFor", []ollamafake.Reply{{Status: 429, RetryAfter: "3600"}, {Content: `{}`}}, KindStatus, []Outcome{OutcomeError}},
		{"ServerErrorRetryAfterTooLong", []ollamafake.Reply{{Status: 503, RetryAfter: "120"}, {Content: `{}`}}, KindStatus, []Outcome{OutcomeError}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := ollamafake.New(t, nil)
			n := 0
			f.SetChatFunc(func(*api.ChatRequest) ollamafake.Reply {
				r := tc.replies[min(n, len(tc.replies)-1)]
				n++
				return r
			})
			c := newClient(t, f.URL(), nil)
			resp, err := c.Chat(context.Background(), chatReq)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("Chat: %v", err)
			}
			if tc.wantErr != "" {
				var me *Error
				if !errors.As(err, &me) || me.Kind != tc.wantErr || !errors.Is(err, ErrUnavailable) {
					t.Fatalf("error %v, want kind %s", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "busy") {
					t.Fatalf("error text carries server text: %q", err)
				}
			}
			if len(resp.Calls) != len(tc.wantCalls) || f.Calls() != len(tc.wantCalls) {
				t.Fatalf("calls %+v (server saw %d), want %v", resp.Calls, f.Calls(), tc.wantCalls)
			}
			for i, want := range tc.wantCalls {
				if resp.Calls[i].Outcome != want {
					t.Fatalf("call %d outcome %s, want %s", i, resp.Calls[i].Outcome, want)
				}
			}
			if tc.name == "OK" {
				if resp.Content != `{"a":1}` || resp.DoneReason != "stop" || resp.Calls[0].PromptTokens != 11 || resp.Calls[0].OutputTokens != 7 {
					t.Fatalf("response %+v", resp)
				}
			}
		})
	}
}

// The request on the wire is what Ollama expects: stream off, the schema
// as format, keep_alive, options, think off.
func TestChatRequestShape(t *testing.T) {
	t.Parallel()
	f := ollamafake.New(t, func(*api.ChatRequest) ollamafake.Reply { return ollamafake.Reply{Content: "{}"} })
	c := newClient(t, f.URL(), func(c *Config) { c.KeepAlive = 7 * time.Minute })
	if _, err := c.Chat(context.Background(), chatReq); err != nil {
		t.Fatal(err)
	}
	r := f.Requests()[0]
	if r.Model != "m" || r.Stream == nil || *r.Stream || string(r.Format) != `{"type":"object"}` ||
		r.KeepAlive == nil || r.KeepAlive.Duration != 7*time.Minute || r.Think == nil || r.Think.Bool() ||
		r.Options["num_predict"] != float64(16) || len(r.Messages) != 2 || r.Messages[1].Content != "secret email body" {
		t.Fatalf("request %+v", r)
	}
}

// A call slower than the timeout is a timeout, not retried, and counts
// against the breaker.
func TestChatTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	f := ollamafake.New(t, func(*api.ChatRequest) ollamafake.Reply { return ollamafake.Reply{Wait: release, Content: "{}"} })
	t.Cleanup(func() { close(release) })
	c := newClient(t, f.URL(), func(c *Config) {
		c.Timeout = 50 * time.Millisecond
		c.Breaker = BreakerConfig{MinCalls: 1}
	})
	resp, err := c.Chat(context.Background(), chatReq)
	var me *Error
	if !errors.As(err, &me) || me.Kind != KindTimeout {
		t.Fatalf("error %v, want a timeout", err)
	}
	if len(resp.Calls) != 1 || resp.Calls[0].Outcome != OutcomeTimeout {
		t.Fatalf("calls %+v, want one timeout", resp.Calls)
	}
	if c.BreakerState() != BreakerOpen {
		t.Fatalf("breaker %s, want open", c.BreakerState())
	}
	resp, err = c.Chat(context.Background(), chatReq)
	// The server saw at most the first call (on a loaded machine the client
	// can give up before the handler reads it); the refused one made none.
	if !errors.Is(err, ErrBreakerOpen) || !errors.Is(err, ErrUnavailable) || len(resp.Calls) != 0 || f.Calls() > 1 {
		t.Fatalf("with the breaker open: %v, %d calls made, server saw %d", err, len(resp.Calls), f.Calls())
	}
}

// The caller's own deadline is the caller's: its error comes back as such
// and says nothing to the breaker.
func TestChatCallerDeadline(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	f := ollamafake.New(t, func(*api.ChatRequest) ollamafake.Reply { return ollamafake.Reply{Wait: release} })
	t.Cleanup(func() { close(release) })
	c := newClient(t, f.URL(), func(c *Config) { c.Breaker = BreakerConfig{MinCalls: 1} })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	resp, err := c.Chat(ctx, chatReq)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("error %v, want the caller's deadline", err)
	}
	if len(resp.Calls) != 1 || resp.Calls[0].Outcome != OutcomeTimeout || c.BreakerState() != BreakerClosed {
		t.Fatalf("calls %+v breaker %s", resp.Calls, c.BreakerState())
	}
}

func TestPing(t *testing.T) {
	t.Parallel()
	f := ollamafake.New(t, nil)
	if v, err := newClient(t, f.URL(), nil).Ping(context.Background()); err != nil || v != ollamafake.Version {
		t.Fatalf("Ping: %q %v", v, err)
	}
	// Nothing listens on a closed fake's port.
	gone := ollamafake.New(t, nil)
	url := gone.URL()
	gone.Close()
	if _, err := newClient(t, url, nil).Ping(context.Background()); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Ping of a closed server: %v", err)
	}
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"http://ollama:11434":     "http://ollama:11434",
		"https://ollama.internal": "https://ollama.internal",
		"127.0.0.1":               "http://127.0.0.1:11434",
		"0.0.0.0:9999":            "http://0.0.0.0:9999",
		` "localhost" `:           "http://localhost:11434",
	} {
		u, err := ParseURL(in)
		if err != nil || u.String() != want {
			t.Errorf("ParseURL(%q) = %v, %v; want %s", in, u, err, want)
		}
	}
	for _, bad := range []string{"", "ftp://x", "http://"} {
		if _, err := ParseURL(bad); err == nil {
			t.Errorf("ParseURL(%q) accepted", bad)
		}
	}
}

// Calls beyond MaxConcurrent wait for a slot, within the caller's context,
// before they reach the server.
func TestChatConcurrencyBound(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	arrived := make(chan struct{}, 4)
	f := ollamafake.New(t, func(*api.ChatRequest) ollamafake.Reply {
		arrived <- struct{}{}
		return ollamafake.Reply{Wait: release, Content: "{}"}
	})
	c := newClient(t, f.URL(), func(c *Config) { c.MaxConcurrent = 1 })
	first := make(chan error, 1)
	go func() { _, err := c.Chat(context.Background(), chatReq); first <- err }()
	<-arrived
	// The second call waits for the slot; its context ends first.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	resp, err := c.Chat(ctx, chatReq)
	if !errors.Is(err, context.DeadlineExceeded) || len(resp.Calls) != 0 || f.Calls() != 1 {
		t.Fatalf("second call: %v, %d calls, server saw %d", err, len(resp.Calls), f.Calls())
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// The slot is free again.
	if _, err := c.Chat(context.Background(), chatReq); err != nil || f.Calls() != 2 {
		t.Fatalf("third call: %v, server saw %d", err, f.Calls())
	}
}

// With every slot busy, the next free one goes to a tenant that has not had
// one rather than to the tenant with the most calls waiting: quiet's call,
// made after three of noisy's were waiting, is the server's third, not its
// fifth.
func TestChatSlotsGoRoundRobinBetweenTenants(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var order []string
	arrived := make(chan struct{}, 8)
	release := make(chan struct{}, 8)
	f := ollamafake.New(t, func(r *api.ChatRequest) ollamafake.Reply {
		mu.Lock()
		order = append(order, r.Messages[1].Content)
		mu.Unlock()
		done := make(chan struct{})
		go func() { <-release; close(done) }()
		arrived <- struct{}{}
		return ollamafake.Reply{Wait: done, Content: "{}"}
	})
	c := newClient(t, f.URL(), func(c *Config) { c.MaxConcurrent = 1 })
	errs := make(chan error, 5)
	call := func(tenant string) {
		req := chatReq
		req.Tenant = tenant
		req.Messages = []Message{{Role: RoleSystem, Content: "sys"}, {Role: RoleUser, Content: tenant}}
		go func() { _, err := c.Chat(context.Background(), req); errs <- err }()
	}
	call("noisy")
	<-arrived
	for i := range 3 {
		call("noisy")
		waiting(t, c, "noisy", i+1)
	}
	call("quiet")
	waiting(t, c, "quiet", 1)
	for range 5 {
		release <- struct{}{}
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"noisy", "noisy", "quiet", "noisy", "noisy"}; !slices.Equal(order, want) {
		t.Fatalf("the server was called for %q, want %q", order, want)
	}
}

// waiting waits until n of tenant's calls wait for a slot.
func waiting(t *testing.T, c *Client, tenant string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for c.slots.Waiting(tenant) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %s's calls wait for a slot, want %d", c.slots.Waiting(tenant), tenant, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A server answering 200 with output the caller cannot use is failing: the
// call is recorded invalid_output, is not retried, and counts against the
// breaker, which opens.
func TestChatUnusableAnswersOpenTheBreaker(t *testing.T) {
	t.Parallel()
	f := ollamafake.New(t, func(*api.ChatRequest) ollamafake.Reply { return ollamafake.Reply{Content: "garbage"} })
	c := newClient(t, f.URL(), func(c *Config) { c.Breaker = BreakerConfig{MinCalls: 3, CoolDown: time.Hour} })
	req := chatReq
	checked := 0
	req.Check = func(content, doneReason string) bool {
		checked++
		return content != "garbage" && doneReason == "stop"
	}
	for i := range 3 {
		resp, err := c.Chat(context.Background(), req)
		if err != nil || resp.Content != "garbage" || len(resp.Calls) != 1 || resp.Calls[0].Outcome != OutcomeInvalidOutput {
			t.Fatalf("call %d: %+v %v", i, resp, err)
		}
	}
	if checked != 3 || c.BreakerState() != BreakerOpen {
		t.Fatalf("checked %d answers, breaker %s; want 3 and open", checked, c.BreakerState())
	}
	if _, err := c.Chat(context.Background(), req); !errors.Is(err, ErrBreakerOpen) || f.Calls() != 3 {
		t.Fatalf("with the breaker open: %v, server saw %d", err, f.Calls())
	}
}

// An answer cut off at num_predict is unusable but not the server's fault
// (an e-mail can ask for an endless reply): it does not count against the
// breaker.
func TestChatCutOffAnswersDoNotOpenTheBreaker(t *testing.T) {
	t.Parallel()
	f := ollamafake.New(t, func(*api.ChatRequest) ollamafake.Reply {
		return ollamafake.Reply{Content: `{"subject":"Re","body":"Dear customer, as you asked, here are all`, DoneReason: "length"}
	})
	c := newClient(t, f.URL(), func(c *Config) { c.Breaker = BreakerConfig{MinCalls: 1, CoolDown: time.Hour} })
	req := chatReq
	req.Check = func(_, doneReason string) bool { return doneReason == "stop" }
	for i := range 3 {
		resp, err := c.Chat(context.Background(), req)
		if err != nil || resp.Calls[0].Outcome != OutcomeInvalidOutput {
			t.Fatalf("call %d: %+v %v", i, resp, err)
		}
	}
	if c.BreakerState() != BreakerClosed {
		t.Fatalf("breaker %s after cut-off answers, want closed", c.BreakerState())
	}
}

// Token counts outside [0, MaxCallTokens] are clamped: a server's bug never
// reaches the ledger as an overflowing number.
func TestChatClampsTokenCounts(t *testing.T) {
	t.Parallel()
	f := ollamafake.New(t, func(*api.ChatRequest) ollamafake.Reply {
		return ollamafake.Reply{Content: "{}", PromptTokens: 3_000_000_000, OutputTokens: -5}
	})
	resp, err := newClient(t, f.URL(), nil).Chat(context.Background(), chatReq)
	if err != nil {
		t.Fatal(err)
	}
	if c := resp.Calls[0]; c.PromptTokens != MaxCallTokens || c.OutputTokens != 0 {
		t.Fatalf("call %+v, want %d prompt and 0 output tokens", c, MaxCallTokens)
	}
}

// A count beyond what the call allowed (num_predict for the output, num_ctx
// for the prompt) is not booked as it stood: one lying answer could spend a
// tenant's daily budget. Counts within the call's allowance stay exact.
func TestChatClampsTokenCountsToTheCallsOptions(t *testing.T) {
	t.Parallel()
	req := chatReq
	req.Options = map[string]any{"temperature": 0, "num_predict": 512, "num_ctx": float64(4096)}
	for _, tc := range []struct {
		name                   string
		prompt, output         int
		wantPrompt, wantOutput int64
	}{
		{"Lies", 2_000_000_000, 2_000_000_000, 4096, 512},
		{"Within", 4096, 512, 4096, 512},
		{"Small", 300, 40, 300, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := ollamafake.New(t, func(*api.ChatRequest) ollamafake.Reply {
				return ollamafake.Reply{Content: "{}", PromptTokens: tc.prompt, OutputTokens: tc.output}
			})
			resp, err := newClient(t, f.URL(), nil).Chat(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if c := resp.Calls[0]; c.PromptTokens != tc.wantPrompt || c.OutputTokens != tc.wantOutput {
				t.Fatalf("call %+v, want %d prompt and %d output tokens", c, tc.wantPrompt, tc.wantOutput)
			}
		})
	}
}

// rawServer answers every call with h, for the misbehaviours the fake
// server does not speak.
func rawServer(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

const unfinishedChunk = `{"model":"m","message":{"role":"assistant","content":"{\"category\":\"general\",\"priority\":\"low\",\"confidence\":0.5}"},"done":false}` + "\n"

// A reply that never reached done:true is not an answer: neither a stream
// the server closed after a chunk, nor one the call's deadline cut off.
func TestChatRefusesAnUnfinishedAnswer(t *testing.T) {
	t.Parallel()
	t.Run("ClosedBeforeDone", func(t *testing.T) {
		t.Parallel()
		url := rawServer(t, func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, unfinishedChunk) })
		resp, err := newClient(t, url, nil).Chat(context.Background(), chatReq)
		var me *Error
		if !errors.As(err, &me) || me.Kind != KindTransport {
			t.Fatalf("a stream closed before done: %v (content %q), want a transport error", err, resp.Content)
		}
		if got := outcomes(resp.Calls); !slices.Equal(got, []Outcome{OutcomeError, OutcomeError}) {
			t.Errorf("calls %v, want two errors (retried once)", got)
		}
	})
	t.Run("EndlessStreamTimesOut", func(t *testing.T) {
		t.Parallel()
		url := rawServer(t, func(w http.ResponseWriter, r *http.Request) {
			for {
				if _, err := io.WriteString(w, unfinishedChunk); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		})
		c := newClient(t, url, func(c *Config) { c.Timeout = 200 * time.Millisecond })
		resp, err := c.Chat(context.Background(), chatReq)
		var me *Error
		if !errors.As(err, &me) || me.Kind != KindTimeout {
			t.Fatalf("an endless stream: %v (content %q), want a timeout", err, resp.Content)
		}
		if got := outcomes(resp.Calls); !slices.Equal(got, []Outcome{OutcomeTimeout}) {
			t.Errorf("calls %v, want one timeout (not retried)", got)
		}
	})
}

// An error status is a status error with or without a body: a 4xx is not
// retried and says nothing against the server, a 5xx and a 429 (busy) are
// retried once.
func TestChatErrorStatusWithoutBody(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code  int
		calls int
	}{{404, 1}, {429, 2}, {500, 2}, {503, 2}} {
		t.Run(strconv.Itoa(tc.code), func(t *testing.T) {
			t.Parallel()
			url := rawServer(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(tc.code) })
			resp, err := newClient(t, url, nil).Chat(context.Background(), chatReq)
			var me *Error
			if !errors.As(err, &me) || me.Kind != KindStatus || me.StatusCode != tc.code {
				t.Fatalf("HTTP %d without a body: %v, want a status error %d", tc.code, err, tc.code)
			}
			if len(resp.Calls) != tc.calls {
				t.Errorf("%d calls, want %d", len(resp.Calls), tc.calls)
			}
		})
	}
}

func outcomes(calls []Call) []Outcome {
	out := make([]Outcome, len(calls))
	for i, c := range calls {
		out[i] = c.Outcome
	}
	return out
}

// A tenant's unusable answers open that tenant's breaker only: the shared
// breaker (the server's health) stays closed and another tenant's calls go
// through. A request without a tenant counts against the shared one
// (TestChatUnusableAnswersOpenTheBreaker).
func TestChatTenantsUnusableAnswersOpenOnlyTheirBreaker(t *testing.T) {
	t.Parallel()
	f := ollamafake.New(t, func(r *api.ChatRequest) ollamafake.Reply {
		if strings.Contains(r.Messages[len(r.Messages)-1].Content, "poison") {
			return ollamafake.Reply{Content: "garbage"}
		}
		return ollamafake.Reply{Content: `{}`}
	})
	c := newClient(t, f.URL(), func(c *Config) { c.Breaker = BreakerConfig{MinCalls: 3, CoolDown: time.Hour} })
	check := func(content, doneReason string) bool { return content != "garbage" }
	poisoned := Request{Model: "m", Messages: []Message{{Role: RoleUser, Content: "poison"}}, Check: check, Tenant: "b"}
	for i := range 3 {
		if resp, err := c.Chat(context.Background(), poisoned); err != nil || resp.Calls[0].Outcome != OutcomeInvalidOutput {
			t.Fatalf("B's call %d: %+v %v", i, resp, err)
		}
	}
	if _, err := c.Chat(context.Background(), poisoned); !errors.Is(err, ErrBreakerOpen) || f.Calls() != 3 {
		t.Fatalf("B's call with its breaker open: %v, server saw %d calls", err, f.Calls())
	}
	if got := c.TenantBreakersOpen(); !slices.Equal(got, []string{"b"}) || c.BreakerState() != BreakerClosed {
		t.Fatalf("tenant breakers open %v, shared %s; want [b] and closed", got, c.BreakerState())
	}
	clean := Request{Model: "m", Messages: []Message{{Role: RoleUser, Content: "hello"}}, Check: check, Tenant: "a"}
	if resp, err := c.Chat(context.Background(), clean); err != nil || resp.Content != `{}` || f.Calls() != 4 {
		t.Fatalf("A's call after B's breaker opened: %+v %v (server saw %d)", resp, err, f.Calls())
	}
}

// A panic in a request's Check (the turn's caller recovers it: brain.process)
// gives back the call's slot: with one slot, a call after three such
// panics still goes through rather than waiting forever for it.
func TestChatPanicInCheckGivesTheSlotBack(t *testing.T) {
	t.Parallel()
	f := ollamafake.New(t, func(*api.ChatRequest) ollamafake.Reply { return ollamafake.Reply{Content: `{}`} })
	c := newClient(t, f.URL(), func(c *Config) { c.MaxConcurrent = 1 })
	poison := chatReq
	poison.Tenant = "b"
	poison.Check = func(string, string) bool { panic("a bug in the caller's check") }
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for i := range 3 {
		func() {
			defer func() {
				if r := recover(); r == nil {
					t.Fatalf("call %d: Check's panic did not reach the caller", i)
				}
			}()
			if _, err := c.Chat(ctx, poison); err != nil {
				t.Fatalf("call %d: %v; want Check's panic (the slot was not given back)", i, err)
			}
		}()
	}
	clean := chatReq
	clean.Tenant = "b"
	if resp, err := c.Chat(ctx, clean); err != nil || resp.Content != `{}` {
		t.Fatalf("a call after three panics: %+v %v; want the answer", resp, err)
	}
	if c.BreakerState() != BreakerClosed || len(c.TenantBreakersOpen()) != 0 {
		t.Fatalf("breakers after the panics: shared %s, tenants open %v; want all closed", c.BreakerState(), c.TenantBreakersOpen())
	}
}

// A call whose Check panicked tells the breakers nothing, not a success:
// four panics before three unusable answers leave the tenant's breaker to
// open on those three (counted as successes, they would keep it closed at
// 3 failures in 7).
func TestChatPanicInCheckIsNoSuccess(t *testing.T) {
	t.Parallel()
	f := ollamafake.New(t, func(r *api.ChatRequest) ollamafake.Reply {
		return ollamafake.Reply{Content: r.Messages[len(r.Messages)-1].Content}
	})
	c := newClient(t, f.URL(), func(c *Config) { c.Breaker = BreakerConfig{MinCalls: 3, CoolDown: time.Hour} })
	check := func(content, _ string) bool {
		if content == "panic" {
			panic("a bug in the caller's check")
		}
		return content != "garbage"
	}
	call := func(content string) {
		defer func() { _ = recover() }()
		_, _ = c.Chat(context.Background(), Request{Model: "m", Messages: []Message{{Role: RoleUser, Content: content}}, Check: check, Tenant: "b"})
	}
	for range 4 {
		call("panic")
	}
	for range 3 {
		call("garbage")
	}
	if got := c.TenantBreakersOpen(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("tenant breakers open %v after 4 panics and 3 unusable answers; want [b]", got)
	}
}

func TestSameModel(t *testing.T) {
	for _, tc := range []struct {
		asked, got string
		same       bool
	}{
		{"m", "m", true},
		{"m", "m:latest", true},
		{"m:latest", "m", true},
		{"qwen2.5:7b", "qwen2.5:7b", true},
		{"qwen2.5:7b", "qwen2.5:3b", false},
		{"qwen2.5:7b", "qwen2.5", false},
		{"hf.co/org/m", "hf.co/org/m:latest", true},
		{"host:5000/m", "host:5000/m:latest", true},
		{"m", "", false},
		{"m", "other", false},
	} {
		if got := sameModel(tc.asked, tc.got); got != tc.same {
			t.Errorf("sameModel(%q, %q) = %v, want %v", tc.asked, tc.got, got, tc.same)
		}
	}
}

// The retry after a 429 waits what the server's Retry-After asked, not the
// client's own short delay.
func TestChatWaitsTheRetryAfter(t *testing.T) {
	t.Parallel()
	f := ollamafake.New(t, nil)
	var mu sync.Mutex
	var at []time.Time
	f.SetChatFunc(func(*api.ChatRequest) ollamafake.Reply {
		mu.Lock()
		defer mu.Unlock()
		at = append(at, time.Now())
		if len(at) == 1 {
			return ollamafake.Reply{Status: http.StatusTooManyRequests, RetryAfter: "1"}
		}
		return ollamafake.Reply{Content: `{}`}
	})
	c := newClient(t, f.URL(), nil) // RetryDelay 1ms
	if _, err := c.Chat(context.Background(), chatReq); err != nil {
		t.Fatal(err)
	}
	if len(at) != 2 || at[1].Sub(at[0]) < 900*time.Millisecond {
		t.Fatalf("%d calls, the retry %s after the 429 with Retry-After: 1", len(at), at[len(at)-1].Sub(at[0]))
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"3", 3 * time.Second, true},
		{"-1", 0, false},
		{"soon", 0, false},
		{now.Add(5 * time.Second).Format(http.TimeFormat), 5 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"99999999999999", (1 << 20) * time.Second, true},
	} {
		got, ok := parseRetryAfter(tc.v, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseRetryAfter(%q) = %s, %v; want %s, %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}

// Retry-After decides only whether and when a call is asked again: a 5xx
// counts against the breaker whatever wait it asks for, and a 429 (busy,
// up) does not.
func TestChatRetryAfterDoesNotChangeWhatTheBreakerCounts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		want   BreakerState
	}{{http.StatusServiceUnavailable, BreakerOpen}, {http.StatusTooManyRequests, BreakerClosed}} {
		f := ollamafake.New(t, func(*api.ChatRequest) ollamafake.Reply {
			return ollamafake.Reply{Status: tc.status, RetryAfter: "120"}
		})
		c := newClient(t, f.URL(), func(c *Config) { c.Breaker = BreakerConfig{MinCalls: 3, CoolDown: time.Hour} })
		for range 3 {
			if _, err := c.Chat(context.Background(), chatReq); !errors.Is(err, ErrUnavailable) {
				t.Fatalf("HTTP %d: %v", tc.status, err)
			}
		}
		if f.Calls() != 3 || c.BreakerState() != tc.want {
			t.Errorf("HTTP %d with Retry-After 120: server saw %d calls, breaker %s; want 3 (none retried) and %s",
				tc.status, f.Calls(), c.BreakerState(), tc.want)
		}
	}
}

// The breaker's default window holds MinCalls calls that all hang until
// their timeout, MaxConcurrent at a time: otherwise a model that hangs
// never opens it (30s against the 60s timeout did not). A window set too
// short is kept, and warned of at start.
func TestBreakerWindowHoldsTheMinCalls(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want time.Duration
	}{
		{Config{}, 4 * time.Minute}, // 60s timeout, 2 at a time, 5 calls: 3 rounds and one to spare
		{Config{Timeout: 2 * time.Second}, 8 * time.Second},
		{Config{MaxConcurrent: 8, Breaker: BreakerConfig{MinCalls: 20}}, 4 * time.Minute},
		{Config{Breaker: BreakerConfig{MinCalls: math.MaxInt32}}, time.Hour}, // the evaluation's never-opening breaker
		{Config{Breaker: BreakerConfig{Window: 10 * time.Second}}, 10 * time.Second},
	} {
		c := tc.cfg.withDefaults()
		if c.Breaker.Window != tc.want {
			t.Errorf("%+v: window %v, want %v", tc.cfg, c.Breaker.Window, tc.want)
		}
		calls := max(tc.cfg.Breaker.MinCalls, 5)
		if tc.cfg.Breaker.Window == 0 && calls < math.MaxInt32 && int(c.Breaker.Window/c.Timeout)*c.MaxConcurrent < calls {
			t.Errorf("%+v: a window of %v sees fewer than %d calls time out", tc.cfg, c.Breaker.Window, calls)
		}
	}
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	if _, err := New(Config{URL: "http://127.0.0.1:1", Breaker: BreakerConfig{Window: 30 * time.Second}}, log); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "BRAIN_MODEL_BREAKER_WINDOW is too short") {
		t.Errorf("a 30s window with the 60s timeout was not warned of: %q", logs.String())
	}
	logs.Reset()
	if _, err := New(Config{URL: "http://127.0.0.1:1"}, log); err != nil || logs.Len() != 0 {
		t.Errorf("the defaults: %v, logged %q", err, logs.String())
	}
}

// A proxy that streams despite stream:false: the answer is its chunks'
// content joined, with the last chunk's counts, as a streaming client
// reads it; chunks adding up to more than an answer may be are refused.
func TestChatJoinsAnAnswerStreamedDespiteStreamFalse(t *testing.T) {
	t.Parallel()
	chunk := func(content string, done bool) string {
		b, _ := json.Marshal(map[string]any{"model": "m", "message": map[string]string{"role": "assistant", "content": content},
			"done": done, "done_reason": map[bool]string{true: "stop"}[done], "prompt_eval_count": 11, "eval_count": 7})
		return string(b) + "\n"
	}
	t.Run("Joined", func(t *testing.T) {
		t.Parallel()
		url := rawServer(t, func(w http.ResponseWriter, _ *http.Request) {
			for _, c := range []string{chunk(`{"categ`, false), chunk(`ory":"quote`, false), chunk(`"}`, false), chunk("", true)} {
				io.WriteString(w, c)
				w.(http.Flusher).Flush()
			}
		})
		resp, err := newClient(t, url, nil).Chat(context.Background(), chatReq)
		if err != nil {
			t.Fatalf("an answer in chunks: %v", err)
		}
		if resp.Content != `{"category":"quote"}` || len(resp.Calls) != 1 || resp.Calls[0].Outcome != OutcomeOK ||
			resp.Calls[0].PromptTokens != 11 || resp.Calls[0].OutputTokens != 7 {
			t.Fatalf("content %q, calls %+v", resp.Content, resp.Calls)
		}
	})
	t.Run("AnotherModelInTheChunks", func(t *testing.T) {
		// The content comes from another model; only the last, empty
		// chunk names the one asked for.
		t.Parallel()
		url := rawServer(t, func(w http.ResponseWriter, _ *http.Request) {
			for _, c := range []string{chunk(`{"category":`, false), chunk(`"quote"}`, false)} {
				io.WriteString(w, strings.Replace(c, `"model":"m"`, `"model":"evil:7b"`, 1))
				w.(http.Flusher).Flush()
			}
			io.WriteString(w, chunk("", true))
		})
		resp, err := newClient(t, url, nil).Chat(context.Background(), chatReq)
		var me *Error
		if !errors.As(err, &me) || me.Kind != KindWrongModel {
			t.Fatalf("chunks of another model: %v (content %q), want a wrong-model error", err, resp.Content)
		}
	})
	t.Run("TooLargeInAll", func(t *testing.T) {
		t.Parallel()
		piece := chunk(strings.Repeat("x", 1<<20), false)
		url := rawServer(t, func(w http.ResponseWriter, r *http.Request) {
			for i := 0; i < 2*maxAnswerBytes>>20; i++ {
				if _, err := io.WriteString(w, piece); err != nil || r.Context().Err() != nil {
					return
				}
			}
			io.WriteString(w, chunk("", true))
		})
		// Time enough to read them under the race detector.
		c := newClient(t, url, func(c *Config) { c.Timeout = time.Minute })
		resp, err := c.Chat(context.Background(), chatReq)
		var me *Error
		if !errors.As(err, &me) || me.Kind != KindTransport {
			t.Fatalf("%d MiB of chunks: %v (content of %d bytes), want a transport error", 2*maxAnswerBytes>>20, err, len(resp.Content))
		}
	})
}
