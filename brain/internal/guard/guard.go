// Package guard recovers a panic in the brain's code (a bug) on a goroutine
// that serves every tenant, so that it costs the one request or piece of
// work it happened in, logged with its stack, and not the replica: left to
// run, a panic on a turn or a timer that JetStream redelivers would take
// down each replica after the other.
package guard

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
)

// ErrPanicked is the error of work whose panic Run recovered (and logged).
var ErrPanicked = errors.New("panicked, a bug in the brain (logged with its stack)")

// Log logs a recovered panic r at ERROR, with the stack of the goroutine
// it happened on. Call it from the deferred function that recovered r.
func Log(log *slog.Logger, r any, msg string, attrs ...any) {
	log.Error(msg, append(attrs, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))...)
}

// Run runs fn and turns a panic in it into ErrPanicked, logged with msg
// and attrs.
func Run(log *slog.Logger, msg string, fn func() error, attrs ...any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			Log(log, r, msg, attrs...)
			err = ErrPanicked
		}
	}()
	return fn()
}
