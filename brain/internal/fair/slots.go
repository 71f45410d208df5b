package fair

import (
	"context"
	"sync"
)

// Slots is a counting semaphore that grants its free slots round robin
// between keys: a key waiting for a slot gets one before a second waiter
// of another key does, so a tenant with many calls waiting for the model
// does not put a quiet tenant's call behind all of them (a channel, first
// come first served, would). The zero value is not usable; call NewSlots.
type Slots struct {
	mu      sync.Mutex
	free    int
	waiting map[string][]*slotWaiter // by key, in arrival order
	ring    ring                     // keys with waiters
}

type slotWaiter struct {
	granted chan struct{} // closed when the slot is this waiter's
	gone    bool          // gave up before it was granted
}

// NewSlots returns n slots (at least 1).
func NewSlots(n int) *Slots {
	return &Slots{free: max(n, 1), waiting: map[string][]*slotWaiter{}}
}

// Acquire waits for a slot for key until ctx ends; the caller gives the
// slot back with Release.
func (s *Slots) Acquire(ctx context.Context, key string) error {
	s.mu.Lock()
	if s.free > 0 && s.ring.len() == 0 {
		s.free--
		s.mu.Unlock()
		return nil
	}
	w := &slotWaiter{granted: make(chan struct{})}
	if len(s.waiting[key]) == 0 {
		s.ring.push(key)
	}
	s.waiting[key] = append(s.waiting[key], w)
	s.mu.Unlock()
	select {
	case <-w.granted:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	select {
	case <-w.granted: // granted meanwhile: hand it on
		s.releaseLocked()
	default:
		w.gone = true // skipped when its turn comes
	}
	s.mu.Unlock()
	return context.Cause(ctx)
}

// Release gives a slot back: to the first waiter of the key at the front
// of the ring, whose key then goes to the back if it has more waiting.
func (s *Slots) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseLocked()
}

func (s *Slots) releaseLocked() {
	for s.ring.len() > 0 {
		key := s.ring.pop()
		q := s.waiting[key]
		w := q[0]
		q[0] = nil
		if q = q[1:]; len(q) > 0 {
			s.waiting[key] = q
			s.ring.push(key)
		} else {
			delete(s.waiting, key)
		}
		if !w.gone {
			close(w.granted)
			return
		}
	}
	s.free++
}

// Waiting is how many of key's Acquires wait for a slot.
func (s *Slots) Waiting(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, w := range s.waiting[key] {
		if !w.gone {
			n++
		}
	}
	return n
}
