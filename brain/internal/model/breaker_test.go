package model

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// clock is a hand-driven time source.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// step is one event of a breaker scenario: advance the clock, then make a
// call with a result (or expect a refusal), then check the state.
type step struct {
	advance time.Duration
	result  Result
	refused bool // the call must be refused
	want    BreakerState
}

func TestBreaker(t *testing.T) {
	t.Parallel()
	ok, fail, ignore := ResultSuccess, ResultFailure, ResultIgnore
	cfg := BreakerConfig{Window: 30 * time.Second, MinCalls: 5, FailureRatio: 0.5, CoolDown: 10 * time.Second}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"StaysClosedBelowMinCalls", []step{
			{result: fail, want: BreakerClosed}, {result: fail, want: BreakerClosed},
			{result: fail, want: BreakerClosed}, {result: fail, want: BreakerClosed},
		}},
		{"OpensAtRatioOverMinCalls", []step{
			{result: ok, want: BreakerClosed}, {result: ok, want: BreakerClosed}, {result: fail, want: BreakerClosed},
			{result: fail, want: BreakerClosed}, {result: ok, want: BreakerClosed}, // 2/5 failed
			{result: fail, want: BreakerOpen}, // 3/6 failed
			{refused: true, want: BreakerOpen},
		}},
		{"StaysClosedBelowRatio", []step{
			{result: fail, want: BreakerClosed}, {result: ok, want: BreakerClosed}, {result: ok, want: BreakerClosed},
			{result: ok, want: BreakerClosed}, {result: fail, want: BreakerClosed}, {result: ok, want: BreakerClosed},
		}},
		{"OldFailuresLeaveTheWindow", []step{
			{result: fail, want: BreakerClosed}, {result: fail, want: BreakerClosed}, {result: fail, want: BreakerClosed},
			{result: fail, want: BreakerClosed},
			{advance: 31 * time.Second, result: fail, want: BreakerClosed}, // the first four are gone
			{result: ok, want: BreakerClosed},
		}},
		{"IgnoredCallsDoNotCount", []step{
			{result: ignore, want: BreakerClosed}, {result: ignore, want: BreakerClosed}, {result: ignore, want: BreakerClosed},
			{result: ignore, want: BreakerClosed}, {result: fail, want: BreakerClosed},
		}},
		{"ProbeSuccessCloses", []step{
			{result: fail}, {result: fail}, {result: fail}, {result: fail}, {result: fail, want: BreakerOpen},
			{advance: 9 * time.Second, refused: true, want: BreakerOpen},
			{advance: time.Second, result: ok, want: BreakerClosed},
			{result: fail, want: BreakerClosed}, // a fresh window
		}},
		{"ProbeFailureReopensForAnotherCoolDown", []step{
			{result: fail}, {result: fail}, {result: fail}, {result: fail}, {result: fail, want: BreakerOpen},
			{advance: 10 * time.Second, result: fail, want: BreakerOpen},
			{advance: 9 * time.Second, refused: true, want: BreakerOpen},
			{advance: time.Second, result: ok, want: BreakerClosed},
		}},
		{"AbandonedProbeLetsTheNextCallProbe", []step{
			{result: fail}, {result: fail}, {result: fail}, {result: fail}, {result: fail, want: BreakerOpen},
			{advance: 10 * time.Second, result: ignore, want: BreakerOpen},
			{result: ok, want: BreakerClosed},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := &clock{now: time.Unix(1_700_000_000, 0)}
			c := cfg
			c.NowFunc = clk.Now
			b := NewBreaker(c, nil)
			for i, s := range tc.steps {
				clk.Advance(s.advance)
				done, err := b.Allow()
				if s.refused {
					if !errors.Is(err, ErrBreakerOpen) {
						t.Fatalf("step %d: want a refusal, got %v", i, err)
					}
				} else {
					if err != nil {
						t.Fatalf("step %d: refused: %v", i, err)
					}
					done(s.result)
				}
				if s.want != "" {
					if got := b.State(); got != s.want {
						t.Fatalf("step %d: state %s, want %s", i, got, s.want)
					}
				}
			}
		})
	}
}

func TestBreakerHalfOpenLetsOneProbeThrough(t *testing.T) {
	t.Parallel()
	clk := &clock{now: time.Unix(1_700_000_000, 0)}
	var changes []string
	b := NewBreaker(BreakerConfig{MinCalls: 1, CoolDown: time.Second, NowFunc: clk.Now}, func(from, to BreakerState) {
		changes = append(changes, string(from)+">"+string(to))
	})
	done, _ := b.Allow()
	done(ResultFailure)
	clk.Advance(time.Second)
	probe, err := b.Allow()
	if err != nil {
		t.Fatal(err)
	}
	if b.State() != BreakerHalfOpen {
		t.Fatalf("state %s, want half_open", b.State())
	}
	if _, err := b.Allow(); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("a second call during the probe: %v, want refused", err)
	}
	probe(ResultSuccess)
	probe(ResultFailure) // done is once only
	if b.State() != BreakerClosed {
		t.Fatalf("state %s, want closed", b.State())
	}
	want := []string{"closed>open", "open>half_open", "half_open>closed"}
	if len(changes) != len(want) {
		t.Fatalf("changes %v, want %v", changes, want)
	}
	for i := range want {
		if changes[i] != want[i] {
			t.Fatalf("changes %v, want %v", changes, want)
		}
	}
}
