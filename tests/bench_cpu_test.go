package tests

// BenchmarkTurnCPU (BENCHMARKS.md, "Where a turn's CPU goes"): the brain and
// the edge run as their own processes (the real binaries), the load comes
// from a third (tests/bench/turnload), and NATS runs embedded in this one,
// so each one's CPU is read from /proc: brain, edge, nats-server (this
// process, idle but for it), the Postgres backends of the brain's sessions,
// and all of Postgres (its WAL writer and checkpointer included). The floor
// (a JetStream round trip through the imports, a Postgres commit) is
// measured in the same run, under the same NATS durability:
// BENCH_SYNC_ALWAYS=1 is the production setting (fsync before each PubAck),
// unset is the development stack's. BENCH_REPLICAS brain replicas (1).
// One measurement whatever b.N: run it with -benchtime 1x.

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/deploy/devstack"
	"n8nbrain/registry"
)

// procCPU is a process's user+system CPU from /proc (USER_HZ = 100); 0
// once it has exited.
func procCPU(pid int) time.Duration {
	return time.Duration(procField(pid, 11)+procField(pid, 12)) * 10 * time.Millisecond
}

// postgresPIDs lists the postmaster and its children: every process of
// the cluster, the brain's backends among them.
func postgresPIDs(b *testing.B, s *system) []int {
	b.Helper()
	var backend int
	if err := s.adminConn("postgres").QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		b.Fatal(err)
	}
	postmaster := procField(backend, 1)
	all := []int{postmaster}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid != postmaster && procField(pid, 1) == postmaster {
			all = append(all, pid)
		}
	}
	return all
}

// procField is field i (0-based, after the command) of /proc/pid/stat.
func procField(pid, i int) int {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(raw)
	v, _ := strconv.Atoi(strings.Fields(s[strings.LastIndexByte(s, ')')+2:])[i])
	return v
}

// sumCPU adds the CPU of pids; a process that has exited counts 0.
func sumCPU(pids []int) time.Duration {
	var d time.Duration
	for _, p := range pids {
		d += procCPU(p)
	}
	return d
}

// maxProcsEnv is GOMAXPROCS for one of the benchmark's processes (EDGE,
// BRAIN, LOAD) from BENCH_GOMAXPROCS_<which>, or nothing (the binary's
// default: one thread for the edge, one per core for the others).
func maxProcsEnv(which string) []string {
	if v := envInt("BENCH_GOMAXPROCS_"+which, 0); v > 0 {
		return []string{"GOMAXPROCS=" + strconv.Itoa(v)}
	}
	return nil
}

type loadResult struct {
	Turns     int     `json:"turns"`
	Errors    int     `json:"errors"`
	TurnsPerS float64 `json:"turns_per_s"`
	P50       float64 `json:"p50_us"`
	P90       float64 `json:"p90_us"`
	P99       float64 `json:"p99_us"`
}

func BenchmarkTurnCPU(b *testing.B) {
	syncAlways := os.Getenv("BENCH_SYNC_ALWAYS") == "1"
	replicas := envInt("BENCH_REPLICAS", 1)
	n := envInt("BENCH_N", 2000)
	if v := envInt("BENCH_GOMAXPROCS_NATS", 0); v > 0 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(v))
	}
	// The brain's and the edge's log level: warn by default, so that the
	// figures are the turn's own; info is what they run with by default
	// (a line per turn each, to a file here).
	logLevel := cmp.Or(os.Getenv("BENCH_LOG_LEVEL"), "warn")
	s := newSystemWith(b, func(c *devstack.Config) { c.SyncAlways = syncAlways })
	sp := spec("cpu")
	sp.Quota = registry.Quota{Turns: 10_000_000, Bytes: 64 << 30}
	tn := s.tenant(sp)

	// The floor, under this run's durability.
	bs := &benchStack{s: s, tn: tn, nc: s.tenantConn(tn), run: randomHex(4)}
	var err error
	if bs.js, err = jetstream.New(bs.nc); err != nil {
		b.Fatal(err)
	}
	js := measureN(b, bs.jetStreamFloor(), 500)
	pg := measureN(b, postgresFloor(bs, bs.tenantPool(b)), 500)
	bs.purgeTurns(b)
	floor := us(js.pct(0.5)) + us(pg.pct(0.5))

	dir := b.TempDir()
	build := func(pkg, name string) string {
		bin := filepath.Join(dir, name)
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			b.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
		return bin
	}
	edgeBin, loadBin := build("../edge/cmd/edge", "edge"), build("./bench/turnload", "turnload")
	var brains []*brainProcess
	for i := range replicas {
		brains = append(brains, startBrainProcess(b, s, fmt.Sprintf("cpu-%d", i+1), append(maxProcsEnv("BRAIN"), "BRAIN_LOG_LEVEL="+logLevel)...))
	}
	// Every turn proposes a reply, so every turn writes an
	// approval_requested event: n8n's webhook (a process of its own)
	// accepts them, and the edge acknowledges each to the brain, as in
	// production.
	hookAddr := freeAddr(b)
	hook := exec.Command(loadBin, "-events", hookAddr)
	hook.Env = append(os.Environ(), maxProcsEnv("LOAD")...)
	if err := hook.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = hook.Process.Kill(); _ = hook.Wait() })
	edgeAddr := freeAddr(b)
	ecfg := s.stack.EdgeConfig(tn)
	edge := exec.Command(edgeBin)
	edgeLog, err := os.Create(filepath.Join(dir, "edge.log"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = edgeLog.Close() }) // after the edge's own cleanup below
	edge.Stdout, edge.Stderr = edgeLog, edgeLog
	edge.Env = append(os.Environ(), "EDGE_NATS_URL="+ecfg.NATSURL, "EDGE_NATS_CREDS="+ecfg.CredsFile, "EDGE_TOKEN="+ecfg.Token,
		"EDGE_ADDR="+edgeAddr, "EDGE_TENANT_ID=cpu", "EDGE_LOG_LEVEL="+logLevel,
		"EDGE_WEBHOOK_URL=http://"+hookAddr+"/webhook/brain-events", "EDGE_WEBHOOK_SECRET=bench-webhook-secret-0123456789")
	edge.Env = append(edge.Env, maxProcsEnv("EDGE")...) // last, so that it wins over the environment's GOMAXPROCS
	if err := edge.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = edge.Process.Signal(os.Interrupt); _ = edge.Wait() })
	eventually2(b, time.Minute, func() bool {
		out, err := httpGet("http://" + edgeAddr + "/readyz")
		return err == nil && strings.Contains(out, "ready")
	})

	// The processes measured, by name; Postgres is every process of the
	// cluster (its WAL writer and checkpointer too), listed anew around
	// each load: a backend that started meanwhile counts from 0, which
	// the warm-up load below keeps rare (the brain's pools stay open).
	cpu := func() map[string]time.Duration {
		m := map[string]time.Duration{"edge": procCPU(edge.Process.Pid), "nats (in the test process)": procCPU(os.Getpid()),
			"postgres (all)": sumCPU(postgresPIDs(b, s))}
		for _, br := range brains {
			m["brain"] += br.cpu()
		}
		return m
	}
	load := func(callers, turns int) (loadResult, map[string]time.Duration) {
		cmd := exec.Command(loadBin, "-url", "http://"+edgeAddr, "-token", ecfg.Token, "-callers", strconv.Itoa(callers),
			"-n", strconv.Itoa(turns), "-warmup", "0", "-run", randomHex(4))
		cmd.Stderr = os.Stderr
		cmd.Env = append(os.Environ(), maxProcsEnv("LOAD")...)
		before := cpu()
		out, err := cmd.Output()
		after := cpu()
		if err != nil {
			b.Fatalf("turnload: %v", err)
		}
		var r loadResult
		if err := json.Unmarshal(out, &r); err != nil {
			b.Fatalf("turnload said %s", out)
		}
		per := map[string]time.Duration{}
		for k, v := range after {
			per[k] = (v - before[k]) / time.Duration(max(r.Turns, 1))
		}
		return r, per
	}
	load(16, 400) // warm-up: connections, pools, prepared statements
	durability := "2m fsync interval (dev stack)"
	if syncAlways {
		durability = "sync_interval always (production)"
	}
	for _, callers := range []int{1, 16} {
		r, per := load(callers, n)
		if r.Errors > 0 {
			b.Errorf("%d callers: %d turns failed", callers, r.Errors)
		}
		var total time.Duration
		var parts []string
		for _, k := range []string{"edge", "brain", "nats (in the test process)", "postgres (all)"} {
			total += per[k]
			parts = append(parts, fmt.Sprintf("%s %.0f µs", k, us(per[k])))
		}
		b.Logf("%s, %d brain replica(s), %d caller(s): %.0f turns/s, p50 %.0f µs (%.2f× the floor of %.0f µs: JetStream %.0f + Postgres %.0f), p99 %.0f µs; CPU per turn %.0f µs: %s",
			durability, replicas, callers, r.TurnsPerS, r.P50, r.P50/floor, floor, us(js.pct(0.5)), us(pg.pct(0.5)), r.P99, us(total),
			strings.Join(parts, ", "))
		pfx := fmt.Sprintf("c%d_", callers)
		b.ReportMetric(r.TurnsPerS, pfx+"turns/s")
		b.ReportMetric(r.P50, pfx+"p50_us")
		b.ReportMetric(r.P99, pfx+"p99_us")
		b.ReportMetric(r.P50/floor, pfx+"turn_over_floor")
		b.ReportMetric(us(per["edge"]), pfx+"cpu_edge_us")
		b.ReportMetric(us(per["brain"]), pfx+"cpu_brain_us")
		b.ReportMetric(us(per["nats (in the test process)"]), pfx+"cpu_nats_us")
		b.ReportMetric(us(per["postgres (all)"]), pfx+"cpu_postgres_us")
		b.ReportMetric(us(total), pfx+"cpu_total_us")
	}
	b.ReportMetric(floor, "floor_us")
	// Nothing was lost on the way to n8n: every event was acknowledged.
	db := s.tenantDB(tn)
	eventually2(b, time.Minute, func() bool {
		var undelivered int
		err := db.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE delivered_at IS NULL`).Scan(&undelivered)
		return err == nil && undelivered == 0
	})
}

// freeAddr is a loopback address nothing listens on yet.
func freeAddr(b testing.TB) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// measureN runs o warm-up times untimed, then n times, sequentially.
func measureN(b *testing.B, o op, n int) latencies {
	b.Helper()
	ctx := context.Background()
	for range benchWarmup {
		if _, err := o(ctx); err != nil {
			b.Fatalf("warm-up: %v", err)
		}
	}
	var l latencies
	for range n {
		d, err := o(ctx)
		if err != nil {
			b.Fatal(err)
		}
		l = append(l, d)
	}
	return l
}
