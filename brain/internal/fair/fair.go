// Package fair schedules work from many tenants onto a fixed set of
// workers, round robin, with a cap on how many workers one tenant may hold.
//
// Each tenant's turns arrive on its own JetStream consumer and are pushed
// here without blocking. Workers take the next item from the tenant at the
// front of a ring of tenants that have queued work and a free slot; a tenant
// that still has work and a free slot goes to the back. So a quiet tenant's
// turn waits for at most one free worker, never behind another tenant's
// backlog, and a noisy tenant can hold at most PerKey workers however much
// it queues. Slots does the same for a fixed number of slots (the model's
// calls in flight) that callers wait for rather than queue work onto.
package fair

import (
	"sync"
)

// Scheduler hands queued items to workers. The zero value is not usable;
// call New.
type Scheduler[T any] struct {
	perKey int

	mu     sync.Mutex
	cond   *sync.Cond
	queues map[string]*queue[T]
	ring   ring
	closed bool
}

type queue[T any] struct {
	items    []T
	inflight int
	inRing   bool
}

// New returns a scheduler that lets one key hold at most perKey items in
// flight (at least 1).
func New[T any](perKey int) *Scheduler[T] {
	s := &Scheduler[T]{perKey: max(perKey, 1), queues: map[string]*queue[T]{}}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// Push queues an item of key. It never blocks; the caller bounds what it
// pushes (the consumer's MaxAckPending bounds a tenant's turns).
func (s *Scheduler[T]) Push(key string, item T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[key]
	if q == nil {
		q = &queue[T]{}
		s.queues[key] = q
	}
	q.items = append(q.items, item)
	s.readyLocked(key, q)
}

// TryPush queues an item of key unless key already has maxQueued items
// waiting; it reports whether it did.
func (s *Scheduler[T]) TryPush(key string, item T, maxQueued int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[key]
	if q == nil {
		q = &queue[T]{}
		s.queues[key] = q
	}
	if len(q.items) >= maxQueued {
		return false
	}
	q.items = append(q.items, item)
	s.readyLocked(key, q)
	return true
}

// readyLocked puts key in the ring when it has work and a free slot.
func (s *Scheduler[T]) readyLocked(key string, q *queue[T]) {
	if !q.inRing && len(q.items) > 0 && q.inflight < s.perKey {
		q.inRing = true
		s.ring.push(key)
		s.cond.Signal()
	}
}

// Next blocks until an item is ready and returns it with its key; ok is
// false once the scheduler is closed. The caller must call Done(key) when
// the item is finished.
func (s *Scheduler[T]) Next() (key string, item T, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.ring.len() == 0 && !s.closed {
		s.cond.Wait()
	}
	if s.closed {
		return "", item, false
	}
	key = s.ring.pop()
	q := s.queues[key]
	q.inRing = false
	item = q.items[0]
	var zero T
	q.items[0] = zero
	q.items = q.items[1:]
	q.inflight++
	s.readyLocked(key, q)
	return key, item, true
}

// Done releases the slot of a finished item of key.
func (s *Scheduler[T]) Done(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[key]
	if q == nil {
		return
	}
	q.inflight--
	if q.inflight == 0 && len(q.items) == 0 {
		delete(s.queues, key)
		return
	}
	s.readyLocked(key, q)
}

// Remove takes every queued (not yet started) item of key out of the
// scheduler and returns them, for instance when the key's consumer stops.
func (s *Scheduler[T]) Remove(key string) []T {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[key]
	if q == nil {
		return nil
	}
	items := q.items
	q.items = nil
	if q.inRing {
		s.ring.remove(key)
		q.inRing = false
	}
	if q.inflight == 0 {
		delete(s.queues, key)
	}
	return items
}

// Close wakes every worker waiting in Next (it returns false) and returns
// every item still queued, so the caller can hand them back.
func (s *Scheduler[T]) Close() []T {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	var left []T
	for _, q := range s.queues {
		left = append(left, q.items...)
		q.items = nil
	}
	s.ring = ring{}
	s.cond.Broadcast()
	return left
}

// Each calls fn for every queued item, with the scheduler locked: fn must
// not block (the brain uses it to tell JetStream queued turns are alive).
func (s *Scheduler[T]) Each(fn func(key string, item T)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, q := range s.queues {
		for _, it := range q.items {
			fn(key, it)
		}
	}
}

// Load is a key's queued and in-flight items.
type Load struct {
	Queued   int
	Inflight int
}

// Loads returns the load of every key with work.
func (s *Scheduler[T]) Loads() map[string]Load {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]Load, len(s.queues))
	for key, q := range s.queues {
		out[key] = Load{Queued: len(q.items), Inflight: q.inflight}
	}
	return out
}

// ring is a FIFO of keys.
type ring struct {
	keys []string
	head int
}

func (r *ring) len() int { return len(r.keys) - r.head }

func (r *ring) push(k string) {
	if r.head > 0 && r.head*2 >= len(r.keys) {
		n := copy(r.keys, r.keys[r.head:])
		clear(r.keys[n:])
		r.keys, r.head = r.keys[:n], 0
	}
	r.keys = append(r.keys, k)
}

func (r *ring) pop() string {
	k := r.keys[r.head]
	r.keys[r.head] = ""
	r.head++
	return k
}

func (r *ring) remove(k string) {
	for i := r.head; i < len(r.keys); i++ {
		if r.keys[i] == k {
			r.keys = append(r.keys[:i], r.keys[i+1:]...)
			return
		}
	}
}
