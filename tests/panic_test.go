package tests

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"n8nbrain/brain"
	"n8nbrain/registry"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// A panic in the brain's code (here a test hook's, as a bug in a handler
// would) is one request answered internal, logged with its stack, not a
// replica taken down: left to run, one tenant's poison turn would crash
// every replica it is redelivered to, every tenant's brain.
func TestPanicIsOneAnswerNotACrash(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("panic-a"))
	b := s.tenant(spec("panic-b"))
	var apiPanics atomic.Bool
	s.startBrain("panic-1", func(c *brain.Config) {
		c.Hooks.AfterCommitFunc = func(_ registry.TenantID, workItemID string, _ int) error {
			if strings.HasPrefix(workItemID, "<poison") {
				panic("test: a bug after the commit")
			}
			return nil
		}
		c.Hooks.BeforeAPIFunc = func(_ registry.TenantID, method string) {
			if method == subjects.APIApprovalList && apiPanics.Load() {
				panic("test: a bug in a handler")
			}
		}
	})
	ea, eb := s.startEdge(a, nil), s.startEdge(b, nil)

	poison := quoteEmail("<poison-1@customer.example>")
	if e := ea.submit(poison).error(t, http.StatusInternalServerError); e.Code != wire.CodeInternal ||
		!strings.Contains(e.Message, "the brain failed on this request") {
		t.Fatalf("the poison turn: %+v", e)
	}
	// The replica is still there, for this tenant and the other.
	ea.submit(quoteEmail("<after-a@customer.example>")).reply(t)
	eb.submit(quoteEmail("<after-b@customer.example>")).reply(t)
	// The poison turn's decision was committed before the panic: sent
	// again, its error is re-driven and the stored decision answers.
	if rep := ea.submit(poison).reply(t); rep.Status != wire.WorkItemStatusAwaitingApproval {
		t.Fatalf("the poison turn again: %s", mustJSON(t, rep))
	}

	apiPanics.Store(true)
	if e := ea.do(http.MethodGet, "/v1/approvals", nil).error(t, http.StatusInternalServerError); e.Code != wire.CodeInternal ||
		!strings.Contains(e.Message, "the brain failed on this request") {
		t.Fatalf("the panicking API call: %+v", e)
	}
	apiPanics.Store(false)
	if l := ea.list(t, nil); len(l.Approvals) != 2 {
		t.Fatalf("%d approvals listed after the panic, want 2", len(l.Approvals))
	}
	logs := s.logs.String()
	for _, want := range []string{"deciding a turn panicked, a bug in the brain", "an API call panicked, a bug in the brain", "goroutine "} {
		if !strings.Contains(logs, want) {
			t.Errorf("no %q in the logs", want)
		}
	}
}

// A panic in the brain's own work for a tenant (here forwarding its events,
// reached by the kick after an approval's decision, the outbox timer and
// the reconciliation pass) is logged with its stack and tried again later,
// not a replica taken down: the events are delivered once forwarding works
// again.
func TestPanicInEventForwardingIsNotACrash(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("panic-fwd"))
	hook := newWebhook(t)
	hook.down.Store(true) // no event is acked: each is forwarded again
	var panics atomic.Bool
	var calls atomic.Int32
	panics.Store(true)
	s.startBrain("panic-fwd-1", func(c *brain.Config) {
		fastEvents(c)
		c.Hooks.BeforeForwardFunc = func(registry.TenantID) {
			if panics.Load() {
				calls.Add(1)
				panic("test: a bug in forwarding events")
			}
		}
	})
	ea := s.startEdge(a, withWebhook(hook))
	id := "<panic-fwd@customer.example>"
	rep := ea.submit(quoteEmail(id)).reply(t)
	if rep.Status != wire.WorkItemStatusAwaitingApproval || rep.Action == nil {
		t.Fatalf("turn 1: %s", mustJSON(t, rep))
	}
	if r := ea.decide(rep.Action.ApprovalID, "approve", map[string]string{"by": "alice"}); r.Status != http.StatusOK {
		t.Fatalf("approve: %d %s", r.Status, r.Body)
	}
	for _, msg := range []string{"forwarding events panicked, a bug in the brain", "an outbox timer panicked, a bug in the brain",
		"the reconciliation pass panicked, a bug in the brain"} {
		eventually(t, 10*time.Second, msg, func() bool { return strings.Contains(s.logs.String(), msg) })
	}
	// The replica is still there.
	ea.submit(quoteEmail("<panic-fwd-after@customer.example>")).reply(t)
	panics.Store(false)
	hook.down.Store(false)
	hook.accepted(wire.EventApprovalDecided, id)
	t.Logf("forwarding panicked %d times before it worked", calls.Load())
}
