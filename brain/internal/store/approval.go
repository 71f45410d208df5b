package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
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
	COALESCE(decided_by, ''), decided_at, COALESCE(reject_reason, ''), created_at,
	category, COALESCE(priority, ''), COALESCE(confidence, 0), COALESCE(assessment_source, ''),
	COALESCE(assessment_rule, ''), COALESCE(email_from, ''), COALESCE(email_subject, '')`

func scanApproval(row pgx.CollectableRow) (wire.Approval, error) {
	var a wire.Approval
	dest, finish := approvalDest(&a)
	err := row.Scan(dest...)
	finish()
	return a, err
}

// approvalDest is where approvalColumns scan into, and what to do after.
func approvalDest(a *wire.Approval) ([]any, func()) {
	var proposed, edited []byte
	var category *string
	var as wire.Assessment
	dest := []any{&a.ID, &a.WorkItemID, &a.Turn, &a.Action, &a.CatalogueVersion, &a.ApprovalMode, &a.Proof, &a.Status,
		&proposed, &a.ProposedSHA256, &edited, &a.EditedSHA256, &a.ApprovedSHA256, &a.ExpiresAt, &a.DecidedBy,
		&a.DecidedAt, &a.RejectReason, &a.CreatedAt,
		&category, &as.Priority, &as.Confidence, &as.Source, &as.Rule, &a.Sender, &a.Subject}
	return dest, func() {
		a.Proposed = proposed
		if edited != nil {
			a.Edited = edited
		}
		if category != nil {
			as.Category = *category
			a.Assessment = &as
		}
	}
}

// ApprovalInsert is the statement that writes a new pending approval in a
// turn's transaction, expiring ttl after the database's clock: every
// comparison with expires_at (decide, sweep) uses that same clock.
func ApprovalInsert(a wire.Approval, ttl time.Duration) Statement {
	as := a.Assessment
	if as == nil {
		as = &wire.Assessment{}
	}
	return Statement{SQL: `INSERT INTO approvals (id, work_item_id, turn, action, catalogue_version, approval_mode, proof,
			status, proposed, proposed_sha256, expires_at,
			category, priority, confidence, assessment_source, assessment_rule, email_from, email_subject)
		VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8, $9, now() + make_interval(secs => $10),
			NULLIF($11, ''), NULLIF($12, ''), $13, NULLIF($14, ''), NULLIF($15, ''), NULLIF($16, ''), NULLIF($17, ''))`,
		Args: []any{a.ID, a.WorkItemID, a.Turn, a.Action, a.CatalogueVersion, a.ApprovalMode, a.Proof,
			[]byte(a.Proposed), a.ProposedSHA256, ttl.Seconds(),
			as.Category, as.Priority, as.Confidence, as.Source, as.Rule, a.Sender, a.Subject}}
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

// ApprovalListQuery selects a page of approvals.
type ApprovalListQuery struct {
	Status wire.ApprovalStatus
	// Search keeps approvals whose sender or subject contains it (any case).
	Search string
	Limit  int
	// After is the sort key of the last approval of the previous page.
	After *ApprovalKey
}

// ApprovalKey is an approval's place in a listing: for pending approvals
// (Urgency, At = created_at, ID) ascending, most urgent then oldest first;
// for the others (At = decided_at, ID) descending, latest decided first.
type ApprovalKey struct {
	Urgency int       `json:"u"`
	At      time.Time `json:"t"`
	ID      string    `json:"id"`
}

// ApprovalPage is one page of a listing.
type ApprovalPage struct {
	Approvals []wire.Approval
	Keys      []ApprovalKey // the sort key of each approval
	Total     int           // approvals matching status and search
	Offset    int           // of them, how many sort before this page
}

// ApprovalList returns a page of approvals with a status, in the listing's
// order (see ApprovalKey), with how many match in all. Keyset pagination: a
// page continues after the last key of the previous one, so approvals
// decided in between do not shift the pages.
func ApprovalList(ctx context.Context, q DBTX, lq ApprovalListQuery) (ApprovalPage, error) {
	// The sort key, its order, and the conditions "sorts after" and "sorts
	// at or before" the key @urgency, @at, @id.
	key, order := `urgency, created_at`, `urgency, created_at, id`
	after := `(urgency, created_at, id) > (@urgency, @at, @id::uuid)`
	before := `(urgency, created_at, id) <= (@urgency, @at, @id::uuid)`
	if lq.Status != wire.ApprovalStatusPending {
		key, order = `0::smallint, decided_at`, `decided_at DESC, id DESC`
		after, before = `(decided_at, id) < (@at, @id::uuid)`, `(decided_at, id) >= (@at, @id::uuid)`
	}
	args := pgx.NamedArgs{"status": string(lq.Status), "pattern": "", "limit": lq.Limit, "id": nil,
		"urgency": int16(0), "at": time.Time{}}
	if lq.Search != "" {
		args["pattern"] = "%" + likeEscaper.Replace(lq.Search) + "%"
	}
	if k := lq.After; k != nil {
		args["urgency"], args["at"], args["id"] = int16(k.Urgency), k.At, k.ID
	}
	where := `status = @status AND (@pattern::text = '' OR email_from ILIKE @pattern OR email_subject ILIKE @pattern)`
	page := ApprovalPage{Approvals: []wire.Approval{}, Keys: []ApprovalKey{}}
	b := &pgx.Batch{}
	b.Queue(`SELECT `+approvalColumns+`, `+key+` FROM approvals
		WHERE `+where+` AND (@id::text IS NULL OR `+after+`) ORDER BY `+order+` LIMIT @limit`, args).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var a wire.Approval
			var urgency int16
			var at *time.Time
			dest, finish := approvalDest(&a)
			if err := rows.Scan(append(dest, &urgency, &at)...); err != nil {
				return err
			}
			finish()
			key := ApprovalKey{Urgency: int(urgency), ID: a.ID}
			if at != nil {
				key.At = *at
			}
			page.Approvals = append(page.Approvals, a)
			page.Keys = append(page.Keys, key)
		}
		return rows.Err()
	})
	b.Queue(`SELECT count(*), count(*) FILTER (WHERE @id::text IS NOT NULL AND `+before+`)
		FROM approvals WHERE `+where, args).QueryRow(func(row pgx.Row) error {
		return row.Scan(&page.Total, &page.Offset)
	})
	if err := q.SendBatch(ctx, b).Close(); err != nil {
		return page, translate(err, "list approvals")
	}
	return page, nil
}

// likeEscaper escapes LIKE's wildcards; backslash is LIKE's default escape.
var likeEscaper = strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)

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
// the change it announces; the forwarder publishes it once woken.
func OutboxInsert(ev wire.Event) Statement {
	return Statement{SQL: `INSERT INTO outbox (id, kind, work_item_id, payload) VALUES ($1, $2, $3, $4)`,
		Args: []any{ev.EventID, string(ev.Kind), ev.WorkItemID, EventPayload(ev)}}
}

// OutboxInsertSent writes an event that its writer publishes itself, with
// these payload bytes, as soon as the transaction commits: that publish is
// its first attempt, so the forwarder's first is due retry later, unless an
// edge acknowledged it by then.
func OutboxInsertSent(ev wire.Event, payload []byte, retry time.Duration) Statement {
	return Statement{SQL: `INSERT INTO outbox (id, kind, work_item_id, payload, attempts, published_at, next_attempt_at)
			VALUES ($1, $2, $3, $4, 1, now(), now() + make_interval(secs => $5))`,
		Args: []any{ev.EventID, string(ev.Kind), ev.WorkItemID, payload, retry.Seconds()}}
}

// EventPayload is an event as the outbox stores and publishes it.
func EventPayload(ev wire.Event) []byte {
	payload, err := json.Marshal(ev)
	if err != nil {
		panic(err) // a wire.Event always encodes
	}
	return payload
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

// OutboxNextAttempt is the earliest next attempt of an undelivered event;
// ok is false when every event is delivered.
func OutboxNextAttempt(ctx context.Context, q DBTX) (next time.Time, ok bool, err error) {
	var t *time.Time
	if err := q.QueryRow(ctx, `SELECT min(next_attempt_at) FROM outbox WHERE delivered_at IS NULL`).Scan(&t); err != nil {
		return time.Time{}, false, translate(err, "next event attempt")
	}
	if t == nil {
		return time.Time{}, false, nil
	}
	return *t, true, nil
}

// ApprovalNextExpiry is the earliest expiry of a pending approval; ok is
// false when none is pending.
func ApprovalNextExpiry(ctx context.Context, q DBTX) (next time.Time, ok bool, err error) {
	var t *time.Time
	if err := q.QueryRow(ctx, `SELECT min(expires_at) FROM approvals WHERE status = 'pending'`).Scan(&t); err != nil {
		return time.Time{}, false, translate(err, "next approval expiry")
	}
	if t == nil {
		return time.Time{}, false, nil
	}
	return *t, true, nil
}

// OutboxMarkDelivered records that n8n accepted the events ids (one call
// of api.event.ack, at most wire.MaxEventAckBatch). It returns the ids that
// name no event, in their order; marking twice is harmless and writes
// nothing.
//
// The mark is one transaction of its own (q is a pool, not a transaction
// of the caller's) committed without waiting for its WAL flush
// (synchronous_commit off for this transaction only). A mark lost to a
// crash of the database means one more delivery of an event n8n already
// has, under the same Idempotency-Key: the at-least-once contract events
// have anyway (an ack lost on the way). Nothing else is at stake, and every
// delivered event no longer costs a flush of its own.
func OutboxMarkDelivered(ctx context.Context, q DBTX, ids []string) (unknown []string, err error) {
	valid := make([]string, 0, len(ids)) // canonical uuids
	for _, id := range ids {
		if u, err := uuid.Parse(id); err == nil {
			valid = append(valid, u.String())
		}
	}
	gone := map[string]bool{}
	if len(valid) > 0 {
		b := &pgx.Batch{}
		b.Queue(`SELECT set_config('synchronous_commit', 'off', true)`)
		if len(valid) == 1 { // the usual call: a quiet tenant's event
			b.Queue(`WITH marked AS (UPDATE outbox SET delivered_at = now() WHERE id = $1 AND delivered_at IS NULL)
				SELECT $1::text WHERE NOT EXISTS (SELECT 1 FROM outbox WHERE id = $1)`, valid[0])
		} else {
			// = ANY on the primary key, in both halves: a join with the
			// unnested ids is planned as a scan of the outbox while its
			// statistics are those of an empty table, and its cost grows
			// with every event (measured: twice Postgres's CPU per turn).
			b.Queue(`WITH marked AS (UPDATE outbox SET delivered_at = now() WHERE id = ANY($1::uuid[]) AND delivered_at IS NULL)
				SELECT u::text FROM unnest($1::uuid[]) u WHERE u <> ALL (ARRAY(SELECT id FROM outbox WHERE id = ANY($1::uuid[])))`, valid)
		}
		if gone, err = markDelivered(ctx, q, b); err != nil {
			return nil, translate(err, "mark events delivered")
		}
	}
	for _, id := range ids {
		u, err := uuid.Parse(id)
		if err != nil || gone[u.String()] { // not an event id at all, or no such event
			unknown = append(unknown, id)
		}
	}
	return unknown, nil
}

// markDelivered runs OutboxMarkDelivered's batch and returns the ids it
// did not find.
func markDelivered(ctx context.Context, q DBTX, b *pgx.Batch) (map[string]bool, error) {
	br := q.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	gone := make(map[string]bool, len(missing))
	for _, id := range missing {
		gone[id] = true
	}
	return gone, br.Close()
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
		ta.P50Seconds, ta.P90Seconds = nearestRank(secs, 50), nearestRank(secs, 90)
	}
	return r, nil
}

// nearestRank is the p-th percentile of sorted (not empty): the smallest
// value with at least p % of them at or below it. Rounding the rank down
// instead made the p90 of three turnarounds their median.
func nearestRank(sorted []float64, p int) float64 {
	return sorted[max(1, (len(sorted)*p+99)/100)-1]
}

// PendingApproval is a pending approval's times, for the metrics of what
// waits for a human.
type PendingApproval struct {
	CreatedAt time.Time
	ExpiresAt time.Time
}

// ApprovalPendingTimes lists the pending approvals' times, soonest expiry
// first, at most limit, and how many are pending in all.
func ApprovalPendingTimes(ctx context.Context, q DBTX, limit int) ([]PendingApproval, int, error) {
	rows, _ := q.Query(ctx, `SELECT created_at, expires_at, count(*) OVER () FROM approvals
		WHERE status = 'pending' ORDER BY expires_at LIMIT $1`, limit)
	total := 0
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (PendingApproval, error) {
		var p PendingApproval
		err := row.Scan(&p.CreatedAt, &p.ExpiresAt, &total)
		return p, err
	})
	return out, total, translate(err, "list pending approvals' times")
}

// OutboxBacklog is how many events are not yet delivered and when the
// oldest of them was written (zero when none).
func OutboxBacklog(ctx context.Context, q DBTX) (n int, oldest time.Time, err error) {
	var t *time.Time
	if err := q.QueryRow(ctx, `SELECT count(*), min(created_at) FROM outbox WHERE delivered_at IS NULL`).Scan(&n, &t); err != nil {
		return 0, time.Time{}, translate(err, "outbox backlog")
	}
	if t != nil {
		oldest = *t
	}
	return n, oldest, nil
}
