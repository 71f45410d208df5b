package tests

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The expiry sweep on a database that has table statistics, as every
// database has once autovacuum has run. With statistics the planner is free
// to evaluate a volatile subquery that does not reference the outer rows
// once for the whole statement; a sweep that drew its event ids that way
// gave every expired approval the same outbox id and failed on outbox_pkey
// for ever. The test forces the condition the suite's fresh databases never
// have: an ANALYZE (as the admin, as autovacuum would) with many approvals
// due, then two sweepers at once.
func TestExpirySweepOnAnalysedDatabase(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("sweep-stats"))
	ctx := context.Background()
	const n = 600 // more than one sweep batch (500)
	pool, err := pgxpool.New(ctx, s.tenantURL(a))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `
		INSERT INTO work_items (id, turn, status, needs_human, catalogue_version, approval_mode, last_action, action_state)
		SELECT 'due-' || i, 1, 'awaiting_approval', false, 1, 'review_app', 'draft_reply', 'pending' FROM generate_series(1, $1) i`, n); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO approvals (id, work_item_id, turn, action, catalogue_version, approval_mode, proof, status, proposed, proposed_sha256, expires_at)
		SELECT gen_random_uuid(), 'due-' || i, 1, 'draft_reply', 1, 'review_app', 'exact_text', 'pending',
			'{"body":"b","subject":"s"}', repeat('a', 64), now() - make_interval(secs => i)
		FROM generate_series(1, $1) i`, n); err != nil {
		t.Fatal(err)
	}
	db := s.tenantDB(a)
	if _, err := db.Exec(ctx, `ANALYZE`); err != nil {
		t.Fatalf("analyze the tenant database: %v", err)
	}
	if c := count(t, db, `SELECT count(*) FROM pg_stats WHERE tablename = 'approvals'`); c == 0 {
		t.Fatal("ANALYZE left no statistics on approvals: the test would not force the planner's choice")
	}

	s.startBrain("sweeper-1", fastEvents)
	s.startBrain("sweeper-2", fastEvents)
	eventually(t, 30*time.Second, "every due approval to expire on an analysed database", func() bool {
		return count(t, db, `SELECT count(*) FROM approvals WHERE status = 'pending'`) == 0
	})

	if c := count(t, db, `SELECT count(*) FROM approvals WHERE status = 'expired' AND decided_by = 'expiry'`); c != n {
		t.Fatalf("%d of %d approvals expired by the sweep", c, n)
	}
	if c := count(t, db, `SELECT count(*) FROM outbox WHERE kind = 'approval_expired'`); c != n {
		t.Fatalf("%d approval_expired events for %d expiries", c, n)
	}
	if c := count(t, db, `SELECT count(DISTINCT payload->>'approval_id') FROM outbox WHERE kind = 'approval_expired'`); c != n {
		t.Fatalf("events name %d distinct approvals, want %d (one each)", c, n)
	}
	if c := count(t, db, `SELECT count(*) FROM outbox WHERE kind = 'approval_expired' AND payload->>'event_id' <> id::text`); c != 0 {
		t.Fatalf("%d events whose payload's event_id is not their outbox id", c)
	}
	if c := count(t, db, `SELECT count(*) FROM outbox o JOIN approvals ap ON ap.id::text = o.payload->>'approval_id'
			WHERE o.work_item_id <> ap.work_item_id OR (o.payload->>'next_turn')::int <> 2`); c != 0 {
		t.Fatalf("%d events naming the wrong work item or next turn", c)
	}
	if c := count(t, db, `SELECT count(*) FROM work_items
			WHERE NOT (status = 'escalated' AND needs_human AND status_reason = 'approval_expired')`); c != 0 {
		t.Fatalf("%d expired items not re-queued for a human", c)
	}
	if strings.Contains(s.logs.String(), "sweep expired approvals") {
		t.Fatalf("a sweep failed on the analysed database:\n%s", s.logs)
	}
}
