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
	"sync"
	"time"
)

// ErrPanicked is the error of work whose panic Run recovered (and logged).
var ErrPanicked = errors.New("panicked, a bug in the brain (logged with its stack)")

// Log logs a recovered panic r at ERROR, with the stack of the goroutine
// it happened on. Call it from the deferred function that recovered r.
//
// A bug that stays panics again every time its work comes round (the
// reconciliation pass visits every tenant each interval): the same panic
// (msg and r) is logged with its stack once per stackEvery, and in between
// as one line saying how often it came again and when its stack was
// logged.
func Log(log *slog.Logger, r any, msg string, attrs ...any) {
	attrs = append(attrs, "panic", fmt.Sprint(r))
	if last, times, ok := stacks.again(msg+"\x00"+fmt.Sprint(r), time.Now()); ok {
		log.Error(msg, append(attrs, "repeated", times, "stack_logged_at", last.UTC().Format(time.RFC3339))...)
		return
	}
	log.Error(msg, append(attrs, "stack", string(debug.Stack()))...)
}

// stackEvery is how often one panic's stack is logged again; stackKinds
// bounds the panics remembered (beyond it, every stack is logged).
const (
	stackEvery = 10 * time.Minute
	stackKinds = 256
)

var stacks = &stackLog{seen: map[string]*stackSeen{}}

// stackLog remembers when the stack of each panic was last logged.
type stackLog struct {
	mu   sync.Mutex
	seen map[string]*stackSeen
}

type stackSeen struct {
	at    time.Time // the stack was logged
	times int       // the panic came again since, without its stack
}

// again reports whether key's stack was logged less than stackEvery before
// now, with when and how often the panic came since (this one counted);
// otherwise it records that the stack is logged now.
func (l *stackLog) again(key string, now time.Time) (last time.Time, times int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.seen[key]; s != nil && now.Sub(s.at) < stackEvery {
		s.times++
		return s.at, s.times, true
	}
	if len(l.seen) >= stackKinds {
		for k, s := range l.seen {
			if now.Sub(s.at) >= stackEvery {
				delete(l.seen, k)
			}
		}
	}
	if _, known := l.seen[key]; known || len(l.seen) < stackKinds {
		l.seen[key] = &stackSeen{at: now}
	}
	return time.Time{}, 0, false
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
