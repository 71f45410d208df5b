package capture

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"n8nbrain/brain/internal/engine"
	"n8nbrain/brain/internal/model"
	"n8nbrain/catalogue"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// Steps of a turn, the keys of their checkpoints and ledger rows.
const (
	StepClassify = "classify"
	StepDraft    = "draft"
)

// Chatter is the model client the stage needs (model.Client).
type Chatter interface {
	Chat(ctx context.Context, req model.Request) (model.Response, error)
}

// Config of the stage. The zero value of a field means its default.
type Config struct {
	// DefaultModel is used for tenants without a model name in the registry.
	DefaultModel string
	// Reserve is kept back from the turn's deadline for writing the
	// decision: model calls stop that much earlier, so a slow model ends in
	// an answered escalation, not an abandoned turn. Default 5s.
	Reserve time.Duration
}

// Stage is the model stage; it implements engine.Model.
type Stage struct {
	chat  Chatter
	cfg   Config
	log   *slog.Logger
	usage usage
}

// New returns the stage.
func New(chat Chatter, cfg Config, log *slog.Logger) *Stage {
	if cfg.Reserve <= 0 {
		cfg.Reserve = 5 * time.Second
	}
	return &Stage{chat: chat, cfg: cfg, log: log}
}

// Usage returns each tenant's model use since start, sorted by tenant.
func (s *Stage) Usage() []TenantUsage { return s.usage.snapshot() }

// Options every call starts from; the tenant's registry options are merged
// over them. Classification is deterministic; num_predict caps what a call
// can cost (and what a runaway answer can produce).
func defaultOptions(step string) map[string]any {
	if step == StepDraft {
		return map[string]any{"temperature": 0.3, "num_predict": 1024}
	}
	return map[string]any{"temperature": 0, "num_predict": 512}
}

// Triage classifies a new item and, for draft_reply, drafts the reply.
// Problems with the model (down, over budget, invalid twice) are outcomes
// that escalate the item with the reason; an error return means the turn
// cannot be decided now (the database failed, the turn's context ended, a
// test hook simulated a crash) and is left for a re-drive.
func (s *Stage) Triage(ctx context.Context, in *engine.Input, rt engine.Runtime) (engine.Outcome, error) {
	if in.Item.Email == nil {
		return engine.Escalate(in, engine.Unassessed(), engine.ReasonNoRuleMatched), nil
	}
	r := &run{s: s, in: in, rt: rt, ctx: ctx,
		log: s.log.With("tenant_id", in.Tenant.ID, "turn_key", subjects.TurnKey(in.Item.ID, in.Turn))}
	var cancel context.CancelFunc
	r.mctx, cancel = s.modelContext(ctx)
	defer cancel()

	c, reason, err := r.classify()
	if err != nil {
		return engine.Outcome{}, err
	}
	if reason != "" {
		s.usage.escalated(in.Tenant.ID, reason)
		return engine.Escalate(in, engine.Unassessed(), reason), nil
	}
	a := wire.Assessment{Category: c.Category, Priority: c.Priority, Confidence: c.Confidence, Source: "model"}
	if c.Action == "" {
		// The tenant offers the model no action: assess only, as an
		// action-less rule does.
		return engine.Outcome{Assessment: a, Status: wire.WorkItemStatusOpen}, nil
	}
	params := c.Params
	if c.Action == catalogue.DraftReply {
		params, reason, err = r.draft(c)
		if err != nil {
			return engine.Outcome{}, err
		}
		if reason != "" {
			s.usage.escalated(in.Tenant.ID, reason)
			return engine.Escalate(in, a, reason), nil
		}
	}
	p, err := engine.Admit(in.Tenant, in.Item.CatalogueVersion, c.Action, params)
	if err != nil {
		// Validated when the step finished; the tenant's configuration
		// changed before a re-drive resumed from the checkpoint.
		return engine.Escalate(in, a, engine.ReasonActionNotAdmitted), nil
	}
	// The engine's gate (guard) re-admits it and applies the tenant's
	// autonomy: what the model chose stops for a human.
	return engine.Proposed(a, p), nil
}

// modelContext ends model calls Reserve before the turn's deadline.
func (s *Stage) modelContext(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	reserve := s.cfg.Reserve
	if left := time.Until(dl); left < 2*reserve {
		reserve = left / 2
	}
	return context.WithDeadline(ctx, dl.Add(-reserve))
}

// run is one turn through the stage.
type run struct {
	s    *Stage
	in   *engine.Input
	rt   engine.Runtime
	ctx  context.Context // the turn's
	mctx context.Context // the model calls' (ends Reserve earlier)
	log  *slog.Logger
}

// checkpoint is a finished step's output. Failed is set when the step ended
// without a usable answer after paying for its calls (invalid twice), so a
// re-drive does not pay again.
type checkpoint struct {
	Classification *classification `json:"classification,omitempty"`
	Draft          json.RawMessage `json:"draft,omitempty"`
	Failed         string          `json:"failed,omitempty"`
}

func (r *run) load(step string) (*checkpoint, error) {
	b, ok, err := r.rt.Load(r.ctx, step)
	if err != nil {
		return nil, fmt.Errorf("load checkpoint %s: %w", step, err)
	}
	if !ok {
		return nil, nil
	}
	var cp checkpoint
	if err := json.Unmarshal(b, &cp); err != nil {
		return nil, fmt.Errorf("decode checkpoint %s: %w", step, err)
	}
	return &cp, nil
}

func (r *run) save(step string, cp checkpoint) error {
	b, err := json.Marshal(cp)
	if err != nil {
		return fmt.Errorf("encode checkpoint %s: %w", step, err)
	}
	if err := r.rt.Save(r.ctx, step, b); err != nil {
		return fmt.Errorf("save checkpoint %s: %w", step, err)
	}
	return nil
}

func (r *run) classify() (classification, string, error) {
	cp, err := r.load(StepClassify)
	if err != nil {
		return classification{}, "", err
	}
	if cp != nil {
		if cp.Failed != "" {
			return classification{}, cp.Failed, nil
		}
		if cp.Classification != nil {
			return *cp.Classification, "", nil
		}
	}
	t, v := r.in.Tenant, r.in.Item.CatalogueVersion
	acts := choices(t, v)
	system, user := classifyMessages(t, r.in.Item.Email, acts)
	var c classification
	reason, err := r.ask(StepClassify, PromptClassify, system, user, classifySchema(t, acts), func(content string) []problem {
		var ps []problem
		c, ps = checkClassification(content, t, v, acts)
		return ps
	})
	if err != nil || reason == engine.ReasonBudgetExhausted || reason == engine.ReasonModelUnavailable {
		// Nothing concluded: a later re-drive may ask again.
		return classification{}, reason, err
	}
	if reason != "" {
		return classification{}, reason, r.save(StepClassify, checkpoint{Failed: reason})
	}
	return c, "", r.save(StepClassify, checkpoint{Classification: &c})
}

func (r *run) draft(c classification) (json.RawMessage, string, error) {
	cp, err := r.load(StepDraft)
	if err != nil {
		return nil, "", err
	}
	if cp != nil {
		if cp.Failed != "" {
			return nil, cp.Failed, nil
		}
		if cp.Draft != nil {
			return cp.Draft, "", nil
		}
	}
	t, v := r.in.Tenant, r.in.Item.CatalogueVersion
	a, ok := catalogue.Lookup(v, catalogue.DraftReply)
	if !ok {
		return nil, engine.ReasonActionNotAdmitted, nil
	}
	system, user := draftMessages(r.in.Item.Email, a, c.Category, c.Priority)
	var params json.RawMessage
	reason, err := r.ask(StepDraft, PromptDraft, system, user, draftSchema(a), func(content string) []problem {
		var ps []problem
		params, ps = checkDraft(content, t, v, a)
		return ps
	})
	if err != nil || reason == engine.ReasonBudgetExhausted || reason == engine.ReasonModelUnavailable {
		return nil, reason, err
	}
	if reason != "" {
		return nil, reason, r.save(StepDraft, checkpoint{Failed: reason})
	}
	return params, "", r.save(StepDraft, checkpoint{Draft: params})
}

// ask runs a step's chat with at most one repair. check validates an answer
// (and keeps the accepted value). It returns "" when an answer was
// accepted, or the reason to escalate.
func (r *run) ask(step, version, system, user string, schema json.RawMessage, check func(string) []problem) (string, error) {
	t := r.in.Tenant
	name := t.ModelName
	if name == "" {
		name = r.s.cfg.DefaultModel
	}
	opts := defaultOptions(step)
	maps.Copy(opts, t.ModelOptions)
	req := model.Request{
		Model:    name,
		Messages: []model.Message{{Role: model.RoleSystem, Content: system}, {Role: model.RoleUser, Content: user}},
		Format:   schema,
		Options:  opts,
	}
	attempt := 0
	for round := 1; ; round++ {
		if reason, err := r.budget(step); reason != "" || err != nil {
			return reason, err
		}
		resp, err := r.s.chat.Chat(r.mctx, req)
		var ps []problem
		if err == nil {
			ps = check(resp.Content)
			if resp.DoneReason == "length" {
				ps = append(ps, problem{"truncated", "The answer was cut off at the output limit: keep it shorter."})
			}
		}
		for i, c := range resp.Calls {
			attempt++
			outcome := c.Outcome
			if err == nil && i == len(resp.Calls)-1 && len(ps) > 0 {
				outcome = model.OutcomeInvalidOutput
			}
			r.s.usage.add(t.ID, c.PromptTokens+c.OutputTokens, outcome)
			if rerr := r.record(engine.ModelCall{Step: step, Attempt: attempt, Model: name,
				PromptVersion: version, PromptTokens: c.PromptTokens, OutputTokens: c.OutputTokens,
				Latency: c.Latency, Outcome: string(outcome)}); rerr != nil {
				return "", fmt.Errorf("record model call of step %s: %w", step, rerr)
			}
		}
		if err != nil {
			if r.ctx.Err() != nil {
				return "", fmt.Errorf("model step %s: %w", step, err)
			}
			// Down, failing, refusing, too slow for the turn, or the breaker
			// is open: visible, never a guess.
			r.log.Warn("model unavailable; item escalated", "step", step, "model", name, "error", unavailableCause(err))
			return engine.ReasonModelUnavailable, nil
		}
		if len(ps) == 0 {
			return "", nil
		}
		if round == 2 {
			r.log.Warn("model output invalid after repair; item escalated", "step", step, "attempt", attempt, "problems", codes(ps))
			return engine.ReasonModelOutputInvalid, nil
		}
		r.log.Info("model output invalid; asking for a repair", "step", step, "attempt", attempt, "problems", codes(ps))
		req.Messages = append(req.Messages, model.Message{Role: model.RoleUser, Content: repairMessage(ps)})
	}
}

// record writes a ledger row. A call is paid for even when the turn's
// context has ended meanwhile, so the row is written regardless, briefly.
func (r *run) record(c engine.ModelCall) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 5*time.Second)
	defer cancel()
	return r.rt.RecordModelCall(ctx, c)
}

// budget says whether the tenant's daily token budget allows another call.
// A budget of 0 means unlimited.
func (r *run) budget(step string) (string, error) {
	limit := r.in.Tenant.DailyTokenBudget
	if limit <= 0 {
		return "", nil
	}
	used, err := r.rt.TokensToday(r.ctx)
	if err != nil {
		return "", fmt.Errorf("model tokens used today: %w", err)
	}
	if used >= limit {
		r.log.Warn("daily model token budget exhausted; item escalated", "step", step, "used", used, "budget", limit)
		return engine.ReasonBudgetExhausted, nil
	}
	return "", nil
}

// unavailableCause is a log-safe description of a model failure.
func unavailableCause(err error) string {
	var me *model.Error
	if errors.As(err, &me) {
		return me.Error()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer before the turn's deadline"
	}
	return "model call failed"
}
