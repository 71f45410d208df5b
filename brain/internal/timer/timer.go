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
	"crypto/rand"
	"encoding/hex"
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

// Next keeps, for this brain process, one timer per tenant and kind: the
// earliest time the tenant has work of that kind due, as far as this
// process knows. A burst of work (an approval and an event per turn) sets
// it once, not once per item: Ensure publishes only when the process's
// timer is not already set no later than the new work's time. Whoever
// handles a timer when it fires does the due work, reads the tenant
// database for the next due time and sets its own timer to it (Set), or
// leaves it unset when nothing is pending (Clear).
//
// Each process's timers have their own id (random, drawn at start), so a
// process only ever replaces its own timer: with one timer per tenant and
// kind shared by every replica, replica B, knowing nothing of the earlier
// expiry replica A had set, would replace it with its own later one, and
// A's approval would expire late (by up to the reconciliation interval). A
// restarted process draws a new id for the same reason. What a process
// knows of its own timers is then exact, except that one may have fired
// and been handled elsewhere: a timer known to be due already is never
// relied on. A fired schedule is removed by the server, so the timers of
// processes long gone leave nothing behind; one that had not fired yet
// still fires at its time, on whichever replica takes it. The brain's
// reconciliation pass sets every tenant's timers again in case a process
// died between a commit and its timer.
type Next struct {
	timers *Timers
	id     string
	mu     sync.Mutex
	at     map[nextKey]time.Time
}

type nextKey struct{ account, kind string }

// NewNext returns this process's per-tenant timers, set through timers.
func NewNext(timers *Timers) *Next {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return &Next{timers: timers, id: "p" + hex.EncodeToString(b), at: map[nextKey]time.Time{}}
}

// ID is the id of this process's timers (subjects.Schedule's last token).
func (n *Next) ID() string { return n.id }

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
	n.timers.Go(ctx, account, kind, n.id, t, func(err error) {
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
	if err := n.timers.At(ctx, account, kind, n.id, t); err != nil {
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
