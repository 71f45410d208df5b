package tests

// Scale benchmarks (BENCHMARKS.md, "A thousand tenants"). They run only with
// -bench; each does one measurement whatever b.N (use -benchtime 1x).
//
//   BenchmarkScale        provisions BENCH_TENANTS (1,000) tenants, runs a
//                         brain replica as its own process, measures its
//                         start, a minute of idling (CPU, RSS, connections),
//                         then a Zipf-skewed load over every tenant.
//   BenchmarkClusterCost  the same turn load on one NATS server and on a
//                         three-node cluster with R3 streams, in one run.

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
	bin := filepath.Join(b.TempDir(), "brain")
	if out, err := exec.Command("go", "build", "-o", bin, "../brain/cmd/brain").CombinedOutput(); err != nil {
		b.Fatalf("build the brain: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := s.stack.BrainConfig(replica)
	keyFile := filepath.Join(b.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte(fmt.Sprintf("%x", cfg.SealingKey)), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "BRAIN_NATS_URL="+cfg.NATSURL, "BRAIN_NATS_CREDS="+cfg.CredsFile,
		"BRAIN_REGISTRY_URL="+cfg.RegistryURL, "BRAIN_SEALING_KEY_FILE="+keyFile, "BRAIN_REPLICA="+replica,
		"BRAIN_OPS_ADDR="+addr, "BRAIN_LOG_LEVEL=warn")
	cmd.Env = append(cmd.Env, extraEnv...)
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

// brainConns counts the brain's sessions on the tenant databases.
func brainConns(b *testing.B, s *system) int {
	var n int
	if err := s.adminConn("postgres").QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = 'brain'`).Scan(&n); err != nil {
		b.Fatal(err)
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

	t0 = time.Now()
	p := startBrainProcess(b, s, "scale-1", "BRAIN_DB_IDLE_TIMEOUT=20s")
	eventually2(b, 5*time.Minute, func() bool { return metricFrom(p.metrics, "brain_tenants_consumed") == float64(n) })
	started := time.Since(t0)
	b.Logf("a replica bound %d tenants in %s", n, started)

	// A minute of idling.
	time.Sleep(5 * time.Second) // settle after start
	cpu0, wall0 := p.cpu(), time.Now()
	peakIdleConns := 0
	for time.Since(wall0) < time.Minute {
		peakIdleConns = max(peakIdleConns, brainConns(b, s))
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
			if c := int64(brainConns(b, s)); c > peakConns.Load() {
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
	b.ReportMetric(tps, "turns/s")
	b.ReportMetric(us(lat.pct(0.5)), "p50_us")
	b.ReportMetric(us(lat.pct(0.99)), "p99_us")
	b.ReportMetric(float64(peakConns.Load()), "peak_pg_conns")
	b.ReportMetric(loadRSS, "load_rss_MiB")
	b.ReportMetric(us(loadCPU/time.Duration(max(len(lat), 1))), "brain_cpu_us/turn")
}

func BenchmarkClusterCost(b *testing.B) {
	total := envInt("BENCH_CLUSTER_TURNS", 5000)
	measure := func(nodes int) (latencies, float64) {
		s := newSystemWith(b, func(c *devstack.Config) { c.NATSNodes = nodes })
		sp := spec(fmt.Sprintf("cost-r%d", nodes))
		sp.Quota = registry.Quota{Turns: 1_000_000}
		tn := s.tenant(sp)
		s.startBrain("r1", nil)
		conns := []*nats.Conn{s.tenantConn(tn)}
		natsLoad(b, conns, 16, 200, func(*rand.Rand) int { return 0 }) // warm-up
		return natsLoad(b, conns, 16, total, func(*rand.Rand) int { return 0 })
	}
	l1, tps1 := measure(1)
	l3, tps3 := measure(3)
	b.Logf("R1 on one server: %.0f turns/s, p50 %s p99 %s; R3 on three: %.0f turns/s, p50 %s p99 %s",
		tps1, l1.pct(0.5), l1.pct(0.99), tps3, l3.pct(0.5), l3.pct(0.99))
	b.ReportMetric(tps1, "r1_turns/s")
	b.ReportMetric(tps3, "r3_turns/s")
	b.ReportMetric(us(l1.pct(0.5)), "r1_p50_us")
	b.ReportMetric(us(l3.pct(0.5)), "r3_p50_us")
	b.ReportMetric(us(l3.pct(0.5))/us(l1.pct(0.5)), "r3_over_r1_p50")
	b.ReportMetric(tps1/tps3, "r1_over_r3_turns/s")
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
