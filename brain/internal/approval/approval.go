// Package approval makes an approval a stop, not a wait. In a turn's
// transaction it writes the approval record of every action that requires
// one (the exact proposed content and its SHA-256, the item's approval
// mode, the expiry) and the events n8n must hear about; it serves the
// tenant API that lists, shows and decides approvals (the human's decision
// and the event that restarts n8n are one transaction, at most once); and
// it expires approvals that nobody decided, which never approves.
package approval

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"n8nbrain/brain/internal/engine"
	"n8nbrain/brain/internal/store"
	"n8nbrain/catalogue"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// ReasonSendNotApproved escalates a send_reply whose content hash is not the
// one a human approved for this item.
const ReasonSendNotApproved = "send_reply_not_approved"

// Pools gives the pool of a tenant's own database.
type Pools interface {
	Pool(ctx context.Context, t *registry.Tenant) (*pgxpool.Pool, error)
}

// Approvals is the approval component of a brain replica. Every time it
// compares with an expiry is the tenant database's clock.
type Approvals struct {
	pools Pools
	log   *slog.Logger
	// kick wakes the outbox forwarder after an event was written.
	kick func()
}

// New returns the approval component. kick is called after events are
// written so they are forwarded without waiting for the next poll.
func New(pools Pools, kick func(), log *slog.Logger) *Approvals {
	return &Approvals{pools: pools, log: log, kick: kick}
}

// Guard refuses a send_reply that does not carry the hash a human approved
// for this very item: the engine builds it from the approval, and this
// check against the database makes sure nothing else ever leaves.
func (a *Approvals) Guard(ctx context.Context, q store.DBTX, in *engine.Input, out engine.Outcome) (engine.Outcome, error) {
	if out.Action == nil || out.Action.Action.Name != catalogue.SendReply {
		return out, nil
	}
	var p struct {
		ApprovalID    string `json:"approval_id"`
		ContentSHA256 string `json:"content_sha256"`
	}
	if err := json.Unmarshal(out.Action.Params, &p); err != nil {
		return engine.Escalate(in, out.Assessment, ReasonSendNotApproved), nil
	}
	ap, err := store.ApprovalGet(ctx, q, p.ApprovalID)
	if errors.Is(err, store.ErrNotFound) {
		return engine.Escalate(in, out.Assessment, ReasonSendNotApproved), nil
	}
	if err != nil {
		return out, err
	}
	if ap.WorkItemID != in.Item.ID || ap.Status != wire.ApprovalStatusApproved || ap.ApprovedSHA256 != p.ContentSHA256 {
		a.log.Warn("send_reply refused: content hash is not the approved one", "approval_id", ap.ID)
		return engine.Escalate(in, out.Assessment, ReasonSendNotApproved), nil
	}
	return out, nil
}

// Extend writes, in the turn's transaction, the approval record of an
// action that requires one with its approval_requested event, supersedes a pending approval when a human
// acted outside the loop, and writes the item_halted event.
func (a *Approvals) Extend(_ context.Context, t *registry.Tenant, w *store.TurnWrite, out *engine.Outcome, reply *wire.TurnSubmitReply) error {
	it := w.Item
	if out.Action != nil && out.Action.Action.RequiresApproval {
		proof := wire.ProofExactText
		if it.ApprovalMode == registry.ApprovalModeMailbox {
			proof = wire.ProofProposalOnly
		}
		rec := wire.Approval{
			ID:               uuid.NewString(),
			WorkItemID:       it.ID,
			Turn:             it.Turn,
			Action:           string(out.Action.Action.Name),
			CatalogueVersion: int(it.CatalogueVersion),
			ApprovalMode:     string(it.ApprovalMode),
			Proof:            proof,
			Proposed:         out.Action.Params,
			ProposedSHA256:   wire.ContentSHA256(out.Action.Params),
		}
		// The record and the event that tells n8n to notify reviewers are
		// one transaction: a draft nobody hears about cannot exist.
		w.Extra = append(w.Extra, store.ApprovalInsert(rec, t.ApprovalTTL),
			store.OutboxInsert(wire.Event{EventID: uuid.NewString(), Kind: wire.EventApprovalRequested,
				WorkItemID: it.ID, NextTurn: it.Turn + 1, ApprovalID: rec.ID, Action: rec.Action, OccurredAt: time.Now().UTC()}))
		w.AfterCommit = a.kick
		reply.Action.ApprovalID = rec.ID
	}
	switch out.Status {
	case wire.WorkItemStatusClosedManual:
		w.Extra = append(w.Extra, store.ApprovalSupersede(it.ID))
	case wire.WorkItemStatusHalted:
		w.Extra = append(w.Extra, store.OutboxInsert(wire.Event{EventID: uuid.NewString(), Kind: wire.EventItemHalted,
			WorkItemID: it.ID, NextTurn: it.Turn + 1, Reason: out.Reason, OccurredAt: time.Now().UTC()}))
		w.AfterCommit = a.kick
	}
	return nil
}

// Approval loads the approval of a work item's latest proposal for the
// engine (turn.ResumeLoader).
func (a *Approvals) Approval(ctx context.Context, q store.DBTX, workItemID string) (*engine.Approval, error) {
	ap, err := store.ApprovalLatest(ctx, q, workItemID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &engine.Approval{ID: ap.ID, Status: engine.ApprovalStatus(ap.Status), ApprovedSHA256: ap.ApprovedSHA256,
		ProposedAt: ap.CreatedAt}, nil
}

// List serves api.approval.list.
func (a *Approvals) List(ctx context.Context, t *registry.Tenant, req *wire.ApprovalListRequest) (*wire.ApprovalListReply, error) {
	status := req.Status
	if status == "" {
		status = wire.ApprovalStatusPending
	}
	switch status {
	case wire.ApprovalStatusPending, wire.ApprovalStatusApproved, wire.ApprovalStatusRejected, wire.ApprovalStatusExpired, wire.ApprovalStatusSuperseded:
	default:
		return nil, &wire.Error{Code: wire.CodeInvalid, Field: "status", Message: "status must be one of pending, approved, rejected, expired, superseded"}
	}
	limit := req.Limit
	if limit == 0 {
		limit = 50
	}
	if limit < 1 || limit > 200 {
		return nil, &wire.Error{Code: wire.CodeInvalid, Field: "limit", Message: "limit must be between 1 and 200"}
	}
	pool, err := a.pools.Pool(ctx, t)
	if err != nil {
		return nil, err
	}
	as, err := store.ApprovalList(ctx, pool, status, limit)
	if err != nil {
		return nil, err
	}
	return &wire.ApprovalListReply{Approvals: as}, nil
}

// Get serves api.approval.get, with the e-mail the approval is about.
func (a *Approvals) Get(ctx context.Context, t *registry.Tenant, req *wire.ApprovalGetRequest) (*wire.ApprovalGetReply, error) {
	pool, err := a.pools.Pool(ctx, t)
	if err != nil {
		return nil, err
	}
	ap, err := store.ApprovalGet(ctx, pool, req.ApprovalID)
	if err != nil {
		return nil, notFound(err)
	}
	item, err := store.WorkItemGet(ctx, pool, ap.WorkItemID)
	if err != nil {
		return nil, err
	}
	return &wire.ApprovalGetReply{Approval: ap, Email: item.Email}, nil
}

// Decide serves api.approval.decide: approve, edit and approve, or reject,
// at most once, recording who and when, with the event that restarts n8n.
func (a *Approvals) Decide(ctx context.Context, t *registry.Tenant, req *wire.ApprovalDecideRequest) (*wire.ApprovalDecideReply, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	pool, err := a.pools.Pool(ctx, t)
	if err != nil {
		return nil, err
	}
	ap, err := store.ApprovalGet(ctx, pool, req.ApprovalID)
	if err != nil {
		return nil, notFound(err)
	}
	d := store.ApprovalDecision{ApprovalID: ap.ID, Status: wire.ApprovalStatusApproved, By: req.By}
	switch req.Decision {
	case wire.DecisionReject:
		d.Status, d.Reason = wire.ApprovalStatusRejected, req.Reason
	case wire.DecisionEdit:
		action, ok := catalogue.Lookup(catalogue.Version(ap.CatalogueVersion), catalogue.Name(ap.Action))
		if !ok {
			return nil, fmt.Errorf("approval %s names unknown action %s v%d", ap.ID, ap.Action, ap.CatalogueVersion)
		}
		canon, err := action.ValidateParams(req.Edited)
		if err != nil {
			return nil, &wire.Error{Code: wire.CodeInvalid, Field: "edited", Message: err.Error()}
		}
		d.Edited, d.EditedSHA256 = canon, wire.ContentSHA256(canon)
	}
	rec, ev, err := store.ApprovalDecide(ctx, pool, d)
	switch {
	case errors.Is(err, store.ErrApprovalExpired):
		return nil, &wire.Error{Code: wire.CodeConflict, Reason: wire.ReasonApprovalExpired,
			Message: "the approval expired before this decision; the item went back to a human"}
	case errors.Is(err, store.ErrAlreadyResolved):
		return nil, &wire.Error{Code: wire.CodeConflict, Reason: wire.ReasonAlreadyResolved,
			Message: "the approval was already resolved (" + string(ap.Status) + " when read); decisions happen at most once"}
	case err != nil:
		return nil, notFound(err)
	}
	a.log.Info("approval decided", "tenant_id", t.ID, "approval_id", rec.ID, "status", rec.Status, "event_id", ev.EventID)
	a.kick()
	return &wire.ApprovalDecideReply{Approval: rec, EventID: ev.EventID}, nil
}

// AckEvent serves api.event.ack: n8n accepted the event.
func (a *Approvals) AckEvent(ctx context.Context, t *registry.Tenant, req *wire.EventAckRequest) (*wire.EventAckReply, error) {
	pool, err := a.pools.Pool(ctx, t)
	if err != nil {
		return nil, err
	}
	ok, err := store.OutboxMarkDelivered(ctx, pool, req.EventID)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, &wire.Error{Code: wire.CodeNotFound, Message: "no such event"}
	}
	return &wire.EventAckReply{Delivered: true}, nil
}

// Report serves api.report.outcomes.
func (a *Approvals) Report(ctx context.Context, t *registry.Tenant, req *wire.ReportRequest) (*wire.OutcomeReport, error) {
	pool, err := a.pools.Pool(ctx, t)
	if err != nil {
		return nil, err
	}
	r, err := store.OutcomeReport(ctx, pool, req.Since)
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// Sweep expires the pending approvals of every active tenant that are past
// their expiry. Safe on several replicas at once (see store.ApprovalSweep).
func (a *Approvals) Sweep(ctx context.Context, tenants []*registry.Tenant) (int, error) {
	total := 0
	var errs []error
	for _, t := range tenants {
		if t.Status != registry.TenantStatusActive {
			continue
		}
		pool, err := a.pools.Pool(ctx, t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for {
			n, err := store.ApprovalSweep(ctx, pool, 500)
			if err != nil {
				errs = append(errs, fmt.Errorf("tenant %s: %w", t.ID, err))
				break
			}
			total += n
			if n < 500 {
				break
			}
		}
	}
	if total > 0 {
		a.kick()
	}
	return total, errors.Join(errs...)
}

func notFound(err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return &wire.Error{Code: wire.CodeNotFound, Message: "no such approval for this tenant"}
	}
	return err
}
