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
