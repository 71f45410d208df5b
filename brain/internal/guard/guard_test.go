package guard

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestRunLogsAStackOnceThenCountsRepeats: a bug that panics again on every
// visit logs its stack the first time and then one line per panic, saying
// how often it came and when its stack was logged; another panic gets its
// own stack.
func TestRunLogsAStackOnceThenCountsRepeats(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	value := fmt.Sprintf("test: a bug that stays (%d)", time.Now().UnixNano()) // no other test's panic
	for range 3 {
		if err := Run(log, "visiting panicked", func() error { panic(value) }, "tenant_id", "t1"); !errors.Is(err, ErrPanicked) {
			t.Fatalf("Run returned %v, want ErrPanicked", err)
		}
	}
	if err := Run(log, "visiting panicked", func() error { panic(value + " elsewhere") }); !errors.Is(err, ErrPanicked) {
		t.Fatalf("Run returned %v, want ErrPanicked", err)
	}
	var lines []map[string]any
	for l := range strings.Lines(buf.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 4 {
		t.Fatalf("%d log lines, want one per panic (4):\n%s", len(lines), buf.String())
	}
	for i, l := range lines {
		_, stack := l["stack"].(string)
		if wantStack := i == 0 || i == 3; stack != wantStack || l["level"] != "ERROR" || l["msg"] != "visiting panicked" {
			t.Errorf("line %d: stack %v, want %v; level %v, msg %v", i+1, stack, wantStack, l["level"], l["msg"])
		}
	}
	for i, want := range []float64{1, 2} {
		l := lines[i+1]
		if l["repeated"] != want || l["stack_logged_at"] == nil || l["panic"] != value || l["tenant_id"] != "t1" {
			t.Errorf("repeat %d: %v, want repeated %v with the time of the stack, the panic and the tenant", i+1, l, want)
		}
	}
	if s, _ := lines[0]["stack"].(string); !strings.Contains(s, "goroutine ") {
		t.Errorf("the first line's stack is %q", s)
	}
}

// TestStackLogAgainAfterTheInterval: the stack is logged again once
// stackEvery has passed, and the panics remembered are bounded: beyond
// stackKinds a new one is not remembered (its stack is always logged) until
// old ones have expired.
func TestStackLogAgainAfterTheInterval(t *testing.T) {
	l := &stackLog{seen: map[string]*stackSeen{}}
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	check := func(key string, d time.Duration, wantOK bool, wantTimes int) {
		t.Helper()
		if _, times, ok := l.again(key, at(d)); ok != wantOK || times != wantTimes {
			t.Errorf("%s at +%s: again %v %d times, want %v %d", key, d, ok, times, wantOK, wantTimes)
		}
	}
	check("a", 0, false, 0)
	check("a", time.Minute, true, 1)
	check("a", 2*time.Minute, true, 2)
	check("b", 2*time.Minute, false, 0)
	check("a", stackEvery, false, 0) // logged again
	check("a", stackEvery+time.Minute, true, 1)

	l = &stackLog{seen: map[string]*stackSeen{}}
	for i := range stackKinds {
		check(fmt.Sprint(i), 0, false, 0)
	}
	check("new", time.Minute, false, 0)
	check("new", 2*time.Minute, false, 0) // not remembered: the map is full
	check("new", stackEvery+time.Minute, false, 0)
	check("new", stackEvery+2*time.Minute, true, 1) // the old ones expired
	if len(l.seen) > stackKinds {
		t.Errorf("%d panics remembered, want at most %d", len(l.seen), stackKinds)
	}
}
