package capture

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"

	"n8nbrain/brain/internal/engine"
	"n8nbrain/brain/internal/model"
	"n8nbrain/catalogue"
	"n8nbrain/registry"
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
	// CallObservedFunc, when set, is told every HTTP call's tenant,
	// outcome and latency (the brain's latency histogram).
	CallObservedFunc func(tenant registry.TenantID, outcome model.Outcome, latency time.Duration)
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

// firstAnswer suffixes the key of a step's first answer when it needs a
// repair: checkpoints are written once per key (the first save wins), so
// each round of a step has its own.
const firstAnswer = ":1"

// checkpoint is a step's saved state. Under the step's key it is what the
// step concluded: Classification or Draft, or Failed with the reason when
// the step ended without a usable answer after paying for calls (invalid
// twice, or the model failed), so a re-drive does not pay again. Under the
// step's key plus firstAnswer it is a first answer that needs a repair,
// with the problems to name (Repair). Calls are the calls the round cost:
// the checkpoint is saved before anything else that can fail after a paid
// call, then the calls are written to the ledger, and written again from
// the checkpoint by every re-drive (their call ids make that a no-op once
// they are in): a paid call is recorded once and never paid for twice
// because our own bookkeeping failed.
type checkpoint struct {
	Classification *classification    `json:"classification,omitempty"`
	Draft          json.RawMessage    `json:"draft,omitempty"`
	Failed         string             `json:"failed,omitempty"`
	Repair         []savedProblem     `json:"repair,omitempty"`
	Attempts       int                `json:"attempts,omitempty"` // calls the step made so far
	Calls          []engine.ModelCall `json:"calls,omitempty"`
}

// savedProblem is a problem in a checkpoint; its text is ours (see problem).
type savedProblem struct {
	Code string `json:"code"`
	Text string `json:"text"`
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
	t, v := r.in.Tenant, r.in.Item.CatalogueVersion
	if _, err := catalogue.Get(v); err != nil {
		// The tenant is pinned to a version a newer release published and
		// this brain does not know (a rollback): nothing the model could
		// choose would be admitted, so no call is paid for.
		r.log.Warn("the tenant's catalogue version is unknown to this brain: items escalate without a model call; upgrade the brain or pin a published version",
			"catalogue_version", v, "error", err)
		return classification{}, engine.ReasonActionNotAdmitted, nil
	}
	acts := choices(t, v)
	system, user := classifyMessages(t, r.in.Item.Email, acts)
	var c classification
	cp, reason, err := r.step(StepClassify, PromptClassify, system, user, classifySchema(t, acts), func(content string) []problem {
		var ps []problem
		c, ps = checkClassification(content, t, v, acts)
		return ps
	}, func() checkpoint { return checkpoint{Classification: &c} })
	switch {
	case err != nil || reason != "":
		return classification{}, reason, err
	case cp.Failed != "":
		return classification{}, cp.Failed, nil
	case cp.Classification == nil:
		return classification{}, "", fmt.Errorf("checkpoint %s holds no classification", StepClassify)
	}
	return *cp.Classification, "", nil
}

func (r *run) draft(c classification) (json.RawMessage, string, error) {
	t, v := r.in.Tenant, r.in.Item.CatalogueVersion
	a, ok := catalogue.Lookup(v, catalogue.DraftReply)
	if !ok {
		return nil, engine.ReasonActionNotAdmitted, nil
	}
	system, user := draftMessages(r.in.Item.Email, a, c.Category, c.Priority)
	var params json.RawMessage
	cp, reason, err := r.step(StepDraft, PromptDraft, system, user, draftSchema(a), func(content string) []problem {
		var ps []problem
		params, ps = checkDraft(content, t, v, a)
		return ps
	}, func() checkpoint { return checkpoint{Draft: params} })
	switch {
	case err != nil || reason != "":
		return nil, reason, err
	case cp.Failed != "":
		return nil, cp.Failed, nil
	case cp.Draft == nil:
		return nil, "", fmt.Errorf("checkpoint %s holds no draft", StepDraft)
	}
	return cp.Draft, "", nil
}

// step runs a step's chat with at most one repair, resuming from its
// checkpoints (see checkpoint). check validates an answer (keeping the
// accepted value) and accepted makes the step's checkpoint of it. It
// returns the step's concluding checkpoint, or a reason to escalate for
// which nothing was concluded (over budget, or the breaker refused the
// call): a later re-drive may ask again.
func (r *run) step(step, version, system, user string, schema json.RawMessage, check func(string) []problem, accepted func() checkpoint) (*checkpoint, string, error) {
	if cp, err := r.load(step); err != nil || cp != nil {
		if cp != nil {
			err = r.recordAll(step, cp.Calls)
		}
		return cp, "", err
	}
	first, err := r.load(step + firstAnswer)
	if err != nil {
		return nil, "", err
	}
	var repair []problem
	attempts := 0
	if first != nil {
		if err := r.recordAll(step, first.Calls); err != nil {
			return nil, "", err
		}
		attempts = first.Attempts
		for _, p := range first.Repair {
			repair = append(repair, problem{p.Code, p.Text})
		}
	}
	t := r.in.Tenant
	name := t.ModelName
	if name == "" {
		name = r.s.cfg.DefaultModel
	}
	opts := defaultOptions(step)
	maps.Copy(opts, t.ModelOptions)
	question := []model.Message{{Role: model.RoleSystem, Content: system}, {Role: model.RoleUser, Content: user}}
	for {
		req := model.Request{Model: name, Messages: question, Format: schema, Options: opts, Tenant: string(t.ID)}
		if repair != nil {
			req.Messages = append(slices.Clip(question), model.Message{Role: model.RoleUser, Content: repairMessage(repair)})
		}
		if reason, err := r.budget(step, req); reason != "" || err != nil {
			return nil, reason, err
		}
		var ps []problem
		req.Check = func(content, doneReason string) bool {
			ps = check(content)
			if doneReason == "length" {
				ps = append(ps, problem{"truncated", "The answer was cut off at the output limit: keep it shorter."})
			}
			return len(ps) == 0
		}
		resp, err := r.s.chat.Chat(r.mctx, req)
		calls := r.calls(step, version, name, resp.Calls, &attempts)
		if err != nil && r.ctx.Err() != nil {
			// The turn itself ended: nothing is concluded and a re-drive
			// asks again; the calls made are still recorded.
			return nil, "", errors.Join(fmt.Errorf("model step %s: %w", step, err), r.recordAll(step, calls))
		}
		key, cp := step, checkpoint{}
		switch {
		case err != nil && len(calls) == 0:
			// The breaker refused: nothing was paid for or concluded.
			r.log.Warn("model unavailable; item escalated", "step", step, "model", name, "error", unavailableCause(err))
			return nil, engine.ReasonModelUnavailable, nil
		case err != nil:
			// Down, failing, refusing, or too slow for the turn: visible, never a guess.
			r.log.Warn("model unavailable; item escalated", "step", step, "model", name, "error", unavailableCause(err))
			cp.Failed = engine.ReasonModelUnavailable
		case len(ps) == 0:
			cp = accepted()
		case repair == nil:
			r.log.Info("model output invalid; asking for a repair", "step", step, "attempt", attempts, "problems", codes(ps))
			key = step + firstAnswer
			for _, p := range ps {
				cp.Repair = append(cp.Repair, savedProblem{p.code, p.text})
			}
		default:
			r.log.Warn("model output invalid after repair; item escalated", "step", step, "attempt", attempts, "problems", codes(ps))
			cp.Failed = engine.ReasonModelOutputInvalid
		}
		cp.Attempts, cp.Calls = attempts, calls
		// First the answer, then the ledger: a ledger write that fails
		// re-drives the turn, which resumes here without paying again.
		if err := r.save(key, cp); err != nil {
			return nil, "", err
		}
		if err := r.recordAll(step, calls); err != nil {
			return nil, "", err
		}
		if key == step {
			return &cp, "", nil
		}
		repair = ps
	}
}

// calls turns the HTTP calls of one chat into ledger rows, numbering them
// after the step's earlier attempts, and adds them to the running totals.
func (r *run) calls(step, version, name string, made []model.Call, attempts *int) []engine.ModelCall {
	out := make([]engine.ModelCall, 0, len(made))
	for _, c := range made {
		*attempts++
		r.s.usage.add(r.in.Tenant.ID, c.PromptTokens+c.OutputTokens, c.Outcome)
		if f := r.s.cfg.CallObservedFunc; f != nil {
			f(r.in.Tenant.ID, c.Outcome, c.Latency)
		}
		out = append(out, engine.ModelCall{CallID: uuid.NewString(), Step: step, Attempt: *attempts, Model: name,
			PromptVersion: version, PromptTokens: c.PromptTokens, OutputTokens: c.OutputTokens,
			Latency: c.Latency, Outcome: string(c.Outcome)})
	}
	return out
}

// recordAll writes ledger rows; a row already written is not written again.
// A call is paid for even when the turn's context has ended meanwhile, so
// the rows are written regardless, briefly.
func (r *run) recordAll(step string, calls []engine.ModelCall) error {
	for _, c := range calls {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 5*time.Second)
		err := r.rt.RecordModelCall(ctx, c)
		cancel()
		if err != nil {
			return fmt.Errorf("record model call of step %s: %w", step, err)
		}
	}
	return nil
}

// budget says whether what is left of the tenant's daily token budget
// covers the call: its estimated prompt (estimateTokens) plus the most it
// may answer (model.OutputAllowance). A budget of 0 means unlimited.
func (r *run) budget(step string, req model.Request) (string, error) {
	limit := r.in.Tenant.DailyTokenBudget
	if limit <= 0 {
		return "", nil
	}
	used, err := r.rt.TokensToday(r.ctx)
	if err != nil {
		return "", fmt.Errorf("model tokens used today: %w", err)
	}
	need := estimateTokens(req.Messages) + model.OutputAllowance(req.Options)
	if used+need > limit {
		r.log.Warn("daily model token budget cannot cover the call; item escalated", "step", step,
			"used", used, "needed", need, "budget", limit)
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
