package model

import (
	"errors"
	"sync"
	"time"
)

// BreakerConfig tunes the circuit breaker. The zero value of a field means
// its default.
type BreakerConfig struct {
	// Window is how far back calls count. Default 30s.
	Window time.Duration
	// MinCalls is how many calls in the window it takes before the failure
	// ratio means anything. Default 5.
	MinCalls int
	// FailureRatio opens the breaker when failures/calls in the window reach
	// it. Default 0.5.
	FailureRatio float64
	// CoolDown is how long an open breaker refuses calls before it lets one
	// probe through (half-open). Default 30s.
	CoolDown time.Duration
	// NowFunc is the clock (tests); default time.Now.
	NowFunc func() time.Time
}

func (c BreakerConfig) withDefaults() BreakerConfig {
	if c.Window <= 0 {
		c.Window = 30 * time.Second
	}
	if c.MinCalls <= 0 {
		c.MinCalls = 5
	}
	if c.FailureRatio <= 0 || c.FailureRatio > 1 {
		c.FailureRatio = 0.5
	}
	if c.CoolDown <= 0 {
		c.CoolDown = 30 * time.Second
	}
	if c.NowFunc == nil {
		c.NowFunc = time.Now
	}
	return c
}

// BreakerState is where the breaker stands.
type BreakerState string

const (
	BreakerClosed   BreakerState = "closed"    // calls go through
	BreakerOpen     BreakerState = "open"      // calls are refused until the cool-down is over
	BreakerHalfOpen BreakerState = "half_open" // one probe call is in flight; the others are refused
)

// Result is what a call that the breaker let through tells it.
type Result int

const (
	// ResultSuccess: the server answered (a 4xx too: it is reachable).
	ResultSuccess Result = iota
	// ResultFailure: transport error, timeout or 5xx.
	ResultFailure
	// ResultIgnore: the caller gave up (its context ended); says nothing about the server.
	ResultIgnore
)

// ErrBreakerOpen: the breaker refused the call without making it.
var ErrBreakerOpen = errors.New("model circuit breaker is open")

// maxWindowCalls bounds the memory of the window under high call rates.
const maxWindowCalls = 1024

// Breaker is a circuit breaker on the failure ratio of calls over a sliding
// time window. Closed, it lets every call through and opens when the ratio
// reaches the threshold; open, it refuses calls for the cool-down; then one
// probe goes through (half-open): success closes it, failure opens it again.
type Breaker struct {
	cfg BreakerConfig
	// onChange, when set, is called (without the lock held) on every state
	// change, for logs.
	onChange func(from, to BreakerState)

	mu       sync.Mutex
	state    BreakerState
	calls    []call // in the window, oldest first
	openedAt time.Time
}

type call struct {
	at     time.Time
	failed bool
}

// NewBreaker returns a closed breaker. onChange may be nil.
func NewBreaker(cfg BreakerConfig, onChange func(from, to BreakerState)) *Breaker {
	return &Breaker{cfg: cfg.withDefaults(), onChange: onChange, state: BreakerClosed}
}

// State returns the breaker's state (an open breaker whose cool-down is
// over still reports open until a call probes it).
func (b *Breaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// Allow asks to make one call. It returns ErrBreakerOpen, or a done func
// that the caller must call exactly once with the call's result.
func (b *Breaker) Allow() (done func(Result), err error) {
	b.mu.Lock()
	from := b.state
	switch b.state {
	case BreakerHalfOpen:
		b.mu.Unlock()
		return nil, ErrBreakerOpen // a probe is in flight
	case BreakerOpen:
		if b.cfg.NowFunc().Sub(b.openedAt) < b.cfg.CoolDown {
			b.mu.Unlock()
			return nil, ErrBreakerOpen
		}
		b.state = BreakerHalfOpen
		b.mu.Unlock()
		b.changed(from, BreakerHalfOpen)
		return b.onceDone(b.probeDone), nil
	}
	b.mu.Unlock()
	return b.onceDone(b.record), nil
}

func (b *Breaker) onceDone(f func(Result)) func(Result) {
	var once sync.Once
	return func(r Result) { once.Do(func() { f(r) }) }
}

// record books a call made while closed.
func (b *Breaker) record(r Result) {
	if r == ResultIgnore {
		return
	}
	b.mu.Lock()
	if b.state != BreakerClosed {
		// The breaker opened while this call was in flight; its result is
		// already accounted for by the calls that opened it.
		b.mu.Unlock()
		return
	}
	now := b.cfg.NowFunc()
	b.calls = append(b.calls, call{at: now, failed: r == ResultFailure})
	b.prune(now)
	failed := 0
	for _, c := range b.calls {
		if c.failed {
			failed++
		}
	}
	n := len(b.calls)
	if n < b.cfg.MinCalls || float64(failed)/float64(n) < b.cfg.FailureRatio {
		b.mu.Unlock()
		return
	}
	b.state, b.openedAt, b.calls = BreakerOpen, now, b.calls[:0]
	b.mu.Unlock()
	b.changed(BreakerClosed, BreakerOpen)
}

// probeDone books the half-open probe.
func (b *Breaker) probeDone(r Result) {
	b.mu.Lock()
	var to BreakerState
	switch r {
	case ResultSuccess:
		to = BreakerClosed
		b.calls = b.calls[:0]
	case ResultFailure:
		to = BreakerOpen
		b.openedAt = b.cfg.NowFunc()
	default:
		// The prober gave up: the cool-down counts as over, so the next
		// call probes again.
		to = BreakerOpen
	}
	b.state = to
	b.mu.Unlock()
	b.changed(BreakerHalfOpen, to)
}

// prune drops calls older than the window, and the oldest beyond the cap.
func (b *Breaker) prune(now time.Time) {
	i := 0
	for i < len(b.calls) && now.Sub(b.calls[i].at) > b.cfg.Window {
		i++
	}
	if over := len(b.calls) - i - maxWindowCalls; over > 0 {
		i += over
	}
	if i > 0 {
		b.calls = append(b.calls[:0], b.calls[i:]...)
	}
}

func (b *Breaker) changed(from, to BreakerState) {
	if b.onChange != nil && from != to {
		b.onChange(from, to)
	}
}
