package tests

// The turn benchmarks of BENCHMARKS.md (DESIGN §7a). They run only with
// -bench (`make bench` runs them with the LangGraph baseline and prints the
// ratios); `go test` without -bench runs none of this.
//
// Each benchmark builds a whole stack with the harness (embedded NATS in
// operator mode, the tenant's own Postgres database and role, real brain
// replica, real edge) once, and measures every iteration's latency: the
// metrics are p50/p90/p99 in µs (plus turns/s for concurrent callers).
// BenchmarkTurnBudget measures the floor and the turn on one stack in one
// run, and reports their ratio; the other benchmarks measure one thing each
// on a stack of their own (for -cpuprofile and friends).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/brain"
	"n8nbrain/deploy/devstack"
	"n8nbrain/edge"
	"n8nbrain/nats/account"
	"n8nbrain/registry"
	"n8nbrain/subjects"
)

const (
	// benchConcurrency is how many callers the parallel benchmarks run; the
	// LangGraph baseline (tests/bench/langgraph) uses the same number.
	benchConcurrency = 16
	// benchWarmup operations run before the timed loop (connections, pools
	// and prepared statements are set up there, not in the numbers).
	benchWarmup = 50
	// benchReplayItems is how many decided turns the replay benchmark cycles through.
	benchReplayItems = 200
)

// ---------------------------------------------------------------- the stack

type benchStack struct {
	s      *system
	tn     *devstack.Tenant
	nc     *nats.Conn // the tenant's edge credentials
	js     jetstream.JetStream
	client *http.Client
	edge   *edgeClient
	seq    atomic.Int64
	run    string // distinguishes this stack's work items
	// delivered counts the events the edge delivered to the webhook.
	delivered atomic.Int64
	// edgeMetrics is the edge's /metrics base URL (startWithEvents).
	edgeMetrics string
}

// newBenchStack starts NATS, the registry and one tenant (the harness's
// spec: a confident "quotes" rule), with no brain and no edge yet.
func newBenchStack(b *testing.B) *benchStack {
	b.Helper()
	// BENCH_SYNC_ALWAYS=1: JetStream fsyncs before every PubAck (the
	// production setting), for the floor and the turn alike.
	s := newSystemWith(b, func(c *devstack.Config) { c.SyncAlways = os.Getenv("BENCH_SYNC_ALWAYS") == "1" })
	sp := spec("bench")
	// A benchmark submits far more turns than a tenant's default quota.
	sp.Quota = registry.Quota{Turns: 10_000_000, Bytes: 64 << 30}
	tn := s.tenant(sp)
	nc := s.tenantConn(tn)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	// n8n keeps its connections alive; so does this client, for every caller.
	tr := &http.Transport{MaxIdleConns: 4 * benchConcurrency, MaxIdleConnsPerHost: 4 * benchConcurrency, DisableCompression: true}
	b.Cleanup(tr.CloseIdleConnections)
	return &benchStack{s: s, tn: tn, nc: nc, js: js, client: &http.Client{Transport: tr}, run: randomHex(4)}
}

// start runs one brain replica (rules only: no model is configured) and the
// tenant's edge. Each turn's approval_requested event is published once, to
// no one: the edge has no webhook, and its re-publication is due only after
// the run, so that it does not load the machine the turns are measured on.
// BenchmarkTurnEvents measures the turn with its event delivered.
func (bs *benchStack) start(b *testing.B) {
	bs.s.startBrain("bench-1", func(c *brain.Config) {
		c.RegistryRefresh = 0 // the default (30s), not the harness's 1s
		c.EventRetryBase, c.EventRetryMax = time.Hour, time.Hour
		benchTenantLimits(c)
	})
	bs.edge = bs.s.startEdge(bs.tn, nil)
}

// benchTenantLimits sets a tenant's limits from BENCH_TENANT_WORKERS and
// BENCH_DB_CONNS_PER_TENANT, to measure what they cost a busy tenant
// (BENCHMARKS.md); the brain's defaults otherwise. Every one-process
// benchmark's brain takes them.
func benchTenantLimits(c *brain.Config) {
	c.TenantWorkers = envInt("BENCH_TENANT_WORKERS", c.TenantWorkers)
	c.DBConnsPerTenant = int32(envInt("BENCH_DB_CONNS_PER_TENANT", int(c.DBConnsPerTenant)))
}

// startWithEvents is start with the edge delivering every event to a
// webhook that accepts it, as n8n's does, and acknowledging it.
func (bs *benchStack) startWithEvents(b *testing.B) {
	bs.s.startBrain("bench-1", func(c *brain.Config) {
		c.RegistryRefresh = 0
		benchTenantLimits(c)
	})
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		bs.delivered.Add(1)
	}))
	b.Cleanup(hook.Close)
	metLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	bs.edgeMetrics = "http://" + metLn.Addr().String()
	bs.edge = bs.s.startEdge(bs.tn, func(c *edge.Config) {
		c.WebhookURL = hook.URL
		c.WebhookSecret = "bench-webhook-secret-0123456789"
		c.MetricsListener = metLn
	})
}

// purgeTurns empties TURNS after the JetStream floor, so that no brain ever
// decides the floor's messages.
func (bs *benchStack) purgeTurns(b *testing.B) {
	b.Helper()
	st, err := bs.s.stack.Streams.JS.Stream(context.Background(), subjects.TurnsStream(bs.tn.Account.Public))
	if err != nil {
		b.Fatal(err)
	}
	if err := st.Purge(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// tenantPool is a pool on the tenant database with the tenant's own role,
// configured as the brain configures its tenant pools
// (brain/internal/tenancy) in the test stack: the stack's sslmode
// (disable), the default statement cache, application_name,
// statement_timeout, 4 connections.
func (bs *benchStack) tenantPool(b *testing.B) *pgxpool.Pool {
	b.Helper()
	app, err := pgxpool.ParseConfig(bs.tn.DB.AppURL)
	if err != nil {
		b.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(fmt.Sprintf("host=%s port=%d sslmode=%s", app.ConnConfig.Host, app.ConnConfig.Port,
		bs.s.stack.BrainConfig("bench").DBSSLMode))
	if err != nil {
		b.Fatal(err)
	}
	pc.ConnConfig.Database = app.ConnConfig.Database
	pc.ConnConfig.User = app.ConnConfig.User
	pc.ConnConfig.Password = app.ConnConfig.Password
	pc.ConnConfig.ConnectTimeout = 5 * time.Second
	pc.ConnConfig.RuntimeParams["application_name"] = "bench"
	pc.ConnConfig.RuntimeParams["statement_timeout"] = "10000"
	pc.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// workItem is a new work item id, unique across stacks and runs.
func (bs *benchStack) workItem() string {
	return fmt.Sprintf("<bench-%s-%d@customer.example>", bs.run, bs.seq.Add(1))
}

// turnBody is turn 1 of a new quote request, which the confident "quotes"
// rule decides (draft_reply, awaiting approval).
func (bs *benchStack) turnBody() (id string, body []byte) {
	id = bs.workItem()
	body, err := json.Marshal(quoteEmail(id))
	if err != nil {
		panic(err)
	}
	return id, body
}

// ---------------------------------------------------------------- operations
//
// An operation prepares what it needs, then times only the part under test.

type op func(ctx context.Context) (time.Duration, error)

// jetStreamFloor: the tenant publishes a turn through its import
// (turn.<key> → brain.turn.<account>.<key> in TURNS) and waits for the
// PubAck, with the headers the edge sends.
func (bs *benchStack) jetStreamFloor() op {
	return func(ctx context.Context) (time.Duration, error) {
		id, body := bs.turnBody()
		key := subjects.TurnKey(id, 1)
		msg := &nats.Msg{Subject: subjects.TurnLocal(key), Data: body}
		t0 := time.Now()
		ack, err := bs.js.PublishMsg(ctx, msg, jetstream.WithMsgID(key+".floor"),
			jetstream.WithExpectLastSequencePerSubject(0), jetstream.WithRetryAttempts(0))
		d := time.Since(t0)
		if err == nil && (ack.Duplicate || ack.Stream != subjects.TurnsStream(bs.tn.Account.Public)) {
			err = fmt.Errorf("unexpected PubAck %+v", ack)
		}
		return d, err
	}
}

// postgresFloor: one single-row INSERT, autocommit (so one commit, fsync
// on), into the tenant database with the tenant's own role.
func postgresFloor(bs *benchStack, pool *pgxpool.Pool) op {
	return func(ctx context.Context) (time.Duration, error) {
		id := bs.workItem()
		t0 := time.Now()
		tag, err := pool.Exec(ctx, `INSERT INTO step_checkpoints (work_item_id, turn, step, output) VALUES ($1, 1, 'bench_floor', $2)`,
			id, []byte(`{"floor":true}`))
		d := time.Since(t0)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("inserted %d rows", tag.RowsAffected())
		}
		return d, err
	}
}

// httpTurn: the full turn, HTTP in to HTTP out: POST /v1/turns to the edge,
// JetStream, the brain (rules decide, the model is not configured), the
// tenant's Postgres commit, the reply, HTTP 200.
func (bs *benchStack) httpTurn() op {
	return func(ctx context.Context) (time.Duration, error) {
		_, body := bs.turnBody()
		d, status, res, err := bs.post(ctx, body)
		if err == nil && (status != http.StatusOK || !bytes.Contains(res, []byte(`"status":"awaiting_approval"`)) ||
			bytes.Contains(res, []byte(`"replayed":true`))) {
			err = fmt.Errorf("want a new decision, got %d %s", status, res)
		}
		return d, err
	}
}

// natsTurn: the same turn without HTTP and the edge: the tenant publishes
// it over JetStream itself and waits for the live reply (a stage of the
// breakdown, not a floor).
func (bs *benchStack) natsTurn(b *testing.B) op {
	sub, err := bs.nc.SubscribeSync(subjects.LocalReply + ">")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := bs.nc.Flush(); err != nil {
		b.Fatal(err)
	}
	return func(ctx context.Context) (time.Duration, error) {
		id, body := bs.turnBody()
		key := subjects.TurnKey(id, 1)
		msg := &nats.Msg{Subject: subjects.TurnLocal(key), Data: body}
		t0 := time.Now()
		if _, err := bs.js.PublishMsg(ctx, msg, jetstream.WithMsgID(key+".nats"),
			jetstream.WithExpectLastSequencePerSubject(0), jetstream.WithRetryAttempts(0)); err != nil {
			return 0, err
		}
		for {
			m, err := sub.NextMsgWithContext(ctx)
			if err != nil {
				return 0, err
			}
			if m.Subject == subjects.ReplyLocal(key) {
				d := time.Since(t0)
				if !bytes.Contains(m.Data, []byte(`"status":"awaiting_approval"`)) {
					return d, fmt.Errorf("want a decision, got %s", m.Data)
				}
				return d, nil
			}
		}
	}
}

// replayTurn re-submits turns that were already decided: the edge finds
// the turn in TURNS (duplicate message id) and answers from the stored
// reply in RESULTS, marked replayed; the brain is not involved.
func (bs *benchStack) replayTurn(b *testing.B) op {
	b.Helper()
	bodies := make([][]byte, benchReplayItems)
	for i := range bodies {
		_, bodies[i] = bs.turnBody()
		if _, status, res, err := bs.post(context.Background(), bodies[i]); err != nil || status != http.StatusOK {
			b.Fatalf("decide turn to replay: %d %s %v", status, res, err)
		}
	}
	var next atomic.Int64
	return func(ctx context.Context) (time.Duration, error) {
		body := bodies[int(next.Add(1))%len(bodies)]
		d, status, res, err := bs.post(ctx, body)
		if err == nil && (status != http.StatusOK || !bytes.Contains(res, []byte(`"replayed":true`))) {
			err = fmt.Errorf("want a replayed decision, got %d %s", status, res)
		}
		return d, err
	}
}

// post sends a turn to the edge as n8n does and reads the whole answer.
func (bs *benchStack) post(ctx context.Context, body []byte) (time.Duration, int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, bs.edge.base+"/v1/turns", bytes.NewReader(body))
	if err != nil {
		return 0, 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+bs.edge.token)
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	res, err := bs.client.Do(req)
	if err != nil {
		return 0, 0, nil, err
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	return time.Since(t0), res.StatusCode, b, err
}

// ---------------------------------------------------------------- measuring

type latencies []time.Duration

// pct is the p-quantile by nearest rank.
func (l latencies) pct(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(i, 0)]
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func (l latencies) report(b *testing.B, prefix string) {
	b.ReportMetric(us(l.pct(0.50)), prefix+"p50_us")
	b.ReportMetric(us(l.pct(0.90)), prefix+"p90_us")
	b.ReportMetric(us(l.pct(0.99)), prefix+"p99_us")
}

// measure runs o benchWarmup times untimed, then once per b.Loop iteration,
// sequentially, and returns each iteration's latency.
func measure(b *testing.B, o op) latencies {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	for range benchWarmup {
		if _, err := o(ctx); err != nil {
			b.Fatalf("warm-up: %v", err)
		}
	}
	var l latencies
	for b.Loop() {
		d, err := o(ctx)
		if err != nil {
			b.Fatal(err)
		}
		l = append(l, d)
	}
	return l
}

// measureParallel runs o from benchConcurrency callers at once, b.N times
// in all, and returns each call's latency and the throughput.
func measureParallel(b *testing.B, o op) (latencies, float64) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	work := make(chan struct{})
	var (
		mu     sync.Mutex
		all    latencies
		failed atomic.Pointer[error]
		wg     sync.WaitGroup
	)
	call := func() {
		d, err := o(ctx)
		if err != nil {
			failed.CompareAndSwap(nil, &err)
			cancel()
			return
		}
		mu.Lock()
		all = append(all, d)
		mu.Unlock()
	}
	// Warm-up: every caller's connection, untimed.
	for range benchConcurrency {
		wg.Go(call)
	}
	wg.Wait()
	if p := failed.Load(); p != nil {
		b.Fatalf("warm-up: %v", *p)
	}
	all = nil
	for range benchConcurrency {
		wg.Go(func() {
			for range work {
				if ctx.Err() == nil {
					call()
				}
			}
		})
	}
	start := time.Now()
	for b.Loop() {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)
	if p := failed.Load(); p != nil {
		b.Fatal(*p)
	}
	return all, float64(len(all)) / elapsed.Seconds()
}

// brainDurations are the "turn answered" durations the brain logged (from
// taking the turn off TURNS to acking it: database, engine, reply publish)
// in logs[from:].
func brainDurations(s *system, from int) latencies {
	logs := s.logs.String()
	var l latencies
	for line := range strings.SplitSeq(logs[from:], "\n") {
		if !strings.Contains(line, `"msg":"turn answered"`) {
			continue
		}
		var rec struct {
			DurationMS float64 `json:"duration_ms"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil {
			l = append(l, time.Duration(rec.DurationMS*float64(time.Millisecond)))
		}
	}
	return l
}

func logLen(s *system) int { return len(s.logs.String()) }

// ---------------------------------------------------------------- benchmarks

// BenchmarkTurnBudget measures, on one stack and in sequence: the two
// floors of DESIGN §7a (a JetStream round trip through the account imports
// with no brain running, then a Postgres commit), the turn over NATS only,
// the full HTTP turn (which reports turn_over_floor = turn p50 / (JetStream
// p50 + Postgres p50)), the HTTP turn from 16 callers (turns/s) and the replay.
func BenchmarkTurnBudget(b *testing.B) {
	bs := newBenchStack(b)
	var js, pg, natsTurn latencies
	b.Run("1_floor_jetstream", func(b *testing.B) {
		js = measure(b, bs.jetStreamFloor())
		js.report(b, "")
	})
	bs.purgeTurns(b)
	pool := bs.tenantPool(b)
	b.Run("2_floor_postgres", func(b *testing.B) {
		pg = measure(b, postgresFloor(bs, pool))
		pg.report(b, "")
	})
	pool.Close()
	bs.start(b)
	b.Run("3_turn_nats", func(b *testing.B) {
		natsTurn = measure(b, bs.natsTurn(b))
		natsTurn.report(b, "")
	})
	b.Run("4_turn_http", func(b *testing.B) {
		from := logLen(bs.s)
		turn := measure(b, bs.httpTurn())
		turn.report(b, "")
		if br := brainDurations(bs.s, from); len(br) > 0 {
			b.ReportMetric(us(br.pct(0.5)), "brain_p50_us")
		}
		if len(js) > 0 && len(pg) > 0 {
			floor := us(js.pct(0.5)) + us(pg.pct(0.5))
			b.ReportMetric(us(js.pct(0.5)), "floor_js_p50_us")
			b.ReportMetric(us(pg.pct(0.5)), "floor_pg_p50_us")
			b.ReportMetric(us(turn.pct(0.5))/floor, "turn_over_floor")
		}
		if len(natsTurn) > 0 {
			b.ReportMetric(us(natsTurn.pct(0.5)), "nats_turn_p50_us")
		}
	})
	b.Run(fmt.Sprintf("5_turn_http_parallel%d", benchConcurrency), func(b *testing.B) {
		l, tps := measureParallel(b, bs.httpTurn())
		l.report(b, "")
		b.ReportMetric(tps, "turns/s")
	})
	b.Run("6_turn_replay", func(b *testing.B) {
		l := measure(b, bs.replayTurn(b))
		l.report(b, "")
	})
}

// BenchmarkTurnEvents is the HTTP turn, sequential then from 16 callers,
// with each turn's approval_requested event delivered to a webhook (n8n's,
// here in the benchmark's process) and acknowledged to the brain, which
// marks it delivered: the whole of what an approval-awaiting turn costs a
// deployment. Each part reports the events per acknowledgement call
// (events/ack); at the end every event is marked delivered in the
// tenant's database.
func BenchmarkTurnEvents(b *testing.B) {
	bs := newBenchStack(b)
	bs.startWithEvents(b)
	var turns atomic.Int64
	ht := bs.httpTurn()
	turn := func(ctx context.Context) (time.Duration, error) {
		d, err := ht(ctx)
		if err == nil {
			turns.Add(1)
		}
		return d, err
	}
	// acks is the acknowledgement calls and the events they carried so far.
	acks := func(b *testing.B) (calls, events int) {
		return metric(b, bs.edgeMetrics, `edge_event_ack_batch_events_count{tenant="bench"}`),
			metric(b, bs.edgeMetrics, `edge_event_ack_batch_events_sum{tenant="bench"}`)
	}
	// settled waits for the deliveries still on their way, then reports
	// the events per acknowledgement call since calls0, events0.
	settled := func(b *testing.B, calls0, events0 int) {
		deadline := time.Now().Add(10 * time.Second)
		for bs.delivered.Load() < turns.Load() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := bs.delivered.Load(); n < turns.Load() {
			b.Fatalf("%d events delivered for %d turns", n, turns.Load())
		}
		var calls, events int
		for time.Now().Before(deadline) {
			if calls, events = acks(b); int64(events) >= turns.Load() {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if calls == calls0 {
			b.Fatalf("no acknowledgement call")
		}
		b.ReportMetric(float64(events-events0)/float64(calls-calls0), "events/ack")
	}
	b.Run("turn_http", func(b *testing.B) {
		calls0, events0 := acks(b)
		measure(b, turn).report(b, "")
		settled(b, calls0, events0)
	})
	b.Run(fmt.Sprintf("turn_http_parallel%d", benchConcurrency), func(b *testing.B) {
		calls0, events0 := acks(b)
		l, tps := measureParallel(b, turn)
		l.report(b, "")
		b.ReportMetric(tps, "turns/s")
		settled(b, calls0, events0)
	})
	db := bs.s.tenantDB(bs.tn)
	deadline := time.Now().Add(10 * time.Second)
	undelivered := func() int {
		return count(b, db, `SELECT count(*) FROM outbox WHERE delivered_at IS NULL`)
	}
	for undelivered() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := undelivered(); n > 0 {
		b.Fatalf("%d events not marked delivered after %d turns", n, turns.Load())
	}
	b.Logf("%d events delivered for %d turns, all marked delivered", bs.delivered.Load(), turns.Load())
}

// BenchmarkFloorJetStream: one JetStream round trip through the account
// imports (publish turn.<key>, wait for the PubAck), no brain running.
func BenchmarkFloorJetStream(b *testing.B) {
	bs := newBenchStack(b)
	measure(b, bs.jetStreamFloor()).report(b, "")
}

// BenchmarkFloorPostgresCommit: one single-row INSERT commit in the tenant
// database with the tenant's role, through a pool set up like the brain's.
func BenchmarkFloorPostgresCommit(b *testing.B) {
	bs := newBenchStack(b)
	measure(b, postgresFloor(bs, bs.tenantPool(b))).report(b, "")
}

// BenchmarkTurn: the full turn, HTTP in to HTTP out, one caller.
func BenchmarkTurn(b *testing.B) {
	bs := newBenchStack(b)
	bs.start(b)
	from := logLen(bs.s)
	measure(b, bs.httpTurn()).report(b, "")
	if br := brainDurations(bs.s, from); len(br) > 0 {
		b.ReportMetric(us(br.pct(0.5)), "brain_p50_us")
	}
}

// BenchmarkTurnParallel: the full turn from benchConcurrency callers at once.
func BenchmarkTurnParallel(b *testing.B) {
	bs := newBenchStack(b)
	bs.start(b)
	l, tps := measureParallel(b, bs.httpTurn())
	l.report(b, "")
	b.ReportMetric(tps, "turns/s")
}

// BenchmarkTurnReplay: the retry of an already decided turn.
func BenchmarkTurnReplay(b *testing.B) {
	bs := newBenchStack(b)
	bs.start(b)
	measure(b, bs.replayTurn(b)).report(b, "")
}

// ---------------------------------------------------------------- where a turn's time goes

// BenchmarkTurnStages is the diagnostic behind BENCHMARKS.md's breakdown.
// pg_turn_4rt runs the database shape of a brain turn (a read of the work
// item, then BEGIN, one batch of three INSERTs, COMMIT: four round trips,
// one commit); pg_turn_2rt the same writes pipelined in one implicit
// transaction (two round trips, one commit). turn_http is the full turn with
// a tap in the STREAMS account that timestamps the turn entering TURNS, the
// brain publishing its reply and RESULTS republishing it live, so the p50 of
// each stage is reported (the tap's own deliveries add a little to the turn).
func BenchmarkTurnStages(b *testing.B) {
	bs := newBenchStack(b)
	pool := bs.tenantPool(b)
	b.Run("pg_turn_4rt", func(b *testing.B) {
		measure(b, dbTurnShape(bs, pool, false)).report(b, "")
	})
	b.Run("pg_turn_2rt", func(b *testing.B) {
		measure(b, dbTurnShape(bs, pool, true)).report(b, "")
	})
	pool.Close()
	bs.start(b)
	b.Run("turn_http", func(b *testing.B) {
		tp := newTap(b, bs.s, bs.tn.Account.Public)
		type sample struct {
			key   string
			t0    time.Time
			total time.Duration
		}
		var samples []sample
		o := func(ctx context.Context) (time.Duration, error) {
			id, body := bs.turnBody()
			t0 := time.Now()
			d, status, res, err := bs.post(ctx, body)
			if err == nil && status != http.StatusOK {
				err = fmt.Errorf("want 200, got %d %s", status, res)
			}
			samples = append(samples, sample{subjects.TurnKey(id, 1), t0, d})
			return d, err
		}
		from := logLen(bs.s)
		total := measure(b, o)
		total.report(b, "")
		time.Sleep(100 * time.Millisecond) // the tap's last deliveries
		var in, brainPart, results, out latencies
		for _, sm := range samples[benchWarmup:] {
			st, ok := tp.get(sm.key)
			if !ok {
				continue
			}
			end := sm.t0.Add(sm.total)
			in = append(in, st.turn.Sub(sm.t0))
			brainPart = append(brainPart, st.reply.Sub(st.turn))
			results = append(results, st.live.Sub(st.reply))
			out = append(out, end.Sub(st.live))
		}
		b.ReportMetric(us(in.pct(0.5)), "1_http_edge_publish_p50_us")
		b.ReportMetric(us(brainPart.pct(0.5)), "2_stream_brain_db_p50_us")
		b.ReportMetric(us(results.pct(0.5)), "3_results_store_p50_us")
		b.ReportMetric(us(out.pct(0.5)), "4_live_edge_http_p50_us")
		if br := brainDurations(bs.s, from); len(br) > 0 {
			b.ReportMetric(us(br.pct(0.5)), "brain_handle_p50_us")
		}
	})
}

// dbTurnShape writes a turn's rows (work item, decision, one more row) as
// the brain does (pipelined=false) or pipelined (true).
func dbTurnShape(bs *benchStack, pool *pgxpool.Pool, pipelined bool) op {
	return func(ctx context.Context) (time.Duration, error) {
		id := bs.workItem()
		email := []byte(`{"from":"Jo Bloggs <jo@customer.example>","subject":"Quote for a new deck please","body":"Hi, could you quote for a 20m2 hardwood deck? Thanks, Jo"}`)
		reply := []byte(`{"work_item_id":"x","turn":1,"status":"awaiting_approval"}`)
		queue := func(q *pgx.Batch) {
			q.Queue(`INSERT INTO work_items (id, turn, status, catalogue_version, approval_mode, email) VALUES ($1, 1, 'awaiting_approval', 1, 'review_app', $2)`, id, email)
			q.Queue(`INSERT INTO decisions (work_item_id, turn, fingerprint, turn_seq, status, action, reply) VALUES ($1, 1, 'fp', 1, 'awaiting_approval', 'draft_reply', $2)`, id, reply)
			q.Queue(`INSERT INTO step_checkpoints (work_item_id, turn, step, output) VALUES ($1, 1, 'approval', $2)`, id, []byte(`{"approval":true}`))
		}
		t0 := time.Now()
		var turn int
		if err := pool.QueryRow(ctx, `SELECT turn FROM work_items WHERE id = $1`, id).Scan(&turn); err != pgx.ErrNoRows {
			return 0, fmt.Errorf("read work item: %v", err)
		}
		var err error
		if pipelined {
			q := &pgx.Batch{}
			queue(q)
			err = pool.SendBatch(ctx, q).Close() // one implicit transaction
		} else {
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				q := &pgx.Batch{}
				queue(q)
				return tx.SendBatch(ctx, q).Close()
			})
		}
		return time.Since(t0), err
	}
}

// tap timestamps a turn's messages inside the STREAMS account, where
// TURNS and RESULTS store them.
type tap struct {
	mu sync.Mutex
	at map[string]*tapStamps
}

type tapStamps struct{ turn, reply, live time.Time }

func newTap(b *testing.B, s *system, tenant string) *tap {
	b.Helper()
	creds, err := account.UserCreds(s.stack.StreamsAccount, "bench-tap", account.RoleUnrestricted)
	if err != nil {
		b.Fatal(err)
	}
	path := b.TempDir() + "/tap.creds"
	if err := writeFile(path, creds); err != nil {
		b.Fatal(err)
	}
	nc, err := nats.Connect(s.stack.NATS.ClientURL(), nats.UserCredentials(path))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	tp := &tap{at: map[string]*tapStamps{}}
	for i, subject := range []string{subjects.Turn(tenant, "*"), subjects.Reply(tenant, "*"), subjects.Live(tenant, "*")} {
		if _, err := nc.Subscribe(subject, func(m *nats.Msg) {
			now := time.Now()
			key := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
			tp.mu.Lock()
			defer tp.mu.Unlock()
			st := tp.at[key]
			if st == nil {
				st = &tapStamps{}
				tp.at[key] = st
			}
			switch i {
			case 0:
				st.turn = now
			case 1:
				st.reply = now
			default:
				st.live = now
			}
		}); err != nil {
			b.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
	return tp
}

func (tp *tap) get(key string) (tapStamps, bool) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	st := tp.at[key]
	if st == nil || st.turn.IsZero() || st.reply.IsZero() || st.live.IsZero() {
		return tapStamps{}, false
	}
	return *st, true
}
