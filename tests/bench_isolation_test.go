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
	"n8nbrain/wire"
)

// Noisy neighbour (BENCHMARKS.md, tenant isolation). Tenant A submits turns
// through its edge at a steady rate; first alone (quiet), then while tenant
// B publishes straight on NATS at ten times that rate, more than the brain
// gives one tenant, until four fifths into the phase B reaches its turn
// quota and the server refuses the rest. Reported: A's p50/p99 in both
// phases and their ratios, B's accepted and refused (over quota) publishes,
// and the losses: A's turns not answered 200, B's accepted turns not decided
// (or decided more than once) once the backlog drained. A refused turn is
// not a loss: B was told (and its edge answers 429 tenant_quota_exceeded).
const (
	noisyRateA  = 50 // A's turns per second
	noisyFactor = 10 // B's rate over A's
	noisyPhase  = 10 * time.Second
	// noisyOfferB is what B publishes in the phase, on a fixed schedule (a
	// publish that is late goes at once, none is skipped), so B offers the
	// same on a loaded machine as on a quiet one.
	noisyOfferB = noisyRateA * noisyFactor * int(noisyPhase/time.Second)
	// noisyQuotaB is B's turn quota, four fifths of its offer: B's backlog
	// loads the brain through the phase and its last fifth is refused.
	noisyQuotaB    = noisyOfferB * 4 / 5
	noisyDrainWait = 3 * time.Minute
)

func BenchmarkNoisyNeighbour(b *testing.B) {
	s := newSystem(b)
	a := s.tenant(spec("noisy-a"))
	spb := spec("noisy-b")
	spb.Quota = registry.Quota{Turns: int64(noisyQuotaB)}
	tb := s.tenant(spb)
	s.startBrain("r1", benchTenantLimits)
	ea, eb := s.startEdge(a, nil), s.startEdge(tb, nil)
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
		var futures []jetstream.PubAckFuture
		other := 0
		stopB := make(chan struct{})
		var bwg sync.WaitGroup
		bwg.Go(func() {
			every := time.Second / (noisyRateA * noisyFactor)
			start := time.Now()
			wait := time.NewTimer(0)
			defer wait.Stop()
			for i := range noisyOfferB {
				wait.Reset(time.Until(start.Add(time.Duration(i) * every)))
				select {
				case <-stopB:
					return
				case <-wait.C:
				}
				req := quoteEmail(fmt.Sprintf("<noisy-b-%s-%d@x>", run, i))
				payload, _ := json.Marshal(req)
				f, err := bjs.PublishAsync(subjects.TurnLocal(subjects.TurnKey(req.WorkItemID, 1)), payload)
				if err != nil {
					other++
					continue
				}
				futures = append(futures, f)
			}
		})
		noisy, noisyFailed := steadyA(noisyPhase)
		close(stopB)
		bwg.Wait()
		select {
		case <-bjs.PublishAsyncComplete():
		case <-time.After(time.Minute):
			b.Fatal("B's publishes were not all answered within a minute")
		}
		// Every future is answered now: a PubAck, or the server's refusal.
		accepted, refused := 0, 0
		for _, f := range futures {
			select {
			case <-f.Ok():
				accepted++
			case err := <-f.Err():
				var apiErr *jetstream.APIError
				if errors.As(err, &apiErr) && apiErr.ErrorCode == 10077 && strings.Contains(apiErr.Description, "maximum messages") {
					refused++
				} else {
					other++
				}
			}
		}

		// Nothing lost: every accepted B turn is decided, once, after its backlog drains.
		dbB := s.tenantDB(tb)
		deadline := time.Now().Add(noisyDrainWait)
		decidedB := 0
		for time.Now().Before(deadline) {
			if err := dbB.QueryRow(context.Background(), `SELECT count(*) FROM decisions`).Scan(&decidedB); err != nil {
				b.Fatal(err)
			}
			if decidedB >= accepted {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		lostB := accepted - decidedB // negative: decided more than once
		// B's edge, meanwhile, answers what a tenant over its quota hears.
		rb := eb.submit(quoteEmail(fmt.Sprintf("<noisy-b-%s-edge@x>", run)))
		var er wire.ErrorReply
		if err := json.Unmarshal(rb.Body, &er); rb.Status != http.StatusTooManyRequests || err != nil || er.Error == nil ||
			er.Error.Reason != wire.ReasonTenantQuotaExceeded || rb.Header.Get("Retry-After") == "" {
			b.Errorf("B's edge over quota answered %d %s, want 429 tenant_quota_exceeded with Retry-After", rb.Status, rb.Body)
		}
		b.Logf("A quiet: p50 %s p99 %s (%d turns, %d not 200); A noisy: p50 %s p99 %s (%d turns, %d not 200)",
			quiet.pct(0.5), quiet.pct(0.99), len(quiet), quietFailed, noisy.pct(0.5), noisy.pct(0.99), len(noisy), noisyFailed)
		b.Logf("B: %d offered, %d accepted (quota %d), %d refused over quota, %d other errors; %d decided, %d lost",
			len(futures)+other, accepted, noisyQuotaB, refused, other, decidedB, lostB)
		b.ReportMetric(us(quiet.pct(0.5)), "a_quiet_p50_us")
		b.ReportMetric(us(quiet.pct(0.99)), "a_quiet_p99_us")
		b.ReportMetric(us(noisy.pct(0.5)), "a_noisy_p50_us")
		b.ReportMetric(us(noisy.pct(0.99)), "a_noisy_p99_us")
		b.ReportMetric(us(noisy.pct(0.5))/us(quiet.pct(0.5)), "a_p50_noisy_over_quiet")
		b.ReportMetric(us(noisy.pct(0.99))/us(quiet.pct(0.99)), "a_p99_noisy_over_quiet")
		b.ReportMetric(float64(accepted), "b_accepted")
		b.ReportMetric(float64(refused), "b_refused")
		b.ReportMetric(float64(quietFailed+noisyFailed), "a_lost")
		b.ReportMetric(float64(lostB), "b_lost")
		if quietFailed+noisyFailed > 0 || lostB != 0 || other != 0 {
			b.Errorf("losses: A %d, B %d (negative: decided twice), B other errors %d", quietFailed+noisyFailed, lostB, other)
		}
		// The phase must have shown a refusal, or B's bound was not measured.
		if accepted != noisyQuotaB || refused == 0 {
			b.Errorf("B had %d accepted and %d refused: want exactly its quota (%d) accepted and the rest refused", accepted, refused, noisyQuotaB)
		}
	}
}
