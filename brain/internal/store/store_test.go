package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"n8nbrain/brain/internal/engine"
	"n8nbrain/internal/testdb"
	"n8nbrain/migrations"
	"n8nbrain/wire"
)

// tenantDB is a scratch database with the tenant schema through migration
// version through (0: all), dropped at the end.
func tenantDB(tb testing.TB, through int) *pgxpool.Pool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, testdb.AdminURL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	defer admin.Close(context.Background())
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := pgx.Identifier{"store_" + hex.EncodeToString(b)}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatal(err)
	}
	cfg := admin.Config().Copy()
	cfg.Database = strings.Trim(name, `"`)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := migrations.ApplyThrough(ctx, conn, migrations.Tenant, through); err != nil {
		tb.Fatal(err)
	}
	pcfg, err := pgxpool.ParseConfig(cfg.ConnString())
	if err != nil {
		tb.Fatal(err)
	}
	pcfg.ConnConfig.Database = cfg.Database
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		pool.Close()
		c, err := pgx.Connect(context.Background(), testdb.AdminURL(tb))
		if err != nil {
			tb.Error(err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			tb.Error(err)
		}
	})
	return pool
}

// approvalTurn is what a turn 1 that proposes a draft reply writes, as the
// brain writes it: the new work item, its decision, the pending approval
// and the approval_requested event, sent at once.
func approvalTurn(id string, isNew bool) TurnWrite {
	const proposed = `{"body":"Hi Jo,\n\nThanks for your message. We would be glad to quote for a 20 m² hardwood deck. ` +
		`Could you tell us the site's access and when you would like the work done?\n\nBest regards","subject":"Re: Quote for a new deck please","tone":"friendly"}`
	email := &wire.Email{MessageID: id, From: "Jo Bloggs <jo@customer.example>", To: []string{"sales@tenant.example"},
		Subject: "Quote for a new deck please", Body: strings.Repeat("Hi, could you quote for a 20m2 hardwood deck? ", 6)}
	w := TurnWrite{
		New: isNew,
		Item: WorkItem{ID: id, Turn: 1, Status: wire.WorkItemStatusAwaitingApproval, Category: "quote_request",
			Priority: "normal", Confidence: 0.95, AssessmentSource: "rule", CatalogueVersion: 1, ApprovalMode: "review_app",
			Email: email, LastAction: "draft_reply", LastActionParams: []byte(proposed), ActionState: engine.ActionStatePending},
		Decision: Decision{WorkItemID: id, Turn: 1, Fingerprint: strings.Repeat("f", 64), TurnSeq: 1,
			TurnStoredAt: time.Now(), Status: wire.WorkItemStatusAwaitingApproval, Action: "draft_reply",
			Reply: []byte(`{"work_item_id":"` + id + `","turn":1,"status":"awaiting_approval","next":{"action":"draft_reply","params":` +
				proposed + `},"assessment":{"category":"quote_request","priority":"normal","confidence":0.95,"source":"rule","rule":"quotes"}}`)},
	}
	a := wire.Approval{ID: uuid.NewString(), WorkItemID: id, Turn: 1, Action: "draft_reply", CatalogueVersion: 1,
		ApprovalMode: "review_app", Proof: "exact_text", Proposed: []byte(proposed), ProposedSHA256: strings.Repeat("a", 64),
		Assessment: &wire.Assessment{Category: "quote_request", Priority: "normal", Confidence: 0.95, Source: "rule", Rule: "quotes"},
		Sender:     email.From, Subject: email.Subject}
	ev := wire.Event{EventID: uuid.NewString(), Kind: wire.EventApprovalRequested, WorkItemID: id, NextTurn: 2,
		ApprovalID: a.ID, Action: a.Action, OccurredAt: time.Now()}
	w.Extra = []Statement{ApprovalInsert(a, 72*time.Hour), OutboxInsertSent(ev, EventPayload(ev), 2*time.Second)}
	return w
}

func count(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTurnCommitNewItemThatExistsConflicts: a turn 1 committed as new (its
// item not read) when another replica created the item first is a
// conflict, and writes nothing; so is the same turn through the upsert.
func TestTurnCommitNewItemThatExistsConflicts(t *testing.T) {
	ctx := context.Background()
	pool := tenantDB(t, 0)
	if err := TurnCommit(ctx, pool, approvalTurn("<a@x>", true)); err != nil {
		t.Fatal(err)
	}
	for _, isNew := range []bool{true, false} {
		ran := false
		w := approvalTurn("<a@x>", isNew)
		w.OnCommit(func(context.Context) { ran = true })
		if err := TurnCommit(ctx, pool, w); !errors.Is(err, ErrConflict) {
			t.Fatalf("new=%v: the turn again: %v, want ErrConflict", isNew, err)
		}
		if ran {
			t.Errorf("new=%v: a conflicting commit ran its after-commit functions", isNew)
		}
	}
	for _, table := range []string{"work_items", "decisions", "approvals", "outbox"} {
		if n := count(t, pool, table); n != 1 {
			t.Errorf("%d rows in %s, want the first commit's one", n, table)
		}
	}
	// The item advances to turn 2 through the upsert.
	w := approvalTurn("<a@x>", false)
	w.Item.Turn, w.Decision.Turn, w.Extra = 2, 2, nil
	w.Item.Status, w.Decision.Status = wire.WorkItemStatusOpen, wire.WorkItemStatusOpen
	if err := TurnCommit(ctx, pool, w); err != nil {
		t.Fatal(err)
	}
	it, err := WorkItemGet(ctx, pool, "<a@x>")
	if err != nil || it.Turn != 2 || it.Status != wire.WorkItemStatusOpen {
		t.Fatalf("after turn 2: %+v, %v", it, err)
	}
}

// BenchmarkTurnCommit measures the commit of an approval-awaiting turn 1
// (approvalTurn) against the floor, a single-row insert, on scratch tenant
// databases of the schema before migration 0008 and of the current one,
// interleaved round by round so the ratios come from one run:
//
//	go test -run '^$' -bench '^BenchmarkTurnCommit$' -benchtime 2000x -v ./brain/internal/store/
func BenchmarkTurnCommit(b *testing.B) {
	ctx := context.Background()
	before, after := tenantDB(b, 7), tenantDB(b, 0)
	for _, p := range []*pgxpool.Pool{before, after} {
		if _, err := p.Exec(ctx, `CREATE TABLE floor (id uuid PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())`); err != nil {
			b.Fatal(err)
		}
	}
	var seq int // a new work item each time
	next := func(prefix string) string { seq++; return fmt.Sprintf("<%s-%d@bench>", prefix, seq) }
	shapes := []commitShape{
		{"floor", func() error {
			_, err := after.Exec(ctx, `INSERT INTO floor (id) VALUES ($1)`, uuid.New())
			return err
		}},
		{"schema7_upsert", func() error { return TurnCommit(ctx, before, approvalTurn(next("a"), false)) }},
		{"current_upsert", func() error { return TurnCommit(ctx, after, approvalTurn(next("b"), false)) }},
		{"current_insert", func() error { return TurnCommit(ctx, after, approvalTurn(next("c"), true)) }},
		// Diagnostic: the same without its outbox row, what the event costs.
		{"current_insert_no_event", func() error {
			w := approvalTurn(next("d"), true)
			w.Extra = w.Extra[:1]
			return TurnCommit(ctx, after, w)
		}},
		// Diagnostics: the floor and the turn without waiting for their WAL
		// flush, to split each commit into the fsync (the same in both) and
		// the statements' own work. Never how the brain commits.
		{"floor_no_flush_wait", func() error {
			bt := &pgx.Batch{}
			bt.Queue(noFlushWait)
			bt.Queue(`INSERT INTO floor (id) VALUES ($1)`, uuid.New())
			return after.SendBatch(ctx, bt).Close()
		}},
		{"current_insert_no_flush_wait", func() error {
			w := approvalTurn(next("e"), true)
			w.Extra = append([]Statement{{SQL: noFlushWait, Optional: true}}, w.Extra...)
			return TurnCommit(ctx, after, w)
		}},
	}
	median := interleaved(b, 5, shapes)
	floor := median("floor")
	for _, s := range shapes[1:] {
		b.Logf("%s: median of the rounds' p50 %.0f µs = %.2f× the floor (%.0f µs); %.2f× schema7_upsert",
			s.name, median(s.name), median(s.name)/floor, floor, median(s.name)/median("schema7_upsert"))
	}
	b.Logf("waiting for the WAL flush: %.0f µs of the floor, %.0f µs of the turn's commit; the rest: floor %.0f µs, turn %.0f µs",
		floor-median("floor_no_flush_wait"), median("current_insert")-median("current_insert_no_flush_wait"),
		median("floor_no_flush_wait"), median("current_insert_no_flush_wait"))
}

// BenchmarkTurnCommitConstraints: what the schema's guarantees cost the
// turn's commit (BENCHMARKS.md). The same commit on scratch tenant
// databases of the current schema, of the schema before migration 0009
// (its one-column CHECKs on text as table constraints: Postgres reads and
// plans a table's CHECK expressions again for every statement, where it
// keeps a domain's per connection), of the current one without its
// remaining CHECK constraints, and without its two foreign keys; each
// waiting for its WAL flush (as the brain commits) and not (the statements'
// own work), in interleaved rounds.
//
//	go test -run '^$' -bench TurnCommitConstraints -benchtime 2000x -v ./brain/internal/store/
func BenchmarkTurnCommitConstraints(b *testing.B) {
	ctx := context.Background()
	variants := []struct {
		name    string
		through int // migrations applied (0: all)
		ddl     string
	}{
		{"schema", 0, ``},
		{"schema8_checks", 8, ``},
		{"no_check", 0, `DO $$ DECLARE r record; BEGIN
			FOR r IN SELECT conrelid::regclass AS t, conname FROM pg_constraint WHERE contype = 'c' AND conrelid <> 0 LOOP
				EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', r.t, r.conname);
			END LOOP; END $$`},
		{"no_fk", 0, `ALTER TABLE decisions DROP CONSTRAINT decisions_work_item_id_fkey;
			ALTER TABLE approvals DROP CONSTRAINT approvals_work_item_id_fkey`},
	}
	var seq int // a new work item each time
	next := func() string { seq++; return fmt.Sprintf("<c-%d@bench>", seq) }
	var shapes []commitShape
	for _, v := range variants {
		db := tenantDB(b, v.through)
		if v.ddl != "" {
			if _, err := db.Exec(ctx, v.ddl); err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
		}
		if v.name == "schema" {
			if _, err := db.Exec(ctx, `CREATE TABLE floor (id uuid PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())`); err != nil {
				b.Fatal(err)
			}
			shapes = append(shapes, commitShape{"floor", func() error {
				_, err := db.Exec(ctx, `INSERT INTO floor (id) VALUES ($1)`, uuid.New())
				return err
			}})
		}
		shapes = append(shapes,
			commitShape{v.name, func() error { return TurnCommit(ctx, db, approvalTurn(next(), true)) }},
			commitShape{v.name + "_no_flush_wait", func() error {
				w := approvalTurn(next(), true)
				w.Extra = append([]Statement{{SQL: noFlushWait, Optional: true}}, w.Extra...)
				return TurnCommit(ctx, db, w)
			}})
	}
	median := interleaved(b, 5, shapes)
	for _, v := range variants {
		b.Logf("%s: %.0f µs (%.2f× the schema's, %.2f× the floor's %.0f µs); without the flush wait %.0f µs (%.2f× the schema's)",
			v.name, median(v.name), median(v.name)/median("schema"), median(v.name)/median("floor"), median("floor"),
			median(v.name+"_no_flush_wait"), median(v.name+"_no_flush_wait")/median("schema_no_flush_wait"))
	}
}

// BenchmarkTurnWAL measures what the turn's commit (approvalTurn) and the
// floor's single-row commit write to the WAL, per commit and by record kind,
// from the WAL between the first and the last of b.N commits of each
// (pg_walinspect, created by the admin role: a diagnostic, never how the
// brain runs). The WAL a commit waits to flush is the one lever the flush
// wait has, beside the number of commits:
//
//	go test -run '^$' -bench '^BenchmarkTurnWAL$' -benchtime 1000x -v ./brain/internal/store/
func BenchmarkTurnWAL(b *testing.B) {
	ctx := context.Background()
	pool := tenantDB(b, 0)
	if _, err := pool.Exec(ctx, `CREATE TABLE floor (id uuid PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())`); err != nil {
		b.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, testdb.AdminURL(b))
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`); err != nil {
		b.Fatal(err)
	}
	lsn := func() string {
		var s string
		if err := admin.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
			b.Fatal(err)
		}
		return s
	}
	var seq int
	shapes := []commitShape{
		{"floor", func() error {
			_, err := pool.Exec(ctx, `INSERT INTO floor (id) VALUES ($1)`, uuid.New())
			return err
		}},
		{"turn", func() error {
			seq++
			return TurnCommit(ctx, pool, approvalTurn(fmt.Sprintf("<wal-%d@bench>", seq), true))
		}},
	}
	total := map[string]float64{}
	for _, sh := range shapes {
		b.Run(sh.name, func(b *testing.B) {
			for range 50 { // warm-up: connections, prepared statements, the tables' first pages
				if err := sh.op(); err != nil {
					b.Fatal(err)
				}
			}
			from := lsn()
			for range b.N {
				if err := sh.op(); err != nil {
					b.Fatal(err)
				}
			}
			rows, err := admin.Query(ctx, `SELECT "resource_manager/record_type", count, record_size, fpi_size
				FROM pg_get_wal_stats($1::pg_lsn, $2::pg_lsn, true) WHERE count > 0`, from, lsn())
			if err != nil {
				b.Fatal(err)
			}
			defer rows.Close()
			n, bytes := float64(b.N), 0.0
			for rows.Next() {
				var kind string
				var count, size, fpi int64
				if err := rows.Scan(&kind, &count, &size, &fpi); err != nil {
					b.Fatal(err)
				}
				bytes += float64(size + fpi)
				b.Logf("%s: %s %.2f records, %.0f bytes (%.0f of full pages) a commit", sh.name, kind, float64(count)/n, float64(size+fpi)/n, float64(fpi)/n)
			}
			if err := rows.Err(); err != nil {
				b.Fatal(err)
			}
			total[sh.name] = bytes / n
			b.ReportMetric(bytes/n, "wal_bytes/op")
		})
	}
	b.Logf("WAL a commit: turn %.0f bytes, floor %.0f bytes, %.1f×", total["turn"], total["floor"], total["turn"]/total["floor"])
}

// commitShape is one operation a commit benchmark times.
type commitShape struct {
	name string
	op   func() error
}

// interleaved runs every shape in turn, rounds times (so that all see the
// same machine), each after a warm-up, and returns the median over the
// rounds of each shape's p50 in µs.
func interleaved(b *testing.B, rounds int, shapes []commitShape) (median func(name string) float64) {
	p50 := make(map[string][]float64)
	for r := range rounds {
		for _, s := range shapes {
			var last float64 // of the run with the full b.N
			b.Run(fmt.Sprintf("round%d/%s", r+1, s.name), func(b *testing.B) {
				for range 50 { // warm-up: connections, prepared statements
					if err := s.op(); err != nil {
						b.Fatal(err)
					}
				}
				lat := make([]float64, 0, b.N)
				b.ResetTimer()
				for range b.N {
					t0 := time.Now()
					if err := s.op(); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, float64(time.Since(t0).Microseconds()))
				}
				slices.Sort(lat)
				last = lat[len(lat)/2]
				b.ReportMetric(last, "p50_us")
			})
			p50[s.name] = append(p50[s.name], last)
		}
	}
	return func(name string) float64 {
		v := slices.Clone(p50[name])
		slices.Sort(v)
		return v[len(v)/2]
	}
}

// noFlushWait makes a transaction commit without waiting for its WAL flush
// (BenchmarkTurnCommit's diagnostics only).
const noFlushWait = `SET LOCAL synchronous_commit = off`

// TestOutboxMarkDelivered: an event is marked once, a second mark writes
// nothing, a batch marks what it knows and returns the rest in order, and
// the mark's asynchronous commit stays within its own transaction.
func TestOutboxMarkDelivered(t *testing.T) {
	ctx := context.Background()
	pool := tenantDB(t, 0)
	var ids []string
	for i := range 3 {
		w := approvalTurn(fmt.Sprintf("<m%d@x>", i), true)
		if err := TurnCommit(ctx, pool, w); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, w.Extra[1].Args[0].(string))
	}
	id := ids[0]
	xmin := func(id string) (x string, at *time.Time) {
		if err := pool.QueryRow(ctx, `SELECT xmin::text, delivered_at FROM outbox WHERE id = $1`, id).Scan(&x, &at); err != nil {
			t.Fatal(err)
		}
		return x, at
	}
	if unknown, err := OutboxMarkDelivered(ctx, pool, []string{id}); err != nil || len(unknown) != 0 {
		t.Fatalf("mark: unknown %q, %v", unknown, err)
	}
	x1, at1 := xmin(id)
	if at1 == nil {
		t.Fatal("the mark did not set delivered_at")
	}
	if unknown, err := OutboxMarkDelivered(ctx, pool, []string{id}); err != nil || len(unknown) != 0 {
		t.Fatalf("mark again: unknown %q, %v", unknown, err)
	}
	if x2, at2 := xmin(id); x2 != x1 || !at2.Equal(*at1) {
		t.Errorf("the second mark rewrote the row: xmin %s → %s, delivered_at %v → %v", x1, x2, at1, at2)
	}
	// A batch: an id already marked, an unknown one, one that is not a
	// uuid, one twice, one in upper case (Postgres's uuid input accepts it).
	stranger, upper := uuid.NewString(), strings.ToUpper(ids[2])
	unknown, err := OutboxMarkDelivered(ctx, pool, []string{id, stranger, ids[1], "not-a-uuid", ids[1], upper})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{stranger, "not-a-uuid"}; !slices.Equal(unknown, want) {
		t.Errorf("batch: unknown %q, want %q", unknown, want)
	}
	for _, id := range ids {
		if _, at := xmin(id); at == nil {
			t.Errorf("event %s not marked by the batch", id)
		}
	}
	if x3, _ := xmin(id); x3 != x1 {
		t.Errorf("the batch rewrote an event marked before: xmin %s → %s", x1, x3)
	}
	if unknown, err := OutboxMarkDelivered(ctx, pool, []string{"nope"}); err != nil || !slices.Equal(unknown, []string{"nope"}) {
		t.Errorf("only a malformed id: unknown %q, %v", unknown, err)
	}
	// The setting holds for the rest of the batch, one implicit
	// transaction, which commits with it; then no longer.
	b := &pgx.Batch{}
	b.Queue(`SELECT set_config('synchronous_commit', 'off', true)`)
	b.Queue(`SHOW synchronous_commit`)
	br := pool.SendBatch(ctx, b)
	var v string
	if _, err := br.Exec(); err != nil {
		t.Fatal(err)
	}
	if err := br.QueryRow().Scan(&v); err != nil || v != "off" {
		t.Fatalf("synchronous_commit within the batch: %q %v, want off", v, err)
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	// Every connection of the pool still commits synchronously.
	for range 8 {
		var v string
		if err := pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&v); err != nil || v != "on" {
			t.Fatalf("synchronous_commit after a mark: %q %v", v, err)
		}
	}
}

// TestCheckDomainsMigrationUnderCachedStatements: migration 0009 changes
// the type of columns a running brain reads (an upgrade stops nothing).
// A connection that cached a statement reading them before gets one error
// for it (Postgres: the cached plan's result type changed; a turn is
// retried, an API call answered 503), and pgx prepares it again: the next
// use works, and the writes never fail.
func TestCheckDomainsMigrationUnderCachedStatements(t *testing.T) {
	ctx := context.Background()
	pool := tenantDB(t, 8)
	if err := TurnCommit(ctx, pool, approvalTurn("<before@x>", true)); err != nil {
		t.Fatal(err)
	}
	if _, err := WorkItemGet(ctx, pool, "<before@x>"); err != nil {
		t.Fatal(err)
	}
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = migrations.ApplyThrough(ctx, c.Conn(), migrations.Tenant, 0)
	c.Release()
	if err != nil {
		t.Fatal(err)
	}
	if err := TurnCommit(ctx, pool, approvalTurn("<after@x>", true)); err != nil {
		t.Fatalf("a turn's commit right after the migration: %v", err)
	}
	failed := 0
	for range 4 {
		it, err := WorkItemGet(ctx, pool, "<before@x>")
		if err != nil {
			if !PlanChanged(err) || !Transient(err) {
				t.Fatalf("read after the migration: %v; want a changed plan, transient", err)
			}
			failed++
			continue
		}
		if it.Status != wire.WorkItemStatusAwaitingApproval {
			t.Fatalf("read after the migration: %+v", it)
		}
	}
	if failed > 1 {
		t.Fatalf("the cached read failed %d times after the migration; want at most once per connection", failed)
	}
}

// TestTransient: what the brain answers 503 (retry) for, not 500.
func TestTransient(t *testing.T) {
	ctx := context.Background()
	pool := tenantDB(t, 0)
	_, syntax := pool.Exec(ctx, `SELEC 1`)
	_, missing := WorkItemGet(ctx, pool, "<none@x>")
	_, down := pgx.Connect(ctx, "postgres://nobody@127.0.0.1:1/x?connect_timeout=2")
	dctx, cancel := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel()
	time.Sleep(time.Millisecond)
	_, late := pool.Exec(dctx, `SELECT 1`)
	_, deadlock := pool.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '40P01'; END $$`)
	_, shutdown := pool.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '57P01'; END $$`)
	wrong := pool.Config().ConnConfig.Copy()
	wrong.Password = "wrong"
	_, refused := pgx.ConnectConfig(ctx, wrong)
	_, starting := pool.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '57P03'; END $$`)
	_, full := pool.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '53300'; END $$`)
	// Unreachable: the database does not answer at all, so the brain holds
	// the tenant's turns until it does; what an answering database says,
	// and a deadline a slow model call meets too, are not.
	for _, c := range []struct {
		name                   string
		err                    error
		transient, unreachable bool
	}{
		{"a syntax error", syntax, false, false},
		{"no such item", missing, false, false},
		{"no server listening", down, true, true},
		{"the call's deadline", late, true, false},
		{"the turn's deadline", fmt.Errorf("model: %w", context.DeadlineExceeded), true, false},
		{"a deadlock", deadlock, true, false},
		{"too many connections", full, true, false},
		{"an administrator shutdown", shutdown, true, true},
		{"a server starting up", starting, true, true},
		{"a wrong password", refused, false, false},
		// A server that crashed under a statement, as pgx reports it
		// (TestPostgresCrashLosesNothing meets both for real).
		{"the connection ended mid-answer", fmt.Errorf("list approvals: %w", io.ErrUnexpectedEOF), true, true},
		{"the connection was reset", fmt.Errorf("mark events delivered: %w", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}), true, true},
		{"no error", nil, false, false},
	} {
		if (c.err == nil) != (c.name == "no error") {
			t.Fatalf("%s: the call did not fail", c.name)
		}
		if got := Transient(c.err); got != c.transient {
			t.Errorf("%s (%v): Transient %v, want %v", c.name, c.err, got, c.transient)
		}
		if got := Unreachable(c.err); got != c.unreachable {
			t.Errorf("%s (%v): Unreachable %v, want %v", c.name, c.err, got, c.unreachable)
		}
	}
}

// The report's turnaround percentiles are nearest-rank: the p90 of three
// is the largest, not the median.
func TestNearestRank(t *testing.T) {
	for _, tc := range []struct {
		secs     []float64
		p50, p90 float64
	}{
		{[]float64{6.83, 6.86, 35.4}, 6.86, 35.4},
		{[]float64{7}, 7, 7},
		{[]float64{1, 2}, 1, 2},
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 5, 9},
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 6, 10},
	} {
		if p50, p90 := nearestRank(tc.secs, 50), nearestRank(tc.secs, 90); p50 != tc.p50 || p90 != tc.p90 {
			t.Errorf("%v: p50 %v p90 %v, want %v and %v", tc.secs, p50, p90, tc.p50, tc.p90)
		}
	}
}
