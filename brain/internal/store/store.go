// Package store is the brain's SQL on a tenant database. Every function takes
// the DBTX to run on (a pool, a connection or a transaction), so the same
// function runs inside a turn's transaction and in a test. Driver errors are
// translated here, once: no rows → ErrNotFound, unique violation → ErrConflict.
//
// The tenant is not a parameter here because the DBTX is the tenant: it is a
// connection made with that tenant's own role to that tenant's own database.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"n8nbrain/brain/internal/engine"
	"n8nbrain/catalogue"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// DBTX is what the query functions need.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

var (
	// ErrNotFound: no such row.
	ErrNotFound = errors.New("not found")
	// ErrConflict: a concurrent writer got there first (unique key or optimistic check).
	ErrConflict = errors.New("conflict")
)

// translate maps driver errors to the package's sentinels.
func translate(err error, what string) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s: %w", what, ErrNotFound)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" {
		return fmt.Errorf("%s: %w", what, ErrConflict)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// PlanChanged reports whether err is Postgres refusing a statement whose
// cached plan's result type a migration changed (a column's type). pgx
// has dropped the statement already: the same call again prepares it anew.
func PlanChanged(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "0A000" && strings.Contains(pe.Message, "cached plan must not change result type")
}

// Transient reports whether err is the tenant database being unreachable
// or briefly unable to serve (restarting, shutting down, out of
// connections, a lost connection, a timeout, a serialization failure or a
// deadlock, a changed plan): the same call may succeed later. A connection
// lost after a statement was sent counts too (the server crashed or was
// restarted under it): whether the statement took effect is unknown, and
// every caller's retry is safe (a turn is guarded by its decision's key,
// an approval decided already says so, an acknowledgement is idempotent).
func Transient(err error) bool {
	if err == nil {
		return false
	}
	if PlanChanged(err) || errors.Is(err, context.DeadlineExceeded) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	var netErr net.Error
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.As(err, &netErr) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case strings.HasPrefix(pe.Code, "08"), // connection exception
			pe.Code == "40001", pe.Code == "40P01", // serialization failure, deadlock
			pe.Code == "53300",                                         // too many connections
			pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03": // shutdown, crash, cannot connect now
			return true
		}
		return false
	}
	var ce *pgconn.ConnectError
	return errors.As(err, &ce)
}

// Unreachable reports whether err is the tenant database not answering at
// all: a connection that could not be made or was lost, or a server
// shutting down, crashed or starting up (SQLSTATE class 08, 57P01-57P03).
// Unlike Transient it leaves out what a database that answers says (a
// serialization failure, a deadlock, too many connections, a changed plan)
// and a turn's own deadline, which a slow model call reaches too.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "08") || pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03"
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false // (a context error is a net.Error too)
	}
	var netErr net.Error
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.As(err, &netErr)
}

// WorkItem is a work item's state.
type WorkItem struct {
	ID               string
	Turn             int // last decided turn
	Status           wire.WorkItemStatus
	StatusReason     string
	NeedsHuman       bool
	Category         string
	Priority         string
	Confidence       float64
	AssessmentSource string
	CatalogueVersion catalogue.Version
	ApprovalMode     registry.ApprovalMode
	Email            *wire.Email
	LastAction       catalogue.Name
	LastActionParams json.RawMessage
	ActionState      engine.ActionState
	Outcome          string
	HumanAction      *wire.HumanAction
	ClosedAt         *time.Time
	CreatedAt        time.Time
	UpdatedAt        time.Time
}

const workItemColumns = `id, turn, status, COALESCE(status_reason, ''), needs_human, COALESCE(category, ''),
	COALESCE(priority, ''), COALESCE(confidence, 0), COALESCE(assessment_source, ''), catalogue_version,
	approval_mode, email, COALESCE(last_action, ''), last_action_params, COALESCE(action_state, ''),
	COALESCE(outcome, ''), human_action, closed_at, created_at, updated_at`

func scanWorkItem(row pgx.CollectableRow) (WorkItem, error) {
	var w WorkItem
	var email, human []byte
	err := row.Scan(&w.ID, &w.Turn, &w.Status, &w.StatusReason, &w.NeedsHuman, &w.Category, &w.Priority,
		&w.Confidence, &w.AssessmentSource, &w.CatalogueVersion, &w.ApprovalMode, &email, &w.LastAction,
		&w.LastActionParams, &w.ActionState, &w.Outcome, &human, &w.ClosedAt, &w.CreatedAt, &w.UpdatedAt)
	if err != nil {
		return w, err
	}
	if email != nil {
		w.Email = new(wire.Email)
		if err := json.Unmarshal(email, w.Email); err != nil {
			return w, fmt.Errorf("decode email of work item: %w", err)
		}
	}
	if human != nil {
		w.HumanAction = new(wire.HumanAction)
		if err := json.Unmarshal(human, w.HumanAction); err != nil {
			return w, fmt.Errorf("decode human action of work item: %w", err)
		}
	}
	return w, nil
}

// WorkItemGet returns a work item, or ErrNotFound.
func WorkItemGet(ctx context.Context, q DBTX, id string) (WorkItem, error) {
	rows, _ := q.Query(ctx, `SELECT `+workItemColumns+` FROM work_items WHERE id = $1`, id)
	w, err := pgx.CollectExactlyOneRow(rows, scanWorkItem)
	return w, translate(err, "get work item")
}

// Decision is a stored decision: the exact reply bytes and what they answered.
type Decision struct {
	WorkItemID  string
	Turn        int
	Fingerprint string
	TurnSeq     uint64
	// TurnStoredAt is when the answered turn message was stored in its
	// stream (zero for decisions from before it was recorded).
	TurnStoredAt time.Time
	Status       wire.WorkItemStatus
	Action       catalogue.Name
	Reply        []byte
	CreatedAt    time.Time
}

// DecisionGetByTurn returns the decision of a turn, or ErrNotFound.
func DecisionGetByTurn(ctx context.Context, q DBTX, workItemID string, turn int) (Decision, error) {
	var d Decision
	var action *string
	var storedAt *time.Time
	err := q.QueryRow(ctx, `SELECT work_item_id, turn, fingerprint, turn_seq, turn_stored_at, status, action, reply, created_at
		FROM decisions WHERE work_item_id = $1 AND turn = $2`, workItemID, turn).
		Scan(&d.WorkItemID, &d.Turn, &d.Fingerprint, &d.TurnSeq, &storedAt, &d.Status, &action, &d.Reply, &d.CreatedAt)
	if action != nil {
		d.Action = catalogue.Name(*action)
	}
	if storedAt != nil {
		d.TurnStoredAt = *storedAt
	}
	return d, translate(err, "get decision")
}

// TurnWrite is everything one turn writes, in one transaction.
type TurnWrite struct {
	Item WorkItem // the item's new state; Item.Turn is the decided turn
	// New: the item was not read and is taken not to exist (turn 1's first
	// attempt). It is inserted, without the upsert's speculative insertion;
	// an item that exists after all makes the commit ErrConflict.
	New      bool
	Decision Decision
	// Extra statements in the same transaction (approval records, outbox rows).
	Extra []Statement
	// afterCommit run once the transaction committed (wake the forwarder,
	// set a timer), in order.
	afterCommit []func(context.Context)
}

// OnCommit adds fn to what runs once the turn's transaction committed.
func (w *TurnWrite) OnCommit(fn func(context.Context)) { w.afterCommit = append(w.afterCommit, fn) }

// Statement is one SQL statement with its arguments. Unless Optional, it
// must affect at least one row, or the whole turn is rolled back.
type Statement struct {
	SQL      string
	Args     []any
	Optional bool
}

// TurnCommit writes a turn in one transaction: it advances the work item
// from turn Item.Turn-1 (creating it on turn 1), inserts the decision and
// runs the extra statements. A concurrent writer that advanced the item or
// decided the turn first makes it return ErrConflict, with nothing written.
func TurnCommit(ctx context.Context, db interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, w TurnWrite) error {
	err := turnCommit(ctx, db, w)
	if err == nil {
		for _, fn := range w.afterCommit {
			fn(ctx)
		}
	}
	return err
}

// turnCommit sends every statement of the turn as one pipelined batch: one
// round trip and one implicit transaction (all or nothing). The guard
// against a concurrent writer is the decisions primary key: work_items.turn
// only ever advances in a transaction that inserts the decision of the new
// turn, so if the item is no longer at turn-1, decision (item, turn) exists
// and this insert fails, which rolls the whole batch back.
func turnCommit(ctx context.Context, db interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, w TurnWrite) error {
	it := w.Item
	var email, human []byte
	var err error
	if it.Email != nil {
		if email, err = json.Marshal(it.Email); err != nil {
			return err
		}
	}
	if it.HumanAction != nil {
		if human, err = json.Marshal(it.HumanAction); err != nil {
			return err
		}
	}
	b := &pgx.Batch{}
	// A new item is inserted: its primary key refuses a concurrent creator
	// (ErrConflict). Otherwise insert on the first turn, or advance only from
	// the previous turn (optimistic check): 0 rows means somebody else moved
	// the item.
	insert := workItemUpsert
	if w.New {
		insert = workItemInsert
	}
	b.Queue(insert,
		it.ID, it.Turn, it.Status, it.StatusReason, it.NeedsHuman, it.Category, it.Priority,
		it.Confidence, it.AssessmentSource, it.CatalogueVersion, it.ApprovalMode, email, string(it.LastAction),
		nullJSON(it.LastActionParams), string(it.ActionState), it.Outcome, human, it.ClosedAt)
	d := w.Decision
	var action *string
	if d.Action != "" {
		a := string(d.Action)
		action = &a
	}
	var storedAt *time.Time
	if !d.TurnStoredAt.IsZero() {
		storedAt = &d.TurnStoredAt
	}
	b.Queue(`INSERT INTO decisions (work_item_id, turn, fingerprint, turn_seq, turn_stored_at, status, action, reply)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, d.WorkItemID, d.Turn, d.Fingerprint, d.TurnSeq, storedAt, d.Status, action, d.Reply)
	for _, s := range w.Extra {
		b.Queue(s.SQL, s.Args...)
	}
	br := db.SendBatch(ctx, b)
	defer br.Close()
	advanced, err := br.Exec()
	if err != nil {
		return translate(err, "advance work item")
	}
	if _, err := br.Exec(); err != nil {
		return translate(err, "insert decision")
	}
	for i, st := range w.Extra {
		tag, err := br.Exec()
		if err != nil {
			return translate(err, fmt.Sprintf("turn statement %d", i+1))
		}
		if tag.RowsAffected() == 0 && !st.Optional {
			return fmt.Errorf("turn statement %d affected no row (committed; a bug in the statement)", i+1)
		}
	}
	if err := br.Close(); err != nil {
		return translate(err, "commit turn")
	}
	if advanced.RowsAffected() != 1 {
		// Impossible by the invariant above; loud if it ever is not.
		return fmt.Errorf("work item did not advance to turn %d but its decision was inserted: invariant broken", it.Turn)
	}
	return nil
}

// The statements that write a turn's work item: insert a new one, or
// insert or advance one (turnCommit).
const (
	workItemInsert = `INSERT INTO work_items AS w (id, turn, status, status_reason, needs_human, category, priority,
			confidence, assessment_source, catalogue_version, approval_mode, email, last_action,
			last_action_params, action_state, outcome, human_action, closed_at)
		VALUES ($1, $2, $3, NULLIF($4, ''), $5, NULLIF($6, ''), NULLIF($7, ''), $8, NULLIF($9, ''), $10, $11, $12,
			NULLIF($13, ''), $14, NULLIF($15, ''), NULLIF($16, ''), $17, $18)`
	workItemUpsert = workItemInsert + `
		ON CONFLICT (id) DO UPDATE SET turn = EXCLUDED.turn, status = EXCLUDED.status,
			status_reason = EXCLUDED.status_reason, needs_human = EXCLUDED.needs_human,
			category = EXCLUDED.category, priority = EXCLUDED.priority, confidence = EXCLUDED.confidence,
			assessment_source = EXCLUDED.assessment_source, email = COALESCE(EXCLUDED.email, w.email),
			last_action = EXCLUDED.last_action, last_action_params = EXCLUDED.last_action_params,
			action_state = EXCLUDED.action_state, outcome = EXCLUDED.outcome,
			human_action = COALESCE(EXCLUDED.human_action, w.human_action),
			closed_at = EXCLUDED.closed_at, updated_at = now()
		WHERE w.turn = EXCLUDED.turn - 1`
)

func nullJSON(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	return []byte(b)
}

// CheckpointGet returns a finished step's output, or ErrNotFound.
func CheckpointGet(ctx context.Context, q DBTX, workItemID string, turn int, step string) ([]byte, error) {
	var out []byte
	err := q.QueryRow(ctx, `SELECT output FROM step_checkpoints WHERE work_item_id = $1 AND turn = $2 AND step = $3`,
		workItemID, turn, step).Scan(&out)
	return out, translate(err, "get checkpoint "+step)
}

// CheckpointPut saves a finished step's output. Saving a step twice keeps
// the first output: a re-driven turn must not change what a step concluded.
func CheckpointPut(ctx context.Context, q DBTX, workItemID string, turn int, step string, output []byte) error {
	_, err := q.Exec(ctx, `INSERT INTO step_checkpoints (work_item_id, turn, step, output) VALUES ($1, $2, $3, $4)
		ON CONFLICT (work_item_id, turn, step) DO NOTHING`, workItemID, turn, step, output)
	return translate(err, "save checkpoint "+step)
}

// ModelCall is one row of the model-call ledger.
type ModelCall struct {
	CallID        string // a UUID; empty for none
	TenantID      string
	WorkItemID    string
	Turn          int
	Step          string
	Attempt       int
	Model         string
	PromptVersion string
	PromptTokens  int64
	OutputTokens  int64
	Latency       time.Duration
	Outcome       string
}

// ModelCallInsert records a model call. It runs outside the turn's final
// transaction on purpose: a call is paid for even if the turn later fails.
// A call with a CallID is recorded once however often it is inserted.
func ModelCallInsert(ctx context.Context, q DBTX, c ModelCall) error {
	var callID *string
	if c.CallID != "" {
		callID = &c.CallID
	}
	latency := min(max(c.Latency.Milliseconds(), 0), math.MaxInt32)
	_, err := q.Exec(ctx, `INSERT INTO model_calls (tenant_id, work_item_id, turn, step, attempt, model, prompt_version,
		prompt_tokens, output_tokens, latency_ms, outcome, call_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
		ON CONFLICT (call_id) DO NOTHING`,
		c.TenantID, c.WorkItemID, c.Turn, c.Step, c.Attempt, c.Model, c.PromptVersion, c.PromptTokens, c.OutputTokens,
		latency, c.Outcome, callID)
	return translate(err, "insert model call")
}

// ModelTokensSince sums prompt and output tokens of calls since t.
func ModelTokensSince(ctx context.Context, q DBTX, t time.Time) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, `SELECT COALESCE(sum(prompt_tokens + output_tokens), 0)::bigint FROM model_calls WHERE created_at >= $1`, t).Scan(&n)
	return n, translate(err, "sum model tokens")
}
