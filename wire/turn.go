package wire

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Size limits of a turn, enforced by the edge (HTTP) and the brain (NATS).
const (
	MaxTurnBytes       = 256 << 10
	MaxWorkItemIDBytes = 512
	MaxTurn            = 100_000
	MaxBodyBytes       = 128 << 10
	MaxSubjectBytes    = 2_000
	MaxDetailBytes     = 8 << 10
	// MaxAddressBytes bounds email.from and each of to and cc.
	MaxAddressBytes = 512
	// MaxNameBytes bounds latest_result.action and human_action.kind:
	// names, not text.
	MaxNameBytes = 64
)

// NATS headers the brain sets on a turn's reply.
const (
	// HeaderFingerprint carries the fingerprint of the request the reply answers,
	// so an edge that finds a stored reply can tell whether it answers its payload.
	HeaderFingerprint = "Brain-Request-Fingerprint"
	// HeaderTurnSeq carries the TURNS stream sequence of the message answered.
	HeaderTurnSeq = "Brain-Turn-Seq"
	// HeaderStatus is "ok" for a decision and "error" for an ErrorReply.
	HeaderStatus = "Brain-Status"
)

// Values of HeaderStatus.
const (
	StatusOK    = "ok"
	StatusError = "error"
)

// WorkItemStatus is the state of a work item after a turn.
type WorkItemStatus string

const (
	WorkItemStatusOpen             WorkItemStatus = "open"
	WorkItemStatusAwaitingApproval WorkItemStatus = "awaiting_approval"
	WorkItemStatusEscalated        WorkItemStatus = "escalated"
	WorkItemStatusHalted           WorkItemStatus = "halted"
	WorkItemStatusClosed           WorkItemStatus = "closed"
	WorkItemStatusClosedManual     WorkItemStatus = "closed_manual"
)

// Outcome is what n8n reports about the action it executed.
type Outcome string

const (
	OutcomeSucceeded    Outcome = "succeeded"
	OutcomeFailed       Outcome = "failed"
	OutcomeUnknown      Outcome = "unknown"       // n8n cannot tell whether the effect landed
	OutcomeClosedManual Outcome = "closed_manual" // a human already did it; see HumanAction
)

// TurnSubmitRequest is one turn, as n8n posts it to the edge and as the edge
// publishes it to the brain.
type TurnSubmitRequest struct {
	WorkItemID string `json:"work_item_id"`
	Turn       int    `json:"turn"`
	// TenantID is optional. The tenant is the NATS account; when present and
	// different, the turn is rejected.
	TenantID     string        `json:"tenant_id,omitempty"`
	Email        *Email        `json:"email,omitempty"`
	LatestResult *LatestResult `json:"latest_result,omitempty"`
}

// Email is the work item of the email triage engine.
type Email struct {
	MessageID  string     `json:"message_id,omitempty"`
	ThreadID   string     `json:"thread_id,omitempty"`
	From       string     `json:"from"`
	To         []string   `json:"to,omitempty"`
	Cc         []string   `json:"cc,omitempty"`
	Subject    string     `json:"subject"`
	Body       string     `json:"body"`
	ReceivedAt *time.Time `json:"received_at,omitempty"`
}

// LatestResult is the outcome of the action the previous turn proposed.
type LatestResult struct {
	Action  string  `json:"action"`
	Outcome Outcome `json:"outcome"`
	Detail  string  `json:"detail,omitempty"`
	// HumanAction is required with OutcomeClosedManual: what the human did.
	HumanAction *HumanAction `json:"human_action,omitempty"`
}

// HumanAction records what a human did outside the loop.
type HumanAction struct {
	Kind string     `json:"kind"` // e.g. "replied", "created_job"
	Text string     `json:"text,omitempty"`
	At   *time.Time `json:"at,omitempty"`
}

// TurnSubmitReply is the decision envelope.
type TurnSubmitReply struct {
	WorkItemID       string         `json:"work_item_id"`
	Turn             int            `json:"turn"`
	NextTurn         int            `json:"next_turn"`
	Replayed         bool           `json:"replayed"`
	CatalogueVersion int            `json:"catalogue_version"`
	Status           WorkItemStatus `json:"status"`
	// Reason says why the item is escalated, halted or closed.
	Reason     string     `json:"reason,omitempty"`
	Assessment Assessment `json:"assessment"`
	Action     *Action    `json:"action"`
	// Autonomy is the tenant's autonomy level the decision was made under.
	// "assist": every action the model chose stops for a human
	// (Action.RequiresApproval is true even where the catalogue would not
	// require it), except escalate_item, which already hands the item to a
	// human; actions of deterministic rules and follow-ups of earlier
	// decisions keep the catalogue's requires_approval. Absent only from
	// decisions stored before the field existed.
	Autonomy string `json:"autonomy,omitempty"`
}

// CategoryUnclassified is the assessment's category of an item that nothing
// assessed: no confident rule matched and the model did not answer (no
// model, model down, over budget, or its answers invalid). It is reserved:
// no tenant may name a category so. Such an assessment has priority
// "normal", confidence 0 and source "none", and the item is escalated with
// the reason.
const CategoryUnclassified = "unclassified"

// Assessment is what the brain concluded about the item.
type Assessment struct {
	// Category is one of the tenant's categories, or CategoryUnclassified.
	Category   string  `json:"category"`
	Priority   string  `json:"priority"`
	Confidence float64 `json:"confidence"`
	// Source is "rule", "model", "carried" (unchanged from an earlier turn),
	// or "none" (not assessed: see CategoryUnclassified).
	Source string `json:"source"`
	Rule   string `json:"rule,omitempty"`
}

// Action is what should happen next in the outside world, from the catalogue.
// RequiresApproval true means n8n stops: a human decides the approval
// ApprovalID on the review page or the API, and the next turn carries out
// what was approved.
type Action struct {
	Name             string          `json:"name"`
	Params           json.RawMessage `json:"params"`
	RequiresApproval bool            `json:"requires_approval"`
	ApprovalID       string          `json:"approval_id,omitempty"`
}

// TurnPendingReply is the body of the edge's 202: the turn is accepted and
// still being decided. GET ResultURL (or re-submit the same turn, which is
// idempotent) for the decision. n8n treats a 202 as success, so a workflow
// branches on Status == "pending".
type TurnPendingReply struct {
	Status    string `json:"status"` // always "pending"
	TurnKey   string `json:"turn_key"`
	ResultURL string `json:"result_url"`
	Message   string `json:"message"`
}

// Fingerprint identifies a request's content: the same logical request always
// has the same fingerprint, whatever whitespace or key order it arrived with.
func Fingerprint(r *TurnSubmitRequest) string {
	b, err := json.Marshal(r)
	if err != nil {
		panic(fmt.Sprintf("marshal decoded turn: %v", err)) // cannot happen for this type
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// EncodeReply is the one encoding of a decision: the bytes the brain stores
// and sends. Work item ids are e-mail message ids, so '<' and '>' are kept
// as they are rather than HTML-escaped.
func EncodeReply(r *TurnSubmitReply) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// MarkReplayed returns a stored reply with replayed set to true. Every replay
// of the same stored reply is byte-identical.
func MarkReplayed(stored []byte) ([]byte, error) { return SetReplayed(stored, true) }

// SetReplayed returns a stored reply with replayed set as given: false for
// the first delivery of a decision that was stored before anyone saw it (a
// decision fetched after a 202), true for every repeat.
func SetReplayed(stored []byte, replayed bool) ([]byte, error) {
	var r TurnSubmitReply
	if err := json.Unmarshal(stored, &r); err != nil {
		return nil, fmt.Errorf("decode stored reply: %w", err)
	}
	if r.Replayed == replayed {
		return stored, nil // already says so: the brain's own bytes
	}
	r.Replayed = replayed
	return EncodeReply(&r)
}

// DecodeTurnSubmitRequest decodes and validates a turn strictly.
func DecodeTurnSubmitRequest(data []byte) (*TurnSubmitRequest, error) {
	if len(data) > MaxTurnBytes {
		return nil, &Error{Code: CodeInvalid, Reason: ReasonTooLarge,
			Message: fmt.Sprintf("turn is %d bytes, the limit is %d", len(data), MaxTurnBytes)}
	}
	var r TurnSubmitRequest
	if err := Decode(data, &r); err != nil {
		return nil, ErrorOf(err)
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// Validate checks the rules a well-formed turn must follow.
func (r *TurnSubmitRequest) Validate() error {
	switch {
	case strings.TrimSpace(r.WorkItemID) == "":
		return invalidField("work_item_id", "is required (and not only spaces)")
	case len(r.WorkItemID) > MaxWorkItemIDBytes:
		return invalidField("work_item_id", fmt.Sprintf("is longer than %d bytes", MaxWorkItemIDBytes))
	case r.Turn == 0:
		return invalidField("turn", fmt.Sprintf("is required: the turn's number, from 1 to %d (absent or 0)", MaxTurn))
	case r.Turn < 1 || r.Turn > MaxTurn:
		return invalidField("turn", fmt.Sprintf("must be between 1 and %d", MaxTurn))
	case len(r.TenantID) > 128:
		return invalidField("tenant_id", "is longer than 128 bytes")
	case r.Turn == 1 && r.Email == nil:
		return invalidField("email", "is required on turn 1: it is the work item")
	case r.Turn == 1 && r.LatestResult != nil:
		return invalidField("latest_result", "must be absent on turn 1: no action was proposed yet")
	}
	if err := r.identifierError(); err != nil {
		return err
	}
	if field := nulField(r); field != "" {
		// Postgres cannot store U+0000 in text or jsonb: refused at the door
		// rather than failing the turn on every retry.
		return invalidField(field, "contains the NUL character (U+0000)")
	}
	if e := r.Email; e != nil {
		switch {
		case strings.TrimSpace(e.From) == "":
			return invalidField("email.from", "is required")
		case len(e.From) > MaxAddressBytes:
			return invalidField("email.from", fmt.Sprintf("is not a plausible address (longer than %d bytes)", MaxAddressBytes))
		case len(e.MessageID) > MaxWorkItemIDBytes:
			return invalidField("email.message_id", fmt.Sprintf("is longer than %d bytes", MaxWorkItemIDBytes))
		case len(e.ThreadID) > MaxWorkItemIDBytes:
			return invalidField("email.thread_id", fmt.Sprintf("is longer than %d bytes", MaxWorkItemIDBytes))
		case len(e.Subject) > MaxSubjectBytes:
			return invalidField("email.subject", fmt.Sprintf("is longer than %d bytes", MaxSubjectBytes))
		case len(e.Body) > MaxBodyBytes:
			return invalidField("email.body", fmt.Sprintf("is longer than %d bytes", MaxBodyBytes))
		case len(e.To)+len(e.Cc) > 200:
			return invalidField("email.to", "has more than 200 recipients with cc")
		}
		for _, list := range []struct {
			field string
			addrs []string
		}{{"email.to", e.To}, {"email.cc", e.Cc}} {
			for i, a := range list.addrs {
				if len(a) > MaxAddressBytes {
					return invalidField(fmt.Sprintf("%s[%d]", list.field, i), fmt.Sprintf("is not a plausible address (longer than %d bytes)", MaxAddressBytes))
				}
			}
		}
	}
	if lr := r.LatestResult; lr != nil {
		switch lr.Outcome {
		case OutcomeSucceeded, OutcomeFailed, OutcomeUnknown, OutcomeClosedManual:
		default:
			return invalidField("latest_result.outcome", "must be one of succeeded, failed, unknown, closed_manual")
		}
		switch {
		case lr.Action == "":
			return invalidField("latest_result.action", "is required: the action whose outcome this is")
		case len(lr.Action) > MaxNameBytes:
			return invalidField("latest_result.action", fmt.Sprintf("is longer than %d bytes: it names a catalogue action", MaxNameBytes))
		case len(lr.Detail) > MaxDetailBytes:
			return invalidField("latest_result.detail", fmt.Sprintf("is longer than %d bytes", MaxDetailBytes))
		case lr.Outcome == OutcomeClosedManual && lr.HumanAction == nil:
			return invalidField("latest_result.human_action", "is required with outcome closed_manual")
		case lr.HumanAction != nil && lr.HumanAction.Kind == "":
			return invalidField("latest_result.human_action.kind", "is required")
		case lr.HumanAction != nil && len(lr.HumanAction.Kind) > MaxNameBytes:
			return invalidField("latest_result.human_action.kind", fmt.Sprintf("is longer than %d bytes", MaxNameBytes))
		case lr.HumanAction != nil && len(lr.HumanAction.Text) > MaxBodyBytes:
			return invalidField("latest_result.human_action.text", fmt.Sprintf("is longer than %d bytes", MaxBodyBytes))
		}
	}
	return nil
}

// identifierError refuses control and invisible characters in the turn's
// identifiers and in the address part of its e-mail addresses (see
// identifierError and addressError in ident.go).
func (r *TurnSubmitRequest) identifierError() *Error {
	ids := []struct{ field, v string }{{"work_item_id", r.WorkItemID}, {"tenant_id", r.TenantID}}
	if e := r.Email; e != nil {
		ids = append(ids, struct{ field, v string }{"email.message_id", e.MessageID}, struct{ field, v string }{"email.thread_id", e.ThreadID})
	}
	if lr := r.LatestResult; lr != nil {
		ids = append(ids, struct{ field, v string }{"latest_result.action", lr.Action})
		if h := lr.HumanAction; h != nil {
			ids = append(ids, struct{ field, v string }{"latest_result.human_action.kind", h.Kind})
		}
	}
	for _, id := range ids {
		if err := identifierError(id.field, id.v); err != nil {
			return err
		}
	}
	e := r.Email
	if e == nil {
		return nil
	}
	if err := addressError("email.from", e.From); err != nil {
		return err
	}
	for _, list := range []struct {
		field string
		addrs []string
	}{{"email.to", e.To}, {"email.cc", e.Cc}} {
		for i, a := range list.addrs {
			if err := addressError(fmt.Sprintf("%s[%d]", list.field, i), a); err != nil {
				return err
			}
		}
	}
	return nil
}

// nulField names the first text field containing U+0000, or "".
func nulField(r *TurnSubmitRequest) string {
	has := func(s string) bool { return strings.ContainsRune(s, 0) }
	if has(r.TenantID) {
		return "tenant_id"
	}
	if e := r.Email; e != nil {
		for _, f := range [...]struct{ name, v string }{{"email.message_id", e.MessageID}, {"email.thread_id", e.ThreadID},
			{"email.from", e.From}, {"email.subject", e.Subject}, {"email.body", e.Body}} {
			if has(f.v) {
				return f.name
			}
		}
		for i, v := range e.To {
			if has(v) {
				return fmt.Sprintf("email.to[%d]", i)
			}
		}
		for i, v := range e.Cc {
			if has(v) {
				return fmt.Sprintf("email.cc[%d]", i)
			}
		}
	}
	if lr := r.LatestResult; lr != nil {
		fields := []struct{ name, v string }{{"latest_result.action", lr.Action}, {"latest_result.detail", lr.Detail}}
		if h := lr.HumanAction; h != nil {
			fields = append(fields, struct{ name, v string }{"latest_result.human_action.kind", h.Kind},
				struct{ name, v string }{"latest_result.human_action.text", h.Text})
		}
		for _, f := range fields {
			if has(f.v) {
				return f.name
			}
		}
	}
	return ""
}

func invalidField(field, problem string) *Error {
	return &Error{Code: CodeInvalid, Field: field, Message: field + " " + problem}
}
