package eval

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"n8nbrain/brain/internal/capture"
	"n8nbrain/brain/internal/engine"
	"n8nbrain/brain/internal/model"
	"n8nbrain/catalogue"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// Config of a run. The zero value of a field means its default.
type Config struct {
	// OllamaURL is the model server (as BRAIN_OLLAMA_URL). Required.
	OllamaURL string
	// Model replaces the tenant's model name when set; a tenant without
	// one needs it.
	Model string
	// Tenant is the configuration under test: categories, enabled actions,
	// rules, model options, catalogue version (registry or a config file).
	Tenant *registry.Tenant
	// Concurrency is how many e-mails are decided at once (and the model
	// client's calls in flight). Default 1: a CPU-bound server answers one
	// at a time, and latency figures are the model's own.
	Concurrency int
	// CallTimeout bounds one model call. Default 120s (small CPU models).
	CallTimeout time.Duration
	// ItemTimeout bounds one e-mail's decision, model calls included.
	// Default 10m.
	ItemTimeout time.Duration
	// PricePrompt1K and PriceOutput1K are the price of a thousand prompt
	// and output tokens (any currency; 0 for a local model).
	PricePrompt1K float64
	PriceOutput1K float64
	// Judge, when set, checks each draft with a second model.
	Judge *JudgeConfig
	// ProgressFunc, when set, is called after each e-mail (any goroutine,
	// one call at a time).
	ProgressFunc func(done, total int)
	// Log receives the stage's own log lines (never e-mail content).
	// Default: discarded.
	Log *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Concurrency <= 0 {
		c.Concurrency = 1
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = 120 * time.Second
	}
	if c.ItemTimeout <= 0 {
		c.ItemTimeout = 10 * time.Minute
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Result is what the brain decided for one labelled e-mail, and what it cost.
type Result struct {
	ID       string   `json:"id"`
	Language string   `json:"language"`
	Tags     []string `json:"tags,omitempty"`
	Labels   Labels   `json:"labels"`
	// The decision: assessment, proposed action ("escalate" when the item
	// was escalated, "none" when no action was proposed), status, reason.
	Category   string              `json:"category"`
	Priority   string              `json:"priority"`
	Confidence float64             `json:"confidence"`
	Source     string              `json:"source"` // rule, model, none
	Rule       string              `json:"rule,omitempty"`
	Action     string              `json:"action"`
	Status     wire.WorkItemStatus `json:"status"`
	Reason     string              `json:"reason,omitempty"`
	// Draft is draft_reply's parameters, when proposed.
	Draft *Draft `json:"draft,omitempty"`
	// Check is the draft's check, when both label and decision are draft_reply.
	Check *DraftCheck `json:"check,omitempty"`
	// Calls are the model calls the decision made (the ledger rows).
	Calls []Call `json:"calls,omitempty"`
	// Repairs counts the steps whose first answer failed strict decoding
	// and were asked once more.
	Repairs   int     `json:"repairs"`
	LatencyMS float64 `json:"latency_ms"` // the whole decision, wall time
	// Error is a decision that could not be made (not a model failure,
	// which is an escalation, but e.g. the run's deadline).
	Error string `json:"error,omitempty"`
}

// Draft is a proposed reply.
type Draft struct {
	Subject string `json:"subject"`
	Body    string `json:"body"`
	Tone    string `json:"tone,omitempty"`
}

// Call is one model call of a decision.
type Call struct {
	Step         string  `json:"step"`
	Attempt      int     `json:"attempt"`
	Outcome      string  `json:"outcome"` // ok, invalid_output, error, timeout
	PromptTokens int64   `json:"prompt_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	LatencyMS    float64 `json:"latency_ms"`
}

// Tokens is the decision's prompt plus output tokens.
func (r *Result) Tokens() int64 {
	var n int64
	for _, c := range r.Calls {
		n += c.PromptTokens + c.OutputTokens
	}
	return n
}

// Runner runs labelled e-mails through the brain's real decision path:
// the Capture engine with the tenant's rules first, then the model stage
// (capture) with the tenant's configuration against an Ollama server,
// exactly as the brain wires them (brain.Run), with an in-memory Runtime
// instead of the tenant database for checkpoints and the ledger.
type Runner struct {
	cfg    Config
	tenant *registry.Tenant
	engine *engine.Engine
	model  *model.Client
	judge  *judge
}

// NewRunner builds the engine and model client; it makes no call.
func NewRunner(cfg Config) (*Runner, error) {
	cfg = cfg.withDefaults()
	if cfg.Tenant == nil {
		return nil, errors.New("eval: no tenant configuration")
	}
	t := *cfg.Tenant
	if cfg.Model != "" {
		t.ModelName = cfg.Model
	}
	if t.ModelName == "" {
		return nil, fmt.Errorf("eval: tenant %s names no model: give one (-model)", t.ID)
	}
	if t.CatalogueVersion == 0 {
		t.CatalogueVersion = catalogue.Current
	}
	// The eval measures decisions, not the daily budget: each e-mail is
	// decided as the first of the day.
	t.DailyTokenBudget = 0
	mc, err := model.New(model.Config{
		URL:           cfg.OllamaURL,
		Timeout:       cfg.CallTimeout,
		MaxConcurrent: cfg.Concurrency,
		// Every answer is measured: the breaker would turn a bad run into
		// model_unavailable escalations without calls.
		Breaker: model.BreakerConfig{MinCalls: math.MaxInt32},
	}, cfg.Log)
	if err != nil {
		return nil, fmt.Errorf("eval: %w", err)
	}
	stage := capture.New(mc, capture.Config{DefaultModel: t.ModelName}, cfg.Log)
	r := &Runner{cfg: cfg, tenant: &t, engine: engine.New(stage), model: mc}
	if cfg.Judge != nil {
		if r.judge, err = newJudge(*cfg.Judge, cfg.Concurrency, cfg.Log); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Ping checks that the model servers answer (the model's, and the
// judge's when there is one) before a run that would otherwise escalate
// every e-mail as model_unavailable.
func (r *Runner) Ping(ctx context.Context) error {
	if _, err := r.model.Ping(ctx); err != nil {
		return fmt.Errorf("the model server does not answer: %w", err)
	}
	if r.judge != nil {
		if _, err := r.judge.mc.Ping(ctx); err != nil {
			return fmt.Errorf("the judge's model server does not answer: %w", err)
		}
	}
	return nil
}

// Tenant is the configuration the runner decides with (model name set).
func (r *Runner) Tenant() *registry.Tenant { return r.tenant }

// Run decides every item of the set, Concurrency at a time, and returns
// the results in the set's order. It stops early only when ctx ends.
func (r *Runner) Run(ctx context.Context, items []Item) ([]Result, time.Duration, error) {
	results := make([]Result, len(items))
	jobs := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	start := time.Now()
	for range min(r.cfg.Concurrency, max(len(items), 1)) {
		wg.Go(func() {
			for i := range jobs {
				results[i] = r.decide(ctx, &items[i])
				mu.Lock()
				done++
				if f := r.cfg.ProgressFunc; f != nil {
					f(done, len(items))
				}
				mu.Unlock()
			}
		})
	}
feed:
	for i := range items {
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	wall := time.Since(start)
	if err := ctx.Err(); err != nil {
		return nil, wall, fmt.Errorf("eval interrupted after %d of %d e-mails: %w", done, len(items), err)
	}
	return results, wall, nil
}

// decide runs one item through the engine as a new work item's turn 1.
func (r *Runner) decide(ctx context.Context, it *Item) Result {
	res := Result{ID: it.ID, Language: it.Language, Tags: it.Tags, Labels: it.Labels}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ItemTimeout)
	defer cancel()
	email := it.Email
	req := &wire.TurnSubmitRequest{WorkItemID: "eval:" + it.ID, Turn: 1, Email: &email}
	in := &engine.Input{Tenant: r.tenant, Turn: 1, Request: req, Item: engine.Item{
		ID: req.WorkItemID, New: true, CatalogueVersion: r.tenant.CatalogueVersion,
		ApprovalMode: r.tenant.ApprovalMode, Email: &email}}
	rt := &memRuntime{cps: map[string][]byte{}}
	start := time.Now()
	out, err := r.engine.Decide(ctx, in, rt)
	res.LatencyMS = ms(time.Since(start))
	res.Calls, res.Repairs = rt.ledger()
	if err != nil {
		res.Error = err.Error()
		res.Category, res.Source, res.Action = wire.CategoryUnclassified, "none", ActionNone
		return res
	}
	a := out.Assessment
	res.Category, res.Priority, res.Confidence, res.Source, res.Rule = a.Category, a.Priority, a.Confidence, a.Source, a.Rule
	res.Status, res.Reason = out.Status, out.Reason
	switch {
	case out.Status == wire.WorkItemStatusEscalated:
		res.Action = ActionEscalate
	case out.Action != nil:
		res.Action = string(out.Action.Action.Name)
	default:
		res.Action = ActionNone
	}
	if out.Action != nil && out.Action.Action.Name == catalogue.DraftReply {
		var d Draft
		if json.Unmarshal(out.Action.Params, &d) == nil {
			res.Draft = &d
		}
	}
	if res.Draft != nil && it.Labels.Action == string(catalogue.DraftReply) {
		res.Check = checkDraft(res.Draft.Subject+"\n"+res.Draft.Body, it.Labels)
		if r.judge != nil {
			res.Check.Judge = r.judge.check(ctx, it, res.Draft)
		}
	}
	return res
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// memRuntime is engine.Runtime in memory for one decision: checkpoints
// (the first save of a key wins, as in the tenant database) and the ledger
// (a call id is recorded once).
type memRuntime struct {
	mu    sync.Mutex
	cps   map[string][]byte
	calls []engine.ModelCall
}

func (m *memRuntime) Load(_ context.Context, step string) ([]byte, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.cps[step]
	return b, ok, nil
}

func (m *memRuntime) Save(_ context.Context, step string, output []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.cps[step]; !ok {
		m.cps[step] = slices.Clone(output)
	}
	return nil
}

func (m *memRuntime) RecordModelCall(_ context.Context, c engine.ModelCall) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.ContainsFunc(m.calls, func(x engine.ModelCall) bool { return x.CallID == c.CallID }) {
		m.calls = append(m.calls, c)
	}
	return nil
}

func (m *memRuntime) TokensToday(context.Context) (int64, error) { return 0, nil }

// ledger returns the calls in order and the repairs: steps whose first
// answered call was refused by the strict check and that asked again.
func (m *memRuntime) ledger() ([]Call, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	calls := make([]Call, len(m.calls))
	// Per step: 0 nothing answered yet, 1 first answer accepted, 2 first
	// answer refused, 3 refused and asked again (a repair).
	state := map[string]int{}
	repairs := 0
	for i, c := range m.calls {
		calls[i] = Call{Step: c.Step, Attempt: c.Attempt, Outcome: c.Outcome, PromptTokens: c.PromptTokens,
			OutputTokens: c.OutputTokens, LatencyMS: ms(c.Latency)}
		switch state[c.Step] {
		case 0:
			if c.Outcome == string(model.OutcomeInvalidOutput) {
				state[c.Step] = 2
			} else if c.Outcome == string(model.OutcomeOK) {
				state[c.Step] = 1
			}
		case 2:
			repairs++
			state[c.Step] = 3
		}
	}
	return calls, repairs
}

// answeredOutcome: the model answered (the strict check accepted or refused
// the answer), as opposed to a call that failed.
func answeredOutcome(o string) bool {
	return o == string(model.OutcomeOK) || o == string(model.OutcomeInvalidOutput)
}
