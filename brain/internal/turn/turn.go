// Package turn runs one turn against a tenant's database: it checks the turn
// against the work item (replay, reuse, sequence, ceiling), runs the engine,
// and writes the decision with the item's new state in one transaction. It
// knows nothing of NATS: the consumer hands it the tenant (already derived
// from the NATS account) and the message, and publishes what it returns.
package turn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"n8nbrain/brain/internal/engine"
	"n8nbrain/brain/internal/store"
	"n8nbrain/brain/internal/tenancy"
	"n8nbrain/internal/telemetry"
	"n8nbrain/registry"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// Pools gives the pool of a tenant's own database.
type Pools interface {
	// Lease returns the pool, held open until release (tenancy.Directory).
	Lease(ctx context.Context, t *registry.Tenant) (pool *pgxpool.Pool, release func(), err error)
	// Check returns err, or a *tenancy.LoginError when the tenant's
	// database refuses the tenant's role (and records it).
	Check(t *registry.Tenant, err error) error
}

// Extension takes part in every turn that decides: Guard may replace the
// engine's outcome before anything is written (a last check against the
// tenant database), and Extend adds statements to the turn's transaction
// (approval records, outbox rows) and may amend the reply (approval id).
type Extension interface {
	Guard(ctx context.Context, q store.DBTX, in *engine.Input, out engine.Outcome) (engine.Outcome, error)
	Extend(ctx context.Context, t *registry.Tenant, w *store.TurnWrite, out *engine.Outcome, reply *wire.TurnSubmitReply) error
}

// ResumeLoader loads what the engine needs about an existing item beyond the
// work item row (the approval record of the last action).
type ResumeLoader interface {
	Approval(ctx context.Context, q store.DBTX, workItemID string) (*engine.Approval, error)
}

// Hooks are fault-injection points for tests; nil in production. A hook
// that returns an error makes the turn stop there as if the process died.
type Hooks struct {
	// AfterStepFunc runs after an engine step's checkpoint is saved.
	AfterStepFunc func(tenant registry.TenantID, workItemID string, turn int, step string) error
	// AfterCommitFunc runs after the turn's transaction commits, before the reply is published.
	AfterCommitFunc func(tenant registry.TenantID, workItemID string, turn int) error
}

// ErrCrash wraps a hook's error: the caller must abandon the message (no
// reply, no ack), exactly as if the process had died at that point.
var ErrCrash = errors.New("simulated crash")

// Counters are the processor's running totals.
type Counters struct {
	Decided        atomic.Int64
	Replayed       atomic.Int64
	Rejected       atomic.Int64
	TenantMismatch atomic.Int64
	KeyReused      atomic.Int64
	Halted         atomic.Int64
}

// Processor runs turns.
type Processor struct {
	pools    Pools
	engine   *engine.Engine
	ext      Extension
	resume   ResumeLoader
	hooks    Hooks
	log      *slog.Logger
	Counters Counters
}

// New returns a processor. ext and resume may be nil.
func New(pools Pools, eng *engine.Engine, ext Extension, resume ResumeLoader, hooks Hooks, log *slog.Logger) *Processor {
	return &Processor{pools: pools, engine: eng, ext: ext, resume: resume, hooks: hooks, log: log}
}

// Answer is what to publish on the turn's reply subject.
type Answer struct {
	OK          bool   // a decision (true) or a wire.ErrorReply (false)
	Body        []byte // exact bytes to publish
	Fingerprint string // of the request answered; empty if it could not be decoded
	WorkItemID  string
	Turn        int
	Replayed    bool
	// Status is the decision's status (decided or replayed turns); Error
	// is the error answered (OK false). Both are for metrics and logs.
	Status wire.WorkItemStatus
	Error  *wire.Error
	// Timings are where the turn's time went in the tenant's database and
	// the engine (zero for stages it did not reach).
	Timings Timings
}

// Timings of one turn's stages.
type Timings struct {
	Decide time.Duration // the engine, model calls included
	Commit time.Duration // the one transaction of the turn's writes
}

// Message is a turn as it came off the tenant's turn stream.
type Message struct {
	Key string // turn key from the subject
	Seq uint64 // stream sequence
	// StoredAt is when the stream stored it: with Seq, the message's
	// identity even across a recreated stream.
	StoredAt time.Time
	Data     []byte
}

// sameMessage reports whether d answered the message m itself (a replica
// died after committing, and m is its redelivery).
func sameMessage(d store.Decision, m Message) bool {
	if d.TurnSeq != m.Seq {
		return false
	}
	// Decisions from before the time was recorded compare by sequence only.
	return d.TurnStoredAt.IsZero() || d.TurnStoredAt.Equal(m.StoredAt.Truncate(time.Microsecond))
}

// Process decides one turn. Problems the caller made (bad payload, wrong
// sequence, reused key) are answers with OK false. An error return is
// transient (database down, model down): the message should be retried.
func (p *Processor) Process(ctx context.Context, t *registry.Tenant, m Message) (Answer, error) {
	req, err := wire.DecodeTurnSubmitRequest(m.Data)
	if err != nil {
		return p.reject(Answer{}, wire.ErrorOf(err)), nil
	}
	ans := Answer{Fingerprint: wire.Fingerprint(req), WorkItemID: req.WorkItemID, Turn: req.Turn}
	if m.Key != subjects.TurnKey(req.WorkItemID, req.Turn) {
		return p.reject(ans, &wire.Error{Code: wire.CodeInvalid, Reason: wire.ReasonTurnKeyMismatch,
			Message: "the subject's turn key is not derived from this work_item_id and turn"}), nil
	}
	if req.TenantID != "" && registry.TenantID(req.TenantID) != t.ID {
		// The account decides who the tenant is; a body naming another is
		// rejected and counted, never reconciled.
		p.Counters.TenantMismatch.Add(1)
		p.log.Warn("turn names another tenant than its account; rejected", "tenant_id", t.ID, "turn_key", m.Key)
		return p.reject(ans, &wire.Error{Code: wire.CodeForbidden, Reason: wire.ReasonTenantMismatch,
			Message: "tenant_id in the body does not match the tenant of this connection"}), nil
	}
	pool, release, err := p.pools.Lease(ctx, t)
	if err != nil {
		return p.failed(ans, t, err)
	}
	defer release()
	// Turn 1 is nearly always a new item, so its first attempt does not
	// read the item first: it decides and commits in one round trip, and
	// an item that existed makes the commit fail as a lost race would
	// (store.TurnCommit), with nothing written. Then, as after a lost race,
	// the next attempt reads the item, and usually replays.
	for attempt := 0; attempt < 3; attempt++ {
		got, err := p.attempt(ctx, pool, t, req, m, ans, attempt == 0 && req.Turn == 1)
		if errors.Is(err, store.ErrConflict) || store.PlanChanged(err) {
			// A lost race, or a statement a migration changed (prepared
			// again on the next attempt): nothing was written.
			continue
		}
		if err != nil {
			return p.failed(ans, t, err)
		}
		return got, nil
	}
	return Answer{}, fmt.Errorf("turn %d of a work item: lost the commit race every time", req.Turn)
}

// failed returns a transient error to retry, except a tenant database that
// refuses the tenant's role: retrying would not mend it, so the turn is
// answered at once with the error saying so (the edge re-drives the turn
// when n8n submits it again, once the role is repaired).
func (p *Processor) failed(ans Answer, t *registry.Tenant, err error) (Answer, error) {
	err = p.pools.Check(t, err)
	var le *tenancy.LoginError
	if errors.As(err, &le) {
		return p.reject(ans, wire.ErrorOf(err)), nil
	}
	return Answer{}, err
}

// attempt decides the turn once; assumeNew skips reading the item (turn 1).
func (p *Processor) attempt(ctx context.Context, pool *pgxpool.Pool, t *registry.Tenant, req *wire.TurnSubmitRequest, m Message, ans Answer, assumeNew bool) (Answer, error) {
	var item store.WorkItem
	err := store.ErrNotFound
	if !assumeNew {
		item, err = store.WorkItemGet(ctx, pool, req.WorkItemID)
	}
	isNew := errors.Is(err, store.ErrNotFound)
	if err != nil && !isNew {
		return Answer{}, err
	}
	if !isNew && req.Turn <= item.Turn {
		return p.replay(ctx, pool, req, m, ans)
	}
	expected := item.Turn + 1
	if req.Turn != expected {
		return p.reject(ans, &wire.Error{Code: wire.CodeConflict, Reason: wire.ReasonTurnOutOfSequence, ExpectedTurn: expected,
			Message: fmt.Sprintf("turn %d is out of sequence: the work item expects turn %d", req.Turn, expected)}), nil
	}
	if !isNew {
		switch item.Status {
		case wire.WorkItemStatusHalted:
			return p.reject(ans, &wire.Error{Code: wire.CodeUnprocessable, Reason: wire.ReasonItemHalted,
				Message: "the work item is halted and flagged for a human: " + item.StatusReason}), nil
		case wire.WorkItemStatusClosed, wire.WorkItemStatusClosedManual:
			return p.reject(ans, &wire.Error{Code: wire.CodeUnprocessable, Reason: wire.ReasonItemClosed,
				Message: "the work item is closed (" + string(item.Status) + ")"}), nil
		}
	}
	in, err := p.input(ctx, pool, t, req, item, isNew)
	if err != nil {
		return Answer{}, err
	}
	var out engine.Outcome
	decideStart := time.Now()
	if req.Turn > t.TurnCeiling {
		out = engine.Halt(in.Item)
		p.Counters.Halted.Add(1)
	} else {
		dctx, span := telemetry.Start(ctx, "decide")
		out, err = p.engine.Decide(dctx, in, &runtime{q: pool, workItemID: req.WorkItemID, turn: req.Turn, tenant: t.ID, hooks: p.hooks})
		telemetry.End(span, err)
		var iie *engine.InvalidInputError
		if errors.As(err, &iie) {
			return p.reject(ans, &wire.Error{Code: wire.CodeInvalid, Field: iie.Field, Message: iie.Error()}), nil
		}
		if err != nil {
			return Answer{}, err
		}
	}
	if p.ext != nil {
		if out, err = p.ext.Guard(ctx, pool, in, out); err != nil {
			return Answer{}, err
		}
	}
	reply := envelope(req, in, out)
	w := store.TurnWrite{Item: nextItem(in, item, out, req), New: assumeNew}
	if p.ext != nil {
		if err := p.ext.Extend(ctx, t, &w, &out, &reply); err != nil {
			return Answer{}, err
		}
	}
	body, err := wire.EncodeReply(&reply)
	if err != nil {
		return Answer{}, fmt.Errorf("encode reply: %w", err)
	}
	w.Decision = store.Decision{WorkItemID: req.WorkItemID, Turn: req.Turn, Fingerprint: ans.Fingerprint, TurnSeq: m.Seq,
		TurnStoredAt: m.StoredAt.Truncate(time.Microsecond), Status: out.Status, Reply: body}
	if out.Action != nil {
		w.Decision.Action = out.Action.Action.Name
	}
	ans.Timings.Decide = time.Since(decideStart)
	commitStart := time.Now()
	cctx, span := telemetry.Start(ctx, "commit")
	err = store.TurnCommit(cctx, pool, w)
	telemetry.End(span, err)
	ans.Timings.Commit = time.Since(commitStart)
	if err != nil {
		return Answer{}, err
	}
	p.Counters.Decided.Add(1)
	if h := p.hooks.AfterCommitFunc; h != nil {
		if err := h(t.ID, req.WorkItemID, req.Turn); err != nil {
			return Answer{}, fmt.Errorf("%w after commit: %v", ErrCrash, err)
		}
	}
	ans.OK, ans.Body, ans.Status = true, body, out.Status
	return ans, nil
}

// replay answers a turn that was already decided: the stored bytes when the
// fingerprints match, idempotency_key_reused otherwise. Nothing is written.
func (p *Processor) replay(ctx context.Context, q store.DBTX, req *wire.TurnSubmitRequest, m Message, ans Answer) (Answer, error) {
	d, err := store.DecisionGetByTurn(ctx, q, req.WorkItemID, req.Turn)
	if err != nil {
		return Answer{}, fmt.Errorf("replay turn %d: %w", req.Turn, err)
	}
	if d.Fingerprint != ans.Fingerprint {
		p.Counters.KeyReused.Add(1)
		return p.reject(ans, &wire.Error{Code: wire.CodeConflict, Reason: wire.ReasonIdempotencyKeyReused,
			Message: fmt.Sprintf("turn %d of this work item was already decided for a different payload", req.Turn)}), nil
	}
	p.Counters.Replayed.Add(1)
	ans.OK, ans.Status = true, d.Status
	if sameMessage(d, m) {
		// The same message again (a replica died after committing): the
		// original answer, byte for byte.
		ans.Body = d.Reply
		return ans, nil
	}
	ans.Body, err = wire.MarkReplayed(d.Reply)
	ans.Replayed = true
	return ans, err
}

func (p *Processor) reject(ans Answer, e *wire.Error) Answer {
	p.Counters.Rejected.Add(1)
	body, err := json.Marshal(wire.ErrorReply{Error: e})
	if err != nil {
		panic(err) // a wire.Error always encodes
	}
	ans.OK, ans.Body, ans.Error = false, body, e
	return ans
}

func (p *Processor) input(ctx context.Context, q store.DBTX, t *registry.Tenant, req *wire.TurnSubmitRequest, item store.WorkItem, isNew bool) (*engine.Input, error) {
	it := engine.Item{ID: req.WorkItemID, New: isNew}
	if isNew {
		it.CatalogueVersion = t.CatalogueVersion
		it.ApprovalMode = t.ApprovalMode
		it.Email = req.Email
	} else {
		it.Status = item.Status
		it.Assessment = wire.Assessment{Category: item.Category, Priority: item.Priority, Confidence: item.Confidence,
			Source: item.AssessmentSource}
		it.CatalogueVersion = item.CatalogueVersion
		it.ApprovalMode = item.ApprovalMode
		it.Email = item.Email
		it.LastAction = item.LastAction
		it.LastActionParams = item.LastActionParams
		it.ActionState = item.ActionState
		if p.resume != nil && item.LastAction != "" {
			ap, err := p.resume.Approval(ctx, q, req.WorkItemID)
			if err != nil {
				return nil, err
			}
			it.Approval = ap
		}
	}
	return &engine.Input{Tenant: t, Item: it, Turn: req.Turn, Request: req}, nil
}

func envelope(req *wire.TurnSubmitRequest, in *engine.Input, out engine.Outcome) wire.TurnSubmitReply {
	r := wire.TurnSubmitReply{
		WorkItemID:       req.WorkItemID,
		Turn:             req.Turn,
		NextTurn:         req.Turn + 1,
		CatalogueVersion: int(in.Item.CatalogueVersion),
		Status:           out.Status,
		Reason:           out.Reason,
		Assessment:       out.Assessment,
		Autonomy:         string(autonomy(out.Autonomy)),
	}
	if a := out.Action; a != nil {
		r.Action = &wire.Action{Name: string(a.Action.Name), Params: a.Params, RequiresApproval: a.RequiresApproval}
	}
	return r
}

// autonomy is the level the envelope reports: the one that applied to the
// decision (auto only when the model's action went without a human under
// an autonomy grant the engine re-checked), else assist.
func autonomy(a registry.Autonomy) registry.Autonomy {
	if a != registry.AutonomyAuto {
		return registry.AutonomyAssist
	}
	return a
}

func nextItem(in *engine.Input, prev store.WorkItem, out engine.Outcome, req *wire.TurnSubmitRequest) store.WorkItem {
	w := store.WorkItem{
		ID:               req.WorkItemID,
		Turn:             req.Turn,
		Status:           out.Status,
		StatusReason:     out.Reason,
		NeedsHuman:       out.NeedsHuman,
		Category:         out.Assessment.Category,
		Priority:         out.Assessment.Priority,
		Confidence:       out.Assessment.Confidence,
		AssessmentSource: out.Assessment.Source,
		CatalogueVersion: in.Item.CatalogueVersion,
		ApprovalMode:     in.Item.ApprovalMode,
		Email:            in.Item.Email,
		LastAction:       prev.LastAction,
		LastActionParams: prev.LastActionParams,
		ActionState:      out.ActionState,
		Outcome:          out.ItemOutcome,
		HumanAction:      out.HumanAction,
	}
	if out.Assessment.Source == "carried" {
		w.AssessmentSource = prev.AssessmentSource
	}
	if a := out.Action; a != nil {
		w.LastAction = a.Action.Name
		w.LastActionParams = a.Params
	}
	switch out.Status {
	case wire.WorkItemStatusClosed, wire.WorkItemStatusClosedManual:
		now := time.Now().UTC()
		w.ClosedAt = &now
	}
	return w
}

// runtime gives the engine one turn's checkpoints and ledger in the
// tenant's database.
type runtime struct {
	q          store.DBTX
	tenant     registry.TenantID
	workItemID string
	turn       int
	hooks      Hooks
}

func (r *runtime) Load(ctx context.Context, step string) ([]byte, bool, error) {
	b, err := store.CheckpointGet(ctx, r.q, r.workItemID, r.turn, step)
	if errors.Is(err, store.ErrNotFound) {
		return nil, false, nil
	}
	return b, err == nil, err
}

func (r *runtime) Save(ctx context.Context, step string, output []byte) error {
	if err := store.CheckpointPut(ctx, r.q, r.workItemID, r.turn, step, output); err != nil {
		return err
	}
	if h := r.hooks.AfterStepFunc; h != nil {
		if err := h(r.tenant, r.workItemID, r.turn, step); err != nil {
			return fmt.Errorf("%w after step %s: %v", ErrCrash, step, err)
		}
	}
	return nil
}

func (r *runtime) RecordModelCall(ctx context.Context, c engine.ModelCall) error {
	return store.ModelCallInsert(ctx, r.q, store.ModelCall{TenantID: string(r.tenant), WorkItemID: r.workItemID,
		Turn: r.turn, Step: c.Step, Attempt: c.Attempt, Model: c.Model, PromptVersion: c.PromptVersion,
		PromptTokens: c.PromptTokens, OutputTokens: c.OutputTokens, Latency: c.Latency, Outcome: c.Outcome, CallID: c.CallID})
}

func (r *runtime) TokensToday(ctx context.Context) (int64, error) {
	return store.ModelTokensSince(ctx, r.q, time.Now().UTC().Truncate(24*time.Hour))
}

// Refuse is the answer for a turn rejected before it reached a tenant's
// database (unknown or disabled tenant, a turn that kept failing). The
// request's fingerprint is included when the body decodes, so the edge can
// tell the refusal answers its own payload.
func (p *Processor) Refuse(data []byte, e *wire.Error) Answer {
	ans := Answer{}
	if req, err := wire.DecodeTurnSubmitRequest(data); err == nil {
		ans = Answer{Fingerprint: wire.Fingerprint(req), WorkItemID: req.WorkItemID, Turn: req.Turn}
	}
	return p.reject(ans, e)
}
