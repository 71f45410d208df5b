package model

import (
	"errors"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"
)

// BreakerConfig tunes the circuit breaker. The zero value of a field means
// its default.
type BreakerConfig struct {
	// Window is how far back calls count (a rolling window of ten buckets).
	// Default, in a Client: room for MinCalls calls that all time out,
	// MaxConcurrent at a time, plus one timeout (240s with the defaults);
	// 30s for a Breaker made alone.
	Window time.Duration
	// MinCalls is how many finished calls in the window it takes before the
	// failure ratio means anything. Default 5.
	MinCalls int
	// FailureRatio opens the breaker when failures/calls in the window reach
	// it. Default 0.5.
	FailureRatio float64
	// CoolDown is how long an open breaker refuses calls before it lets one
	// probe through (half-open). Default 30s.
	CoolDown time.Duration
}

const defaultMinCalls = 5

func (c BreakerConfig) withDefaults() BreakerConfig {
	if c.Window <= 0 {
		c.Window = 30 * time.Second
	}
	if c.MinCalls <= 0 {
		c.MinCalls = defaultMinCalls
	}
	if c.FailureRatio <= 0 || c.FailureRatio > 1 {
		c.FailureRatio = 0.5
	}
	if c.CoolDown <= 0 {
		c.CoolDown = 30 * time.Second
	}
	return c
}

// windowBuckets is how finely the rolling window moves: a call leaves the
// window at most Window/windowBuckets late.
const windowBuckets = 10

// BreakerState is where the breaker stands.
type BreakerState string

const (
	BreakerClosed   BreakerState = "closed"    // calls go through
	BreakerOpen     BreakerState = "open"      // calls are refused until the cool-down is over
	BreakerHalfOpen BreakerState = "half_open" // the cool-down is over: one probe call may go through; the others are refused
)

// Result is what a call that the breaker let through tells it.
type Result int

const (
	// ResultSuccess: the server answered usably (a 4xx too: it is reachable
	// and refused this request, not every request).
	ResultSuccess Result = iota
	// ResultFailure: transport error, timeout, 5xx, or an answer the caller
	// could not use (a server answering 200 with garbage is failing too).
	ResultFailure
	// ResultIgnore: the caller gave up (its context ended); says nothing about the server.
	ResultIgnore
)

// ErrBreakerOpen: the breaker refused the call without making it.
var ErrBreakerOpen = errors.New("model circuit breaker is open")

// The errors our results are reported to gobreaker as.
var (
	errCallFailed  = errors.New("model call failed")
	errCallIgnored = errors.New("model call abandoned by its caller")
)

// Breaker is a circuit breaker on the failure ratio of calls over a rolling
// time window: closed, it lets every call through and opens when the ratio
// reaches the threshold over at least MinCalls calls; open, it refuses
// calls for the cool-down; then one probe goes through (half-open): success
// closes it, failure opens it again, an abandoned probe lets the next call
// probe. The state machine is github.com/sony/gobreaker/v2's; this type maps
// our configuration and call results onto it.
type Breaker struct {
	cb *gobreaker.TwoStepCircuitBreaker[struct{}]
}

// NewBreaker returns a closed breaker. onChange, when not nil, is called on
// every state change (for logs); it must not call back into the breaker.
func NewBreaker(cfg BreakerConfig, onChange func(from, to BreakerState)) *Breaker {
	cfg = cfg.withDefaults()
	st := gobreaker.Settings{
		Name:         "model",
		MaxRequests:  1, // one probe when half-open
		Interval:     cfg.Window,
		BucketPeriod: max(cfg.Window/windowBuckets, time.Millisecond),
		Timeout:      cfg.CoolDown,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			done := c.TotalSuccesses + c.TotalFailures
			return done >= uint32(cfg.MinCalls) && float64(c.TotalFailures) >= cfg.FailureRatio*float64(done)
		},
		IsExcluded: func(err error) bool { return errors.Is(err, errCallIgnored) },
	}
	if onChange != nil {
		st.OnStateChange = func(_ string, from, to gobreaker.State) { onChange(state(from), state(to)) }
	}
	return &Breaker{cb: gobreaker.NewTwoStepCircuitBreaker[struct{}](st)}
}

func state(s gobreaker.State) BreakerState {
	switch s {
	case gobreaker.StateOpen:
		return BreakerOpen
	case gobreaker.StateHalfOpen:
		return BreakerHalfOpen
	}
	return BreakerClosed
}

// State returns the breaker's state. An open breaker whose cool-down is
// over reports half_open: the next call will probe.
func (b *Breaker) State() BreakerState { return state(b.cb.State()) }

// Allow asks to make one call. It returns ErrBreakerOpen, or a done func
// that the caller must call exactly once with the call's result.
func (b *Breaker) Allow() (done func(Result), err error) {
	report, err := b.cb.Allow()
	if err != nil {
		// gobreaker.ErrOpenState, or ErrTooManyRequests while a probe is in flight.
		return nil, ErrBreakerOpen
	}
	var once sync.Once
	return func(r Result) {
		once.Do(func() {
			switch r {
			case ResultSuccess:
				report(nil)
			case ResultIgnore:
				report(errCallIgnored)
			default:
				report(errCallFailed)
			}
		})
	}, nil
}
