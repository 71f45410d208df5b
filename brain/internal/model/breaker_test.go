package model

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// These tests check how our configuration and call results map onto
// gobreaker's state machine; gobreaker's own tests cover the machine. The
// library reads the real clock, so the tests that need time to pass use
// short windows and poll the breaker's state (a real condition) with a
// deadline.

// step is one event of a scenario: make a call with a result (or expect a
// refusal), then check the state.
type step struct {
	result  Result
	refused bool // the call must be refused
	want    BreakerState
}

func run(t *testing.T, b *Breaker, steps []step) {
	t.Helper()
	for i, s := range steps {
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
}

// waitState polls the breaker until it reports want.
func waitState(t *testing.T, b *Breaker, want BreakerState) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for b.State() != want {
		if time.Now().After(deadline) {
			t.Fatalf("breaker still %s after 5s, want %s", b.State(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestBreakerRatioOverMinCalls(t *testing.T) {
	t.Parallel()
	ok, fail, ignore := ResultSuccess, ResultFailure, ResultIgnore
	cfg := BreakerConfig{Window: time.Hour, MinCalls: 5, FailureRatio: 0.5, CoolDown: time.Hour}
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
		{"IgnoredCallsDoNotCount", []step{
			{result: ignore, want: BreakerClosed}, {result: ignore, want: BreakerClosed}, {result: ignore, want: BreakerClosed},
			{result: ignore, want: BreakerClosed}, {result: fail, want: BreakerClosed},
			{result: fail}, {result: fail}, {result: fail}, {result: fail, want: BreakerOpen},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			run(t, NewBreaker(cfg, nil), tc.steps)
		})
	}
}

// Failures older than the window no longer count.
func TestBreakerOldFailuresLeaveTheWindow(t *testing.T) {
	t.Parallel()
	b := NewBreaker(BreakerConfig{Window: 100 * time.Millisecond, MinCalls: 5, CoolDown: time.Hour}, nil)
	run(t, b, []step{{result: ResultFailure}, {result: ResultFailure}, {result: ResultFailure}, {result: ResultFailure, want: BreakerClosed}})
	deadline := time.Now().Add(5 * time.Second)
	for {
		b.State() // moves the rolling window to now
		if b.cb.Counts().TotalFailures == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("failures still in a 100ms window after 5s: %+v", b.cb.Counts())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Four fresh failures are four, not eight: still below MinCalls.
	run(t, b, []step{{result: ResultFailure, want: BreakerClosed}, {result: ResultFailure, want: BreakerClosed},
		{result: ResultFailure, want: BreakerClosed}, {result: ResultFailure, want: BreakerClosed}})
}

func TestBreakerCoolDownAndProbe(t *testing.T) {
	t.Parallel()
	cfg := BreakerConfig{Window: time.Hour, MinCalls: 1, CoolDown: 20 * time.Millisecond}
	open := func(t *testing.T) *Breaker {
		b := NewBreaker(cfg, nil)
		run(t, b, []step{{result: ResultFailure, want: BreakerOpen}, {refused: true, want: BreakerOpen}})
		waitState(t, b, BreakerHalfOpen)
		return b
	}
	t.Run("ProbeSuccessCloses", func(t *testing.T) {
		t.Parallel()
		b := open(t)
		run(t, b, []step{{result: ResultSuccess, want: BreakerClosed}})
	})
	t.Run("ProbeFailureReopens", func(t *testing.T) {
		t.Parallel()
		b := open(t)
		run(t, b, []step{{result: ResultFailure, want: BreakerOpen}, {refused: true}})
		waitState(t, b, BreakerHalfOpen)
	})
	t.Run("AbandonedProbeLetsTheNextCallProbe", func(t *testing.T) {
		t.Parallel()
		b := open(t)
		run(t, b, []step{{result: ResultIgnore, want: BreakerHalfOpen}, {result: ResultSuccess, want: BreakerClosed}})
	})
}

func TestBreakerHalfOpenLetsOneProbeThrough(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var changes []string
	b := NewBreaker(BreakerConfig{MinCalls: 1, CoolDown: 20 * time.Millisecond}, func(from, to BreakerState) {
		mu.Lock()
		defer mu.Unlock()
		changes = append(changes, string(from)+">"+string(to))
	})
	done, _ := b.Allow()
	done(ResultFailure)
	waitState(t, b, BreakerHalfOpen)
	probe, err := b.Allow()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Allow(); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("a second call during the probe: %v, want refused", err)
	}
	probe(ResultSuccess)
	probe(ResultFailure) // done is once only
	if b.State() != BreakerClosed {
		t.Fatalf("state %s, want closed", b.State())
	}
	mu.Lock()
	defer mu.Unlock()
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
