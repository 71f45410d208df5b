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
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/mail"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"n8nbrain/brain/internal/engine"
	"n8nbrain/brain/internal/store"
	"n8nbrain/catalogue"
	"n8nbrain/registry"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// ReasonSendNotApproved escalates a send_reply whose content hash is not the
// one a human approved for this item.
const ReasonSendNotApproved = "send_reply_not_approved"

// Pools gives the pool of a tenant's own database.
type Pools interface {
	// Lease returns the pool, held open until release (tenancy.Directory).
	Lease(ctx context.Context, t *registry.Tenant) (pool *pgxpool.Pool, release func(), err error)
	// Check returns err, or a *tenancy.LoginError when the tenant's
	// database refuses the tenant's role (and records it).
	Check(t *registry.Tenant, err error) error
}

// Timers keeps a tenant's one expiry timer (timer.Next): it fires at the
// earliest expiry of the tenant's pending approvals.
type Timers interface {
	Ensure(ctx context.Context, account, kind string, t time.Time, onErr func(error))
	Set(ctx context.Context, account, kind string, t time.Time) error
	Clear(account, kind string)
}

// Events writes and forwards events (outbox.Forwarder).
type Events interface {
	// Stage writes an event in a turn's transaction and publishes it
	// once the transaction commits.
	Stage(w *store.TurnWrite, t *registry.Tenant, ev wire.Event)
	// Kick forwards a tenant's events written by other transactions.
	Kick(t *registry.Tenant)
}

// Approvals is the approval component of a brain replica. Every time it
// compares with an expiry is the tenant database's clock; the timer that
// brings an expiry to the brain is only the wake-up.
type Approvals struct {
	pools  Pools
	timers Timers
	events Events
	log    *slog.Logger

	reportsMu sync.Mutex
	reports   map[registry.TenantID]*tenantReports
}

// The outcome report scans the tenant's work items and approvals, which
// grow with every turn: a tenant calling api.report.outcomes in a loop
// would keep its share of the workers running those scans on a cluster
// other tenants share. So a tenant's reports are computed one at a time on
// a replica (callers wait for the one running), and each is answered from
// memory for reportTTL.
const (
	reportTTL = 10 * time.Second
	// reportKeys bounds the reports of one tenant kept (one per since).
	reportKeys = 16
)

type tenantReports struct {
	mu   sync.Mutex // held while a report is computed
	byAt map[int64]cachedReport
}

type cachedReport struct {
	at  time.Time
	rep wire.OutcomeReport
}

// New returns the approval component: events forwards the events it
// writes, and timers bring a tenant's approvals back when they expire.
func New(pools Pools, timers Timers, events Events, log *slog.Logger) *Approvals {
	return &Approvals{pools: pools, timers: timers, events: events, log: log, reports: map[registry.TenantID]*tenantReports{}}
}

// ensureExpiry makes t's expiry timer fire by an approval's expiry, without
// holding up the caller (a turn answers before its timer is stored). A
// failure is logged, not returned: the commit stands, and the
// reconciliation pass sets the timer later.
func (a *Approvals) ensureExpiry(ctx context.Context, t *registry.Tenant, at time.Time) {
	a.timers.Ensure(ctx, t.NATSAccount, subjects.DueExpiry, at, func(err error) {
		a.log.Warn("set the approvals' expiry timer; the reconciliation pass sets it later", "tenant_id", t.ID, "error", err)
	})
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
	if out.Action != nil && out.Action.RequiresApproval {
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
		// The record explains itself: why it was proposed, and about what.
		as := out.Assessment
		if as.Source == "carried" {
			as.Source = it.AssessmentSource
		}
		rec.Assessment = &as
		if e := it.Email; e != nil {
			rec.Sender, rec.Subject = e.From, e.Subject
		}
		// The record and the event that tells n8n to notify reviewers are
		// one transaction: a draft nobody hears about cannot exist.
		w.Extra = append(w.Extra, store.ApprovalInsert(rec, t.ApprovalTTL))
		a.events.Stage(w, t, wire.Event{EventID: uuid.NewString(), Kind: wire.EventApprovalRequested,
			WorkItemID: it.ID, NextTurn: it.Turn + 1, ApprovalID: rec.ID, Action: rec.Action, OccurredAt: time.Now().UTC()})
		reply.Action.ApprovalID = rec.ID
		// The database sets expires_at by its clock; a timer a little late
		// is harmless, and one early finds the approval not yet due and is
		// set again (Expire).
		expires := time.Now().Add(t.ApprovalTTL)
		w.OnCommit(func(ctx context.Context) { a.ensureExpiry(ctx, t, expires) })
	}
	switch out.Status {
	case wire.WorkItemStatusClosedManual:
		w.Extra = append(w.Extra, store.ApprovalSupersede(it.ID))
	case wire.WorkItemStatusHalted:
		a.events.Stage(w, t, wire.Event{EventID: uuid.NewString(), Kind: wire.EventItemHalted,
			WorkItemID: it.ID, NextTurn: it.Turn + 1, Reason: out.Reason, OccurredAt: time.Now().UTC()})
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
	approved := ap.Proposed
	if len(ap.Edited) > 0 {
		approved = ap.Edited
	}
	return &engine.Approval{ID: ap.ID, Status: engine.ApprovalStatus(ap.Status), ApprovedSHA256: ap.ApprovedSHA256,
		Approved: approved, ProposedAt: ap.CreatedAt}, nil
}

// List serves api.approval.list: a page of approvals with a status, most
// urgent then oldest first while pending, searchable by sender or subject.
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
	query := strings.TrimSpace(req.Query)
	if len(query) > wire.MaxApprovalQueryBytes || !utf8.ValidString(query) || strings.ContainsRune(query, 0) {
		return nil, &wire.Error{Code: wire.CodeInvalid, Field: "query",
			Message: fmt.Sprintf("query must be text of at most %d bytes", wire.MaxApprovalQueryBytes)}
	}
	lq := store.ApprovalListQuery{Status: status, Search: query, Limit: limit}
	if req.Cursor != "" {
		c, err := decodeCursor(req.Cursor, status, query)
		if err != nil {
			return nil, err
		}
		lq.After = &c
	}
	pool, release, err := a.pools.Lease(ctx, t)
	if err != nil {
		return nil, err
	}
	defer release()
	page, err := store.ApprovalList(ctx, pool, lq)
	if err != nil {
		return nil, err
	}
	rep := &wire.ApprovalListReply{Approvals: page.Approvals, Total: page.Total, Offset: page.Offset}
	for i := range rep.Approvals {
		withRecipient(&rep.Approvals[i])
		if req.Brief {
			rep.Approvals[i].Proposed, rep.Approvals[i].Edited = nil, nil
		}
	}
	if n := len(page.Keys); n == limit && page.Offset+n < page.Total {
		rep.NextCursor = encodeCursor(page.Keys[n-1], status, query)
	}
	// Full content (drafts of up to 20,000 characters, edited ones twice)
	// can make a page of 200 larger than a NATS message: such a page ends
	// after the approvals that fit, and its cursor goes on from there.
	for size := replySize(rep); size > wire.MaxAPIReplyBytes && len(rep.Approvals) > 1; size = replySize(rep) {
		n := max(1, len(rep.Approvals)*wire.MaxAPIReplyBytes/size)
		rep.Approvals = rep.Approvals[:n]
		rep.NextCursor = encodeCursor(page.Keys[n-1], status, query)
	}
	return rep, nil
}

// replySize is the encoded size of rep.
func replySize(rep *wire.ApprovalListReply) int {
	b, err := json.Marshal(rep)
	if err != nil {
		return 0 // the API's own encoding reports it
	}
	return len(b)
}

// cursor is a listing's position: the last key of a page, and the status
// and query it belongs to (a cursor means nothing in another listing).
type cursor struct {
	store.ApprovalKey
	Status wire.ApprovalStatus `json:"s"`
	Query  string              `json:"q,omitempty"`
}

func encodeCursor(k store.ApprovalKey, status wire.ApprovalStatus, query string) string {
	b, _ := json.Marshal(cursor{ApprovalKey: k, Status: status, Query: query}) // plain fields: cannot fail
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string, status wire.ApprovalStatus, query string) (store.ApprovalKey, error) {
	bad := &wire.Error{Code: wire.CodeInvalid, Field: "cursor",
		Message: "cursor is not one this listing gave out (it belongs to another status or query, or is damaged); start from the first page"}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) > 1024 {
		return store.ApprovalKey{}, bad
	}
	var c cursor
	if err := json.Unmarshal(b, &c); err != nil || c.Status != status || c.Query != query || uuid.Validate(c.ID) != nil {
		return store.ApprovalKey{}, bad
	}
	return c.ApprovalKey, nil
}

// withRecipient sets who receives what an approval approves: the sender's
// address, for an action that answers the e-mail.
func withRecipient(ap *wire.Approval) {
	act, ok := catalogue.Lookup(catalogue.Version(ap.CatalogueVersion), catalogue.Name(ap.Action))
	if !ok || act.Product != "email" || ap.Sender == "" {
		return
	}
	if addr, err := mail.ParseAddress(ap.Sender); err == nil {
		ap.Recipient = addr.Address
		return
	}
	ap.Recipient = ap.Sender
}

// Get serves api.approval.get, with the e-mail the approval is about.
func (a *Approvals) Get(ctx context.Context, t *registry.Tenant, req *wire.ApprovalGetRequest) (*wire.ApprovalGetReply, error) {
	pool, release, err := a.pools.Lease(ctx, t)
	if err != nil {
		return nil, err
	}
	defer release()
	ap, err := store.ApprovalGet(ctx, pool, req.ApprovalID)
	if err != nil {
		return nil, notFound(err)
	}
	item, err := store.WorkItemGet(ctx, pool, ap.WorkItemID)
	if err != nil {
		return nil, err
	}
	withRecipient(&ap)
	return &wire.ApprovalGetReply{Approval: ap, Email: item.Email}, nil
}

// Decide serves api.approval.decide: approve, edit and approve, or reject,
// at most once, recording who and when, with the event that restarts n8n.
func (a *Approvals) Decide(ctx context.Context, t *registry.Tenant, req *wire.ApprovalDecideRequest) (*wire.ApprovalDecideReply, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	pool, release, err := a.pools.Lease(ctx, t)
	if err != nil {
		return nil, err
	}
	defer release()
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
		// A read-only parameter (external_ref: what keeps n8n from creating
		// the job twice) is shown to the reviewer but never changed.
		if form, ok := catalogue.FormOf(catalogue.Version(ap.CatalogueVersion), action.Name); ok {
			param, err := form.ReadOnlyChange(ap.Proposed, canon)
			if err != nil {
				return nil, fmt.Errorf("approval %s: compare read-only parameters: %w", ap.ID, err)
			}
			if param != "" {
				return nil, &wire.Error{Code: wire.CodeInvalid, Field: "edited." + param,
					Message: fmt.Sprintf("action %s: parameter %q cannot be changed by an edit; keep the proposed value", action.Name, param)}
			}
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
	a.events.Kick(t)
	withRecipient(&rec)
	return &wire.ApprovalDecideReply{Approval: rec, EventID: ev.EventID}, nil
}

// AckEvent serves api.event.ack: n8n accepted the event, or the events.
func (a *Approvals) AckEvent(ctx context.Context, t *registry.Tenant, req *wire.EventAckRequest) (*wire.EventAckReply, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	pool, release, err := a.pools.Lease(ctx, t)
	if err != nil {
		return nil, err
	}
	defer release()
	unknown, err := store.OutboxMarkDelivered(ctx, pool, req.IDs())
	if err != nil {
		return nil, err
	}
	if req.EventID != "" && len(unknown) > 0 {
		return nil, &wire.Error{Code: wire.CodeNotFound, Message: "no such event"}
	}
	return &wire.EventAckReply{Delivered: true, Unknown: unknown}, nil
}

// Report serves api.report.outcomes.
// A report is at most reportTTL old (see reportTTL).
func (a *Approvals) Report(ctx context.Context, t *registry.Tenant, req *wire.ReportRequest) (*wire.OutcomeReport, error) {
	a.reportsMu.Lock()
	tr := a.reports[t.ID]
	if tr == nil {
		tr = &tenantReports{byAt: map[int64]cachedReport{}}
		a.reports[t.ID] = tr
	}
	a.reportsMu.Unlock()
	var since int64 // 0: everything
	if req.Since != nil {
		since = req.Since.UnixNano()
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if c, ok := tr.byAt[since]; ok && time.Since(c.at) < reportTTL {
		return &c.rep, nil
	}
	r, err := a.report(ctx, t, req)
	if err != nil {
		return nil, err
	}
	if len(tr.byAt) >= reportKeys {
		clear(tr.byAt)
	}
	tr.byAt[since] = cachedReport{at: time.Now(), rep: *r}
	return r, nil
}

func (a *Approvals) report(ctx context.Context, t *registry.Tenant, req *wire.ReportRequest) (*wire.OutcomeReport, error) {
	pool, release, err := a.pools.Lease(ctx, t)
	if err != nil {
		return nil, err
	}
	defer release()
	r, err := store.OutcomeReport(ctx, pool, req.Since)
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// Expire handles t's expiry timer: it expires t's pending approvals that
// are past their expiry, re-queues their items for a human and writes their
// events (store.ApprovalSweep: safe on several replicas at once), wakes the
// forwarder, then sets the timer to the earliest expiry still pending (by
// the database's clock: a timer that fired early finds its approval not
// yet due and comes back), or leaves it unset when nothing is pending.
func (a *Approvals) Expire(ctx context.Context, t *registry.Tenant) (int, error) {
	if t.Status != registry.TenantStatusActive {
		return 0, nil
	}
	pool, release, err := a.pools.Lease(ctx, t)
	if err != nil {
		return 0, a.pools.Check(t, err)
	}
	defer release()
	return a.ExpireOn(ctx, t, pool)
}

// ExpireOn is Expire on a tenant database the caller holds: the
// reconciliation pass's repair of a timer a replica that died between a
// commit and its wake-up left unset.
func (a *Approvals) ExpireOn(ctx context.Context, t *registry.Tenant, q store.DBTX) (int, error) {
	if t.Status != registry.TenantStatusActive {
		return 0, nil
	}
	total := 0
	for {
		n, err := store.ApprovalSweep(ctx, q, 500)
		if err != nil {
			return total, fmt.Errorf("tenant %s: %w", t.ID, a.pools.Check(t, err))
		}
		total += n
		if n < 500 {
			break
		}
	}
	if total > 0 {
		a.events.Kick(t)
	}
	next, ok, err := store.ApprovalNextExpiry(ctx, q)
	if err != nil {
		return total, a.pools.Check(t, err)
	}
	if !ok {
		a.timers.Clear(t.NATSAccount, subjects.DueExpiry)
		return total, nil
	}
	return total, a.timers.Set(ctx, t.NATSAccount, subjects.DueExpiry, next)
}

func notFound(err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return &wire.Error{Code: wire.CodeNotFound, Message: "no such approval for this tenant"}
	}
	return err
}
