package tests

// Scale benchmarks (BENCHMARKS.md, "A thousand tenants"). They run only with
// -bench; each does one measurement whatever b.N (use -benchtime 1x).
//
//   BenchmarkScale        provisions BENCH_TENANTS (1,000) tenants, runs a
//                         brain replica as its own process, measures its
//                         start, a minute of idling (CPU, RSS, connections),
//                         then a Zipf-skewed load over every tenant.
//   BenchmarkClusterCost  the same turn load, spread over BENCH_CLUSTER_TENANTS
//                         (8) tenants, on one NATS server and on a three-node
//                         cluster with R3 streams, in one run: latency,
//                         turns/s and CPU per turn (the brain as a process of
//                         its own).

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/deploy/devstack"
	"n8nbrain/registry"
	"n8nbrain/subjects"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// brainProcess is a brain replica running as its own process (the real
// binary), so its CPU and memory are its own.
type brainProcess struct {
	cmd     *exec.Cmd
	metrics string
}

func startBrainProcess(b *testing.B, s *system, replica string, extraEnv ...string) *brainProcess {
	b.Helper()
	return startBrainBinary(b, s, buildBrain(b), replica, extraEnv...)
}

// buildBinary builds one of the system's commands (before anything is
// timed), e.g. "../brain/cmd/brain".
func buildBinary(tb testing.TB, pkg string) string {
	tb.Helper()
	bin := filepath.Join(tb.TempDir(), filepath.Base(pkg))
	if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		tb.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// buildBrain builds the brain binary (before anything is timed).
func buildBrain(b *testing.B) string { return buildBinary(b, "../brain/cmd/brain") }

// brainEnv is the environment of a brain binary running as replica of s,
// its ops endpoints on opsAddr.
func brainEnv(tb testing.TB, s *system, replica, opsAddr string) []string {
	tb.Helper()
	cfg := s.stack.BrainConfig(replica)
	keyFile := filepath.Join(tb.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte(fmt.Sprintf("%x", cfg.SealingKey)), 0o600); err != nil {
		tb.Fatal(err)
	}
	return append(os.Environ(), "BRAIN_NATS_URL="+cfg.NATSURL, "BRAIN_NATS_CREDS="+cfg.CredsFile,
		"BRAIN_REGISTRY_URL="+cfg.RegistryURL, "BRAIN_SEALING_KEY_FILE="+keyFile, "BRAIN_REPLICA="+replica,
		"BRAIN_OPS_ADDR="+opsAddr, "BRAIN_LOG_LEVEL=warn", "BRAIN_DB_SSLMODE="+cfg.DBSSLMode)
}

// startBrainBinary runs the brain binary bin as a replica of s.
func startBrainBinary(b *testing.B, s *system, bin, replica string, extraEnv ...string) *brainProcess {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin)
	cmd.Env = append(brainEnv(b, s, replica, addr), extraEnv...)
	logf, err := os.Create(filepath.Join(b.TempDir(), "brain.log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		logf.Close()
	})
	return &brainProcess{cmd: cmd, metrics: "http://" + addr}
}

// cpu is the process's user+system time.
func (p *brainProcess) cpu() time.Duration { return procCPU(p.cmd.Process.Pid) }

// rssMiB is the process's resident set (/proc).
func (p *brainProcess) rssMiB(b *testing.B) float64 {
	b.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// brainConns counts the brain's sessions on the tenant databases, on one
// admin connection of the caller's (a new one per sample would exhaust
// max_connections within a minute of sampling).
func brainConns(b *testing.B, admin *pgx.Conn) int {
	var n int
	if err := admin.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = 'brain'`).Scan(&n); err != nil {
		b.Error(err)
	}
	return n
}

// natsLoad submits turns straight over each tenant's own NATS connection
// (publish through its import, wait for the live reply): callers at once,
// total turns, tenants chosen by pick. It returns the latencies and turns/s.
func natsLoad(b *testing.B, conns []*nats.Conn, callers, total int, pick func(r *rand.Rand) int) (latencies, float64) {
	b.Helper()
	type tenantConn struct {
		js      jetstream.JetStream
		mu      sync.Mutex
		waiters map[string]chan struct{}
	}
	tcs := make([]*tenantConn, len(conns))
	for i, nc := range conns {
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		tc := &tenantConn{js: js, waiters: map[string]chan struct{}{}}
		if _, err := nc.Subscribe(subjects.LocalReply+">", func(m *nats.Msg) {
			key, _ := subjects.ParseReplyLocal(m.Subject)
			tc.mu.Lock()
			ch := tc.waiters[key]
			tc.mu.Unlock()
			if ch != nil {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		}); err != nil {
			b.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			b.Fatal(err)
		}
		tcs[i] = tc
	}
	run := randomHex(4)
	var seq atomic.Int64
	var mu sync.Mutex
	var all latencies
	var failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for c := range callers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(c), 42))
			for seq.Add(1) <= int64(total) {
				tc := tcs[pick(r)]
				id := fmt.Sprintf("<scale-%s-%d-%d@x>", run, c, seq.Load())
				key := subjects.TurnKey(id, 1)
				payload, _ := json.Marshal(quoteEmail(id))
				ch := make(chan struct{}, 1)
				tc.mu.Lock()
				tc.waiters[key] = ch
				tc.mu.Unlock()
				t0 := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				_, err := tc.js.Publish(ctx, subjects.TurnLocal(key), payload, jetstream.WithMsgID(key))
				if err == nil {
					select {
					case <-ch:
					case <-ctx.Done():
						err = ctx.Err()
					}
				}
				cancel()
				tc.mu.Lock()
				delete(tc.waiters, key)
				tc.mu.Unlock()
				if err != nil {
					failed.Add(1)
					continue
				}
				mu.Lock()
				all = append(all, time.Since(t0))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		b.Errorf("%d turns failed", f)
	}
	return all, float64(len(all)) / time.Since(start).Seconds()
}

func BenchmarkScale(b *testing.B) {
	n := envInt("BENCH_TENANTS", 1000)
	s := newSystem(b)
	// Provisioning: n tenants end to end (NATS account, database, roles,
	// grants, migrations, registry row, streams), one after the other.
	t0 := time.Now()
	tenants := make([]*devstack.Tenant, n)
	for i := range n {
		sp := spec(fmt.Sprintf("scale-%04d", i))
		sp.Quota = registry.Quota{Turns: 1_000_000}
		tenants[i] = s.tenant(sp)
	}
	provisioned := time.Since(t0)
	b.Logf("provisioned %d tenants in %s (%s each)", n, provisioned, provisioned/time.Duration(n))

	bin := buildBrain(b) // not part of the start-up time
	t0 = time.Now()
	p := startBrainBinary(b, s, bin, "scale-1", "BRAIN_DB_IDLE_TIMEOUT=20s")
	eventually2(b, 5*time.Minute, func() bool { return metricFrom(p.metrics, "brain_tenants_consumed") == float64(n) })
	started := time.Since(t0)
	b.Logf("a replica bound %d tenants in %s", n, started)

	// A minute of idling.
	time.Sleep(5 * time.Second) // settle after start
	// One admin connection samples the brain's sessions: the idle loop's,
	// then the load sampler's.
	admin := s.adminConn("postgres")
	cpu0, wall0 := p.cpu(), time.Now()
	peakIdleConns := 0
	for time.Since(wall0) < time.Minute {
		peakIdleConns = max(peakIdleConns, brainConns(b, admin))
		time.Sleep(time.Second)
	}
	idleCPU := float64(p.cpu()-cpu0) / float64(time.Since(wall0)) * 100
	idleRSS := p.rssMiB(b)
	b.Logf("idle for a minute: %.2f%% of a core, RSS %.0f MiB, at most %d tenant connections", idleCPU, idleRSS, peakIdleConns)

	// A Zipf-skewed load over every tenant.
	conns := make([]*nats.Conn, n)
	for i, tn := range tenants {
		conns[i] = s.tenantConn(tn)
	}
	var peakConns atomic.Int64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if c := int64(brainConns(b, admin)); c > peakConns.Load() {
				peakConns.Store(c)
			}
		}
	})
	total := envInt("BENCH_SCALE_TURNS", 20_000)
	cpu0 = p.cpu()
	lat, tps := natsLoad(b, conns, 16, total, func(r *rand.Rand) int {
		z := rand.NewZipf(r, 1.1, 1, uint64(n-1))
		return int(z.Uint64())
	})
	loadCPU := p.cpu() - cpu0
	close(stop)
	sampler.Wait()
	loadRSS := p.rssMiB(b)
	b.Logf("Zipf load: %d turns at %.0f/s, p50 %s p99 %s, peak %d tenant connections, RSS %.0f MiB, brain CPU %s per turn",
		len(lat), tps, lat.pct(0.5), lat.pct(0.99), peakConns.Load(), loadRSS, loadCPU/time.Duration(max(len(lat), 1)))
	b.ReportMetric(provisioned.Seconds(), "provision_s")
	b.ReportMetric(started.Seconds(), "start_s")
	b.ReportMetric(idleCPU, "idle_cpu_pct")
	b.ReportMetric(idleRSS, "idle_rss_MiB")
	b.ReportMetric(float64(peakIdleConns), "idle_peak_pg_conns")
	b.ReportMetric(tps, "turns/s")
	b.ReportMetric(us(lat.pct(0.5)), "p50_us")
	b.ReportMetric(us(lat.pct(0.99)), "p99_us")
	b.ReportMetric(float64(peakConns.Load()), "peak_pg_conns")
	b.ReportMetric(loadRSS, "load_rss_MiB")
	b.ReportMetric(us(loadCPU/time.Duration(max(len(lat), 1))), "brain_cpu_us/turn")
}

func BenchmarkClusterCost(b *testing.B) {
	total := envInt("BENCH_CLUSTER_TURNS", 5000)
	nTenants := envInt("BENCH_CLUSTER_TENANTS", 8)
	bin := buildBrain(b)
	type run struct {
		lat latencies
		tps float64
		// CPU per turn: the brain (a process of its own), the test process
		// (the NATS servers, all nodes, and the load client), Postgres.
		brain, test, pg time.Duration
	}
	measure := func(nodes int) run {
		s := newSystemWith(b, func(c *devstack.Config) { c.NATSNodes = nodes })
		var conns []*nats.Conn
		for i := range nTenants {
			sp := spec(fmt.Sprintf("cost-r%d-%d", nodes, i))
			sp.Quota = registry.Quota{Turns: 1_000_000}
			conns = append(conns, s.tenantConn(s.tenant(sp)))
		}
		p := startBrainBinary(b, s, bin, "r1")
		eventually2(b, time.Minute, func() bool { return metricFrom(p.metrics, "brain_tenants_consumed") == float64(nTenants) })
		spread := func(r *rand.Rand) int { return r.IntN(len(conns)) }
		natsLoad(b, conns, 16, 200, spread) // warm-up
		cpu := func() (brain, test, pg time.Duration) {
			return p.cpu(), procCPU(os.Getpid()), sumCPU(postgresPIDs(b, s))
		}
		b0, t0, pg0 := cpu()
		lat, tps := natsLoad(b, conns, 16, total, spread)
		b1, t1, pg1 := cpu()
		per := time.Duration(max(len(lat), 1))
		return run{lat: lat, tps: tps, brain: (b1 - b0) / per, test: (t1 - t0) / per, pg: (pg1 - pg0) / per}
	}
	r1, r3 := measure(1), measure(3)
	for _, r := range []struct {
		name string
		run
	}{{"R1 on one server", r1}, {"R3 on three", r3}} {
		b.Logf("%s, %d tenants: %.0f turns/s, p50 %s p99 %s; CPU per turn: brain %.0f µs, NATS and load client %.0f µs, Postgres %.0f µs",
			r.name, nTenants, r.tps, r.lat.pct(0.5), r.lat.pct(0.99), us(r.brain), us(r.test), us(r.pg))
	}
	b.ReportMetric(r1.tps, "r1_turns/s")
	b.ReportMetric(r3.tps, "r3_turns/s")
	b.ReportMetric(us(r1.lat.pct(0.5)), "r1_p50_us")
	b.ReportMetric(us(r3.lat.pct(0.5)), "r3_p50_us")
	b.ReportMetric(us(r1.lat.pct(0.99)), "r1_p99_us")
	b.ReportMetric(us(r3.lat.pct(0.99)), "r3_p99_us")
	b.ReportMetric(us(r3.lat.pct(0.5))/us(r1.lat.pct(0.5)), "r3_over_r1_p50")
	b.ReportMetric(r1.tps/r3.tps, "r1_over_r3_turns/s")
	b.ReportMetric(us(r1.brain), "r1_cpu_brain_us/turn")
	b.ReportMetric(us(r3.brain), "r3_cpu_brain_us/turn")
	b.ReportMetric(us(r1.test), "r1_cpu_nats_load_us/turn")
	b.ReportMetric(us(r3.test), "r3_cpu_nats_load_us/turn")
	b.ReportMetric(us(r1.pg), "r1_cpu_postgres_us/turn")
	b.ReportMetric(us(r3.pg), "r3_cpu_postgres_us/turn")
	b.ReportMetric(us(r3.brain+r3.test+r3.pg)/us(r1.brain+r1.test+r1.pg), "r3_over_r1_cpu/turn")
}

// eventually2 is eventually for a benchmark.
func eventually2(b *testing.B, within time.Duration, cond func() bool) {
	b.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatalf("timed out after %s", within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metricFrom reads one sample from a /metrics URL (0 when absent or down).
func metricFrom(url, sample string) float64 {
	res, err := httpGet(url + "/metrics")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(res, "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

func httpGet(url string) (string, error) {
	res, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return string(b), err
}
