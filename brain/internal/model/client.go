package model

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ollama/ollama/api"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"n8nbrain/brain/internal/fair"
	"n8nbrain/internal/telemetry"
)

// Config of a client. The zero value of a field means its default.
type Config struct {
	// URL of the Ollama server: http://host:port, or host[:port] (port
	// 11434 by default, as Ollama's own OLLAMA_HOST).
	URL string
	// Timeout bounds one HTTP call. Default 60s.
	Timeout time.Duration
	// KeepAlive is how long the server keeps the model loaded after a call
	// (Ollama's keep_alive). Default 30m.
	KeepAlive time.Duration
	// RetryDelay is the pause before the one retry. Default 500ms.
	RetryDelay time.Duration
	// MaxConcurrent bounds the calls in flight from this client. A CPU-bound
	// server answers one or two at a time and queues the rest; queued there,
	// a call's timeout would run out while it waits. Waiting here is bounded
	// by the caller's context instead, and Timeout measures the model's own
	// work. Free slots go round robin between the tenants waiting
	// (Request.Tenant), not first come first served. Default 2.
	MaxConcurrent int
	Breaker       BreakerConfig
	// HTTPClient, when set, replaces the client's own (tests).
	HTTPClient *http.Client
}

func (c Config) withDefaults() Config {
	if c.Timeout <= 0 {
		c.Timeout = 60 * time.Second
	}
	if c.KeepAlive <= 0 {
		c.KeepAlive = 30 * time.Minute
	}
	if c.RetryDelay <= 0 {
		c.RetryDelay = 500 * time.Millisecond
	}
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = 2
	}
	if c.Breaker.Window <= 0 {
		c.Breaker.Window = breakerWindow(c.Breaker.MinCalls, c.MaxConcurrent, c.Timeout)
	}
	return c
}

// breakerWindow is the breaker's default window: long enough to see
// minCalls calls finish even when every one hangs until its timeout, at
// most concurrent at a time, with one timeout to spare (the window moves
// in buckets). A shorter window would never count enough calls to open on
// a model that hangs: each item would wait out a whole timeout. At most an
// hour (the evaluation's breakers never open: MinCalls is huge).
func breakerWindow(minCalls, concurrent int, timeout time.Duration) time.Duration {
	if minCalls <= 0 {
		minCalls = defaultMinCalls
	}
	rounds := (minCalls + concurrent - 1) / concurrent
	if rounds >= int(time.Hour/timeout) {
		return time.Hour
	}
	return time.Duration(rounds+1) * timeout
}

// ParseURL accepts what OLLAMA_HOST accepts: a URL, or host[:port] with
// http and port 11434 implied.
func ParseURL(s string) (*url.URL, error) {
	s = strings.Trim(strings.TrimSpace(s), `"'`)
	if s == "" {
		return nil, errors.New("model server URL is empty")
	}
	defaultPort := ""
	if !strings.Contains(s, "://") {
		s = "http://" + s
		defaultPort = "11434"
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("model server URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("model server URL: scheme %q is not http or https", u.Scheme)
	}
	if u.Hostname() == "" {
		return nil, errors.New("model server URL has no host")
	}
	if u.Port() == "" && defaultPort != "" {
		u.Host = net.JoinHostPort(u.Hostname(), defaultPort)
	}
	return u, nil
}

// Roles of chat messages.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
)

// Message is one chat message.
type Message struct {
	Role    string
	Content string
}

// Request is one chat.
type Request struct {
	Model    string
	Messages []Message
	// Format is the JSON schema the answer must follow (Ollama's structured
	// output: the server constrains generation to it).
	Format  json.RawMessage
	Options map[string]any
	// Check, when set, tells whether an answer is usable (content and
	// Ollama's done_reason). An unusable answer is recorded invalid_output
	// and, unless it was only cut off at num_predict (done_reason "length"),
	// counts as a failure for the circuit breaker: a server answering 200
	// with output its caller cannot use is failing too. It is called once
	// per answer, before Chat returns.
	Check func(content, doneReason string) bool
	// Tenant, when set, is whose content the request carries. An answer
	// Check refuses then counts against that tenant's own breaker, not the
	// shared one: a tenant whose e-mails make the model's output unusable
	// (prompt injection, odd content) stops its own calls, never another
	// tenant's. Transport errors, timeouts and 5xx stay the shared
	// breaker's: they are the server's health.
	Tenant string
}

// Outcome of one call, as the ledger records it.
type Outcome string

const (
	OutcomeOK      Outcome = "ok"
	OutcomeError   Outcome = "error"
	OutcomeTimeout Outcome = "timeout"
	// OutcomeInvalidOutput: the call was answered, but Request.Check
	// refused the answer.
	OutcomeInvalidOutput Outcome = "invalid_output"
)

// maxAnswerBytes bounds an answer's content, however many chunks it comes
// in: the longest line the Ollama client reads, so one object's bound.
const maxAnswerBytes = 8 << 20

// MaxCallTokens bounds each token count a server reports for one call.
// No model served by Ollama has a context anywhere near ten million
// tokens, so a larger count is a server's bug, not usage; it is clamped (and
// logged) so that it can neither overflow the ledger nor any sum of it.
const MaxCallTokens = 10_000_000

// clampTokens keeps a reported token count within [0, most].
func clampTokens(n int, most int64) (int64, bool) {
	switch {
	case n < 0:
		return 0, true
	case int64(n) > most:
		return most, true
	}
	return int64(n), false
}

// NoPredictLimit is the output allowance of a call whose options bound
// output by neither num_predict nor num_ctx: no model we run has a larger
// context than this.
const NoPredictLimit = 32768

// OutputAllowance is the most output a call with these options may
// produce: num_predict when positive; otherwise Ollama bounds it only by
// the context (num_predict -1 is unlimited, -2 fills the context), so
// num_ctx, or NoPredictLimit. Ollama stops generating at num_predict, so a
// server counting more output than this is wrong, and the budget reserves
// this much before a call.
func OutputAllowance(opts map[string]any) int64 {
	if n, ok := optionNumber(opts["num_predict"]); ok && n > 0 {
		return min(n, MaxCallTokens)
	}
	if n, ok := optionNumber(opts["num_ctx"]); ok && n > 0 {
		return min(n, MaxCallTokens)
	}
	return NoPredictLimit
}

// promptAllowance is the most prompt a call with these options may count:
// Ollama fits the prompt into num_ctx when it is set.
func promptAllowance(opts map[string]any) int64 {
	if n, ok := optionNumber(opts["num_ctx"]); ok && n > 0 {
		return min(n, MaxCallTokens)
	}
	return MaxCallTokens
}

// optionNumber reads a whole number from an option value: ours are ints,
// the registry's (decoded JSON) float64s.
func optionNumber(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int64:
		return x, true
	case float64:
		if x >= -1e15 && x <= 1e15 {
			return int64(x), true
		}
	}
	return 0, false
}

// Call is what one HTTP call cost.
type Call struct {
	PromptTokens int64 // Ollama's prompt_eval_count, clamped to [0, MaxCallTokens]
	OutputTokens int64 // Ollama's eval_count, clamped likewise
	Latency      time.Duration
	Outcome      Outcome
}

// Response is the answer of a chat and every call it took.
type Response struct {
	Content string
	// DoneReason is Ollama's done_reason: "stop", or "length" when the
	// answer was cut off at num_predict.
	DoneReason string
	// Calls lists every HTTP call made, in order, the failed ones included;
	// it is set whether Chat succeeds or not.
	Calls []Call
}

// ErrUnavailable: the model server cannot be used now (down, failing,
// timing out, refusing the request, or the breaker is open).
var ErrUnavailable = errors.New("model unavailable")

// ErrorKind says how a chat failed.
type ErrorKind string

const (
	KindTimeout     ErrorKind = "timeout"
	KindTransport   ErrorKind = "transport"
	KindStatus      ErrorKind = "status"
	KindBreakerOpen ErrorKind = "breaker_open"
	KindWrongModel  ErrorKind = "wrong_model" // the answer names another model than asked
)

// Error is a chat that failed on the server's side. It deliberately carries
// no text from the server: an error body can echo the prompt.
type Error struct {
	Kind       ErrorKind
	StatusCode int // with KindStatus
	Attempts   int // HTTP calls made
	// RetryAfter is the server's Retry-After on a 429 or 5xx, when it
	// gave one.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Kind == KindStatus {
		return fmt.Sprintf("model unavailable: HTTP status %d after %d call(s)", e.StatusCode, e.Attempts)
	}
	return fmt.Sprintf("model unavailable: %s after %d call(s)", e.Kind, e.Attempts)
}

// Is makes every Error an ErrUnavailable, and a refusal by the breaker an
// ErrBreakerOpen.
func (e *Error) Is(target error) bool {
	return target == ErrUnavailable || (target == ErrBreakerOpen && e.Kind == KindBreakerOpen)
}

// Client calls one Ollama server.
type Client struct {
	cfg     Config
	log     *slog.Logger
	api     *api.Client
	breaker *Breaker
	slots   *fair.Slots // MaxConcurrent calls in flight, granted round robin between tenants

	mu       sync.Mutex
	tenantBr map[string]*Breaker // Request.Tenant's breakers, made on first use
}

// New returns a client; it makes no call.
func New(cfg Config, log *slog.Logger) (*Client, error) {
	cfg = cfg.withDefaults()
	if need := breakerWindow(cfg.Breaker.MinCalls, cfg.MaxConcurrent, cfg.Timeout) - cfg.Timeout; cfg.Breaker.Window < need {
		log.Warn("BRAIN_MODEL_BREAKER_WINDOW is too short to open on a model that hangs: it cannot see BRAIN_MODEL_BREAKER_MIN_CALLS "+
			"calls time out at BRAIN_MODEL_CONCURRENCY at a time, so every item would wait out BRAIN_MODEL_TIMEOUT (unset it for the default)",
			"breaker_window", cfg.Breaker.Window.String(), "needed", need.String())
	}
	u, err := ParseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	hc := cfg.HTTPClient
	if hc == nil {
		// Our own client, never http.DefaultClient: no global state, and no
		// overall Client.Timeout (each call gets its own context deadline).
		hc = &http.Client{Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:          64,
			MaxIdleConnsPerHost:   32,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   5 * time.Second,
			ExpectContinueTimeout: time.Second,
		}}
	}
	hc = withStatusErrors(hc)
	c := &Client{cfg: cfg, log: log, api: api.NewClient(u, hc), slots: fair.NewSlots(cfg.MaxConcurrent)}
	c.breaker = NewBreaker(cfg.Breaker, logBreaker(log, "model circuit breaker changed state"))
	return c, nil
}

// logBreaker logs a breaker's state changes: a WARN when it opens, INFO
// otherwise.
func logBreaker(log *slog.Logger, msg string) func(from, to BreakerState) {
	return func(from, to BreakerState) {
		lvl := slog.LevelInfo
		if to == BreakerOpen {
			lvl = slog.LevelWarn
		}
		log.Log(context.Background(), lvl, msg, "from", string(from), "to", string(to))
	}
}

// BreakerState reports the shared circuit breaker's state.
func (c *Client) BreakerState() BreakerState { return c.breaker.State() }

// TenantBreakersOpen lists, sorted, the tenants whose own breaker is not
// closed (Request.Tenant).
func (c *Client) TenantBreakersOpen() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var open []string
	for id, b := range c.tenantBr {
		if b.State() != BreakerClosed {
			open = append(open, id)
		}
	}
	slices.Sort(open)
	return open
}

// tenantBreaker is id's own breaker, nil for a request without a tenant.
func (c *Client) tenantBreaker(id string) *Breaker {
	if id == "" {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.tenantBr[id]
	if b == nil {
		b = NewBreaker(c.cfg.Breaker, logBreaker(c.log.With("tenant_id", id),
			"tenant's model circuit breaker changed state (it counts the tenant's unusable answers)"))
		if c.tenantBr == nil {
			c.tenantBr = map[string]*Breaker{}
		}
		c.tenantBr[id] = b
	}
	return b
}

// Ping asks the server for its version (a start-up check; it does not
// touch the breaker).
func (c *Client) Ping(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, min(c.cfg.Timeout, 5*time.Second))
	defer cancel()
	v, err := c.api.Version(ctx)
	if err != nil {
		var se api.StatusError
		if errors.As(err, &se) {
			return "", &Error{Kind: KindStatus, StatusCode: se.StatusCode, Attempts: 1}
		}
		if ctx.Err() != nil {
			return "", &Error{Kind: KindTimeout, Attempts: 1}
		}
		return "", &Error{Kind: KindTransport, Attempts: 1}
	}
	return truncate(v, 64), nil // the server's text, for a log line
}

// Chat sends one chat (stream off) and returns the answer. Transport errors,
// 5xx and 429 are retried once, after the server's Retry-After when it
// gives one of at most maxRetryAfter (a longer one is not retried);
// timeouts are not (a server too slow to answer in time would only be
// asked to do the same work again), nor are other 4xx, nor answers that
// req.Check refuses (a repair is the caller's to ask).
// A failure is an *Error (errors.Is ErrUnavailable) unless ctx itself ended,
// which returns ctx's error. The Response lists the calls made either way.
func (c *Client) Chat(ctx context.Context, req Request) (Response, error) {
	var resp Response
	for try := 1; ; try++ {
		got, call, retry, err := c.attempt(ctx, req, try)
		if call.Outcome == "" && err != nil {
			return resp, err // no call made: no slot, or a breaker open
		}
		resp.Calls = append(resp.Calls, call)
		if err == nil {
			resp.Content, resp.DoneReason = got.Message.Content, got.DoneReason
			return resp, nil
		}
		if ctx.Err() != nil {
			return resp, fmt.Errorf("model call: %w", context.Cause(ctx))
		}
		var me *Error
		if errors.As(err, &me) {
			me.Attempts = try
		}
		if !retry || try == 2 {
			return resp, err
		}
		delay := c.cfg.RetryDelay
		if me != nil && me.RetryAfter > 0 {
			delay = me.RetryAfter
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return resp, fmt.Errorf("model call: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
}

// attempt makes try's call with a slot and the breakers' leave, and gives
// both back whatever happens, a panic in req.Check included: the turn's
// caller recovers it, and a slot kept would be lost to every later turn.
// A call refused before it is made has an empty Outcome.
func (c *Client) attempt(ctx context.Context, req Request, try int) (got *api.ChatResponse, call Call, retry bool, err error) {
	if err := c.slots.Acquire(ctx, string(req.Tenant)); err != nil {
		return nil, call, false, fmt.Errorf("model call: waiting for a free slot: %w", err)
	}
	defer c.slots.Release()
	done, err := c.breaker.Allow()
	if err != nil {
		return nil, call, false, &Error{Kind: KindBreakerOpen, Attempts: try - 1}
	}
	res := ResultIgnore
	defer func() { done(res) }()
	tenantDone := func(Result) {}
	if tb := c.tenantBreaker(req.Tenant); tb != nil {
		if tenantDone, err = tb.Allow(); err != nil {
			return nil, call, false, &Error{Kind: KindBreakerOpen, Attempts: try - 1}
		}
	}
	tenantRes := ResultIgnore // the tenant's breaker counts only its answers
	defer func() { tenantDone(tenantRes) }()
	returned := false
	defer func() {
		if !returned { // a panic says nothing of the server's health
			res, tenantRes = ResultIgnore, ResultIgnore
		}
	}()
	got, call, res, retry, err = c.once(ctx, req)
	if err == nil {
		tenantRes = ResultSuccess
	}
	if err == nil && req.Check != nil && !req.Check(got.Message.Content, got.DoneReason) {
		call.Outcome = OutcomeInvalidOutput
		// An answer cut off at num_predict is the server doing as it was
		// told (an e-mail can ask for a reply longer than the cap); any
		// other unusable answer from a server that is meant to follow
		// the JSON schema means the server or model is broken, or the
		// tenant's content broke it: its own breaker when it has one.
		if got.DoneReason != "length" {
			if req.Tenant != "" {
				tenantRes = ResultFailure
			} else {
				res = ResultFailure
			}
		}
	}
	returned = true
	return got, call, retry, err
}

// once makes one HTTP call and classifies its failure: the ledger outcome,
// what it tells the breaker, and whether a retry may help.
func (c *Client) once(ctx context.Context, req Request) (got *api.ChatResponse, call Call, res Result, retry bool, err error) {
	tctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	msgs := make([]api.Message, len(req.Messages))
	for i, m := range req.Messages {
		msgs[i] = api.Message{Role: m.Role, Content: m.Content}
	}
	stream, think := false, api.ThinkValue{Value: false}
	tctx, span := telemetry.Start(tctx, "model chat", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("gen_ai.request.model", req.Model)))
	defer func() {
		if span.IsRecording() {
			span.SetAttributes(attribute.String("model.outcome", string(call.Outcome)),
				attribute.Int64("gen_ai.usage.input_tokens", call.PromptTokens),
				attribute.Int64("gen_ai.usage.output_tokens", call.OutputTokens))
		}
		telemetry.End(span, err)
	}()
	start := time.Now()
	var answer strings.Builder
	otherModel := false // a chunk named another model than asked
	err = c.api.Chat(tctx, &api.ChatRequest{
		Model:     req.Model,
		Messages:  msgs,
		Stream:    &stream,
		Format:    req.Format,
		KeepAlive: &api.Duration{Duration: c.cfg.KeepAlive},
		Options:   req.Options,
		// Thinking models would spend the output budget on reasoning text
		// we never use; models without thinking accept false too.
		Think: &think,
	}, func(r api.ChatResponse) error {
		// Real Ollama answers stream:false with one object. A proxy that
		// streams anyway sends the answer in chunks, the last with done
		// and the counts: the answer is their content joined, as a
		// streaming client would read it, up to maxAnswerBytes.
		if answer.Len()+len(r.Message.Content) > maxAnswerBytes {
			return fmt.Errorf("the answer came in chunks of more than %d bytes in all", maxAnswerBytes)
		}
		answer.WriteString(r.Message.Content)
		// Every chunk: a proxy may stream another model's answer and name
		// the one asked for only in the last.
		otherModel = otherModel || !sameModel(req.Model, r.Model)
		got = &r
		return nil
	})
	call.Latency = time.Since(start)
	if got != nil {
		got.Message.Content = answer.String()
	}
	// The ollama client returns no error for a stream that ends without
	// done:true (the server closed it, or our deadline cut it): the last
	// chunk is not an answer. A deadline is classified as one below.
	if err == nil && (got == nil || !got.Done) {
		err = errors.New("the answer ended before done")
	}
	if err == nil {
		var pc, oc bool
		call.Outcome = OutcomeOK
		// A count beyond what the call allowed is a server's bug or lie,
		// not usage: booked as it stood, one answer could spend a tenant's
		// daily budget.
		most, mostOut := promptAllowance(req.Options), OutputAllowance(req.Options)
		call.PromptTokens, pc = clampTokens(got.PromptEvalCount, most)
		call.OutputTokens, oc = clampTokens(got.EvalCount, mostOut)
		if pc || oc {
			c.log.Warn("model server reported an implausible token count; clamped to what the call allowed",
				"prompt_tokens", got.PromptEvalCount, "output_tokens", got.EvalCount, "max_prompt", most, "max_output", mostOut)
		}
		if otherModel {
			// What the ledger and the decision say answered must be what
			// did: a server or proxy that swaps the model is broken, and its
			// answer is not used (its tokens still count: they were spent).
			call.Outcome = OutcomeError
			c.log.Warn("model server answered with another model than asked; the answer is not used",
				// Not the name it answered: that is the server's text, and
				// a lying server can echo the prompt (the e-mail) in it.
				"asked", req.Model, "answered_bytes", len(got.Model))
			return nil, call, ResultFailure, false, &Error{Kind: KindWrongModel}
		}
		return got, call, ResultSuccess, false, nil
	}
	call.Outcome = OutcomeError
	var se api.StatusError
	var ae api.AuthorizationError
	switch {
	case ctx.Err() != nil:
		// The caller gave up (turn deadline or shutdown): says nothing about the server.
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			call.Outcome = OutcomeTimeout
		}
		return nil, call, ResultIgnore, false, ctx.Err()
	case errors.Is(tctx.Err(), context.DeadlineExceeded):
		call.Outcome = OutcomeTimeout
		return nil, call, ResultFailure, false, &Error{Kind: KindTimeout}
	case errors.As(err, &se):
		var after time.Duration
		var ra retryAfterError
		if errors.As(err, &ra) {
			after = ra.after
		}
		// A 4xx (unknown model, bad request): the server is up but will not
		// do this; retrying the same request cannot help.
		res, retry := ResultSuccess, false
		switch {
		case se.StatusCode >= 500:
			res, retry = ResultFailure, true
		case se.StatusCode == http.StatusTooManyRequests:
			retry = true // busy, not broken: asked again after the wait it asked for
		}
		if after > maxRetryAfter {
			// Asked to come back later than a turn can wait: the item is
			// escalated now, and a re-drive asks again.
			retry = false
		}
		return nil, call, res, retry, &Error{Kind: KindStatus, StatusCode: se.StatusCode, RetryAfter: after}
	case errors.As(err, &ae):
		return nil, call, ResultSuccess, false, &Error{Kind: KindStatus, StatusCode: ae.StatusCode}
	}
	// Connection refused or reset, a malformed answer: the error text may
	// quote the body, so only the kind is kept.
	return nil, call, ResultFailure, true, &Error{Kind: KindTransport}
}

// sameModel reports whether an answer naming model got is from the model
// asked for: the same name, an implicit ":latest" tag aside (Ollama's
// default tag).
func sameModel(asked, got string) bool {
	tagged := func(m string) string {
		if i := strings.LastIndexAny(m, ":/"); i < 0 || m[i] == '/' {
			return m + ":latest"
		}
		return m
	}
	return got == asked || (got != "" && tagged(got) == tagged(asked))
}

// truncate is s cut to at most n bytes, for logging a value a server chose.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// withStatusErrors returns a copy of hc whose answers of status 400 or more
// are an api.StatusError before the ollama client reads them. That client
// reports an error status only when the body holds a line: with an empty
// body it returns nothing at all, which would be typed a transport failure
// (a 404 retried and counted by the breaker). Only the status is kept; the
// body may quote the prompt.
func withStatusErrors(hc *http.Client) *http.Client {
	c := *hc
	base := c.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	c.Transport = statusTransport{base}
	return &c
}

type statusTransport struct{ base http.RoundTripper }

func (t statusTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	// A redirect is an error too, never followed: following it would send
	// the prompt (the e-mail) again, to a host nobody configured, in calls
	// the ledger does not count.
	if err != nil || resp.StatusCode < http.StatusMultipleChoices {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // so the connection is reused
	resp.Body.Close()
	se := api.StatusError{StatusCode: resp.StatusCode, Status: resp.Status}
	if after, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
		return nil, retryAfterError{se, after}
	}
	return nil, se
}

// maxRetryAfter is the longest Retry-After a call waits for before its one
// retry; a longer one is not waited for.
const maxRetryAfter = 10 * time.Second

// retryAfterError is an error status that came with a Retry-After.
type retryAfterError struct {
	api.StatusError
	after time.Duration
}

func (e retryAfterError) Unwrap() error { return e.StatusError }

// parseRetryAfter reads a Retry-After header: seconds, or an HTTP date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		return time.Duration(min(n, 1<<20)) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
