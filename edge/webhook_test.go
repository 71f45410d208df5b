package edge

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"n8nbrain/subjects"
	"n8nbrain/wire"
)

const testWebhookSecret = "webhook-secret-0123456789abcdef"

// hookCall is a POST that reached the fake n8n.
type hookCall struct {
	N      int // 1 for the first POST
	Header http.Header
	Body   []byte
}

// fakeN8N stands in for n8n's Webhook node: it records every POST and
// answers with what status says (which may block).
type fakeN8N struct {
	url   string
	calls chan hookCall
	n     atomic.Int32
	ok    atomic.Int32 // 2xx answers given
}

func startFakeN8N(t *testing.T, status func(hookCall) int) *fakeN8N {
	t.Helper()
	f := &fakeN8N{calls: make(chan hookCall, 256)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("fake n8n: read body: %v", err)
			return
		}
		c := hookCall{N: int(f.n.Add(1)), Header: r.Header.Clone(), Body: body}
		f.calls <- c
		code := status(c)
		if code >= 200 && code < 300 {
			f.ok.Add(1)
		}
		w.WriteHeader(code)
		_, _ = w.Write([]byte(`{"message":"Workflow was started"}`))
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL + "/webhook/brain-events"
	return f
}

func always(code int) func(hookCall) int { return func(hookCall) int { return code } }

// webhookEdge starts an edge delivering to f with fast retries and waits
// until it is subscribed to events.
func webhookEdge(t *testing.T, n *testNATS, f *fakeN8N, edit func(*Config)) *testEdge {
	t.Helper()
	e := startEdge(t, n, func(c *Config) {
		c.WebhookURL = f.url
		c.WebhookSecret = testWebhookSecret
		c.WebhookRetries = 3
		c.WebhookInitialInterval = 5 * time.Millisecond
		c.WebhookMaxInterval = 20 * time.Millisecond
		if edit != nil {
			edit(c)
		}
	})
	e.logs.waitFor(t, `"msg":"event delivery on"`)
	return e
}

// ackRecorder answers event.ack and reports each acknowledged event id
// along with how many 2xx n8n had answered by then.
type ackRecorder struct {
	acks chan ackSeen
}

type ackSeen struct {
	EventID string
	OKs     int32
}

func startAckingBrain(t *testing.T, n *testNATS, f *fakeN8N) *ackRecorder {
	t.Helper()
	ar := &ackRecorder{acks: make(chan ackSeen, 256)}
	startFakeAPI(t, n, func(c apiCall) apiAnswer {
		if c.Method != subjects.APIEventAck {
			return apiAnswer{Error: &wire.Error{Code: wire.CodeNotFound, Message: "unexpected " + c.Method}}
		}
		var req wire.EventAckRequest
		if err := wire.DecodeAPI(c.Body, &req); err != nil {
			t.Errorf("the edge sent an invalid event.ack: %v", err)
			return apiAnswer{Error: wire.ErrorOf(err)}
		}
		if err := req.Validate(); err != nil {
			t.Errorf("the edge sent an invalid event.ack: %v", err)
			return apiAnswer{Error: wire.ErrorOf(err)}
		}
		for _, id := range req.IDs() {
			ar.acks <- ackSeen{EventID: id, OKs: f.ok.Load()}
		}
		return apiAnswer{Reply: wire.EventAckReply{Delivered: true}}
	})
	return ar
}

func (ar *ackRecorder) none(t *testing.T, what string) {
	t.Helper()
	select {
	case a := <-ar.acks:
		t.Errorf("%s: event %s was acknowledged", what, a.EventID)
	default:
	}
}

// sampleEvent is the event of a decided approval, as the brain publishes
// it: the outbox's jsonb payload, with its spacing and key order.
func sampleEvent(id string) (wire.Event, []byte) {
	ev := wire.Event{
		EventID: id, Kind: wire.EventApprovalDecided, WorkItemID: "<CAF=wi-event@mail.example>", NextTurn: 2,
		ApprovalID: testUUID(1), Decision: "approved", OccurredAt: time.Date(2026, 2, 3, 4, 5, 6, 0, time.UTC),
	}
	payload := []byte(`{"kind": "approval_decided", "decision": "approved", "event_id": "` + id +
		`", "next_turn": 2, "approval_id": "` + testUUID(1) + `", "occurred_at": "2026-02-03T04:05:06Z", "work_item_id": "<CAF=wi-event@mail.example>"}`)
	return ev, payload
}

// checkDelivery checks one POST: the headers n8n verifies and the event.
func checkDelivery(t *testing.T, c hookCall, want wire.Event) {
	t.Helper()
	h := c.Header
	if h.Get("Content-Type") != "application/json" || h.Get(HeaderIdempotencyKey) != want.EventID ||
		h.Get(HeaderEventKind) != string(want.Kind) || h.Get(HeaderWebhookToken) != testWebhookSecret {
		t.Errorf("delivery %d headers %v", c.N, h)
	}
	mac := hmac.New(sha256.New, []byte(testWebhookSecret))
	mac.Write(c.Body)
	if got, want := h.Get(HeaderSignature), "sha256="+hex.EncodeToString(mac.Sum(nil)); got != want {
		t.Errorf("delivery %d: %s %q, want %q", c.N, HeaderSignature, got, want)
	}
	ts, err := strconv.ParseInt(h.Get(HeaderTimestamp), 10, 64)
	if err != nil || time.Since(time.Unix(ts, 0)).Abs() > time.Minute {
		t.Errorf("delivery %d: %s %q is not now", c.N, HeaderTimestamp, h.Get(HeaderTimestamp))
	}
	var got wire.Event
	if err := wire.DecodeAPI(c.Body, &got); err != nil {
		t.Fatalf("delivery %d: body %s: %v", c.N, c.Body, err)
	}
	if got != want {
		t.Errorf("delivery %d: event %+v, want %+v", c.N, got, want)
	}
}

func TestWebhookDelivers(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	f := startFakeN8N(t, always(http.StatusOK))
	ar := startAckingBrain(t, n, f)
	e := webhookEdge(t, n, f, nil)

	id := testUUID(100)
	want, payload := sampleEvent(id)
	n.publishEvent(t, id, payload)
	checkDelivery(t, next(t, f.calls, "the delivery"), want)
	if a := next(t, ar.acks, "the ack"); a.EventID != id || a.OKs != 1 {
		t.Errorf("ack %+v, want event %s after n8n's 2xx", a, id)
	}
	e.logs.waitFor(t, `"msg":"event delivered"`)

	logs := e.logs.String()
	for _, secret := range []string{testWebhookSecret, "wi-event@mail.example", "/webhook/brain-events"} {
		if strings.Contains(logs, secret) {
			t.Errorf("the log contains %q", secret)
		}
	}
	if !strings.Contains(logs, `"event_id":"`+id+`"`) || !strings.Contains(logs, `"kind":"approval_decided"`) {
		t.Errorf("the log lacks the event id and kind:\n%s", logs)
	}
}

func TestWebhookRetriesUntilUp(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	f := startFakeN8N(t, func(c hookCall) int {
		if c.N <= 3 {
			return http.StatusServiceUnavailable
		}
		return http.StatusAccepted
	})
	ar := startAckingBrain(t, n, f)
	e := webhookEdge(t, n, f, nil)

	id := testUUID(101)
	want, payload := sampleEvent(id)
	n.publishEvent(t, id, payload)
	for i := 1; i <= 4; i++ {
		c := next(t, f.calls, "a delivery attempt")
		checkDelivery(t, c, want) // the same Idempotency-Key every time
		if i < 4 {
			ar.none(t, "before n8n answered 2xx")
		}
	}
	if a := next(t, ar.acks, "the ack"); a.EventID != id || a.OKs != 1 {
		t.Errorf("ack %+v, want event %s right after the 2xx", a, id)
	}
	e.logs.waitFor(t, `"msg":"event delivered"`)
	ar.none(t, "after the ack")
	if strings.Contains(e.logs.String(), "event parked") {
		t.Errorf("the event was parked although a retry succeeded")
	}
}

func TestWebhookOneDeliveryInFlight(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	release := make(chan struct{})
	f := startFakeN8N(t, func(hookCall) int {
		<-release
		return http.StatusOK
	})
	var once atomic.Bool
	t.Cleanup(func() {
		if once.CompareAndSwap(false, true) {
			close(release)
		}
	})
	ar := startAckingBrain(t, n, f)
	e := webhookEdge(t, n, f, nil)

	id := testUUID(102)
	_, payload := sampleEvent(id)
	n.publishEvent(t, id, payload)
	next(t, f.calls, "the delivery")
	// The brain publishes it again while n8n is still working on it.
	n.publishEvent(t, id, payload)
	n.publishEvent(t, id, payload)
	e.logs.waitFor(t, `"msg":"event already in delivery; skipped"`)
	once.Store(true)
	close(release)

	if a := next(t, ar.acks, "the ack"); a.EventID != id {
		t.Errorf("ack %+v", a)
	}
	e.logs.waitFor(t, `"msg":"event delivered"`)
	if c := f.n.Load(); c != 1 {
		t.Errorf("n8n got %d POSTs, want 1", c)
	}
	ar.none(t, "a second delivery")
}

func TestWebhookParksThenRedelivers(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	var up atomic.Bool
	f := startFakeN8N(t, func(hookCall) int {
		if up.Load() {
			return http.StatusOK
		}
		return http.StatusInternalServerError
	})
	ar := startAckingBrain(t, n, f)
	e := webhookEdge(t, n, f, func(c *Config) { c.WebhookRetries = 2 })

	id := testUUID(103)
	want, payload := sampleEvent(id)
	n.publishEvent(t, id, payload)
	e.logs.waitFor(t, `"msg":"event parked`)
	if c := f.n.Load(); c != 3 {
		t.Errorf("n8n got %d POSTs before the event was parked, want 3 (1 + 2 retries)", c)
	}
	ar.none(t, "a parked event")
	logs := e.logs.String()
	if !strings.Contains(logs, `"level":"WARN","msg":"event parked`) || !strings.Contains(logs, `"kind":"approval_decided"`) {
		t.Errorf("the parked event is not logged at Warn with its kind:\n%s", logs)
	}

	// Later the brain publishes it again; n8n is back.
	up.Store(true)
	n.publishEvent(t, id, payload)
	if a := next(t, ar.acks, "the ack"); a.EventID != id || a.OKs != 1 {
		t.Errorf("ack %+v", a)
	}
	var last hookCall
	for range 4 {
		last = next(t, f.calls, "a POST")
		checkDelivery(t, last, want)
	}
	if last.N != 4 {
		t.Errorf("the delivery after the re-publish is POST %d, want 4", last.N)
	}
}

func TestWebhookMalformedEventIsParked(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	f := startFakeN8N(t, always(http.StatusOK))
	ar := startAckingBrain(t, n, f)
	e := webhookEdge(t, n, f, nil)

	id := testUUID(104)
	_, payload := sampleEvent(id)
	bad := bytes.Replace(payload, []byte(`"next_turn": 2`), []byte(`"next_turn": 2, "email_body": "secret"`), 1)
	n.publishEvent(t, id, bad)
	other := testUUID(105)
	n.publishEvent(t, other, payload) // its event_id is not its subject's
	e.logs.waitFor(t, `"event_id":"`+id+`"`)
	e.logs.waitFor(t, `"event_id":"`+other+`"`)
	if c := f.n.Load(); c != 0 {
		t.Errorf("n8n got %d POSTs of malformed events", c)
	}
	ar.none(t, "a malformed event")
	if logs := e.logs.String(); strings.Count(logs, "event parked") != 2 || strings.Contains(logs, "secret") {
		t.Errorf("want both events parked, without their content:\n%s", logs)
	}
}

func TestWebhookEdgeRestart(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	var up atomic.Bool
	f := startFakeN8N(t, func(hookCall) int {
		if up.Load() {
			return http.StatusNoContent
		}
		return http.StatusBadGateway
	})
	ar := startAckingBrain(t, n, f)
	// Retries that outlast the test: the edge is stopped mid-delivery.
	slow := func(c *Config) {
		c.WebhookRetries = 1000
		c.WebhookMaxInterval = time.Second
	}
	first := webhookEdge(t, n, f, slow)

	id := testUUID(106)
	want, payload := sampleEvent(id)
	n.publishEvent(t, id, payload)
	next(t, f.calls, "the first attempt")
	next(t, f.calls, "the second attempt")
	start := time.Now()
	first.stop()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the edge took %s to stop mid-delivery", d)
	}
	ar.none(t, "an undelivered event")
	if strings.Contains(first.logs.String(), "event parked") {
		t.Errorf("the shutdown parked the event:\n%s", first.logs.String())
	}

	up.Store(true)
	second := webhookEdge(t, n, f, slow)
	// The brain publishes the unacknowledged event again.
	n.publishEvent(t, id, payload)
	if a := next(t, ar.acks, "the ack"); a.EventID != id {
		t.Errorf("ack %+v", a)
	}
	second.logs.waitFor(t, `"msg":"event delivered"`)
	var last hookCall
	for len(f.calls) > 0 {
		last = <-f.calls
	}
	checkDelivery(t, last, want)
	if last.Header.Get(HeaderIdempotencyKey) != id {
		t.Errorf("Idempotency-Key %q after the restart, want %q", last.Header.Get(HeaderIdempotencyKey), id)
	}
}

func TestWebhookOff(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	e := startEdge(t, n, nil)
	e.logs.waitFor(t, "events are not delivered: EDGE_WEBHOOK_URL is not set")
}

// TestServeLeavesNoGoroutines stops an edge in the middle of a delivery and
// checks that nothing it started is left: the router, its handlers, the
// subscription's goroutine, the webhook client's connections. It is not
// parallel, so the goroutines it looks for can only be this edge's.
func TestServeLeavesNoGoroutines(t *testing.T) {
	n := startNATS(t, false)
	f := startFakeN8N(t, always(http.StatusServiceUnavailable))
	e := webhookEdge(t, n, f, func(c *Config) { c.WebhookRetries = 1000 })
	id := testUUID(108)
	_, payload := sampleEvent(id)
	n.publishEvent(t, id, payload)
	next(t, f.calls, "an attempt")
	next(t, f.calls, "another attempt")
	e.stop()

	leaked := func() []string {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var out []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			for _, frame := range []string{"ThreeDotsLabs/watermill", "n8nbrain/edge.Serve", "n8nbrain/edge.(*eventSub", "net/http.(*persistConn)"} {
				if strings.Contains(g, frame) {
					out = append(out, g)
					break
				}
			}
		}
		return out
	}
	// Goroutines end a moment after the calls that stop them return.
	deadline := time.Now().Add(5 * time.Second)
	for g := leaked(); len(g) > 0; g = leaked() {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left after Serve returned:\n%s", len(g), strings.Join(g, "\n\n"))
		}
		runtime.Gosched()
	}
}

// batchEvents publishes n events (ids from base) and returns their ids.
func batchEvents(t *testing.T, n *testNATS, base, count int) []string {
	t.Helper()
	var ids []string
	for i := range count {
		id := testUUID(base + i)
		_, payload := sampleEvent(id)
		n.publishEvent(t, id, payload)
		ids = append(ids, id)
	}
	return ids
}

// ackCalls is a fake brain's record of event.ack calls: their ids, per call.
type ackCalls struct {
	calls chan []string
	// inFlight is closed when the first call arrives, before it is held.
	inFlight chan struct{}
}

// startSlowAckBrain answers event.ack, holding the first call until n8n
// has accepted hold events; decode is the brain's strict decoder.
func startSlowAckBrain(t *testing.T, n *testNATS, f *fakeN8N, hold int32, answer func(req []byte) apiAnswer) *ackCalls {
	t.Helper()
	ac := &ackCalls{calls: make(chan []string, 256), inFlight: make(chan struct{})}
	var first atomic.Bool
	startFakeAPI(t, n, func(c apiCall) apiAnswer {
		if c.Method != subjects.APIEventAck {
			return apiAnswer{Error: &wire.Error{Code: wire.CodeNotFound, Message: "unexpected " + c.Method}}
		}
		if first.CompareAndSwap(false, true) {
			close(ac.inFlight)
			deadline := time.Now().Add(10 * time.Second)
			for f.ok.Load() < hold && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
		}
		var req wire.EventAckRequest
		if err := wire.DecodeAPI(c.Body, &req); err == nil {
			ac.calls <- req.IDs()
		}
		return answer(c.Body)
	})
	return ac
}

// The events n8n accepts while an acknowledgement is in flight go to the
// brain together, in one call; each is marked and logged delivered once.
func TestWebhookBatchesAcks(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	f := startFakeN8N(t, always(http.StatusOK))
	ac := startSlowAckBrain(t, n, f, 6, func(body []byte) apiAnswer {
		var req wire.EventAckRequest
		if err := wire.DecodeAPI(body, &req); err != nil {
			return apiAnswer{Error: wire.ErrorOf(err)}
		}
		if err := req.Validate(); err != nil {
			t.Errorf("the edge sent an invalid event.ack: %v", err)
			return apiAnswer{Error: wire.ErrorOf(err)}
		}
		return apiAnswer{Reply: wire.EventAckReply{Delivered: true}}
	})
	e := webhookEdge(t, n, f, nil)

	first := batchEvents(t, n, 200, 1)
	if got := next(t, f.calls, "the first delivery"); got.Header.Get(HeaderIdempotencyKey) != first[0] {
		t.Fatalf("delivery of %s", got.Header.Get(HeaderIdempotencyKey))
	}
	// n8n's answer is not yet the edge's ack: wait until the first ack is
	// in flight, or a later event could be acknowledged first.
	next(t, ac.inFlight, "the first event's ack to reach the brain")
	rest := batchEvents(t, n, 201, 5)
	if got := next(t, ac.calls, "the first ack"); !slices.Equal(got, first) {
		t.Errorf("first call acknowledged %q, want %q alone", got, first)
	}
	// The fake brain answers the first call once n8n has answered all five,
	// but the edge may not have read n8n's last answer by then: that event
	// then goes in a call of its own. So the five come in one call, or in
	// two of which the first carries at least four.
	var calls [][]string
	var got []string
	for len(got) < len(rest) {
		c := next(t, ac.calls, "the batched ack")
		calls = append(calls, c)
		got = append(got, c...)
	}
	slices.Sort(got)
	if !slices.Equal(got, rest) {
		t.Errorf("the later calls acknowledged %q, want the five events n8n accepted meanwhile %q, once each", got, rest)
	}
	if len(calls) > 2 || len(calls[0]) < len(rest)-1 {
		t.Errorf("the five events were acknowledged in calls of %v events, want them batched (one call, or four then one)", lens(calls))
	}
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(e.logs.String(), `"msg":"event delivered"`) < 6 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	logs := e.logs.String()
	for _, id := range append(first, rest...) {
		if c := eventLines(logs, "event delivered", id); c != 1 {
			t.Errorf("event %s logged delivered %d times, want 1", id, c)
		}
	}
	select {
	case c := <-ac.calls:
		t.Errorf("an event.ack call after every event was acknowledged: %q", c)
	case <-time.After(100 * time.Millisecond):
	}
}

// A brain that does not take event_ids (an older release) gets one call
// per event from then on, and every event is still acknowledged.
func TestWebhookAcksOneByOneForAnOlderBrain(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	f := startFakeN8N(t, always(http.StatusOK))
	type oldRequest struct { // api.event.ack before batching
		EventID string `json:"event_id"`
	}
	var acked sync.Map
	startSlowAckBrain(t, n, f, 4, func(body []byte) apiAnswer {
		var req oldRequest
		if err := wire.DecodeAPI(body, &req); err != nil {
			return apiAnswer{Error: wire.ErrorOf(err)}
		}
		acked.Store(req.EventID, true)
		return apiAnswer{Reply: wire.EventAckReply{Delivered: true}}
	})
	e := webhookEdge(t, n, f, nil)
	ids := batchEvents(t, n, 300, 1)
	next(t, f.calls, "the first delivery")
	ids = append(ids, batchEvents(t, n, 301, 3)...)
	e.logs.waitFor(t, `"msg":"the brain does not take event_ids; acknowledging one event per call"`)
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(e.logs.String(), `"msg":"event delivered"`) < 4 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	for _, id := range ids {
		if _, ok := acked.Load(id); !ok {
			t.Errorf("event %s never acknowledged", id)
		}
	}
	if c := strings.Count(e.logs.String(), `"msg":"event delivered"`); c != 4 {
		t.Errorf("%d events logged delivered, want 4", c)
	}
	if strings.Contains(e.logs.String(), "event delivered but not acknowledged") {
		t.Errorf("an event was reported unacknowledged although the older brain took it singly")
	}
}

// An event the brain reports unknown in a batch is not taken as
// acknowledged: its delivery fails and is retried; the others are done.
func TestWebhookBatchUnknownEventIsNotAcknowledged(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	f := startFakeN8N(t, always(http.StatusOK))
	stranger := testUUID(402)
	startSlowAckBrain(t, n, f, 4, func(body []byte) apiAnswer {
		var req wire.EventAckRequest
		if err := wire.DecodeAPI(body, &req); err != nil {
			return apiAnswer{Error: wire.ErrorOf(err)}
		}
		if slices.Contains(req.IDs(), stranger) {
			if req.EventID != "" {
				return apiAnswer{Error: &wire.Error{Code: wire.CodeNotFound, Message: "no such event"}}
			}
			return apiAnswer{Reply: wire.EventAckReply{Delivered: true, Unknown: []string{stranger}}}
		}
		return apiAnswer{Reply: wire.EventAckReply{Delivered: true}}
	})
	e := webhookEdge(t, n, f, nil)
	batchEvents(t, n, 400, 1)
	next(t, f.calls, "the first delivery")
	batchEvents(t, n, 401, 3)
	deadline := time.Now().Add(10 * time.Second)
	for eventLines(e.logs.String(), "event delivered but not acknowledged; it will be delivered again", stranger) == 0 &&
		time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if eventLines(e.logs.String(), "event delivered but not acknowledged; it will be delivered again", stranger) == 0 {
		t.Fatalf("the unknown event %s was not reported unacknowledged", stranger)
	}
	for strings.Count(e.logs.String(), `"msg":"event delivered"`) < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	logs := e.logs.String()
	for _, id := range []string{testUUID(400), testUUID(401), testUUID(403)} {
		if c := eventLines(logs, "event delivered", id); c != 1 {
			t.Errorf("event %s logged delivered %d times, want 1", id, c)
		}
	}
	if eventLines(logs, "event delivered", stranger) > 0 {
		t.Errorf("the unknown event was logged delivered")
	}
}

// lens is the length of each call.
func lens(calls [][]string) []int {
	out := make([]int, len(calls))
	for i, c := range calls {
		out[i] = len(c)
	}
	return out
}

// eventLines counts the log lines with message msg about event id.
func eventLines(logs, msg, id string) int {
	n := 0
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, `"msg":"`+msg+`"`) && strings.Contains(l, `"event_id":"`+id+`"`) {
			n++
		}
	}
	return n
}

// Events delivered at once keep their connections to n8n between bursts:
// the edge's client keeps as many idle connections as it has deliveries
// in flight, not Go's default of two per host, which would close the rest
// after each burst and dial them again (a TCP handshake per event, and a
// TIME_WAIT socket per event on the edge's host).
func TestWebhookReusesItsConnectionsAcrossBursts(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	const burst, bursts = 8, 4
	var (
		mu       sync.Mutex
		inFlight int
		peak     int
		arrived  = make(chan struct{}, burst*bursts)
		release  = make(chan struct{})
		newConns atomic.Int32
	)
	f := &fakeN8N{} // for startAckingBrain, which reads f.ok; this server records no calls
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		inFlight++
		peak = max(peak, inFlight)
		mu.Unlock()
		arrived <- struct{}{}
		<-release // the test lets the whole burst answer at once
		mu.Lock()
		inFlight--
		mu.Unlock()
		f.ok.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			newConns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	f.url = srv.URL + "/webhook/brain-events"
	ar := startAckingBrain(t, n, f)
	webhookEdge(t, n, f, nil)

	for b := range bursts {
		batchEvents(t, n, 300+b*burst, burst)
		for range burst {
			next(t, arrived, fmt.Sprintf("burst %d's deliveries to be in flight together", b+1))
		}
		for range burst {
			release <- struct{}{}
		}
		for range burst {
			next(t, ar.acks, fmt.Sprintf("burst %d's acks", b+1))
		}
	}
	mu.Lock()
	most := peak
	mu.Unlock()
	if most != burst {
		t.Fatalf("at most %d deliveries were in flight at once, want %d: the test did not test reuse", most, burst)
	}
	// One connection per delivery in flight, made in the first burst; the
	// old client made 8 + 3×6 = 26.
	if got := newConns.Load(); got > burst {
		t.Errorf("n8n saw %d connections for %d bursts of %d events, want at most %d (one per delivery in flight)", got, bursts, burst, burst)
	}
}

// A webhook timeout no longer than the turn wait is warned of at start (n8n
// answers an event once its next turn is accepted); the default is not.
func TestShortWebhookTimeoutIsWarnedOf(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	const warning = "EDGE_WEBHOOK_TIMEOUT is not longer than EDGE_TURN_WAIT"
	for _, tc := range []struct {
		timeout time.Duration
		warned  bool
	}{{5 * time.Second, true}, {0, false}} {
		e := startEdge(t, n, func(c *Config) {
			c.WebhookURL, c.WebhookSecret, c.WebhookTimeout = "http://127.0.0.1:1/w", testWebhookSecret, tc.timeout
		})
		e.logs.waitFor(t, `"msg":"edge serving"`)
		if got := strings.Contains(e.logs.String(), warning); got != tc.warned {
			t.Errorf("EDGE_WEBHOOK_TIMEOUT %v with EDGE_TURN_WAIT 5s: warned %v, want %v", tc.timeout, got, tc.warned)
		}
		e.stop()
	}
}
