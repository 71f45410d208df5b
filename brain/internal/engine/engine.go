// Package engine is the Capture engine: it decides what should happen next to
// a work item. Its first stage is deterministic (triage rules from tenant
// configuration, and the bookkeeping of outcomes n8n reports); a model stage
// slots in behind the Model interface. Whatever a stage proposes passes one
// gate, admit, before it can leave the engine: the action must exist in the
// item's pinned catalogue version, be enabled for the tenant, and have valid
// parameters; requires_approval comes from the catalogue, and, for what the
// model stage chose, from the tenant's autonomy (under assist every such
// action stops for a human). Nothing a stage or a model says can lower it.
package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"n8nbrain/catalogue"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// Escalation and closing reasons, stable strings on the wire and in the database.
const (
	ReasonNoRuleMatched        = "no_rule_matched"
	ReasonRuleActionNotEnabled = "rule_action_not_enabled"
	ReasonActionNotAdmitted    = "action_not_admitted"
	ReasonActionFailed         = "action_failed"
	ReasonVerificationFailed   = "verification_failed"
	ReasonTurnCeiling          = "turn_ceiling"
	ReasonAwaitingHuman        = "awaiting_human"
	ReasonApprovalRejected     = "approval_rejected"
	ReasonApprovalExpired      = "approval_expired"
	ReasonClosedManual         = "closed_manual"
	ReasonModelUnavailable     = "model_unavailable"
	ReasonBudgetExhausted      = "budget_exhausted"
	ReasonModelOutputInvalid   = "model_output_invalid"
)

// ConfidentRule is the rule confidence at and above which a rule match
// decides alone, without the model (registry.ConfidentRule, shared with the
// ops tool's dry run).
const ConfidentRule = registry.ConfidentRule

// ActionState tracks a proposed action: pending (awaiting approval) → sent
// (handed to n8n) → verifying (after an unknown outcome, a read-back was
// proposed) → succeeded | failed. Stored on the work item.
type ActionState string

const (
	ActionStatePending   ActionState = "pending"
	ActionStateSent      ActionState = "sent"
	ActionStateVerifying ActionState = "verifying"
	ActionStateSucceeded ActionState = "succeeded"
	ActionStateFailed    ActionState = "failed"
)

// Item is what the engine knows of a work item before the turn.
type Item struct {
	ID               string
	New              bool // no turn decided yet
	Status           wire.WorkItemStatus
	Assessment       wire.Assessment
	CatalogueVersion catalogue.Version
	ApprovalMode     registry.ApprovalMode
	Email            *wire.Email
	LastAction       catalogue.Name
	LastActionParams json.RawMessage
	ActionState      ActionState
	// Approval is the approval record of the last proposed action, if any.
	Approval *Approval
}

// ApprovalStatus is the state of an approval record.
type ApprovalStatus string

const (
	ApprovalStatusPending  ApprovalStatus = "pending"
	ApprovalStatusApproved ApprovalStatus = "approved"
	ApprovalStatusRejected ApprovalStatus = "rejected"
	ApprovalStatusExpired  ApprovalStatus = "expired"
)

// Approval is what the engine needs of an approval record.
type Approval struct {
	ID     string
	Status ApprovalStatus
	// ApprovedSHA256 is the hash of the text a human approved (after any edit).
	ApprovedSHA256 string
	// Approved is the content a human approved: the edited parameters if
	// edited, else the proposed ones.
	Approved   json.RawMessage
	ProposedAt time.Time
}

// Input is one turn's input.
type Input struct {
	Tenant  *registry.Tenant
	Item    Item
	Turn    int
	Request *wire.TurnSubmitRequest
}

// Proposal is an admitted action: it exists, is enabled, has valid params.
type Proposal struct {
	Action catalogue.Action
	Params json.RawMessage
	// RequiresApproval is whether this proposal stops for a human: the
	// catalogue's flag, raised (never lowered) by the tenant's autonomy for
	// what the model chose, and cleared only when a human already approved
	// this very action and the turn carries it out.
	RequiresApproval bool
}

// Outcome is the engine's decision for a turn.
type Outcome struct {
	Assessment  wire.Assessment
	Action      *Proposal // nil: update the item and stop
	Status      wire.WorkItemStatus
	Reason      string
	NeedsHuman  bool
	ActionState ActionState
	// ItemOutcome is set when the item ends: succeeded, failed, closed_manual.
	ItemOutcome string
	HumanAction *wire.HumanAction
	// Autonomy is the level that applied to this decision: auto when the
	// model's action went without a human under an autonomy grant, else
	// assist (the zero value means assist too).
	Autonomy registry.Autonomy
}

// Model is the model stage the engine calls when no confident rule decides.
// A nil Model means rules only: such items are escalated. Whatever it
// proposes is re-admitted by the engine (guard), so a stage cannot widen
// the tenant's closed set of actions.
type Model interface {
	Triage(ctx context.Context, in *Input, rt Runtime) (Outcome, error)
}

// Runtime is what a stage may use during one turn, all in the tenant's own
// database: checkpoints of finished steps and the model-call ledger.
type Runtime interface {
	// Load returns a finished step's output of this turn, if any.
	Load(ctx context.Context, step string) ([]byte, bool, error)
	// Save records a finished step before the next one starts, so a turn
	// re-driven after a crash resumes after it.
	Save(ctx context.Context, step string, output []byte) error
	// RecordModelCall writes one model call to the ledger.
	RecordModelCall(ctx context.Context, c ModelCall) error
	// TokensToday is the tenant's model token use since midnight UTC.
	TokensToday(ctx context.Context) (int64, error)
}

// ModelCall is one ledger row: counts and timings, never prompt or content.
type ModelCall struct {
	// CallID identifies the HTTP call; writing the same call twice (after a
	// failure, from a checkpoint) records it once.
	CallID        string
	Step          string
	Attempt       int
	Model         string
	PromptVersion string
	PromptTokens  int64
	OutputTokens  int64
	Latency       time.Duration
	Outcome       string // ok, invalid_output, error, timeout
}

// Engine decides turns.
type Engine struct {
	model Model
	// rules caches each rule's admission (see admitRule).
	rules     sync.Map // ruleKey → admitted
	ruleCount atomic.Int64
}

// ruleKey names a rule of one registry entry of a tenant under one
// catalogue version. A registry change gives the tenant a new
// *registry.Tenant, and so new keys.
type ruleKey struct {
	tenant *registry.Tenant
	rule   *registry.Rule
	v      catalogue.Version
}

type admitted struct {
	p   Proposal
	err error
}

// maxCachedRules bounds the admission cache: entries of replaced registry
// entries are dropped with everything else when it is full.
const maxCachedRules = 4096

// New returns an engine; model may be nil (rules only).
func New(model Model) *Engine { return &Engine{model: model} }

// InvalidInputError is a problem with the request that only the engine can
// see (it needs the item's state); it becomes a wire invalid error.
type InvalidInputError struct {
	Field   string
	Message string
}

func (e *InvalidInputError) Error() string { return e.Field + ": " + e.Message }

// Decide runs the engine for one turn.
func (e *Engine) Decide(ctx context.Context, in *Input, rt Runtime) (Outcome, error) {
	if in.Item.New {
		return e.triage(ctx, in, rt)
	}
	if lr := in.Request.LatestResult; lr != nil {
		return e.onResult(in, lr)
	}
	return e.onResume(in), nil
}

// triage assesses a new item: a confident rule decides alone; otherwise the
// model stage runs, or, without a model, the item goes to a human.
func (e *Engine) triage(ctx context.Context, in *Input, rt Runtime) (Outcome, error) {
	rule := matchRule(in.Tenant.Rules, in.Item.Email)
	if rule != nil && (rule.Confidence >= ConfidentRule || e.model == nil) {
		return e.fromRule(in, rule), nil
	}
	if e.model == nil {
		return Escalate(in, Unassessed(), ReasonNoRuleMatched), nil
	}
	out, err := e.model.Triage(ctx, in, rt)
	if err != nil {
		return Outcome{}, err
	}
	return e.guard(in, out), nil
}

func (e *Engine) fromRule(in *Input, r *registry.Rule) Outcome {
	a := wire.Assessment{Category: r.Category, Priority: r.Priority, Confidence: r.Confidence, Source: "rule", Rule: r.Name}
	if r.Action == "" {
		return Outcome{Assessment: a, Status: wire.WorkItemStatusOpen}
	}
	p, err := e.admitRule(in.Tenant, in.Item.CatalogueVersion, r)
	if err == nil {
		p, err = forItem(p, in.Item.ID)
	}
	if err != nil {
		return Escalate(in, a, ReasonRuleActionNotEnabled)
	}
	if p.Action.FollowUp {
		return Escalate(in, a, ReasonActionNotAdmitted)
	}
	return Proposed(a, p)
}

// admitRule is Admit of a rule's action. A rule's action and parameters,
// and what its tenant enabled, are fixed for as long as the tenant's
// registry entry is, so the parameters are checked against the catalogue
// once per entry and version, not on every turn the rule decides.
func (e *Engine) admitRule(t *registry.Tenant, v catalogue.Version, r *registry.Rule) (Proposal, error) {
	k := ruleKey{tenant: t, rule: r, v: v}
	if got, ok := e.rules.Load(k); ok {
		a := got.(admitted)
		return a.p, a.err
	}
	// Admitted with a placeholder for what the brain sets from the work
	// item (fromRule sets it per item): a rule does not give it.
	params := r.Params
	var err error
	if a, ok := catalogue.Lookup(v, r.Action); ok {
		params, err = a.WithItemParams(params, "")
	}
	p := Proposal{}
	if err == nil {
		p, err = Admit(t, v, r.Action, params)
	}
	if e.ruleCount.Add(1) > maxCachedRules {
		e.rules.Clear()
		e.ruleCount.Store(1)
	}
	e.rules.Store(k, admitted{p: p, err: err})
	return p, err
}

// guard is the admission gate of everything the model stage proposes. It
// re-admits the action (a stage that forgot to admit, or a double that
// returns anything, still cannot leave the closed set) and applies the
// tenant's autonomy: under assist, every action the model chose is
// AI-generated and stops for a human, whatever the catalogue says of it;
// under auto, so does every action except those granted for the item's
// category on a passing eval report of the current configuration
// (registry.Tenant.AutonomyFor, re-checked here at each decision).
// The one exception is escalate_item, whose whole effect is to hand the
// item to a human: approving a hand-over to a human would only ask the
// same human twice. (The stage's own fallbacks, Escalate with a reason, are
// escalate_item too, and stop for a human the same way.)
func (e *Engine) guard(in *Input, out Outcome) Outcome {
	if out.Action == nil {
		return out
	}
	// What the brain sets from the item, it sets here, whatever the stage
	// proposed (catalogue.Param.FromItem), by the catalogue's action of
	// that name, not the stage's.
	params, err := out.Action.Params, error(nil)
	if a, ok := catalogue.Lookup(in.Item.CatalogueVersion, out.Action.Action.Name); ok {
		params, err = a.WithItemParams(params, in.Item.ID)
	}
	p := Proposal{}
	if err == nil {
		p, err = Admit(in.Tenant, in.Item.CatalogueVersion, out.Action.Action.Name, params)
	}
	if err != nil || p.Action.FollowUp {
		// A follow-up (send_reply, verify_*) continues an earlier decision;
		// triage proposing one, with whatever approval id it made up, is refused.
		return Escalate(in, out.Assessment, ReasonActionNotAdmitted)
	}
	applied := registry.AutonomyAssist
	if p.Action.Name != catalogue.EscalateItem {
		// Only an action the catalogue lets go without approval, granted
		// for exactly this category on evidence that still holds for the
		// tenant's configuration as it is now, skips the human.
		if !p.RequiresApproval && in.Tenant.AutonomyFor(p.Action.Name, out.Assessment.Category) == registry.AutonomyAuto {
			applied = registry.AutonomyAuto
		} else {
			p.RequiresApproval = true
		}
	}
	if !p.RequiresApproval {
		out.Action = &p
		out.Autonomy = applied
		if out.ActionState == "" || out.ActionState == ActionStatePending {
			out.ActionState = ActionStateSent
		}
		return out
	}
	// Stopped for a human: whatever the stage said the action would do to
	// the item (close it, say) waits for the approval.
	return Outcome{Assessment: out.Assessment, Action: &p, Status: wire.WorkItemStatusAwaitingApproval,
		ActionState: ActionStatePending, Autonomy: applied}
}

// Proposed is the outcome of proposing an admitted action: awaiting
// approval when it requires one, else what the action does to the item.
func Proposed(a wire.Assessment, p Proposal) Outcome {
	out := Outcome{Assessment: a, Action: &p, Status: wire.WorkItemStatusOpen, ActionState: ActionStateSent}
	switch {
	case p.RequiresApproval:
		out.Status = wire.WorkItemStatusAwaitingApproval
		out.ActionState = ActionStatePending
	case p.Action.Name == catalogue.EscalateItem:
		out.Status = wire.WorkItemStatusEscalated
		out.NeedsHuman = true
	case p.Action.Name == catalogue.CloseItem:
		out.Status = wire.WorkItemStatusClosed
	}
	return out
}

// forItem sets p's parameters that the brain takes from the work item
// (catalogue.Param.FromItem) to itemID's.
func forItem(p Proposal, itemID string) (Proposal, error) {
	params, err := p.Action.WithItemParams(p.Params, itemID)
	if err != nil {
		return Proposal{}, err
	}
	p.Params = params
	return p, nil
}

// AdmitError says why a proposed action may not leave the engine.
type AdmitError struct {
	Action  catalogue.Name
	Problem string
}

func (e *AdmitError) Error() string {
	return fmt.Sprintf("action %q not admitted: %s", e.Action, e.Problem)
}

// Admit is the only way an action becomes a Proposal: it must exist in the
// pinned catalogue version, be enabled for the tenant, and its parameters
// must pass the action's schema (returned in canonical form).
func Admit(t *registry.Tenant, v catalogue.Version, name catalogue.Name, params json.RawMessage) (Proposal, error) {
	a, ok := catalogue.Lookup(v, name)
	if !ok {
		return Proposal{}, &AdmitError{Action: name, Problem: fmt.Sprintf("not in catalogue version %d", v)}
	}
	if !t.ActionEnabled(name) {
		return Proposal{}, &AdmitError{Action: name, Problem: "not enabled for the tenant"}
	}
	canon, err := a.ValidateParams(params)
	if err != nil {
		var pe *catalogue.ParamError
		if errors.As(err, &pe) {
			return Proposal{}, &AdmitError{Action: name, Problem: pe.Error()}
		}
		return Proposal{}, err
	}
	return Proposal{Action: a, Params: canon, RequiresApproval: a.RequiresApproval}, nil
}

// Escalate hands the item to a human with a reason: with escalate_item when
// the tenant enabled it, otherwise with no action; flagged either way.
func Escalate(in *Input, a wire.Assessment, reason string) Outcome {
	out := Outcome{Assessment: a, Status: wire.WorkItemStatusEscalated, Reason: reason, NeedsHuman: true}
	params, _ := json.Marshal(map[string]string{"reason": reason})
	if p, err := Admit(in.Tenant, in.Item.CatalogueVersion, catalogue.EscalateItem, params); err == nil {
		out.Action = &p
		out.ActionState = ActionStateSent
	}
	return out
}

// Unassessed is the assessment of an item nothing assessed (no confident
// rule, no usable model answer): the reserved category
// wire.CategoryUnclassified, priority normal, confidence 0, source none.
func Unassessed() wire.Assessment {
	return wire.Assessment{Category: wire.CategoryUnclassified, Priority: "normal", Confidence: 0, Source: "none"}
}

func carried(it Item) wire.Assessment {
	a := it.Assessment
	a.Source = "carried"
	return a
}

// onResult books the outcome n8n reports for the last proposed action and
// decides the next step without judgement.
func (e *Engine) onResult(in *Input, lr *wire.LatestResult) (Outcome, error) {
	it := in.Item
	a := carried(it)
	if it.LastAction == "" || catalogue.Name(lr.Action) != it.LastAction {
		return Outcome{}, &InvalidInputError{Field: "latest_result.action",
			Message: fmt.Sprintf("reports on %q, but the last proposed action was %q", lr.Action, it.LastAction)}
	}
	last := it.LastAction
	switch lr.Outcome {
	case wire.OutcomeClosedManual:
		return Outcome{Assessment: a, Status: wire.WorkItemStatusClosedManual, Reason: ReasonClosedManual,
			ItemOutcome: string(wire.OutcomeClosedManual), HumanAction: lr.HumanAction, ActionState: ActionStateSucceeded}, nil
	case wire.OutcomeFailed:
		out := Escalate(in, a, ReasonActionFailed)
		if last == catalogue.VerifyReplySent || last == catalogue.VerifyJob {
			out = Escalate(in, a, ReasonVerificationFailed)
		}
		out.ItemOutcome = string(wire.OutcomeFailed)
		return out, nil
	case wire.OutcomeUnknown:
		// Never repeat blindly: ask n8n to read back whether the effect landed.
		if v, params, ok := verification(last, it.LastActionParams); ok {
			p, err := Admit(in.Tenant, it.CatalogueVersion, v, params)
			if err == nil {
				out := Proposed(a, p)
				out.ActionState = ActionStateVerifying
				return out, nil
			}
		}
		return Escalate(in, a, ReasonActionFailed), nil
	}
	// Succeeded.
	switch last {
	case catalogue.SendReply, catalogue.CreateJob, catalogue.VerifyReplySent, catalogue.VerifyJob, catalogue.CloseItem:
		return Outcome{Assessment: a, Status: wire.WorkItemStatusClosed, Reason: string(last) + "_succeeded",
			ItemOutcome: string(wire.OutcomeSucceeded), ActionState: ActionStateSucceeded}, nil
	case catalogue.DraftReply:
		// Mailbox mode: the draft is in the client's mailbox and a human sends
		// it; the item waits for n8n's reconciliation (closed_manual).
		return Outcome{Assessment: a, Status: wire.WorkItemStatusAwaitingApproval, Reason: ReasonAwaitingHuman,
			NeedsHuman: true, ActionState: ActionStateSucceeded}, nil
	}
	return Outcome{Assessment: a, Status: wire.WorkItemStatusEscalated, Reason: ReasonAwaitingHuman,
		NeedsHuman: true, ActionState: ActionStateSucceeded}, nil
}

// verification returns the read-back action for an action whose outcome is unknown.
func verification(last catalogue.Name, params json.RawMessage) (catalogue.Name, json.RawMessage, bool) {
	var p map[string]any
	if err := json.Unmarshal(params, &p); err != nil {
		return "", nil, false
	}
	switch last {
	case catalogue.SendReply:
		b, _ := json.Marshal(map[string]any{"approval_id": p["approval_id"], "content_sha256": p["content_sha256"]})
		return catalogue.VerifyReplySent, b, true
	case catalogue.CreateJob:
		b, _ := json.Marshal(map[string]any{"external_ref": p["external_ref"]})
		return catalogue.VerifyJob, b, true
	}
	return "", nil, false
}

// onResume handles a turn without a latest result on an existing item:
// typically the approval event restarting n8n.
func (e *Engine) onResume(in *Input) Outcome {
	it := in.Item
	a := carried(it)
	ap := it.Approval
	if it.Status == wire.WorkItemStatusAwaitingApproval && ap != nil {
		switch ap.Status {
		case ApprovalStatusApproved:
			return e.afterApproval(in, a)
		case ApprovalStatusRejected:
			return Escalate(in, a, ReasonApprovalRejected)
		case ApprovalStatusExpired:
			return Escalate(in, a, ReasonApprovalExpired)
		}
		return Outcome{Assessment: a, Status: wire.WorkItemStatusAwaitingApproval, Reason: ReasonAwaitingHuman,
			NeedsHuman: true, ActionState: it.ActionState}
	}
	return Outcome{Assessment: a, Status: it.Status, Reason: ReasonAwaitingHuman, NeedsHuman: true, ActionState: it.ActionState}
}

// afterApproval turns an approved proposal into the action that carries it
// out: an approved draft becomes send_reply (the approved hash, never the
// text itself); any other approved action (create_job, or what the model
// chose under assist, close_item say) is proposed again with exactly the
// parameters the human approved, now without requiring approval.
func (e *Engine) afterApproval(in *Input, a wire.Assessment) Outcome {
	it := in.Item
	ap := it.Approval
	if it.LastAction == catalogue.DraftReply {
		if it.ApprovalMode == registry.ApprovalModeMailbox {
			// The human sends from the mailbox; nothing for us to send.
			return Outcome{Assessment: a, Status: wire.WorkItemStatusAwaitingApproval, Reason: ReasonAwaitingHuman,
				NeedsHuman: true, ActionState: ActionStateSent}
		}
		params, _ := json.Marshal(map[string]string{
			"approval_id":            ap.ID,
			"content_sha256":         ap.ApprovedSHA256,
			"abort_if_replied_since": ap.ProposedAt.UTC().Format(time.RFC3339),
		})
		p, err := Admit(in.Tenant, it.CatalogueVersion, catalogue.SendReply, params)
		if err != nil {
			return Escalate(in, a, ReasonActionNotAdmitted)
		}
		return Proposed(a, p)
	}
	if it.LastAction == "" || len(ap.Approved) == 0 || wire.ContentSHA256(ap.Approved) != ap.ApprovedSHA256 {
		return Escalate(in, a, ReasonActionNotAdmitted)
	}
	p, err := Admit(in.Tenant, it.CatalogueVersion, it.LastAction, ap.Approved)
	if err != nil || p.Action.FollowUp {
		return Escalate(in, a, ReasonActionNotAdmitted)
	}
	p.RequiresApproval = false // approved: this turn carries it out
	return Proposed(a, p)
}

// Halt is the outcome of a turn past the tenant's ceiling: the item stops
// and is flagged for a human, with no action.
func Halt(it Item) Outcome {
	return Outcome{Assessment: carried(it), Status: wire.WorkItemStatusHalted, Reason: ReasonTurnCeiling,
		NeedsHuman: true, ItemOutcome: "halted", ActionState: it.ActionState}
}
