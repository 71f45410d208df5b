#!/usr/bin/env bash
# The turn benchmarks of BENCHMARKS.md (`make bench`): the Go benchmarks
# (floors, the full turn, concurrency, replay, the stage breakdown, a
# thousand tenants, the cost of a NATS cluster) and the LangGraph baseline,
# in one run on this machine, then one summary of ratios.
#
#   BENCH_N      iterations per measurement (default 2000)
#   BENCH_OUT    folder for the raw outputs (default .data/bench/<UTC time>)
#   PG_PORT      the port of the local cluster in .data/pg (default 55432)
#   BENCH_SKIP_LANGGRAPH=1  run the Go benchmarks only
#   BENCH_SKIP_SCALE=1      skip BenchmarkScale and BenchmarkClusterCost (a
#                           thousand tenants provisioned, a minute of idling,
#                           two NATS set-ups: the longest part of the run)
#   BENCH_TENANTS, BENCH_SCALE_TURNS, BENCH_CLUSTER_TURNS, BENCH_CLUSTER_TENANTS
#                           their sizes (1000, 20000, 5000, 8)
#   BENCH_GOMAXPROCS_EDGE, BENCH_GOMAXPROCS_BRAIN, BENCH_GOMAXPROCS_LOAD, BENCH_GOMAXPROCS_NATS
#                           GOMAXPROCS of BenchmarkTurnCPU's processes (the
#                           binary's default when unset: 1 for the edge, Go's
#                           for the others; compose runs the brain at 1 too)
#   BenchmarkTurnBudget runs three times: as it is, with GOMAXPROCS=1, and
#                           with BENCH_SYNC_ALWAYS=1 (JetStream's production fsync)
#   BENCH_TENANT_WORKERS, BENCH_DB_CONNS_PER_TENANT
#                           the brain's limits for the benchmark's tenant in
#                           the one-process benchmarks (the brain's defaults,
#                           4 and 4, when unset)
#
# Not part of `make test` or CI: it needs no Node, but uses it when present.
set -euo pipefail
cd "$(dirname "$0")/../.."

N="${BENCH_N:-2000}"
CONCURRENCY=16 # fixed in tests/bench_test.go (benchConcurrency)
OUT="${BENCH_OUT:-.data/bench/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"

if [ -n "${BRAIN_TEST_DATABASE_URL:-}" ]; then
	echo "Postgres: BRAIN_TEST_DATABASE_URL is set; using that cluster."
else
	# As `make test` does: the local cluster in .data/pg, started if needed.
	deploy/ensure-postgres.sh
	pg_env="$(go run ./deploy/cmd/devstack pg-env -pg-port "${PG_PORT:-55432}")"
	eval "$pg_env"
fi

{
	echo "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "cpus:     $(nproc) ($(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//'))"
	echo "memory:   $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo 2>/dev/null)"
	echo "go:       $(go version | awk '{print $3}')"
	if command -v node >/dev/null 2>&1; then echo "node:     $(node --version)"; fi
	if command -v psql >/dev/null 2>&1; then
		echo "postgres: $(psql "$BRAIN_TEST_DATABASE_URL" -Atc 'SHOW server_version' 2>/dev/null) (fsync $(psql "$BRAIN_TEST_DATABASE_URL" -Atc 'SHOW fsync' 2>/dev/null), synchronous_commit $(psql "$BRAIN_TEST_DATABASE_URL" -Atc 'SHOW synchronous_commit' 2>/dev/null))"
	fi
	echo "load:     $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null) (1/5/15 min, before the run)"
	echo "GOMAXPROCS of BenchmarkTurnCPU's processes: edge ${BENCH_GOMAXPROCS_EDGE:-default (1)}, brain ${BENCH_GOMAXPROCS_BRAIN:-default}, load ${BENCH_GOMAXPROCS_LOAD:-default}, test process (NATS) ${BENCH_GOMAXPROCS_NATS:-default}"
	echo "the tenant's limits in the one-process benchmarks: workers ${BENCH_TENANT_WORKERS:-default}, connections ${BENCH_DB_CONNS_PER_TENANT:-default}"
} | tee "$OUT/machine.txt"

echo
GO_BENCH='^Benchmark(TurnBudget|TurnEvents|Floor.*|Turn|TurnParallel|TurnReplay|TurnStages)$'
echo "== Go benchmarks: go test -run '^\$' -bench '$GO_BENCH' -benchtime ${N}x -count 1 ./tests/"
BENCH_SYNC_ALWAYS=0 go test -run '^$' -bench "$GO_BENCH" -benchtime "${N}x" -count 1 -timeout 30m ./tests/ | tee "$OUT/go.txt"
echo
# The same turn with one thread of Go code for the whole stack (client, edge,
# NATS, brain), as Node runs LangGraph's 16 callers on one thread of
# JavaScript: a goroutine woken by another then runs on the same thread.
echo "== The same with one thread of Go code: GOMAXPROCS=1 go test -run '^\$' -bench '^BenchmarkTurnBudget\$' -benchtime ${N}x -count 1 ./tests/"
BENCH_SYNC_ALWAYS=0 GOMAXPROCS=1 go test -run '^$' -bench '^BenchmarkTurnBudget$' -benchtime "${N}x" -count 1 -timeout 30m ./tests/ |
	sed 's/^BenchmarkTurnBudget/BenchmarkTurnBudgetOneThread/' | tee -a "$OUT/go.txt"
echo
# The same stack with JetStream's production durability (sync_interval:
# always, an fsync before every PubAck), the floor measured under it too.
echo "== The same with the production fsync: BENCH_SYNC_ALWAYS=1 go test -run '^\$' -bench '^BenchmarkTurnBudget\$' -benchtime ${N}x -count 1 ./tests/"
BENCH_SYNC_ALWAYS=1 go test -run '^$' -bench '^BenchmarkTurnBudget$' -benchtime "${N}x" -count 1 -timeout 30m ./tests/ |
	sed 's/^BenchmarkTurnBudget/BenchmarkTurnBudgetSyncAlways/' | tee -a "$OUT/go.txt"
echo
echo "== The turn's commit alone against a single-row commit (BenchmarkTurnCommit, scratch tenant databases)"
go test -run '^$' -bench '^BenchmarkTurnCommit$' -benchtime "${N}x" -count 1 -timeout 30m -v ./brain/internal/store/ |
	grep -E 'p50_us|×|WAL flush|^(ok|FAIL)' | tee -a "$OUT/go.txt"
echo
echo "== Where a turn's CPU goes: brain, edge and load client as processes of their own (BenchmarkTurnCPU, N=$N)"
for sync in 0 1; do
	BENCH_N="$N" BENCH_SYNC_ALWAYS="$sync" go test -run '^$' -bench '^BenchmarkTurnCPU$' -benchtime 1x -count 1 -timeout 30m -v ./tests/ |
		sed "s/^BenchmarkTurnCPU/BenchmarkTurnCPU_sync$sync/" | tee -a "$OUT/go.txt"
done
echo
echo "== Noisy neighbour (tenant isolation): one measurement of fixed length"
go test -run '^$' -bench 'NoisyNeighbour' -benchtime 1x -count 1 -timeout 30m -v ./tests/ | tee -a "$OUT/go.txt"
if [ "${BENCH_SKIP_SCALE:-}" = 1 ]; then
	echo
	echo "BENCH_SKIP_SCALE=1: skipping BenchmarkScale and BenchmarkClusterCost."
else
	echo
	echo "== A thousand tenants on one replica (BenchmarkScale) and R3 on three NATS nodes against one (BenchmarkClusterCost): one measurement each"
	go test -run '^$' -bench '^Benchmark(Scale|ClusterCost)$' -benchtime 1x -count 1 -timeout 90m -v ./tests/ | tee -a "$OUT/go.txt"
fi

: >"$OUT/langgraph.jsonl"
if [ "${BENCH_SKIP_LANGGRAPH:-}" = 1 ]; then
	echo "BENCH_SKIP_LANGGRAPH=1: skipping the LangGraph baseline."
elif command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
	echo
	echo "== LangGraph baseline: node tests/bench/langgraph/bench.mjs (N=$N, concurrency $CONCURRENCY)"
	(cd tests/bench/langgraph && npm ci --no-audit --no-fund --loglevel=error)
	BENCH_N="$N" BENCH_CONCURRENCY="$CONCURRENCY" node tests/bench/langgraph/bench.mjs | tee "$OUT/langgraph.jsonl"
else
	echo
	echo "node and npm are not installed: skipping the LangGraph baseline (the Go numbers above stand alone)."
fi

echo
awk -v C="$CONCURRENCY" '
# Go benchmark lines: name iterations (value unit)...
FNR == NR && /^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name)
	m[name, "ns/op"] = $3
	for (i = 5; i < NF; i += 2) m[name, $(i + 1)] = $i
	next
}
# LangGraph JSON lines
FNR != NR && /"mode"/ {
	k = str($0, "mode") "/" str($0, "durability") "/" num($0, "procs")
	lg[k, "p50"] = num($0, "p50_us"); lg[k, "tps"] = num($0, "turns_per_s")
	if (!(str($0, "durability") in seen)) { seen[str($0, "durability")] = 1; order[++nd] = str($0, "durability") }
	next
}
function num(s, key,   r) {
	if (!match(s, "\"" key "\":[0-9.]+")) return ""
	r = substr(s, RSTART, RLENGTH); sub(/.*:/, "", r); return r + 0
}
function str(s, key,   r) {
	if (!match(s, "\"" key "\":\"[^\"]*\"")) return ""
	r = substr(s, RSTART, RLENGTH); sub(/^[^:]*:"/, "", r); sub(/"$/, "", r); return r
}
function verdict(ok) { return ok ? "met" : "MISSED" }
END {
	B = "BenchmarkTurnBudget/"
	js = m[B "1_floor_jetstream", "p50_us"]; pg = m[B "2_floor_postgres", "p50_us"]
	turn = m[B "4_turn_http", "p50_us"]; ratio = m[B "4_turn_http", "turn_over_floor"]
	if (turn == "" || js == "" || pg == "") { print "summary: BenchmarkTurnBudget results missing"; exit 1 }
	seqtps = 1e9 / m[B "4_turn_http", "ns/op"]
	par = B "5_turn_http_parallel" C
	partps = m[par, "turns/s"]; parp50 = m[par, "p50_us"]
	print "== Summary (one run; ratios first, absolute times vary between machines)"
	print ""
	print "DESIGN 7a budget: full turn (HTTP in -> HTTP out, model stubbed) vs the floor"
	printf "  %-44s %10.0f us\n", "floor: JetStream round trip via imports p50", js
	printf "  %-44s %10.0f us\n", "floor: Postgres commit p50", pg
	printf "  %-44s %10.0f us\n", "floor = sum", js + pg
	printf "  %-44s %10.0f us\n", "turn p50", turn
	printf "  %-44s %10.2fx   goal <= 3x: %s\n", "turn p50 / floor", ratio, verdict(ratio <= 3)
	printf "  %-44s %10.0f us  (%.2fx the floor)\n", "turn over NATS only (no HTTP, no edge) p50", m[B "3_turn_nats", "p50_us"], m[B "3_turn_nats", "p50_us"] / (js + pg)
	printf "  %-44s %10.0f us\n", "brain: off TURNS to ack, from its log, p50", m[B "4_turn_http", "brain_p50_us"]
	printf "  %-44s %10.0f us\n", "replay of a decided turn p50", m[B "6_turn_replay", "p50_us"]
	printf "  %-44s %10.0f\n", "turns/s, 1 caller", seqtps
	printf "  %-44s %10.0f   (p50 %.0f us)\n", "turns/s, " C " callers", partps, parp50
	O = "BenchmarkTurnBudgetOneThread/"
	oratio = m[O "4_turn_http", "turn_over_floor"]; otps = m[O "5_turn_http_parallel" C, "turns/s"]
	if (oratio != "") {
		printf "  %-44s %10.2fx   goal <= 3x: %s\n", "the same, one thread of Go code: turn / floor", oratio, verdict(oratio <= 3)
		printf "  %-44s %10.0f\n", "the same, one thread: turns/s, " C " callers", otps
	}
	A = "BenchmarkTurnBudgetSyncAlways/"
	aratio = m[A "4_turn_http", "turn_over_floor"]
	if (aratio != "") {
		printf "  %-44s %10.0f us  (JetStream %.0f + Postgres %.0f)\n", "production fsync (sync_interval always): floor", m[A "4_turn_http", "floor_js_p50_us"] + m[A "4_turn_http", "floor_pg_p50_us"], m[A "4_turn_http", "floor_js_p50_us"], m[A "4_turn_http", "floor_pg_p50_us"]
		printf "  %-44s %10.0f us\n", "production fsync: turn p50", m[A "4_turn_http", "p50_us"]
		printf "  %-44s %10.2fx   goal <= 3x: %s\n", "production fsync: turn / floor", aratio, verdict(aratio <= 3)
		printf "  %-44s %10.0f\n", "production fsync: turns/s, " C " callers", m[A "5_turn_http_parallel" C, "turns/s"]
	}
	E = "BenchmarkTurnEvents/turn_http"
	if (m[E, "p50_us"] != "") {
		printf "  %-44s %10.0f us\n", "with its event delivered and acked: p50", m[E, "p50_us"]
		printf "  %-44s %10.0f   (%.2fx without)\n", "with its event: turns/s, " C " callers", m[E "_parallel" C, "turns/s"], m[E "_parallel" C, "turns/s"] / partps
	}
	S = "BenchmarkTurnStages/turn_http"
	if (m[S, "p50_us"] != "") {
		print ""
		print "Where a turn goes (BenchmarkTurnStages, p50 of each stage)"
		printf "  %-44s %10.0f us\n", "1 HTTP + edge, until the turn is in TURNS", m[S, "1_http_edge_publish_p50_us"]
		printf "  %-44s %10.0f us\n", "2 TURNS -> brain -> database -> reply sent", m[S, "2_stream_brain_db_p50_us"]
		printf "  %-44s %10.0f us\n", "3 RESULTS stores, republishes live", m[S, "3_results_store_p50_us"]
		printf "  %-44s %10.0f us\n", "4 live reply -> edge -> HTTP 200 read", m[S, "4_live_edge_http_p50_us"]
		printf "  %-44s %10.0f us\n", "brain: database shape of a turn (4 RTs)", m["BenchmarkTurnStages/pg_turn_4rt", "p50_us"]
		printf "  %-44s %10.0f us\n", "brain: same writes pipelined (2 RTs)", m["BenchmarkTurnStages/pg_turn_2rt", "p50_us"]
	}
	for (sync = 0; sync <= 1; sync++) {
		P = "BenchmarkTurnCPU_sync" sync
		if (m[P, "floor_us"] == "") continue
		print ""
		printf "BenchmarkTurnCPU, %s: brain, edge, load as processes; floor %.0f us\n", sync ? "NATS sync_interval always (production durability)" : "NATS default fsync interval (dev stack)", m[P, "floor_us"]
		printf "  %-12s %10s %10s %8s %12s %10s %10s %10s %10s\n", "callers", "turns/s", "p50 us", "/floor", "CPU/turn us", "brain", "edge", "nats", "postgres"
		for (ci = 1; ci <= 2; ci++) {
			c = ci == 1 ? "c1_" : "c16_"
			printf "  %-12s %10.0f %10.0f %7.2fx %12.0f %10.0f %10.0f %10.0f %10.0f\n", ci == 1 ? "1" : "16", m[P, c "turns/s"], m[P, c "p50_us"], m[P, c "turn_over_floor"], m[P, c "cpu_total_us"], m[P, c "cpu_brain_us"], m[P, c "cpu_edge_us"], m[P, c "cpu_nats_us"], m[P, c "cpu_postgres_us"]
		}
	}
	N = "BenchmarkNoisyNeighbour"
	if (m[N, "a_quiet_p50_us"] != "") {
		print ""
		print "Noisy neighbour: A steady, B at ten times the rate of A, straight on NATS (BenchmarkNoisyNeighbour)"
		printf "  %-44s %10.0f us / %.0f us\n", "A quiet p50 / p99", m[N, "a_quiet_p50_us"], m[N, "a_quiet_p99_us"]
		printf "  %-44s %10.0f us / %.0f us\n", "A with B flooding p50 / p99", m[N, "a_noisy_p50_us"], m[N, "a_noisy_p99_us"]
		printf "  %-44s %10.2fx   goal <= 2x: %s\n", "A p99 noisy / quiet", m[N, "a_p99_noisy_over_quiet"], verdict(m[N, "a_p99_noisy_over_quiet"] <= 2)
		printf "  %-44s %10.2fx\n", "A p50 noisy / quiet", m[N, "a_p50_noisy_over_quiet"]
		printf "  %-44s %10.0f accepted, %.0f refused over quota\n", "B", m[N, "b_accepted"], m[N, "b_refused"]
		printf "  %-44s %10.0f (A), %.0f (B)\n", "lost", m[N, "a_lost"], m[N, "b_lost"]
	}
	S = "BenchmarkScale"
	if (m[S, "turns/s"] != "") {
		print ""
		print "A thousand tenants on one replica (BenchmarkScale)"
		printf "  %-44s %10.1f s\n", "provisioning, every tenant end to end", m[S, "provision_s"]
		printf "  %-44s %10.2f s\n", "replica start-up, every tenant bound", m[S, "start_s"]
		printf "  %-44s %10.2f %% of a core, RSS %.0f MiB, at most %.0f tenant connections\n", "idle for a minute", m[S, "idle_cpu_pct"], m[S, "idle_rss_MiB"], m[S, "idle_peak_pg_conns"]
		printf "  %-44s %10.0f   (p50 %.0f us, p99 %.0f us)\n", "Zipf load over every tenant: turns/s", m[S, "turns/s"], m[S, "p50_us"], m[S, "p99_us"]
		printf "  %-44s %10.0f\n", "peak Postgres connections under load", m[S, "peak_pg_conns"]
		printf "  %-44s %10.0f MiB, brain CPU %.0f us per turn\n", "RSS under load", m[S, "load_rss_MiB"], m[S, "brain_cpu_us/turn"]
	}
	K = "BenchmarkClusterCost"
	if (m[K, "r1_turns/s"] != "") {
		print ""
		print "NATS: three nodes with R3 streams against one server, same run (BenchmarkClusterCost)"
		printf "  %-34s %12s %12s %10s\n", "", "R1, 1 node", "R3, 3 nodes", "R3 / R1"
		printf "  %-34s %12.0f %12.0f %9.2fx\n", "turns/s", m[K, "r1_turns/s"], m[K, "r3_turns/s"], m[K, "r3_turns/s"] / m[K, "r1_turns/s"]
		printf "  %-34s %9.0f us %9.0f us %9.2fx\n", "p50", m[K, "r1_p50_us"], m[K, "r3_p50_us"], m[K, "r3_over_r1_p50"]
		printf "  %-34s %9.0f us %9.0f us %9.2fx\n", "p99", m[K, "r1_p99_us"], m[K, "r3_p99_us"], m[K, "r3_p99_us"] / m[K, "r1_p99_us"]
		printf "  %-34s %9.0f us %9.0f us\n", "CPU per turn: brain", m[K, "r1_cpu_brain_us/turn"], m[K, "r3_cpu_brain_us/turn"]
		printf "  %-34s %9.0f us %9.0f us\n", "CPU per turn: NATS and load client", m[K, "r1_cpu_nats_load_us/turn"], m[K, "r3_cpu_nats_load_us/turn"]
		printf "  %-34s %9.0f us %9.0f us\n", "CPU per turn: Postgres", m[K, "r1_cpu_postgres_us/turn"], m[K, "r3_cpu_postgres_us/turn"]
		r1cpu = m[K, "r1_cpu_brain_us/turn"] + m[K, "r1_cpu_nats_load_us/turn"] + m[K, "r1_cpu_postgres_us/turn"]
		r3cpu = m[K, "r3_cpu_brain_us/turn"] + m[K, "r3_cpu_nats_load_us/turn"] + m[K, "r3_cpu_postgres_us/turn"]
		printf "  %-34s %9.0f us %9.0f us %9.2fx\n", "CPU per turn: all", r1cpu, r3cpu, m[K, "r3_over_r1_cpu/turn"]
	}
	if (nd == 0) { print ""; print "LangGraph baseline: not run (no node/npm, or skipped)"; exit 0 }
	for (d = 1; d <= nd; d++) {
		dur = order[d]
		sk = "sequential/" dur "/1"; ck = "concurrent" C "/" dur "/1"; pk = "concurrent" C "/" dur "/2"
		print ""
		printf "vs LangGraph.js + PostgresSaver, durability=%s%s\n", dur, dur == "async" ? " (LangGraph default)" : (dur == "exit" ? " (one checkpoint per invoke, its cheapest)" : "")
		printf "  %-30s %12s %12s %10s\n", "", "ours", "LangGraph", "ratio"
		printf "  %-30s %9.0f us %9.0f us %9.1fx lower\n", "p50 latency, 1 caller", turn, lg[sk, "p50"], lg[sk, "p50"] / turn
		printf "  %-30s %12.0f %12.1f %9.1fx   goal >= 10x: %s\n", "turns/s, 1 caller", seqtps, lg[sk, "tps"], seqtps / lg[sk, "tps"], verdict(seqtps / lg[sk, "tps"] >= 10)
		printf "  %-30s %9.0f us %9.0f us %9.1fx lower\n", "p50 latency, " C " callers", parp50, lg[ck, "p50"], lg[ck, "p50"] / parp50
		printf "  %-30s %12.0f %12.1f %9.1fx   goal >= 10x: %s\n", "turns/s, " C " callers", partps, lg[ck, "tps"], partps / lg[ck, "tps"], verdict(partps / lg[ck, "tps"] >= 10)
		if (lg[pk, "tps"] != "")
			printf "  %-30s %12.0f %12.1f %9.1fx   goal >= 10x: %s\n", "turns/s, " C " callers, 2 procs", partps, lg[pk, "tps"], partps / lg[pk, "tps"], verdict(partps / lg[pk, "tps"] >= 10)
		if (otps != "")
			printf "  %-30s %12.0f %12.1f %9.1fx   goal >= 10x: %s\n", "turns/s, " C " callers, 1 thread", otps, lg[ck, "tps"], otps / lg[ck, "tps"], verdict(otps / lg[ck, "tps"] >= 10)
	}
}
' "$OUT/go.txt" "$OUT/langgraph.jsonl" | tee "$OUT/summary.txt"
echo
echo "raw outputs: $OUT"
