package brain

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// TestGateRefusesOnceClosed starts work from another goroutine while the
// gate is closed and waited for, as a consumer's late delivery does at
// shutdown. Under -race, a WaitGroup added to while it is waited for is
// reported; after Wait nothing more may run.
func TestGateRefusesOnceClosed(t *testing.T) {
	for range 500 {
		var g gate
		var started, done atomic.Int64
		var feeder sync.WaitGroup
		feeder.Go(func() {
			for g.Go(func() {
				started.Add(1)
				done.Add(1)
			}) {
			}
		})
		for started.Load() < 10 { // close while the feeder runs
			runtime.Gosched()
		}
		g.Close()
		g.Wait()
		after := started.Load()
		if d := done.Load(); d != after {
			t.Fatalf("Wait returned with %d of %d functions still running", after-d, after)
		}
		feeder.Wait()
		if g.Go(func() { started.Add(1) }) {
			t.Fatal("Go ran a function after Close")
		}
		if n := started.Load(); n != after {
			t.Fatalf("%d functions started before Wait returned, %d in all; want the same", after, n)
		}
	}
}
