package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/registry"
	"n8nbrain/subjects"
)

// Noisy neighbour (BENCHMARKS.md, tenant isolation). Tenant A submits turns
// through its edge at a steady rate; first alone (quiet), then while tenant
// B publishes straight on NATS at ten times that rate, more than the brain
// gives one tenant. Reported: A's p50/p99 in both phases and their ratios,
// B's accepted and refused (over quota) publishes, and the losses: A's
// turns not answered 200, B's accepted turns not decided once the backlog
// drained.
const (
	noisyRateA     = 50 // A's turns per second
	noisyFactor    = 10 // B's rate over A's
	noisyPhase     = 10 * time.Second
	noisyQuotaB    = 6000 // B's turn quota: below what B offers in a phase
	noisyDrainWait = 3 * time.Minute
)

func BenchmarkNoisyNeighbour(b *testing.B) {
	s := newSystem(b)
	a := s.tenant(spec("noisy-a"))
	spb := spec("noisy-b")
	spb.Quota = registry.Quota{Turns: noisyQuotaB}
	tb := s.tenant(spb)
	s.startBrain("r1", nil)
	ea := s.startEdge(a, nil)
	bjs, err := jetstream.New(s.tenantConn(tb))
	if err != nil {
		b.Fatal(err)
	}
	run := randomHex(4)
	var seq atomic.Int64

	// steadyA submits A's turns at noisyRateA for d and returns their latencies.
	steadyA := func(d time.Duration) (latencies, int) {
		var mu sync.Mutex
		var l latencies
		failed := 0
		var wg sync.WaitGroup
		tick := time.NewTicker(time.Second / noisyRateA)
		defer tick.Stop()
		end := time.After(d)
	loop:
		for {
			select {
			case <-end:
				break loop
			case <-tick.C:
			}
			wg.Go(func() {
				req := quoteEmail(fmt.Sprintf("<noisy-a-%s-%d@x>", run, seq.Add(1)))
				t0 := time.Now()
				r := ea.submit(req)
				took := time.Since(t0)
				mu.Lock()
				defer mu.Unlock()
				if r.Status != http.StatusOK {
					failed++
					return
				}
				l = append(l, took)
			})
		}
		wg.Wait()
		return l, failed
	}
	// One measurement whatever b.N: run it with -benchtime 1x (make bench does).
	{
		steadyA(time.Second) // warm-up: pools, connections
		quiet, quietFailed := steadyA(noisyPhase)

		// B floods at ten times A's rate, straight on NATS.
		var accepted, refused, other atomic.Int64
		stopB := make(chan struct{})
		var bwg sync.WaitGroup
		bwg.Go(func() {
			tick := time.NewTicker(time.Second / (noisyRateA * noisyFactor))
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-stopB:
					return
				case <-tick.C:
				}
				req := quoteEmail(fmt.Sprintf("<noisy-b-%s-%d@x>", run, i))
				payload, _ := json.Marshal(req)
				ack, err := bjs.PublishAsync(subjects.TurnLocal(subjects.TurnKey(req.WorkItemID, 1)), payload)
				if err != nil {
					other.Add(1)
					continue
				}
				go func() {
					select {
					case <-ack.Ok():
						accepted.Add(1)
					case err := <-ack.Err():
						var apiErr *jetstream.APIError
						if errors.As(err, &apiErr) && strings.Contains(apiErr.Description, "maximum messages") {
							refused.Add(1)
						} else {
							other.Add(1)
						}
					}
				}()
			}
		})
		noisy, noisyFailed := steadyA(noisyPhase)
		close(stopB)
		bwg.Wait()
		<-bjs.PublishAsyncComplete()

		// Nothing lost: every accepted B turn is decided once its backlog drains.
		dbB := s.tenantDB(tb)
		deadline := time.Now().Add(noisyDrainWait)
		decidedB := 0
		for time.Now().Before(deadline) {
			if err := dbB.QueryRow(context.Background(), `SELECT count(*) FROM decisions`).Scan(&decidedB); err != nil {
				b.Fatal(err)
			}
			if int64(decidedB) >= accepted.Load() {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		lostB := accepted.Load() - int64(decidedB)
		b.Logf("A quiet: p50 %s p99 %s (%d turns, %d not 200); A noisy: p50 %s p99 %s (%d turns, %d not 200)",
			quiet.pct(0.5), quiet.pct(0.99), len(quiet), quietFailed, noisy.pct(0.5), noisy.pct(0.99), len(noisy), noisyFailed)
		b.Logf("B: %d accepted, %d refused over quota, %d other errors; %d decided, %d lost",
			accepted.Load(), refused.Load(), other.Load(), decidedB, lostB)
		b.ReportMetric(us(quiet.pct(0.5)), "a_quiet_p50_us")
		b.ReportMetric(us(quiet.pct(0.99)), "a_quiet_p99_us")
		b.ReportMetric(us(noisy.pct(0.5)), "a_noisy_p50_us")
		b.ReportMetric(us(noisy.pct(0.99)), "a_noisy_p99_us")
		b.ReportMetric(us(noisy.pct(0.5))/us(quiet.pct(0.5)), "a_p50_noisy_over_quiet")
		b.ReportMetric(us(noisy.pct(0.99))/us(quiet.pct(0.99)), "a_p99_noisy_over_quiet")
		b.ReportMetric(float64(accepted.Load()), "b_accepted")
		b.ReportMetric(float64(refused.Load()), "b_refused")
		b.ReportMetric(float64(quietFailed+noisyFailed), "a_lost")
		b.ReportMetric(float64(lostB), "b_lost")
		if quietFailed+noisyFailed > 0 || lostB != 0 || other.Load() != 0 {
			b.Errorf("losses: A %d, B %d, B other errors %d", quietFailed+noisyFailed, lostB, other.Load())
		}
	}
}
