package brain

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"

	"n8nbrain/brain/internal/store"
	"n8nbrain/brain/internal/tenancy"
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

// A turn whose connection could not be dialled because this replica is at
// its tenant connection cap is not held as if the database were down: as
// pgx reports the two (a connect error wrapping what the dialler said),
// only the refused dial holds.
func TestAtCapacityIsNotUnreachable(t *testing.T) {
	for _, c := range []struct {
		name string
		dial error
		want bool
	}{
		{"the cap", fmt.Errorf("%w (8 connections)", tenancy.ErrAtCapacity), false},
		{"a refused dial", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
	} {
		cfg, err := pgx.ParseConfig("postgres://app@127.0.0.1:1/db")
		if err != nil {
			t.Fatal(err)
		}
		cfg.DialFunc = func(context.Context, string, string) (net.Conn, error) { return nil, c.dial }
		_, err = pgx.ConnectConfig(context.Background(), cfg)
		if err == nil {
			t.Fatalf("%s: connected", c.name)
		}
		if !store.Unreachable(err) {
			t.Errorf("%s (%v): not a connection that failed", c.name, err)
		}
		if got := unreachable(err); got != c.want {
			t.Errorf("%s (%v): unreachable %v, want %v", c.name, err, got, c.want)
		}
	}
}
