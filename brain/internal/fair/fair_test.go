package fair

import (
	"slices"
	"sync"
	"testing"
)

// next takes one ready item without blocking the test on an empty scheduler.
func next(t *testing.T, s *Scheduler[int]) (string, int) {
	t.Helper()
	s.mu.Lock()
	ready := s.ring.len()
	s.mu.Unlock()
	if ready == 0 {
		t.Fatal("nothing is ready")
	}
	k, v, ok := s.Next()
	if !ok {
		t.Fatal("closed")
	}
	return k, v
}

func TestRoundRobinAcrossKeys(t *testing.T) {
	t.Parallel()
	s := New[int](100)
	for i := range 5 {
		s.Push("noisy", i)
	}
	s.Push("quiet", 100)
	var got []string
	for range 3 {
		k, _ := next(t, s)
		got = append(got, k)
	}
	// The quiet key's one item comes second, not after the noisy backlog.
	if want := []string{"noisy", "quiet", "noisy"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestPerKeyCapHoldsBackTheKeyNotOthers(t *testing.T) {
	t.Parallel()
	s := New[int](2)
	for i := range 10 {
		s.Push("b", i)
	}
	next(t, s)
	next(t, s)
	// b holds its 2 slots: nothing of b is ready although 8 are queued.
	if l := s.Loads()["b"]; l.Inflight != 2 || l.Queued != 8 {
		t.Fatalf("load of b %+v, want 2 in flight, 8 queued", l)
	}
	s.mu.Lock()
	ready := s.ring.len()
	s.mu.Unlock()
	if ready != 0 {
		t.Fatalf("%d keys ready while b is at its cap", ready)
	}
	s.Push("a", 1)
	if k, v := next(t, s); k != "a" || v != 1 {
		t.Fatalf("got %s/%d, want a/1", k, v)
	}
	s.Done("b")
	if k, v := next(t, s); k != "b" || v != 2 {
		t.Fatalf("after a slot of b freed: got %s/%d, want b/2", k, v)
	}
}

func TestItemsOfAKeyStayInOrder(t *testing.T) {
	t.Parallel()
	s := New[int](1)
	for i := range 4 {
		s.Push("k", i)
	}
	for want := range 4 {
		_, v := next(t, s)
		if v != want {
			t.Fatalf("got %d, want %d", v, want)
		}
		s.Done("k")
	}
	if len(s.Loads()) != 0 {
		t.Fatalf("loads left: %v", s.Loads())
	}
}

func TestRemoveAndCloseHandBackQueuedItems(t *testing.T) {
	t.Parallel()
	s := New[int](1)
	s.Push("a", 1)
	s.Push("a", 2)
	s.Push("b", 3)
	next(t, s) // a/1 in flight
	if got := s.Remove("a"); !slices.Equal(got, []int{2}) {
		t.Fatalf("Remove(a) = %v, want [2]", got)
	}
	if k, v := next(t, s); k != "b" || v != 3 {
		t.Fatalf("got %s/%d, want b/3", k, v)
	}
	s.Push("c", 4)
	var wg sync.WaitGroup
	wg.Go(func() {
		// A worker blocked on an empty ring is woken by Close.
		s2 := New[int](1)
		go func() { s2.Close() }()
		if _, _, ok := s2.Next(); ok {
			t.Error("Next returned an item from a closed, empty scheduler")
		}
	})
	wg.Wait()
	if left := s.Close(); !slices.Equal(left, []int{4}) {
		t.Fatalf("Close left %v, want [4]", left)
	}
	if _, _, ok := s.Next(); ok {
		t.Fatal("Next after Close returned an item")
	}
}

func TestConcurrentWorkersNeverExceedTheCap(t *testing.T) {
	t.Parallel()
	const perKey, workers, items = 3, 8, 2000
	s := New[int](perKey)
	var mu sync.Mutex
	inflight := map[string]int{}
	peak := map[string]int{}
	done := 0
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				k, _, ok := s.Next()
				if !ok {
					return
				}
				mu.Lock()
				inflight[k]++
				peak[k] = max(peak[k], inflight[k])
				mu.Unlock()
				mu.Lock()
				inflight[k]--
				done++
				finished := done == items
				mu.Unlock()
				s.Done(k)
				if finished {
					s.Close()
				}
			}
		})
	}
	for i := range items {
		s.Push([]string{"a", "b", "c", "d"}[i%4], i)
	}
	wg.Wait()
	for k, p := range peak {
		if p > perKey {
			t.Errorf("key %s had %d in flight, cap %d", k, p, perKey)
		}
	}
	if done != items {
		t.Fatalf("done %d of %d", done, items)
	}
}

func TestTryPushBoundsAKeysQueue(t *testing.T) {
	t.Parallel()
	s := New[int](1)
	for i := range 3 {
		if !s.TryPush("a", i, 3) {
			t.Fatalf("push %d refused below the bound", i)
		}
	}
	if s.TryPush("a", 3, 3) {
		t.Fatal("a fourth item was queued over a bound of 3")
	}
	if !s.TryPush("b", 0, 3) {
		t.Fatal("another key was refused")
	}
	next(t, s) // a/0 in flight: a has 2 queued now
	if !s.TryPush("a", 4, 3) {
		t.Fatal("refused although the queue shrank")
	}
}
