// Package timer keeps the brain's timers in JetStream, so that work which
// becomes due later (an approval's expiry, the next delivery attempt of an
// event no edge acknowledged) finds the brain by itself at its time: no
// replica scans every tenant's database on an interval, and an idle tenant
// costs nothing. A timer is a message schedule (ADR-51) in the SCHEDULES
// stream of the STREAMS account; when it fires, a message on
// brain.due.<account>.<kind>.<id> reaches the brain's shared consumer.
package timer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/nats/stream"
	"n8nbrain/subjects"
)

// Headers of a message schedule (nats-server 2.12+, ADR-51).
const (
	headerSchedule       = "Nats-Schedule"
	headerScheduleTarget = "Nats-Schedule-Target"
	headerScheduleTTL    = "Nats-Schedule-TTL"
)

// Timers publishes timers through the brain's schedule import.
type Timers struct {
	js jetstream.JetStream
	// NowFunc is the clock (tests).
	NowFunc func() time.Time
}

// New returns timers published with js (the brain's own client: the
// schedules subject is one of its imports).
func New(js jetstream.JetStream) *Timers { return &Timers{js: js, NowFunc: time.Now} }

// At sets the timer (account, kind, id) to fire at t, replacing the one it
// had: one schedule per subject. A time in the past, or within the second,
// fires in about a second (schedules have a resolution of one second).
func (s *Timers) At(ctx context.Context, account, kind, id string, t time.Time) error {
	earliest := s.NowFunc().Add(time.Second)
	if t.Before(earliest) {
		t = earliest
	}
	// Round up: a timer never fires before its time.
	if r := t.Truncate(time.Second); !r.Equal(t) {
		t = r.Add(time.Second)
	}
	msg := nats.NewMsg(subjects.Schedule(account, kind, id))
	msg.Header.Set(headerSchedule, "@at "+t.UTC().Format(time.RFC3339))
	msg.Header.Set(headerScheduleTarget, subjects.Due(account, kind, id))
	msg.Header.Set(headerScheduleTTL, stream.DueTTL.String())
	if _, err := s.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("set timer %s %s at %s: %w", kind, id, t.UTC().Format(time.RFC3339), err)
	}
	return nil
}

// Go sets the timer like At, without waiting: for a caller on a latency
// path (a turn's commit), whose timer only needs to be there by its time.
// A failure goes to onErr; the reconciliation pass sets a lost timer later.
func (s *Timers) Go(ctx context.Context, account, kind, id string, t time.Time, onErr func(error)) {
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := s.At(ctx, account, kind, id, t); err != nil && onErr != nil {
			onErr(err)
		}
	}()
}

// Next keeps one timer per tenant and kind (id "next"): the earliest time
// the tenant has work of that kind due. A burst of work (an approval and an
// event per turn) sets it once, not once per item: Ensure publishes only
// when this replica does not know of a timer already set no later than the
// new work's time. Whoever handles the timer when it fires does the due work
// and sets it again to the next due time (Set), or leaves it unset when
// nothing is pending (Clear).
//
// What a replica knows is only what it set itself. A timer that another
// replica replaced with a later time delays this replica's work by at most
// the difference (work is due within a bounded time of being written), and
// the brain's reconciliation pass sets every tenant's timers again in case
// anything was missed. A timer known to be due already is never relied on:
// its handler may have read the pending work before this work was written.
type Next struct {
	timers *Timers
	mu     sync.Mutex
	at     map[nextKey]time.Time
}

type nextKey struct{ account, kind string }

// NextID is the id of a tenant's one timer of a kind.
const NextID = "next"

// NewNext returns per-tenant timers set through timers.
func NewNext(timers *Timers) *Next { return &Next{timers: timers, at: map[nextKey]time.Time{}} }

// Ensure makes the (account, kind) timer fire no later than about t, without
// waiting for the timer to be stored; a failure goes to onErr (and the next
// Ensure tries again).
func (n *Next) Ensure(ctx context.Context, account, kind string, t time.Time, onErr func(error)) {
	k := nextKey{account, kind}
	now := n.timers.NowFunc()
	n.mu.Lock()
	if set, ok := n.at[k]; ok && set.After(now) && !set.After(t.Add(time.Second)) {
		n.mu.Unlock()
		return
	}
	n.at[k] = t
	n.mu.Unlock()
	n.timers.Go(ctx, account, kind, NextID, t, func(err error) {
		n.mu.Lock()
		if n.at[k].Equal(t) {
			delete(n.at, k)
		}
		n.mu.Unlock()
		if onErr != nil {
			onErr(err)
		}
	})
}

// Set sets the (account, kind) timer to t and waits until it is stored.
func (n *Next) Set(ctx context.Context, account, kind string, t time.Time) error {
	k := nextKey{account, kind}
	n.mu.Lock()
	n.at[k] = t
	n.mu.Unlock()
	if err := n.timers.At(ctx, account, kind, NextID, t); err != nil {
		n.mu.Lock()
		delete(n.at, k)
		n.mu.Unlock()
		return err
	}
	return nil
}

// Clear forgets the (account, kind) timer: nothing of that kind is pending
// (a timer that fires later finds nothing to do).
func (n *Next) Clear(account, kind string) {
	n.mu.Lock()
	delete(n.at, nextKey{account, kind})
	n.mu.Unlock()
}

// Forget drops what this replica knows of a tenant's timers (the tenant
// left the registry).
func (n *Next) Forget(account string) {
	n.mu.Lock()
	for k := range n.at {
		if k.account == account {
			delete(n.at, k)
		}
	}
	n.mu.Unlock()
}
