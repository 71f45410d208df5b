package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"n8nbrain/wire"
)

var (
	// ErrAlreadyResolved: the approval was decided, expired or superseded.
	ErrAlreadyResolved = errors.New("approval already resolved")
	// ErrApprovalExpired: the approval's time ran out before the decision.
	ErrApprovalExpired = errors.New("approval expired")
)

const approvalColumns = `id::text, work_item_id, turn, action, catalogue_version, approval_mode, proof, status,
	proposed, proposed_sha256, edited, COALESCE(edited_sha256, ''), COALESCE(approved_sha256, ''), expires_at,
	COALESCE(decided_by, ''), decided_at, COALESCE(reject_reason, ''), created_at`

func scanApproval(row pgx.CollectableRow) (wire.Approval, error) {
	var a wire.Approval
	var proposed, edited []byte
	err := row.Scan(&a.ID, &a.WorkItemID, &a.Turn, &a.Action, &a.CatalogueVersion, &a.ApprovalMode, &a.Proof, &a.Status,
		&proposed, &a.ProposedSHA256, &edited, &a.EditedSHA256, &a.ApprovedSHA256, &a.ExpiresAt, &a.DecidedBy,
		&a.DecidedAt, &a.RejectReason, &a.CreatedAt)
	a.Proposed = proposed
	if edited != nil {
		a.Edited = edited
	}
	return a, err
}

// ApprovalInsert is the statement that writes a new pending approval in a
// turn's transaction, expiring ttl after the database's clock: every
// comparison with expires_at (decide, sweep) uses that same clock.
func ApprovalInsert(a wire.Approval, ttl time.Duration) Statement {
	return Statement{SQL: `INSERT INTO approvals (id, work_item_id, turn, action, catalogue_version, approval_mode, proof,
			status, proposed, proposed_sha256, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8, $9, now() + make_interval(secs => $10))`,
		Args: []any{a.ID, a.WorkItemID, a.Turn, a.Action, a.CatalogueVersion, a.ApprovalMode, a.Proof,
			[]byte(a.Proposed), a.ProposedSHA256, ttl.Seconds()}}
}

// ApprovalSupersede is the statement that closes a work item's pending
// approval when a human acted outside the loop (closed_manual).
func ApprovalSupersede(workItemID string) Statement {
	return Statement{SQL: `UPDATE approvals SET status = 'superseded', decided_at = now(), decided_by = 'closed_manual'
		WHERE work_item_id = $1 AND status = 'pending'`, Args: []any{workItemID}, Optional: true}
}

// ApprovalGet returns an approval, or ErrNotFound.
func ApprovalGet(ctx context.Context, q DBTX, id string) (wire.Approval, error) {
	if _, err := uuid.Parse(id); err != nil {
		return wire.Approval{}, fmt.Errorf("get approval: %w", ErrNotFound)
	}
	rows, _ := q.Query(ctx, `SELECT `+approvalColumns+` FROM approvals WHERE id = $1`, id)
	a, err := pgx.CollectExactlyOneRow(rows, scanApproval)
	return a, translate(err, "get approval")
}

// ApprovalLatest returns the approval of a work item's latest proposal, or ErrNotFound.
func ApprovalLatest(ctx context.Context, q DBTX, workItemID string) (wire.Approval, error) {
	rows, _ := q.Query(ctx, `SELECT `+approvalColumns+` FROM approvals WHERE work_item_id = $1 ORDER BY turn DESC LIMIT 1`, workItemID)
	a, err := pgx.CollectExactlyOneRow(rows, scanApproval)
	return a, translate(err, "get latest approval")
}

// ApprovalList returns approvals with a status, oldest first.
func ApprovalList(ctx context.Context, q DBTX, status wire.ApprovalStatus, limit int) ([]wire.Approval, error) {
	rows, _ := q.Query(ctx, `SELECT `+approvalColumns+` FROM approvals WHERE status = $1 ORDER BY created_at, id LIMIT $2`, status, limit)
	as, err := pgx.CollectRows(rows, scanApproval)
	if as == nil {
		as = []wire.Approval{}
	}
	return as, translate(err, "list approvals")
}

// ApprovalDecision is a human's decision on an approval, already validated.
type ApprovalDecision struct {
	ApprovalID string
	Status     wire.ApprovalStatus // approved or rejected
	By         string
	Reason     string
	// Edited is the canonical edited content, with its hash (edit and approve).
	Edited       json.RawMessage
	EditedSHA256 string
}

// ApprovalDecide records a human's decision at most once, with the event
// that restarts n8n, in one transaction. A second decision is
// ErrAlreadyResolved; a decision after expires_at is ErrApprovalExpired
// (expiry never approves, and a late approval never wins).
func ApprovalDecide(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, d ApprovalDecision) (wire.Approval, wire.Event, error) {
	var out wire.Approval
	var ev wire.Event
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		rows, _ := tx.Query(ctx, `SELECT `+approvalColumns+` FROM approvals WHERE id = $1 FOR UPDATE`, d.ApprovalID)
		a, err := pgx.CollectExactlyOneRow(rows, scanApproval)
		if err != nil {
			return translate(err, "lock approval")
		}
		// The database's clock, the one expires_at was set with.
		var now time.Time
		if err := tx.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&now); err != nil {
			return translate(err, "read clock")
		}
		switch {
		case a.Status == wire.ApprovalStatusExpired:
			return ErrApprovalExpired
		case a.Status != wire.ApprovalStatusPending:
			return fmt.Errorf("%w: it is %s", ErrAlreadyResolved, a.Status)
		case !now.Before(a.ExpiresAt):
			return ErrApprovalExpired
		}
		approved := ""
		if d.Status == wire.ApprovalStatusApproved {
			approved = a.ProposedSHA256
			if d.EditedSHA256 != "" {
				approved = d.EditedSHA256
			}
		}
		rows, _ = tx.Query(ctx, `UPDATE approvals SET status = $2, edited = $3, edited_sha256 = NULLIF($4, ''),
				approved_sha256 = NULLIF($5, ''), decided_by = $6, decided_at = $7, reject_reason = NULLIF($8, '')
			WHERE id = $1 RETURNING `+approvalColumns,
			d.ApprovalID, d.Status, nullJSON(d.Edited), d.EditedSHA256, approved, d.By, now, d.Reason)
		if out, err = pgx.CollectExactlyOneRow(rows, scanApproval); err != nil {
			return translate(err, "decide approval")
		}
		var turn int
		if err := tx.QueryRow(ctx, `SELECT turn FROM work_items WHERE id = $1`, a.WorkItemID).Scan(&turn); err != nil {
			return translate(err, "read work item turn")
		}
		decision := "approved"
		if d.Status == wire.ApprovalStatusRejected {
			decision = "rejected"
		}
		ev = wire.Event{EventID: uuid.NewString(), Kind: wire.EventApprovalDecided, WorkItemID: a.WorkItemID,
			NextTurn: turn + 1, ApprovalID: a.ID, Decision: decision, OccurredAt: now.UTC()}
		s := OutboxInsert(ev)
		if _, err := tx.Exec(ctx, s.SQL, s.Args...); err != nil {
			return translate(err, "insert event")
		}
		return nil
	})
	return out, ev, err
}

// ApprovalSweep expires pending approvals past expires_at, re-queues their
// work items for a human and writes one approval_expired event each, in one
// statement. Sweepers on several replicas may run it at once: SKIP LOCKED
// and the status check make every expiry happen exactly once, and a
// concurrent human decision either wins the row lock (and the sweeper skips
// it) or finds it expired.
//
// Each event id is drawn in the RETURNING list of the UPDATE, which is
// evaluated once per updated row. A volatile subquery that does not
// reference the outer rows (a CROSS JOIN LATERAL (SELECT gen_random_uuid()))
// may be planned as the outer side of a nested loop and evaluated once for
// the whole statement, which, once the table has statistics, gave every
// event of a sweep the same id and failed it on outbox_pkey for ever.
func ApprovalSweep(ctx context.Context, q DBTX, limit int) (int, error) {
	tag, err := q.Exec(ctx, `WITH due AS (
			SELECT id FROM approvals WHERE status = 'pending' AND expires_at <= now()
			ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
		), expired AS (
			UPDATE approvals a SET status = 'expired', decided_at = now(), decided_by = 'expiry'
			FROM due WHERE a.id = due.id RETURNING a.id, a.work_item_id, gen_random_uuid() AS event_id
		), requeued AS (
			UPDATE work_items w SET status = 'escalated', status_reason = 'approval_expired', needs_human = true, updated_at = now()
			FROM expired e WHERE w.id = e.work_item_id RETURNING w.id, w.turn
		)
		INSERT INTO outbox (id, kind, work_item_id, payload)
		SELECT e.event_id, 'approval_expired', e.work_item_id, jsonb_build_object(
				'event_id', e.event_id::text, 'kind', 'approval_expired', 'work_item_id', e.work_item_id,
				'next_turn', r.turn + 1, 'approval_id', e.id::text, 'reason', 'approval_expired',
				'occurred_at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
		FROM expired e JOIN requeued r ON r.id = e.work_item_id`, limit)
	if err != nil {
		return 0, translate(err, "sweep expired approvals")
	}
	return int(tag.RowsAffected()), nil
}

// OutboxInsert is the statement that writes an event in the transaction of
// the change it announces.
func OutboxInsert(ev wire.Event) Statement {
	payload, err := json.Marshal(ev)
	if err != nil {
		panic(err) // a wire.Event always encodes
	}
	return Statement{SQL: `INSERT INTO outbox (id, kind, work_item_id, payload) VALUES ($1, $2, $3, $4)`,
		Args: []any{ev.EventID, string(ev.Kind), ev.WorkItemID, payload}}
}

// OutboxEvent is an event to forward.
type OutboxEvent struct {
	ID       string
	Payload  []byte
	Attempts int
}

// OutboxClaimDue claims up to limit undelivered events whose time has come,
// pushing their next attempt back by base·2^attempts (at most max) before
// they are published: a publish that is lost is simply retried then.
func OutboxClaimDue(ctx context.Context, q DBTX, limit int, base, max time.Duration) ([]OutboxEvent, error) {
	rows, _ := q.Query(ctx, `UPDATE outbox o SET attempts = o.attempts + 1, published_at = now(),
			next_attempt_at = now() + LEAST(make_interval(secs => $2 * power(2, LEAST(o.attempts, 20))), make_interval(secs => $3))
		WHERE o.id IN (SELECT id FROM outbox WHERE delivered_at IS NULL AND next_attempt_at <= now()
			ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED)
		RETURNING o.id::text, o.payload, o.attempts`, limit, base.Seconds(), max.Seconds())
	evs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (OutboxEvent, error) {
		var e OutboxEvent
		err := row.Scan(&e.ID, &e.Payload, &e.Attempts)
		return e, err
	})
	return evs, translate(err, "claim due events")
}

// OutboxMarkDelivered records that n8n accepted an event. It reports
// whether the event exists; marking twice is harmless.
func OutboxMarkDelivered(ctx context.Context, q DBTX, id string) (bool, error) {
	if _, err := uuid.Parse(id); err != nil {
		return false, nil
	}
	tag, err := q.Exec(ctx, `UPDATE outbox SET delivered_at = COALESCE(delivered_at, now()) WHERE id = $1`, id)
	return tag.RowsAffected() == 1, translate(err, "mark event delivered")
}

// OutcomeReport counts outcomes and approval turnaround since a time.
func OutcomeReport(ctx context.Context, q DBTX, since *time.Time) (wire.OutcomeReport, error) {
	r := wire.OutcomeReport{Since: since}
	from := time.Time{}
	if since != nil {
		from = *since
	}
	err := q.QueryRow(ctx, `SELECT count(*),
			count(*) FILTER (WHERE outcome IS NULL),
			count(*) FILTER (WHERE outcome = 'succeeded'),
			count(*) FILTER (WHERE outcome = 'failed'),
			count(*) FILTER (WHERE outcome = 'closed_manual'),
			count(*) FILTER (WHERE outcome = 'halted')
		FROM work_items WHERE created_at >= $1`, from).
		Scan(&r.Items, &r.Open, &r.Succeeded, &r.Failed, &r.ClosedManual, &r.Halted)
	if err != nil {
		return r, translate(err, "count outcomes")
	}
	if ended := r.Succeeded + r.Failed + r.ClosedManual + r.Halted; ended > 0 {
		f := float64(ended)
		r.SucceededRate, r.FailedRate = float64(r.Succeeded)/f, float64(r.Failed)/f
		r.ClosedManualRate, r.HaltedRate = float64(r.ClosedManual)/f, float64(r.Halted)/f
	}
	ap := &r.Approvals
	err = q.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'approved'),
			count(*) FILTER (WHERE status = 'rejected'), count(*) FILTER (WHERE status = 'expired'),
			count(*) FILTER (WHERE status = 'superseded')
		FROM approvals WHERE created_at >= $1`, from).Scan(&ap.Pending, &ap.Approved, &ap.Rejected, &ap.Expired, &ap.Superseded)
	if err != nil {
		return r, translate(err, "count approvals")
	}
	if resolved := ap.Approved + ap.Rejected + ap.Expired + ap.Superseded; resolved > 0 {
		ap.ExpiredRate = float64(ap.Expired) / float64(resolved)
	}
	rows, _ := q.Query(ctx, `SELECT extract(epoch FROM decided_at - created_at)::float8 FROM approvals
		WHERE status IN ('approved', 'rejected') AND created_at >= $1`, from)
	secs, err := pgx.CollectRows(rows, pgx.RowTo[float64])
	if err != nil {
		return r, translate(err, "approval turnaround")
	}
	if n := len(secs); n > 0 {
		slices.Sort(secs)
		sum := 0.0
		for _, s := range secs {
			sum += s
		}
		ta := &r.Turnaround
		ta.Count, ta.MeanSeconds = n, sum/float64(n)
		ta.P50Seconds, ta.P90Seconds = secs[(n-1)*50/100], secs[(n-1)*90/100]
	}
	return r, nil
}
