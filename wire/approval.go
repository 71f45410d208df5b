package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// MaxAPIBytes bounds a tenant API request on NATS and over HTTP. The
// largest valid one is an edit of a draft at its catalogue limits: 20,000
// characters of body, each up to 6 bytes in JSON (a 4-byte character, or
// one JSON escapes as \uXXXX), about 120 KB. It stays 64 KiB below the
// tenant account's payload limit (account.TenantMaxPayload, headers
// included), so that what the edge accepts the server carries.
const MaxAPIBytes = 192 << 10

// MaxAPIReplyBytes bounds a tenant API reply, below NATS's default
// max_payload (1 MiB) with room for headers: a page of approvals that would
// be larger ends early, with a next_cursor for the rest.
const MaxAPIReplyBytes = 512 << 10

// ApprovalStatus is the state of an approval record.
type ApprovalStatus string

const (
	ApprovalStatusPending  ApprovalStatus = "pending"
	ApprovalStatusApproved ApprovalStatus = "approved"
	ApprovalStatusRejected ApprovalStatus = "rejected"
	// ApprovalStatusExpired: nobody decided in time; the item went back to a
	// human. Expiry never approves.
	ApprovalStatusExpired ApprovalStatus = "expired"
	// ApprovalStatusSuperseded: a human acted outside the loop (closed_manual)
	// while the approval was pending.
	ApprovalStatusSuperseded ApprovalStatus = "superseded"
)

// Proof says what an approval record proves, by approval mode.
const (
	// ProofExactText (review_app): the record holds the exact text sent.
	ProofExactText = "exact_text"
	// ProofProposalOnly (mailbox): a human sent from their own mailbox; the
	// record proves only what we proposed.
	ProofProposalOnly = "proposal_only"
)

// ApprovalDecision is what a human decided.
type ApprovalDecision string

const (
	DecisionApprove ApprovalDecision = "approve"
	DecisionEdit    ApprovalDecision = "edit" // edit and approve
	DecisionReject  ApprovalDecision = "reject"
)

// Approval is an approval record as the tenant sees it.
type Approval struct {
	ID               string         `json:"id"`
	WorkItemID       string         `json:"work_item_id"`
	Turn             int            `json:"turn"`
	Action           string         `json:"action"`
	CatalogueVersion int            `json:"catalogue_version"`
	ApprovalMode     string         `json:"approval_mode"`
	Proof            string         `json:"proof"`
	Status           ApprovalStatus `json:"status"`
	// Proposed is the exact parameters proposed (for draft_reply: subject,
	// body, tone); ProposedSHA256 is ContentSHA256 of them.
	Proposed       json.RawMessage `json:"proposed,omitempty"` // left out of brief lists
	ProposedSHA256 string          `json:"proposed_sha256"`
	// Edited and EditedSHA256 are set when a human edited before approving.
	Edited       json.RawMessage `json:"edited,omitempty"`
	EditedSHA256 string          `json:"edited_sha256,omitempty"`
	// ApprovedSHA256 is the hash of the content a human approved: the only
	// content send_reply may send.
	ApprovedSHA256 string     `json:"approved_sha256,omitempty"`
	ExpiresAt      time.Time  `json:"expires_at"`
	DecidedBy      string     `json:"decided_by,omitempty"`
	DecidedAt      *time.Time `json:"decided_at,omitempty"`
	RejectReason   string     `json:"reject_reason,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	// Assessment is what the brain concluded about the item when it proposed
	// the action (category, priority, confidence, rule or model), copied onto
	// the record so it explains itself. Nil on records written before it was
	// kept that the migration could not fill.
	Assessment *Assessment `json:"assessment,omitempty"`
	// Sender and Subject are the e-mail's From and Subject, as received.
	Sender  string `json:"sender,omitempty"`
	Subject string `json:"subject,omitempty"`
	// Recipient is who receives what is approved, when the action sends
	// something to a person (a reply goes to the sender's address).
	Recipient string `json:"recipient,omitempty"`
}

// ContentSHA256 is the hash an approval records: SHA-256 over the
// parameters' canonical JSON (keys sorted, no insignificant space), hex.
// n8n can recompute it before sending.
func ContentSHA256(canonicalParams []byte) string {
	sum := sha256.Sum256(canonicalParams)
	return hex.EncodeToString(sum[:])
}

// ApprovalListRequest is api.approval.list. Pending approvals come most
// urgent first (priority urgent, high, normal, low, then none), oldest first
// within a priority; the others most recently decided first.
type ApprovalListRequest struct {
	Status ApprovalStatus `json:"status,omitempty"` // default pending
	Limit  int            `json:"limit,omitempty"`  // default 50, at most 200
	// Query keeps approvals whose sender or subject contains it, ignoring
	// case; at most MaxApprovalQueryBytes.
	Query string `json:"query,omitempty"`
	// Cursor continues a listing from its NextCursor; it is only valid with
	// the same status and query.
	Cursor string `json:"cursor,omitempty"`
	// Brief leaves out the proposed and edited content (Proposed, Edited),
	// for a list that shows only who, what and when.
	Brief bool `json:"brief,omitempty"`
}

// MaxApprovalQueryBytes bounds ApprovalListRequest.Query.
const MaxApprovalQueryBytes = 200

// ApprovalListReply answers ApprovalListRequest.
type ApprovalListReply struct {
	Approvals []Approval `json:"approvals"`
	// Total is how many approvals match the status and query; Offset how
	// many of them come before this page.
	Total  int `json:"total"`
	Offset int `json:"offset"`
	// NextCursor fetches the next page; empty on the last one. A page can
	// hold fewer than the limit asked for when the approvals' content
	// would make it larger than MaxAPIReplyBytes.
	NextCursor string `json:"next_cursor,omitempty"`
}

// ApprovalGetRequest is api.approval.get.
type ApprovalGetRequest struct {
	ApprovalID string `json:"approval_id"`
}

// ApprovalGetReply answers ApprovalGetRequest, with the e-mail the
// approval is about so the reviewer can read it.
type ApprovalGetReply struct {
	Approval Approval `json:"approval"`
	Email    *Email   `json:"email,omitempty"`
}

// ApprovalDecideRequest is api.approval.decide.
type ApprovalDecideRequest struct {
	ApprovalID string           `json:"approval_id"`
	Decision   ApprovalDecision `json:"decision"`
	// By is who decided, set by the edge from the authenticated reviewer
	// ("reviewer:alice") or from n8n's request ("n8n:alice").
	By string `json:"by"`
	// Edited is the full edited parameters, for DecisionEdit.
	Edited json.RawMessage `json:"edited,omitempty"`
	// Reason is required for DecisionReject.
	Reason string `json:"reason,omitempty"`
}

// Validate checks the request's own rules.
func (r *ApprovalDecideRequest) Validate() error {
	switch {
	case r.ApprovalID == "":
		return invalidField("approval_id", "is required")
	case r.By == "" || len(r.By) > 200:
		return invalidField("by", "is required: who decided (at most 200 characters)")
	case len(r.Reason) > 1000:
		return invalidField("reason", "is longer than 1000 bytes")
	case strings.ContainsRune(r.Reason, 0):
		// Postgres cannot store U+0000 in text: refused here, not a 500.
		return invalidField("reason", "contains the NUL character (U+0000)")
	}
	for _, id := range []struct{ field, v string }{{"approval_id", r.ApprovalID}, {"by", r.By}} {
		if err := identifierError(id.field, id.v); err != nil {
			return err
		}
	}
	switch r.Decision {
	case DecisionApprove:
		if len(r.Edited) > 0 {
			return invalidField("edited", "is only for decision edit")
		}
	case DecisionEdit:
		if len(r.Edited) == 0 {
			return invalidField("edited", "is required for decision edit: the full edited parameters")
		}
	case DecisionReject:
		if strings.TrimSpace(r.Reason) == "" {
			return invalidField("reason", "is required for decision reject")
		}
	default:
		return invalidField("decision", "must be one of approve, edit, reject")
	}
	return nil
}

// ApprovalDecideReply answers ApprovalDecideRequest.
type ApprovalDecideReply struct {
	Approval Approval `json:"approval"`
	EventID  string   `json:"event_id"`
}

// EventKind names an event n8n must hear about.
type EventKind string

const (
	EventApprovalDecided EventKind = "approval_decided"
	EventApprovalExpired EventKind = "approval_expired"
	EventItemHalted      EventKind = "item_halted"
	// EventApprovalRequested: an action waits for a human's approval, so n8n
	// can notify reviewers. It restarts nothing: n8n submits no turn for it.
	EventApprovalRequested EventKind = "approval_requested"
)

// Event is what the edge delivers to n8n's webhook. It carries what n8n
// needs to call the next turn, and no e-mail content.
type Event struct {
	EventID    string    `json:"event_id"`
	Kind       EventKind `json:"kind"`
	WorkItemID string    `json:"work_item_id"`
	NextTurn   int       `json:"next_turn"`
	// ApprovalID names the approval, for approval_requested,
	// approval_decided and approval_expired.
	ApprovalID string `json:"approval_id,omitempty"`
	// Action is the action awaiting approval, for approval_requested.
	Action string `json:"action,omitempty"`
	// Decision is approved or rejected, for approval_decided.
	Decision   string    `json:"decision,omitempty"`
	Reason     string    `json:"reason,omitempty"`
	OccurredAt time.Time `json:"occurred_at"`
}

// MaxEventAckBatch bounds the event ids of one api.event.ack.
const MaxEventAckBatch = 256

// EventAckRequest is api.event.ack: n8n accepted the event, or the events.
// Exactly one of EventID and EventIDs is set. An edge sends EventIDs for
// the events n8n accepted while its previous acknowledgement was in flight,
// so a busy tenant pays one call and one transaction for many events.
type EventAckRequest struct {
	EventID  string   `json:"event_id,omitempty"`
	EventIDs []string `json:"event_ids,omitempty"`
}

// IDs are the events acknowledged, in either form.
func (r *EventAckRequest) IDs() []string {
	if r.EventID != "" {
		return []string{r.EventID}
	}
	return r.EventIDs
}

// Validate checks the request's own rules.
func (r *EventAckRequest) Validate() error {
	switch {
	case r.EventID == "" && len(r.EventIDs) == 0:
		return invalidField("event_id", "is required (or event_ids, a list of them)")
	case r.EventID != "" && len(r.EventIDs) > 0:
		return invalidField("event_ids", "is not allowed with event_id: send one or the other")
	case len(r.EventIDs) > MaxEventAckBatch:
		return invalidField("event_ids", fmt.Sprintf("has %d ids, the limit is %d", len(r.EventIDs), MaxEventAckBatch))
	}
	for i, id := range r.EventIDs {
		if id == "" {
			return invalidField(fmt.Sprintf("event_ids[%d]", i), "is empty")
		}
	}
	return nil
}

// EventAckReply answers EventAckRequest. For event_id, an id that names no
// event of the tenant is a not_found error; for event_ids, the call marks
// the events it knows and lists the others in Unknown.
type EventAckReply struct {
	Delivered bool     `json:"delivered"`
	Unknown   []string `json:"unknown,omitempty"`
}

// ReportRequest is api.report.outcomes.
type ReportRequest struct {
	// Since bounds the report to items created since then; zero: everything.
	Since *time.Time `json:"since,omitempty"`
}

// OutcomeReport is a tenant's outcome report.
type OutcomeReport struct {
	Since        *time.Time `json:"since,omitempty"`
	Items        int        `json:"items"`
	Open         int        `json:"open"`
	Succeeded    int        `json:"succeeded"`
	Failed       int        `json:"failed"`
	ClosedManual int        `json:"closed_manual"`
	Halted       int        `json:"halted"`
	// Rates are over items that reached an outcome (succeeded, failed,
	// closed_manual, halted); ExpiredRate over approvals that were resolved.
	SucceededRate    float64 `json:"succeeded_rate"`
	FailedRate       float64 `json:"failed_rate"`
	ClosedManualRate float64 `json:"closed_manual_rate"`
	HaltedRate       float64 `json:"halted_rate"`
	Approvals        struct {
		Pending     int     `json:"pending"`
		Approved    int     `json:"approved"`
		Rejected    int     `json:"rejected"`
		Expired     int     `json:"expired"`
		Superseded  int     `json:"superseded"`
		ExpiredRate float64 `json:"expired_rate"`
	} `json:"approvals"`
	// Turnaround of decided approvals, proposal to human decision.
	Turnaround struct {
		Count       int     `json:"count"`
		MeanSeconds float64 `json:"mean_seconds"`
		P50Seconds  float64 `json:"p50_seconds"`
		P90Seconds  float64 `json:"p90_seconds"`
	} `json:"turnaround"`
}

// CheckAPISize refuses a tenant API request beyond MaxAPIBytes; it is nil
// within it.
func CheckAPISize(data []byte) *Error {
	if len(data) <= MaxAPIBytes {
		return nil
	}
	return &Error{Code: CodeInvalid, Reason: ReasonTooLarge,
		Message: fmt.Sprintf("request is %d bytes, the limit is %d", len(data), MaxAPIBytes)}
}

// DecodeAPI decodes a tenant API request strictly, with the size limit.
func DecodeAPI(data []byte, v any) error {
	if e := CheckAPISize(data); e != nil {
		return e
	}
	if len(data) == 0 {
		data = []byte("{}")
	}
	if err := Decode(data, v); err != nil {
		return ErrorOf(err)
	}
	return nil
}
