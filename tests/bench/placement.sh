#!/usr/bin/env bash
# What sharing the cores with Postgres costs each side (BENCHMARKS.md, "The
# runs of 2026-12-05"): BenchmarkTurnBudget, BenchmarkTurnCPU (with the dev
# stack's fsync interval and with sync_interval always) and the LangGraph
# baseline at durability exit, in three placements:
#
#   free     the scheduler puts any process on any core
#   threads  the same, with GOMAXPROCS of the Go processes at the number of
#            cores pinned gives them (the last core's worth fewer), so that
#            pinned is not credited with what fewer Go threads do alone
#   pinned   Postgres held on the last core, the benchmark's processes (the
#            Go stack, or Node) on the others
#
# The placements alternate, round after round, so all see the same machine.
#
#   BENCH_ROUNDS  rounds of each placement (default 3)
#   BENCH_N       iterations per measurement (default 2000)
#   BENCH_OUT     folder for the raw outputs (default .data/bench/placement-<UTC time>)
#   BENCH_SKIP_LANGGRAPH=1  the Go benchmarks only
#
# It moves the local cluster's processes (.data/pg) between cores with
# taskset, so it needs that cluster, at least two cores and the right to
# change the affinity of the postgres processes (root). Every core is given
# back to Postgres when it ends.
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS="${BENCH_ROUNDS:-3}"
N="${BENCH_N:-2000}"
OUT="${BENCH_OUT:-.data/bench/placement-$(date -u +%Y%m%dT%H%M%SZ)}"
CORES="$(nproc)"
die() { echo "placement.sh: $*" >&2; exit 2; }
[ "$CORES" -ge 2 ] || die "needs at least two cores, this machine has $CORES"
command -v taskset >/dev/null || die "taskset (util-linux) is not installed"
[ -z "${BRAIN_TEST_DATABASE_URL:-}" ] ||
	die "BRAIN_TEST_DATABASE_URL is set: this script moves the local cluster's processes, so unset it"
deploy/ensure-postgres.sh
eval "$(go run ./deploy/cmd/devstack pg-env -pg-port "${PG_PORT:-55432}")"
PIDFILE=.data/pg/data/postmaster.pid
[ -r "$PIDFILE" ] || die "no $PIDFILE: the local cluster is not running"
POSTMASTER="$(head -1 "$PIDFILE")"

PG_CORE=$((CORES - 1))
OWN_CORES="0-$((CORES - 2))"
ALL_CORES="0-$PG_CORE"
# pg_to CORES: the postmaster and every process it started (new backends
# inherit the postmaster's affinity).
pg_to() {
	taskset -a -p -c "$1" "$POSTMASTER" >/dev/null ||
		die "cannot set the affinity of postgres (pid $POSTMASTER): run as root"
	for p in $(pgrep -P "$POSTMASTER"); do taskset -a -p -c "$1" "$p" >/dev/null 2>&1 || true; done
}
trap 'pg_to "$ALL_CORES"' EXIT
pg_to "$ALL_CORES"

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
: >"$OUT/go.txt"
: >"$OUT/langgraph.txt"
echo "placement: $CORES cores; pinned = Postgres on core $PG_CORE, the benchmark's process on $OWN_CORES" | tee "$OUT/machine.txt"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min, before the run)" | tee -a "$OUT/machine.txt"
go test -c -o "$OUT/tests.test" ./tests/
LG=0
if [ "${BENCH_SKIP_LANGGRAPH:-}" != 1 ] && command -v node >/dev/null && command -v npm >/dev/null; then
	(cd tests/bench/langgraph && npm ci --no-audit --no-fund --loglevel=error)
	LG=1
fi

# run PLACEMENT COMMAND...: COMMAND as the placement says.
run() {
	local placement="$1"
	shift
	case "$placement" in
	threads) GOMAXPROCS="$((CORES - 1))" "$@" ;;
	pinned) taskset -c "$OWN_CORES" "$@" ;;
	*) "$@" ;;
	esac
}
go_run() { # placement
	# In the package's folder, as go test runs it (BenchmarkTurnCPU builds
	# the binaries from there).
	(cd tests && run "$1" "$OUT/tests.test" -test.run '^$' -test.bench '^BenchmarkTurnBudget$' -test.benchtime "${N}x") |
		sed "s/^BenchmarkTurnBudget/$1 BenchmarkTurnBudget/" | tee -a "$OUT/go.txt"
	# The brain and the edge as the binaries, each a process of its own
	# (they inherit the placement), with each fsync setting.
	for sync in 0 1; do
		(cd tests && BENCH_N="$N" BENCH_SYNC_ALWAYS="$sync" run "$1" "$OUT/tests.test" -test.run '^$' -test.bench '^BenchmarkTurnCPU$' -test.benchtime 1x) |
			sed "s/^BenchmarkTurnCPU/$1 BenchmarkTurnCPU$([ $sync = 1 ] && echo Sync)/" | tee -a "$OUT/go.txt"
	done
}
lg_run() { # placement; Node runs one thread of JavaScript whatever GOMAXPROCS says
	LG_DURABILITY=exit LG_PROCS=1 BENCH_N="$N" BENCH_CONCURRENCY=16 run "$1" node tests/bench/langgraph/bench.mjs |
		grep '"mode"' | sed "s/^/$1 /" | tee -a "$OUT/langgraph.txt"
}
for r in $(seq "$ROUNDS"); do
	for placement in free threads pinned; do
		echo "== round $r, $placement"
		if [ "$placement" = pinned ]; then pg_to "$PG_CORE"; else pg_to "$ALL_CORES"; fi
		go_run "$placement"
		if [ "$LG" = 1 ] && [ "$placement" != threads ]; then lg_run "$placement"; fi
	done
done
pg_to "$ALL_CORES"

echo
awk '
function median(k,   n, i, j, t, a) {
	n = cnt[k]; if (n == 0) return 0
	for (i = 1; i <= n; i++) a[i] = v[k, i]
	for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function add(k, x) { v[k, ++cnt[k]] = x }
function num(s, key,   r) {
	if (!match(s, "\"" key "\":[0-9.]+")) return ""
	r = substr(s, RSTART, RLENGTH); sub(/.*:/, "", r); return r + 0
}
# "name-GOMAXPROCS", or "name" alone when GOMAXPROCS is 1 (pinned to one core)
function is(name, want) { sub(/-[0-9]+$/, "", name); return name == want }
function metric(unit, key,   i) { for (i = 4; i < NF; i++) if ($(i + 1) == unit) add($1 " " key, $i) }
FILENAME ~ /go.txt$/ && is($2, "BenchmarkTurnBudget/4_turn_http") { metric("turn_over_floor", "ratio") }
FILENAME ~ /go.txt$/ && is($2, "BenchmarkTurnBudget/5_turn_http_parallel16") { metric("turns/s", "tps16") }
FILENAME ~ /go.txt$/ && is($2, "BenchmarkTurnCPU") {
	metric("c1_turn_over_floor", "cpu_ratio"); metric("c16_turns/s", "cpu_tps16"); metric("c16_cpu_total_us", "cpu_total16")
	metric("c16_cpu_postgres_us", "cpu_pg16")
}
FILENAME ~ /go.txt$/ && is($2, "BenchmarkTurnCPUSync") { metric("c1_turn_over_floor", "sync_ratio"); metric("c16_turns/s", "sync_tps16") }
FILENAME ~ /langgraph.txt$/ && /"concurrent16"/ { add($1 " lg16", num($0, "turns_per_s")) }
FILENAME ~ /langgraph.txt$/ && /"sequential"/ { add($1 " lg1", num($0, "turns_per_s")) }
END {
	printf "medians of %d rounds; free = the scheduler places every process; threads = free, GOMAXPROCS %d;\n", cnt["free tps16"], cores - 1
	printf "pinned = Postgres on a core of its own, the rest on the others\n\n"
	printf "  %-42s %10s %10s %10s %12s %14s\n", "", "free", "threads", "pinned", "pinned/free", "pinned/threads"
	row("ours: turn p50 / floor", "ratio", "%9.2fx")
	row("ours: turns/s, 16 callers", "tps16", "%9.0f ")
	print "  processes of their own (BenchmarkTurnCPU), dev stack fsync:"
	row("  turn p50 / floor, 1 caller", "cpu_ratio", "%9.2fx")
	row("  turns/s, 16 callers", "cpu_tps16", "%9.0f ")
	row("  CPU per turn, all processes, 16 callers", "cpu_total16", "%7.0fus ")
	row("  of it Postgres", "cpu_pg16", "%7.0fus ")
	print "  the same, sync_interval always (production):"
	row("  turn p50 / floor, 1 caller", "sync_ratio", "%9.2fx")
	row("  turns/s, 16 callers", "sync_tps16", "%9.0f ")
	if (cnt["free lg16"]) {
		row("LangGraph exit: turns/s, 16 callers", "lg16", "%9.1f ")
		row("LangGraph exit: turns/s, 1 caller", "lg1", "%9.1f ")
		of = median("free tps16"); op = median("pinned tps16"); lf = median("free lg16"); lp = median("pinned lg16")
		best = lf > lp ? lf : lp
		printf "\n  ours / LangGraph exit, 16 callers: free %.1fx, pinned %.1fx; ours pinned / LangGraph at its better placement %.1fx (goal >= 10x)\n", of / lf, op / lp, op / best
	}
}
function row(label, k, f) {
	printf "  %-42s %s %s %s %s %s\n", label, cell(f, "free " k), cell(f, "threads " k), cell(f, "pinned " k),
		ratio(11, "pinned " k, "free " k), ratio(13, "pinned " k, "threads " k)
}
# cell(FORMAT, KEY): the median of KEY, or a dash where nothing was measured.
function cell(f, k) { return cnt[k] ? sprintf(f, median(k)) : sprintf("%9s ", "-") }
function ratio(w, a, b) { return cnt[a] && cnt[b] && median(b) ? sprintf("%" w ".2fx", median(a) / median(b)) : sprintf("%" w "s ", "-") }
' cores="$CORES" "$OUT/go.txt" "$OUT/langgraph.txt" | tee "$OUT/summary.txt"
