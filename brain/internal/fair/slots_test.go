package fair

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// waitFor starts an Acquire of key and returns a channel that gets its
// error once it returns.
func waitFor(s *Slots, ctx context.Context, key string) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- s.Acquire(ctx, key) }()
	return ch
}

// queued waits until key has n waiters.
func queued(t *testing.T, s *Slots, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.Waiting(key) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s has %d waiters, want %d", key, s.Waiting(key), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestSlotsGoRoundRobinBetweenKeys(t *testing.T) {
	s := NewSlots(1)
	ctx := context.Background()
	if err := s.Acquire(ctx, "noisy"); err != nil {
		t.Fatal(err)
	}
	var noisy []<-chan error
	for i := range 3 {
		noisy = append(noisy, waitFor(s, ctx, "noisy"))
		queued(t, s, "noisy", i+1)
	}
	quiet := waitFor(s, ctx, "quiet")
	queued(t, s, "quiet", 1)
	// The first slot given back goes to noisy's first waiter (its key came
	// first), the second to quiet, though two more of noisy's were waiting
	// before it: first come first served would have made it wait for all.
	s.Release()
	if err := <-noisy[0]; err != nil {
		t.Fatal(err)
	}
	s.Release()
	select {
	case err := <-quiet:
		if err != nil {
			t.Fatal(err)
		}
	case <-noisy[1]:
		t.Fatal("noisy's second waiter got the slot before quiet's first")
	case <-time.After(5 * time.Second):
		t.Fatal("quiet never got the slot")
	}
	s.Release()
	if err := <-noisy[1]; err != nil {
		t.Fatal(err)
	}
	s.Release()
	if err := <-noisy[2]; err != nil {
		t.Fatal(err)
	}
	s.Release()
	if s.free != 1 {
		t.Fatalf("%d free slots after every one was given back, want 1", s.free)
	}
}

func TestSlotsAWaiterThatGivesUpIsSkipped(t *testing.T) {
	s := NewSlots(1)
	if err := s.Acquire(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := waitFor(s, ctx, "b")
	queued(t, s, "b", 1)
	next := waitFor(s, context.Background(), "c")
	queued(t, s, "c", 1)
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled Acquire returned %v", err)
	}
	s.Release()
	if err := <-next; err != nil {
		t.Fatal(err)
	}
	s.Release()
	if s.free != 1 {
		t.Fatalf("%d free slots, want 1: a slot was lost to the waiter that gave up", s.free)
	}
}

func TestSlotsNeverExceedTheirCount(t *testing.T) {
	const n = 3
	s := NewSlots(n)
	var mu sync.Mutex
	held, most := 0, 0
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%7)*time.Millisecond)
			defer cancel()
			if err := s.Acquire(ctx, string(rune('a'+i%5))); err != nil {
				return
			}
			mu.Lock()
			held++
			most = max(most, held)
			mu.Unlock()
			time.Sleep(100 * time.Microsecond)
			mu.Lock()
			held--
			mu.Unlock()
			s.Release()
		})
	}
	wg.Wait()
	if most > n || most == 0 {
		t.Fatalf("at most %d slots held at once, want 1 to %d", most, n)
	}
	if s.free != n || len(s.waiting) != 0 || s.ring.len() != 0 {
		t.Fatalf("after the run: %d free, %d keys waiting, ring %d; want %d, 0, 0", s.free, len(s.waiting), s.ring.len(), n)
	}
}
