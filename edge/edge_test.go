package edge

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/nats/stream"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

func TestTurnSubmitRejects(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	fb := startFakeBrain(t, n, decide)
	e := startEdge(t, n, nil)
	valid := turnBody("wi-rejects", "hello")

	huge := append([]byte(`{"work_item_id":"wi","turn":1,"email":{"from":"a@b","subject":"s","body":"`),
		bytes.Repeat([]byte("x"), wire.MaxTurnBytes)...)
	huge = append(huge, `"}}`...)

	for _, tc := range []struct {
		name      string
		method    string
		path      string
		body      []byte
		header    map[string]string
		status    int
		code      wire.Code
		reason    string
		field     string
		errSubstr string
	}{
		{name: "NoToken", body: valid, header: map[string]string{"Authorization": ""}, status: 401, code: wire.CodeUnauthorized},
		{name: "WrongToken", body: valid, header: map[string]string{"Authorization": "Bearer " + testToken + "x"}, status: 401, code: wire.CodeUnauthorized},
		{name: "WrongScheme", body: valid, header: map[string]string{"Authorization": "Basic " + testToken}, status: 401, code: wire.CodeUnauthorized},
		{name: "BareToken", body: valid, header: map[string]string{"Authorization": testToken}, status: 401, code: wire.CodeUnauthorized},
		{name: "NoTokenBeatsBadBody", body: []byte("{"), header: map[string]string{"Authorization": "", "Content-Type": "text/plain"}, status: 401, code: wire.CodeUnauthorized},
		{name: "TextPlain", body: valid, header: map[string]string{"Content-Type": "text/plain"}, status: 415, code: wire.CodeInvalid, field: "Content-Type"},
		{name: "NoContentType", body: valid, header: map[string]string{"Content-Type": ""}, status: 415, code: wire.CodeInvalid, field: "Content-Type"},
		{name: "Latin1Charset", body: valid, header: map[string]string{"Content-Type": "application/json; charset=latin1"}, status: 415, code: wire.CodeInvalid, field: "Content-Type"},
		{name: "TooLarge", body: huge, status: 413, code: wire.CodeInvalid, reason: wire.ReasonTooLarge},
		{name: "EmptyBody", body: []byte{}, status: 400, code: wire.CodeInvalid, field: wire.DocumentField},
		{name: "UnknownField", body: []byte(`{"work_item_id":"wi","turn":1,"email":{"from":"a@b","subject":"s","body":"b"},"priority":"high"}`),
			status: 400, code: wire.CodeInvalid, field: "priority"},
		{name: "UnknownNestedField", body: []byte(`{"work_item_id":"wi","turn":1,"email":{"from":"a@b","subject":"s","body":"b","bcc":[]}}`),
			status: 400, code: wire.CodeInvalid, field: "email.bcc"},
		{name: "DuplicateKey", body: []byte(`{"work_item_id":"wi","work_item_id":"other","turn":1,"email":{"from":"a@b","subject":"s","body":"b"}}`),
			status: 400, code: wire.CodeInvalid, field: "work_item_id"},
		{name: "TrailingData", body: []byte(`{"work_item_id":"wi","turn":1,"email":{"from":"a@b","subject":"s","body":"b"}} {}`),
			status: 400, code: wire.CodeInvalid, field: wire.DocumentField, errSubstr: "after the JSON document"},
		{name: "WrongType", body: []byte(`{"work_item_id":"wi","turn":"1","email":{"from":"a@b","subject":"s","body":"b"}}`),
			status: 400, code: wire.CodeInvalid, field: "turn"},
		{name: "NullForString", body: []byte(`{"work_item_id":null,"turn":1,"email":{"from":"a@b","subject":"s","body":"b"}}`),
			status: 400, code: wire.CodeInvalid, field: "work_item_id"},
		{name: "MissingEmailOnTurnOne", body: []byte(`{"work_item_id":"wi","turn":1}`),
			status: 400, code: wire.CodeInvalid, field: "email"},
		{name: "InvalidUTF8", body: []byte("{\"work_item_id\":\"\xff\",\"turn\":1}"), status: 400, code: wire.CodeInvalid, field: "work_item_id"},
		{name: "GetBadKey", method: "GET", path: "/v1/turns/not-a-key", status: 400, code: wire.CodeInvalid, field: "key"},
		{name: "GetNoToken", method: "GET", path: "/v1/turns/0123456789abcdef0123456789abcdef", header: map[string]string{"Authorization": ""}, status: 401, code: wire.CodeUnauthorized},
		{name: "UnknownRoute", method: "GET", path: "/v2/nothing", status: 404, code: wire.CodeNotFound},
		{name: "WrongMethod", method: "PUT", path: "/v1/turns", body: valid, status: 405, code: wire.CodeInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			method, path := tc.method, tc.path
			if method == "" {
				method, path = http.MethodPost, "/v1/turns"
			}
			r := e.do(t, method, path, tc.body, tc.header)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d; body %s", r.status, tc.status, r.body)
			}
			we := r.wireError(t)
			if we.Code != tc.code || we.Reason != tc.reason || we.Field != tc.field {
				t.Errorf("error %+v, want code %q reason %q field %q", we, tc.code, tc.reason, tc.field)
			}
			if !strings.Contains(we.Message, tc.errSubstr) {
				t.Errorf("message %q does not contain %q", we.Message, tc.errSubstr)
			}
			if tc.status == 401 && r.header.Get("WWW-Authenticate") != "Bearer" {
				t.Errorf("WWW-Authenticate %q, want Bearer", r.header.Get("WWW-Authenticate"))
			}
			if tc.status == 405 && r.header.Get("Allow") == "" {
				t.Errorf("405 without an Allow header")
			}
		})
	}
	t.Cleanup(func() {
		// After every subtest: nothing reached the brain.
		select {
		case tm := <-fb.received:
			t.Errorf("a rejected request reached the brain: turn %s", tm.Key)
		default:
		}
	})
}

func TestTurnSubmitDecidesAndReplays(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	fb := startFakeBrain(t, n, decide)
	e := startEdge(t, n, nil)

	const workItem = "<CAF=wi-1@mail.example>"
	const secret = "please quote 42 Wallaby Way"
	body := turnBody(workItem, secret)
	key, req := keyOf(t, body)

	first := e.do(t, http.MethodPost, "/v1/turns", body, map[string]string{"Content-Type": "application/json; charset=UTF-8"})
	if first.status != http.StatusOK {
		t.Fatalf("first submit: status %d, body %s", first.status, first.body)
	}
	if !bytes.Equal(first.body, decision(req)) {
		t.Errorf("first submit body is not the brain's bytes:\n%s\nwant\n%s", first.body, decision(req))
	}
	if got := first.header.Get("X-Turn-Key"); got != key {
		t.Errorf("X-Turn-Key %q, want %q", got, key)
	}
	if first.reply(t).Replayed {
		t.Errorf("first answer is marked replayed")
	}

	var replay []byte
	for i := range 5 {
		r := e.submit(t, body)
		if r.status != http.StatusOK {
			t.Fatalf("replay %d: status %d, body %s", i, r.status, r.body)
		}
		if rep := r.reply(t); !rep.Replayed || rep.WorkItemID != workItem || rep.Action == nil || rep.Action.Name != "draft_reply" {
			t.Errorf("replay %d: %+v, want the decision with replayed=true", i, rep)
		}
		if replay != nil && !bytes.Equal(r.body, replay) {
			t.Errorf("replay %d is not byte-identical:\n%s\nwant\n%s", i, r.body, replay)
		}
		replay = r.body
	}

	// The same key from the result URL, bound to this payload, is the same replay.
	fp := wire.Fingerprint(mustDecode(t, body))
	got := e.do(t, http.MethodGet, "/v1/turns/"+key+"?fingerprint="+fp, nil, nil)
	if got.status != http.StatusOK || !bytes.Equal(got.body, replay) {
		t.Errorf("GET result: status %d, body %s; want 200 and the replay", got.status, got.body)
	}
	// Without the fingerprint the result URL answers nothing; with another
	// payload's, it answers what a POST of that payload would: 409.
	if g := e.do(t, http.MethodGet, "/v1/turns/"+key, nil, nil); g.status != http.StatusBadRequest || g.wireError(t).Field != "fingerprint" {
		t.Errorf("GET without fingerprint: status %d, body %s; want 400 naming the field", g.status, g.body)
	}
	otherFP := wire.Fingerprint(mustDecode(t, turnBody(workItem, "a different email")))
	if g := e.do(t, http.MethodGet, "/v1/turns/"+key+"?fingerprint="+otherFP, nil, nil); g.status != http.StatusConflict ||
		g.wireError(t).Reason != wire.ReasonIdempotencyKeyReused {
		t.Errorf("GET with another payload's fingerprint: status %d, body %s; want 409 idempotency_key_reused", g.status, g.body)
	}

	// The same work item and turn with another payload.
	other := e.submit(t, turnBody(workItem, "a different email"))
	if other.status != http.StatusConflict {
		t.Fatalf("other payload: status %d, body %s; want 409", other.status, other.body)
	}
	if we := other.wireError(t); we.Code != wire.CodeConflict || we.Reason != wire.ReasonIdempotencyKeyReused {
		t.Errorf("other payload: %+v, want conflict idempotency_key_reused", we)
	}

	if c := n.turnCount(t, key); c != 1 {
		t.Errorf("TURNS holds %d messages for the key, want 1", c)
	}
	if c := fb.seenCount(key); c != 1 {
		t.Errorf("the brain saw the turn %d times, want 1", c)
	}

	logs := e.logs.String()
	for _, secret := range []string{workItem, secret, testToken, "customer@example.com"} {
		if strings.Contains(logs, secret) {
			t.Errorf("the log contains %q", secret)
		}
	}
	if !strings.Contains(logs, `"turn_key":"`+key+`"`) || !strings.Contains(logs, `"route":"POST /v1/turns"`) {
		t.Errorf("the log has no request line with route and turn_key:\n%s", logs)
	}
}

func TestTurnSubmitConcurrentIdentical(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	fb := startFakeBrain(t, n, decide)
	e := startEdge(t, n, nil)
	body := turnBody("wi-concurrent", "fifty at once")
	key, req := keyOf(t, body)

	const clients = 50
	var wg sync.WaitGroup
	results := make([]response, clients)
	for i := range clients {
		wg.Go(func() { results[i] = e.submit(t, body) })
	}
	wg.Wait()

	want := decision(req)
	for i, r := range results {
		if r.status != http.StatusOK {
			t.Errorf("client %d: status %d, body %s", i, r.status, r.body)
			continue
		}
		rep := r.reply(t)
		if rep.Replayed {
			// A replay differs from the brain's bytes only in the flag.
			rep.Replayed = false
			if marked, _ := wire.MarkReplayed(want); !bytes.Equal(r.body, marked) {
				t.Errorf("client %d: replay %s is not the decision", i, r.body)
			}
		} else if !bytes.Equal(r.body, want) {
			t.Errorf("client %d: body %s is not the brain's bytes", i, r.body)
		}
	}
	if c := fb.seenCount(key); c != 1 {
		t.Errorf("the brain saw the turn %d times, want 1", c)
	}
	if c := n.turnCount(t, key); c != 1 {
		t.Errorf("TURNS holds %d messages for the key, want 1", c)
	}
}

func TestTurnSubmitRedrivesStoredError(t *testing.T) {
	t.Parallel()
	brainDown := &wire.Error{Code: wire.CodeUnavailable, Message: "tenant database unavailable", RetryAfter: 7}
	// The brain fails the first message of each key and decides the second.
	answer := func(tm turnMsg) *fakeAnswer {
		if tm.N == 1 {
			return &fakeAnswer{Status: wire.StatusError, Body: errorBody(brainDown)}
		}
		return decide(tm)
	}

	t.Run("SamePayload", func(t *testing.T) {
		t.Parallel()
		n := startNATS(t, true)
		fb := startFakeBrain(t, n, answer)
		e := startEdge(t, n, nil)
		body := turnBody("wi-redrive", "retry me")
		key, req := keyOf(t, body)

		r := e.submit(t, body)
		if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "7" {
			t.Fatalf("first submit: status %d Retry-After %q body %s; want 503 with Retry-After 7", r.status, r.header.Get("Retry-After"), r.body)
		}
		if we := r.wireError(t); we.Code != wire.CodeUnavailable || we.Message != brainDown.Message {
			t.Errorf("first submit: %+v, want the brain's error", we)
		}
		// The stored error is the answer of the result URL until a retry.
		// (The live reply can beat its storage in RESULTS: wait for the PubAck.)
		next(t, fb.replied, "the error stored in RESULTS")
		if g := e.do(t, http.MethodGet, "/v1/turns/"+key+"?fingerprint="+wire.Fingerprint(req), nil, nil); g.status != http.StatusServiceUnavailable {
			t.Errorf("GET after the error: status %d, body %s; want 503", g.status, g.body)
		}

		r = e.submit(t, body)
		if r.status != http.StatusOK || !bytes.Equal(r.body, decision(req)) {
			t.Fatalf("retry: status %d, body %s; want 200 and the brain's decision", r.status, r.body)
		}
		if c := fb.seenCount(key); c != 2 {
			t.Errorf("the brain saw %d messages, want 2 (the turn and its re-drive)", c)
		}
		// Decided now: a third try is a replay, not another re-drive.
		r = e.submit(t, body)
		if r.status != http.StatusOK || !r.reply(t).Replayed {
			t.Errorf("third submit: status %d, body %s; want a replay", r.status, r.body)
		}
		if c := n.turnCount(t, key); c != 2 {
			t.Errorf("TURNS holds %d messages for the key, want 2", c)
		}
	})

	t.Run("OtherPayload", func(t *testing.T) {
		t.Parallel()
		n := startNATS(t, true)
		fb := startFakeBrain(t, n, answer)
		e := startEdge(t, n, nil)
		first := turnBody("wi-redrive-other", "first version")
		second := turnBody("wi-redrive-other", "corrected version")
		key, req := keyOf(t, second)

		if r := e.submit(t, first); r.status != http.StatusServiceUnavailable {
			t.Fatalf("first payload: status %d, body %s; want 503", r.status, r.body)
		}
		// An error consumes nothing: another payload under the key is decided.
		// Sent at once, it may find the error not yet stored in RESULTS
		// (the live reply beats storage); the edge looks again while waiting.
		r := e.submit(t, second)
		if r.status != http.StatusOK || !bytes.Equal(r.body, decision(req)) {
			t.Fatalf("second payload: status %d, body %s; want 200 and its decision", r.status, r.body)
		}
		if c := fb.seenCount(key); c != 2 {
			t.Errorf("the brain saw %d messages, want 2", c)
		}
		// And now the first payload is the one reusing the key.
		if r := e.submit(t, first); r.status != http.StatusConflict {
			t.Errorf("first payload after the decision: status %d, body %s; want 409", r.status, r.body)
		}
	})
}

// Two payloads under one key at once: the first is held, then fails. The
// second, already waiting (or arriving after the error is stored), re-drives
// the key with its own payload and gets its decision; the first gets its error.
func TestTurnSubmitConcurrentOtherPayload(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	fb := startFakeBrain(t, n, func(tm turnMsg) *fakeAnswer {
		if tm.N == 1 {
			return nil // held; answered by the test below
		}
		return decide(tm)
	})
	e := startEdge(t, n, nil)
	bodyA := turnBody("wi-two-payloads", "version A")
	bodyB := turnBody("wi-two-payloads", "version B")
	key, reqB := keyOf(t, bodyB)

	resA, resB := make(chan response, 1), make(chan response, 1)
	go func() { resA <- e.submit(t, bodyA) }()
	tmA := next(t, fb.received, "turn A at the brain")
	go func() { resB <- e.submit(t, bodyB) }()
	fb.reply(key, tmA.Seq, tmA.FP, &fakeAnswer{Status: wire.StatusError,
		Body: errorBody(&wire.Error{Code: wire.CodeUnavailable, Message: "model timeout"})})

	if a := next(t, resA, "A's answer"); a.status != http.StatusServiceUnavailable {
		t.Errorf("A: status %d, body %s; want its 503", a.status, a.body)
	}
	if b := next(t, resB, "B's answer"); b.status != http.StatusOK || !bytes.Equal(b.body, decision(reqB)) {
		t.Errorf("B: status %d, body %s; want 200 and B's decision", b.status, b.body)
	}
	if c := fb.seenCount(key); c != 2 {
		t.Errorf("the brain saw %d messages, want 2 (A, then B's re-drive)", c)
	}
}

func TestTurnSubmitBrainErrors(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	halted := &wire.Error{Code: wire.CodeUnprocessable, Reason: wire.ReasonItemHalted, Message: "the item is halted for a human"}
	outOfSeq := &wire.Error{Code: wire.CodeConflict, Reason: wire.ReasonTurnOutOfSequence, Message: "expected turn 2", ExpectedTurn: 2}
	answer := func(tm turnMsg) *fakeAnswer {
		e := halted
		if strings.Contains(tm.Req.Email.Body, "sequence") {
			e = outOfSeq
		}
		return &fakeAnswer{Status: wire.StatusError, Body: errorBody(e)}
	}
	startFakeBrain(t, n, answer)
	e := startEdge(t, n, nil)

	for _, tc := range []struct {
		name   string
		body   []byte
		status int
		want   *wire.Error
	}{
		{"Halted", turnBody("wi-halted", "hello"), http.StatusUnprocessableEntity, halted},
		{"OutOfSequence", turnBody("wi-seq", "sequence"), http.StatusConflict, outOfSeq},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := e.submit(t, tc.body)
			if r.status != tc.status {
				t.Fatalf("status %d, body %s; want %d", r.status, r.body, tc.status)
			}
			if got := r.wireError(t); *got != *tc.want {
				t.Errorf("error %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestTurnSubmitPendingThenFetch(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	fb := startFakeBrain(t, n, func(turnMsg) *fakeAnswer { return nil }) // holds every turn
	e := startEdge(t, n, func(c *Config) { c.TurnWait = 300 * time.Millisecond })
	body := turnBody("wi-slow", "the model is slow today")
	key, req := keyOf(t, body)

	r := e.submit(t, body)
	if r.status != http.StatusAccepted {
		t.Fatalf("submit: status %d, body %s; want 202", r.status, r.body)
	}
	url := "/v1/turns/" + key + "?fingerprint=" + wire.Fingerprint(req)
	if r.header.Get("Location") != url || r.header.Get("Retry-After") != "2" {
		t.Errorf("202 headers Location %q Retry-After %q; want %q and 2", r.header.Get("Location"), r.header.Get("Retry-After"), url)
	}
	var pending wire.TurnPendingReply
	must(t, json.Unmarshal(r.body, &pending))
	if pending.Status != "pending" || pending.TurnKey != key || pending.ResultURL != url || pending.Message == "" {
		t.Errorf("202 body %+v", pending)
	}

	g := e.do(t, http.MethodGet, url, nil, nil)
	if g.status != http.StatusNotFound {
		t.Fatalf("GET before the decision: status %d, body %s; want 404", g.status, g.body)
	}
	if we := g.wireError(t); we.Code != wire.CodeNotFound || !strings.Contains(we.Message, "safe") {
		t.Errorf("GET before the decision: %+v", we)
	}

	// The brain decides late.
	tm := next(t, fb.received, "the turn at the brain")
	fb.reply(key, tm.Seq, tm.FP, decide(tm))

	// The first delivery of the decision is not a replay: nobody had it.
	g = e.do(t, http.MethodGet, url, nil, nil)
	if g.status != http.StatusOK {
		t.Fatalf("GET after the decision: status %d, body %s; want 200", g.status, g.body)
	}
	if !bytes.Equal(g.body, decision(req)) {
		t.Errorf("first GET after the decision: %s, want the brain's bytes with replayed false %s", g.body, decision(req))
	}
	// Every later delivery is.
	marked, err := wire.MarkReplayed(decision(req))
	must(t, err)
	if g := e.do(t, http.MethodGet, url, nil, nil); g.status != http.StatusOK || !bytes.Equal(g.body, marked) {
		t.Errorf("second GET: status %d, body %s; want %s", g.status, g.body, marked)
	}
	// And the same turn re-submitted gets it too, without a second message.
	if r := e.submit(t, body); r.status != http.StatusOK || !bytes.Equal(r.body, marked) {
		t.Errorf("re-submit after the decision: status %d, body %s", r.status, r.body)
	}
	if c := fb.seenCount(key); c != 1 {
		t.Errorf("the brain saw %d messages, want 1", c)
	}
}

// The live reply is gone (it was published before the edge listened) but
// the result is stored: the edge's last look before answering 202 finds it.
func TestTurnSubmitMissedLiveReply(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	fb := startFakeBrain(t, n, func(turnMsg) *fakeAnswer { return nil })
	e := startEdge(t, n, func(c *Config) { c.TurnWait = 300 * time.Millisecond })
	body := turnBody("wi-missed", "lost in a reconnect")
	key, req := keyOf(t, body)

	// TURNS is empty, so the edge's turn will be sequence 1: this is the
	// brain's answer to exactly that message, published "too early".
	fb.reply(key, 1, wire.Fingerprint(req), decide(turnMsg{Req: req}))

	r := e.submit(t, body)
	if r.status != http.StatusOK {
		t.Fatalf("submit: status %d, body %s; want 200 from the stored result", r.status, r.body)
	}
	if !bytes.Equal(r.body, decision(req)) {
		t.Errorf("body %s, want the brain's bytes unmarked: the reply answers this request's own message", r.body)
	}
	if tm := next(t, fb.received, "the turn at the brain"); tm.Seq != 1 {
		t.Errorf("the edge's turn is sequence %d, want 1", tm.Seq)
	}
}

// Another process of the same tenant (an edge before a restart) sent the
// turn and the brain answered it: the edge gets 10071, fetches, replays.
func TestTurnSubmitAcceptedElsewhere(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	fb := startFakeBrain(t, n, decide)
	e := startEdge(t, n, nil)
	body := turnBody("wi-elsewhere", "sent before a restart")
	key, req := keyOf(t, body)

	payload, err := json.Marshal(req)
	must(t, err)
	earlier, err := jetstream.New(n.connect(t, n.edgeCreds))
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = earlier.PublishMsg(ctx, &nats.Msg{Subject: subjects.TurnLocal(key), Data: payload},
		jetstream.WithMsgID(msgID(key, wire.Fingerprint(req), 0)), jetstream.WithExpectLastSequencePerSubject(0))
	must(t, err)
	next(t, fb.replied, "the brain's reply to the earlier edge")

	r := e.submit(t, body)
	if r.status != http.StatusOK || !r.reply(t).Replayed {
		t.Fatalf("submit: status %d, body %s; want 200 and a replay", r.status, r.body)
	}
	if c := fb.seenCount(key); c != 1 {
		t.Errorf("the brain saw %d messages, want 1", c)
	}
}

// The reply is stored while the edge waits but never reaches it live (as
// when the live reply beat its storage, before the edge listened). A request
// waiting on a message it did not publish looks at the stored reply again
// and answers long before TurnWait.
func TestTurnSubmitStoredWithoutLiveReply(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	fb := startFakeBrain(t, n, func(turnMsg) *fakeAnswer { return nil })
	// TurnWait is far beyond the test's deadlines: only a re-look can answer.
	e := startEdge(t, n, func(c *Config) { c.TurnWait = 5 * time.Minute })
	body := turnBody("wi-stored-only", "stored, never pushed")
	key, req := keyOf(t, body)

	// RESULTS also captures a staging subject, stored under the reply
	// subject: a message stored there is never delivered live, since the
	// tenant's event import only carries its own account in token 3.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc := stream.Results(stream.Config{Memory: true}, n.tenant.Public, stream.Limits{})
	// Without the republish a stored reply is never live: the case of a
	// live reply lost while the edge was reconnecting.
	rc.RePublish = nil
	rc.Subjects = append(rc.Subjects, "stage.>")
	rc.SubjectTransform = &jetstream.SubjectTransformConfig{
		Source: "stage.*.*", Destination: "brain.reply.{{wildcard(1)}}.{{wildcard(2)}}",
	}
	_, err := n.streamsJS.UpdateStream(ctx, rc)
	must(t, err)

	// An earlier edge sent the turn; the brain holds it.
	payload, err := json.Marshal(req)
	must(t, err)
	earlier, err := jetstream.New(n.connect(t, n.edgeCreds))
	must(t, err)
	_, err = earlier.PublishMsg(ctx, &nats.Msg{Subject: subjects.TurnLocal(key), Data: payload},
		jetstream.WithMsgID(msgID(key, wire.Fingerprint(req), 0)), jetstream.WithExpectLastSequencePerSubject(0))
	must(t, err)
	tm := next(t, fb.received, "the turn at the brain")

	res := make(chan response, 1)
	go func() { res <- e.submit(t, body) }()
	e.logs.waitFor(t, `"msg":"no stored reply yet","tenant_id":"client-zero","turn_key":"`+key+`"`)

	msg := &nats.Msg{Subject: "stage." + n.tenant.Public + "." + key, Data: decision(req), Header: nats.Header{}}
	msg.Header.Set(wire.HeaderStatus, wire.StatusOK)
	msg.Header.Set(wire.HeaderFingerprint, tm.FP)
	msg.Header.Set(wire.HeaderTurnSeq, fmt.Sprint(tm.Seq))
	ack, err := n.streamsJS.PublishMsg(ctx, msg)
	must(t, err)
	if ack.Stream != subjects.ResultsStream(n.tenant.Public) {
		t.Fatalf("staged reply stored in %q", ack.Stream)
	}

	r := next(t, res, "the edge's answer")
	if r.status != http.StatusOK || !r.reply(t).Replayed {
		t.Fatalf("status %d, body %s; want 200 with the stored decision", r.status, r.body)
	}
}

// A stored reply without the brain's headers is a brain bug: a visible 500,
// never a 202 that no retry can resolve.
func TestTurnMalformedStoredReply(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	startFakeBrain(t, n, func(turnMsg) *fakeAnswer { return nil })
	e := startEdge(t, n, func(c *Config) { c.TurnWait = 200 * time.Millisecond })
	body := turnBody("wi-malformed", "hello")
	key, _ := keyOf(t, body)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg := &nats.Msg{Subject: subjects.Reply(n.tenant.Public, key), Data: []byte(`{}`), Header: nats.Header{}}
	msg.Header.Set(wire.HeaderStatus, "maybe")
	_, err := n.brainJS.PublishMsg(ctx, msg)
	must(t, err)

	if g := e.do(t, http.MethodGet, "/v1/turns/"+key+"?fingerprint="+strings.Repeat("a", 64), nil, nil); g.status != http.StatusInternalServerError || g.wireError(t).Code != wire.CodeInternal {
		t.Errorf("GET: status %d, body %s; want 500 internal", g.status, g.body)
	}
	if r := e.submit(t, body); r.status != http.StatusInternalServerError || r.wireError(t).Code != wire.CodeInternal {
		t.Errorf("POST: status %d, body %s; want 500 internal", r.status, r.body)
	}
	if logs := e.logs.String(); !strings.Contains(logs, "malformed brain reply") {
		t.Errorf("the cause is not in the log")
	}
}

// Without the tenant's turn stream nothing acknowledges a turn: the edge
// retries for PublishTimeout and answers 503 with Retry-After and the
// reason, never a silent loss.
func TestTurnSubmitUnavailable(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	e := startEdge(t, n, func(c *Config) { c.PublishTimeout = 400 * time.Millisecond })

	start := time.Now()
	r := e.submit(t, turnBody("wi-nostream", "anyone there?"))
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "2" {
		t.Fatalf("status %d Retry-After %q body %s; want 503 with Retry-After 2", r.status, r.header.Get("Retry-After"), r.body)
	}
	if we := r.wireError(t); we.Code != wire.CodeUnavailable || we.RetryAfter != 2 || we.Reason != wire.ReasonNotProvisioned {
		t.Errorf("error %+v, want unavailable (tenant_not_provisioned) with retry_after 2", we)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s; the publish budget is 400ms", d)
	}
	if logs := e.logs.String(); !strings.Contains(logs, "turn publish retry") {
		t.Errorf("no publish retry was logged:\n%s", logs)
	}
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	e := startEdge(t, n, nil)

	if r := e.do(t, http.MethodGet, "/healthz", nil, map[string]string{"Authorization": ""}); r.status != 200 || string(r.body) != `{"status":"ok"}` {
		t.Errorf("healthz: %d %s", r.status, r.body)
	}
	if r := e.do(t, http.MethodGet, "/readyz", nil, map[string]string{"Authorization": ""}); r.status != 200 {
		t.Errorf("readyz while connected: %d %s", r.status, r.body)
	}

	n.srv.Stop()
	// The client is RECONNECTING before it reports the disconnect.
	e.logs.waitFor(t, `"msg":"nats disconnected"`)
	r := e.do(t, http.MethodGet, "/readyz", nil, map[string]string{"Authorization": ""})
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("readyz without NATS: %d %s, want 503", r.status, r.body)
	}
	if we := r.wireError(t); we.Code != wire.CodeUnavailable || r.header.Get("Retry-After") == "" {
		t.Errorf("readyz without NATS: %+v, Retry-After %q", we, r.header.Get("Retry-After"))
	}
	if r := e.do(t, http.MethodGet, "/healthz", nil, nil); r.status != 200 {
		t.Errorf("healthz without NATS: %d", r.status)
	}
}

func TestServeStartErrors(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"MissingURL", Config{CredsFile: n.edgeCreds, Token: testToken}, "EDGE_NATS_URL"},
		{"ShortToken", Config{NATSURL: n.srv.ClientURL(), CredsFile: n.edgeCreds, Token: "short"}, "EDGE_TOKEN"},
		{"MissingCredsFile", Config{NATSURL: n.srv.ClientURL(), CredsFile: t.TempDir() + "/nope.creds", Token: testToken}, "connect to NATS"},
		{"WebhookWithoutSecret", Config{NATSURL: n.srv.ClientURL(), CredsFile: n.edgeCreds, Token: testToken, WebhookURL: "http://127.0.0.1:1/w"}, "EDGE_WEBHOOK_SECRET"},
		{"MissingReviewersFile", Config{NATSURL: n.srv.ClientURL(), CredsFile: n.edgeCreds, Token: testToken, ReviewersFile: t.TempDir() + "/nope"}, "EDGE_REVIEWERS_FILE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			must(t, err)
			err = Serve(context.Background(), ln, tc.cfg, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Serve: %v, want an error naming %s", err, tc.want)
			}
			if _, err := ln.Accept(); err == nil {
				t.Errorf("the listener is still open after Serve failed")
			}
		})
	}
}

func TestConfigFromEnv(t *testing.T) {
	t.Parallel()
	tokenFile := t.TempDir() + "/token"
	must(t, os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600))
	secretFile := t.TempDir() + "/webhook-secret"
	must(t, os.WriteFile(secretFile, []byte(testWebhookSecret+"\n"), 0o600))
	base := map[string]string{
		"EDGE_NATS_URL":   "nats://127.0.0.1:4222",
		"EDGE_NATS_CREDS": "/run/secrets/edge.creds",
		"EDGE_TOKEN":      testToken,
	}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		wantErr string
		check   func(t *testing.T, c Config)
	}{
		{name: "Defaults", env: base, check: func(t *testing.T, c Config) {
			if c.Addr != DefaultAddr || c.TurnWait != DefaultTurnWait || c.PublishTimeout != DefaultPublishTimeout || c.Token != testToken {
				t.Errorf("%+v", c)
			}
		}},
		{name: "Overrides", env: with("EDGE_ADDR", ":9000", "EDGE_TURN_WAIT", "3s", "EDGE_PUBLISH_TIMEOUT", "750ms", "EDGE_TENANT_ID", "client-zero"),
			check: func(t *testing.T, c Config) {
				if c.Addr != ":9000" || c.TurnWait != 3*time.Second || c.PublishTimeout != 750*time.Millisecond || c.TenantID != "client-zero" {
					t.Errorf("%+v", c)
				}
			}},
		{name: "TokenFile", env: with("EDGE_TOKEN", "", "EDGE_TOKEN_FILE", tokenFile), check: func(t *testing.T, c Config) {
			if c.Token != testToken {
				t.Errorf("token %q from the file, want it without the newline", c.Token)
			}
		}},
		{name: "BothTokens", env: with("EDGE_TOKEN_FILE", tokenFile), wantErr: "EDGE_TOKEN_FILE"},
		{name: "MissingTokenFile", env: with("EDGE_TOKEN", "", "EDGE_TOKEN_FILE", tokenFile+".missing"), wantErr: "EDGE_TOKEN_FILE"},
		{name: "NoToken", env: with("EDGE_TOKEN", ""), wantErr: "EDGE_TOKEN"},
		{name: "ShortToken", env: with("EDGE_TOKEN", "0123456789"), wantErr: "EDGE_TOKEN"},
		{name: "SpaceInToken", env: with("EDGE_TOKEN", "0123456789 abcdefgh"), wantErr: "EDGE_TOKEN"},
		{name: "NoURL", env: with("EDGE_NATS_URL", ""), wantErr: "EDGE_NATS_URL"},
		{name: "NoCreds", env: with("EDGE_NATS_CREDS", ""), wantErr: "EDGE_NATS_CREDS"},
		{name: "BadTurnWait", env: with("EDGE_TURN_WAIT", "10"), wantErr: "EDGE_TURN_WAIT"},
		{name: "WebhookDefaults", env: base, check: func(t *testing.T, c Config) {
			if c.WebhookURL != "" || c.WebhookTimeout != DefaultWebhookTimeout || c.WebhookRetries != DefaultWebhookRetries ||
				c.WebhookInitialInterval != DefaultWebhookInitialInterval || c.WebhookMaxInterval != DefaultWebhookMaxInterval || c.ReviewersFile != "" {
				t.Errorf("%+v", c)
			}
		}},
		{name: "Webhook", env: with("EDGE_WEBHOOK_URL", "http://n8n:5678/webhook/brain", "EDGE_WEBHOOK_SECRET", testWebhookSecret,
			"EDGE_WEBHOOK_TIMEOUT", "3s", "EDGE_REVIEWERS_FILE", "/run/secrets/reviewers"), check: func(t *testing.T, c Config) {
			if c.WebhookURL != "http://n8n:5678/webhook/brain" || c.WebhookSecret != testWebhookSecret || c.WebhookTimeout != 3*time.Second ||
				c.ReviewersFile != "/run/secrets/reviewers" {
				t.Errorf("%+v", c)
			}
		}},
		{name: "WebhookSecretFile", env: with("EDGE_WEBHOOK_URL", "https://n8n.example/webhook/x", "EDGE_WEBHOOK_SECRET_FILE", secretFile),
			check: func(t *testing.T, c Config) {
				if c.WebhookSecret != testWebhookSecret {
					t.Errorf("secret %q from the file, want it without the newline", c.WebhookSecret)
				}
			}},
		{name: "WebhookWithoutSecret", env: with("EDGE_WEBHOOK_URL", "http://n8n:5678/webhook/brain"), wantErr: "EDGE_WEBHOOK_SECRET"},
		{name: "WebhookShortSecret", env: with("EDGE_WEBHOOK_URL", "http://n8n/w", "EDGE_WEBHOOK_SECRET", "short"), wantErr: "EDGE_WEBHOOK_SECRET"},
		{name: "WebhookBothSecrets", env: with("EDGE_WEBHOOK_URL", "http://n8n/w", "EDGE_WEBHOOK_SECRET", testWebhookSecret,
			"EDGE_WEBHOOK_SECRET_FILE", secretFile), wantErr: "EDGE_WEBHOOK_SECRET_FILE"},
		{name: "WebhookRelativeURL", env: with("EDGE_WEBHOOK_URL", "/webhook/brain", "EDGE_WEBHOOK_SECRET", testWebhookSecret), wantErr: "EDGE_WEBHOOK_URL"},
		{name: "WebhookFTP", env: with("EDGE_WEBHOOK_URL", "ftp://n8n/w", "EDGE_WEBHOOK_SECRET", testWebhookSecret), wantErr: "EDGE_WEBHOOK_URL"},
		{name: "BadWebhookTimeout", env: with("EDGE_WEBHOOK_TIMEOUT", "soon"), wantErr: "EDGE_WEBHOOK_TIMEOUT"},
		{name: "NegativePublishTimeout", env: with("EDGE_PUBLISH_TIMEOUT", "-1s"), wantErr: "EDGE_PUBLISH_TIMEOUT"},
		{name: "ReviewDefaults", env: base, check: func(t *testing.T, c Config) {
			if c.ReviewSessionIdle != DefaultReviewSessionIdle || c.ReviewSecureCookie || c.ReviewTimeZone != "" || c.ReviewClientIPHeader != "" {
				t.Errorf("%+v", c)
			}
		}},
		{name: "Review", env: with("EDGE_REVIEW_SECURE_COOKIE", "true", "EDGE_REVIEW_SESSION_IDLE", "20m",
			"EDGE_REVIEW_TIMEZONE", "Australia/Sydney", "EDGE_REVIEW_CLIENT_IP_HEADER", "X-Forwarded-For"), check: func(t *testing.T, c Config) {
			if !c.ReviewSecureCookie || c.ReviewSessionIdle != 20*time.Minute || c.ReviewTimeZone != "Australia/Sydney" || c.ReviewClientIPHeader != "X-Forwarded-For" {
				t.Errorf("%+v", c)
			}
		}},
		{name: "BadSecureCookie", env: with("EDGE_REVIEW_SECURE_COOKIE", "yes please"), wantErr: "EDGE_REVIEW_SECURE_COOKIE"},
		{name: "LongSessionIdle", env: with("EDGE_REVIEW_SESSION_IDLE", "24h"), wantErr: "EDGE_REVIEW_SESSION_IDLE"},
		{name: "BadTimeZone", env: with("EDGE_REVIEW_TIMEZONE", "Mars/Olympus"), wantErr: "EDGE_REVIEW_TIMEZONE"},
		{name: "MetricsOffByDefault", env: base, check: func(t *testing.T, c Config) {
			if c.MetricsAddr != "" {
				t.Errorf("metrics listener %q by default, want off", c.MetricsAddr)
			}
		}},
		{name: "Metrics", env: with("EDGE_METRICS_ADDR", ":9480"), check: func(t *testing.T, c Config) {
			if c.MetricsAddr != ":9480" {
				t.Errorf("%+v", c)
			}
		}},
		{name: "MetricsOnTheAPIListener", env: with("EDGE_ADDR", "127.0.0.1:8480", "EDGE_METRICS_ADDR", "127.0.0.1:8480"), wantErr: "EDGE_METRICS_ADDR must differ"},
		{name: "MetricsNotHostPort", env: with("EDGE_METRICS_ADDR", "9480"), wantErr: "EDGE_METRICS_ADDR"},
		{name: "BadIPHeader", env: with("EDGE_REVIEW_CLIENT_IP_HEADER", "X-Real-IP: 1"), wantErr: "EDGE_REVIEW_CLIENT_IP_HEADER"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := ConfigFromEnv(func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			must(t, err)
			tc.check(t, c)
		})
	}
}

func TestHTTPStatus(t *testing.T) {
	t.Parallel()
	for code, want := range map[wire.Code]int{
		wire.CodeInvalid: 400, wire.CodeUnauthorized: 401, wire.CodeForbidden: 403, wire.CodeNotFound: 404,
		wire.CodeConflict: 409, wire.CodeUnprocessable: 422, wire.CodeRateLimited: 429,
		wire.CodeUnavailable: 503, wire.CodeInternal: 500, "something_new": 500,
	} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			t.Parallel()
			e := &wire.Error{Code: code, Message: "m"}
			if got := httpStatus(e); got != want {
				t.Errorf("status %d, want %d", got, want)
			}
			rec := httptest.NewRecorder()
			writeError(rec, e)
			ra := rec.Header().Get("Retry-After")
			if (want == 429 || want == 503) != (ra == "2") {
				t.Errorf("Retry-After %q for status %d", ra, want)
			}
			var er wire.ErrorReply
			if err := json.Unmarshal(rec.Body.Bytes(), &er); err != nil || er.Error.Code != code {
				t.Errorf("body %s: %v", rec.Body.Bytes(), err)
			}
		})
	}
}

func mustDecode(t *testing.T, body []byte) *wire.TurnSubmitRequest {
	t.Helper()
	req, err := wire.DecodeTurnSubmitRequest(body)
	must(t, err)
	return req
}

// What RESULTS holds for a key, read directly or republished live, names
// the subject it was stored under; a stored reply of another key, or a
// message without it (a PubAck, an API answer sent to reply.<key> by a
// forged request), is not that key's reply.
func TestStoredUnder(t *testing.T) {
	t.Parallel()
	k1, k2 := subjects.TurnKey("<one@x>", 1), subjects.TurnKey("<two@x>", 1)
	acc := "ABRAINTESTACCOUNTXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"
	msg := func(storedAs string) *nats.Msg {
		m := nats.NewMsg(subjects.ReplyLocal(k1))
		if storedAs != "" {
			m.Header.Set(jetstream.SubjectHeader, storedAs)
		}
		return m
	}
	for _, tc := range []struct {
		storedAs string
		want     bool
	}{
		{subjects.Reply(acc, k1), true},
		{subjects.Reply(acc, k2), false},
		{"", false},
		{subjects.Live(acc, k1), false},
		{subjects.Reply(acc, k1) + ".x", false},
	} {
		if got := storedUnder(msg(tc.storedAs), k1); got != tc.want {
			t.Errorf("stored as %q: storedUnder = %v, want %v", tc.storedAs, got, tc.want)
		}
	}
}

// Two identical submissions in flight: the second finds the turn already
// published (a duplicate PubAck) and gets the decision from the live
// reply. The first caused the decision; the second is a retry and says
// replayed, as a retry after the decision does (it said replayed:false).
func TestDuplicateInFlightIsAReplay(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	fb := startFakeBrain(t, n, func(turnMsg) *fakeAnswer { return nil }) // held until replied below
	e := startEdge(t, n, nil)
	body := turnBody("wi-dup-in-flight", "twice")
	key, _ := keyOf(t, body)
	first, second := make(chan response, 1), make(chan response, 1)
	go func() { first <- e.submit(t, body) }()
	tm := next(t, fb.received, "the turn")
	go func() { second <- e.submit(t, body) }()
	e.logs.waitFor(t, `"no stored reply yet"`) // the second request looked, and waits
	fb.reply(key, tm.Seq, tm.FP, decide(tm))
	r1, r2 := next(t, first, "the first answer"), next(t, second, "the second answer")
	if r1.reply(t).Replayed || !r2.reply(t).Replayed || fb.seenCount(key) != 1 {
		t.Errorf("first replayed=%v, second replayed=%v, the brain saw the turn %d times: want false, true, once",
			r1.reply(t).Replayed, r2.reply(t).Replayed, fb.seenCount(key))
	}
}

// What a sloppy or hostile client gets: a typed answer naming what to fix,
// and a turn within its fields' limits is taken however it spells them.
func TestRequestsTheEdgeRefusesOrTakes(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	fb := startFakeBrain(t, n, decide)
	e := startEdge(t, n, nil)

	t.Run("LineSeparatorsWithinTheLimits", func(t *testing.T) {
		// 130,894 bytes whose fields are within their limits; U+2028 was
		// published as \u2028, twice its size, and refused 413.
		body := []byte(`{"work_item_id":"wi-2028","turn":1,"email":{"from":"a@b.example","subject":"` +
			strings.Repeat("\u2028", 600) + `","body":"` + strings.Repeat("\u2028", 43000) + `"}}`)
		if r := e.submit(t, body); r.status != http.StatusOK {
			t.Fatalf("status %d %s", r.status, r.body)
		}
		next(t, fb.received, "the turn")
	})
	t.Run("CompressedBody", func(t *testing.T) {
		r := e.do(t, http.MethodPost, "/v1/turns", turnBody("wi-gzip", "x"), map[string]string{"Content-Encoding": "gzip"})
		if we := r.wireError(t); r.status != http.StatusUnsupportedMediaType || we.Field != "Content-Encoding" {
			t.Errorf("Content-Encoding gzip: %d %+v, want 415 naming Content-Encoding", r.status, we)
		}
	})
	t.Run("WrongToken", func(t *testing.T) {
		r := e.do(t, http.MethodGet, "/v1/approvals", nil, map[string]string{"Authorization": "Bearer not-the-token-of-this-edge"})
		if we := r.wireError(t); r.status != http.StatusUnauthorized || !strings.Contains(we.Message, "not this edge's token") {
			t.Errorf("a wrong token: %d %+v, want 401 saying the token is not this edge's", r.status, we)
		}
	})
	t.Run("TwoAuthorizationHeaders", func(t *testing.T) {
		for _, second := range []string{"Bearer " + testToken, "Bearer wrong"} {
			req, err := http.NewRequest(http.MethodGet, e.url+"/v1/approvals", nil)
			must(t, err)
			req.Header.Add("Authorization", "Bearer "+testToken)
			req.Header.Add("Authorization", second)
			res, err := http.DefaultClient.Do(req)
			must(t, err)
			res.Body.Close()
			if res.StatusCode != http.StatusUnauthorized {
				t.Errorf("two Authorization headers (the second %q): %d, want 401", second, res.StatusCode)
			}
		}
	})
}

// A turn whose body arrives slowly, as long as the read allows less a
// margin, is still answered: the write deadline, counted from the end of
// the headers, used to end before a body that took TurnWait+15s.
func TestSlowBodyStillGetsItsAnswer(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	fb := startFakeBrain(t, n, decide)
	e := startEdge(t, n, func(c *Config) { c.TurnWait = time.Second }) // the old write deadline: 16s
	body := turnBody("wi-slow-body", "slow")
	key, _ := keyOf(t, body)
	c, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	must(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "POST /v1/turns HTTP/1.1\r\nHost: edge\r\nAuthorization: Bearer "+testToken+
		"\r\nContent-Type: application/json\r\n"+fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body)))
	must(t, err)
	const steps = 17 // a second each
	per := len(body)/steps + 1
	for i := 0; i < len(body); i += per {
		_, err := c.Write(body[i:min(i+per, len(body))])
		must(t, err)
		time.Sleep(time.Second)
	}
	must(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("a body sent over %ds got no answer (%v); the brain saw the turn %d times", steps, err, fb.seenCount(key))
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || fb.seenCount(key) != 1 {
		t.Errorf("status %d, the brain saw the turn %d times", res.StatusCode, fb.seenCount(key))
	}
}

// With the NATS server gone, a turn that could not be sent says that the
// edge lost NATS, not that the brain did not take it.
func TestTurnWithoutNATSSaysSo(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	e := startEdge(t, n, func(c *Config) { c.PublishTimeout = 500 * time.Millisecond })
	deadline := time.Now().Add(10 * time.Second)
	for e.do(t, http.MethodGet, "/readyz", nil, map[string]string{"Authorization": ""}).status != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("the edge never connected to NATS")
		}
		time.Sleep(20 * time.Millisecond)
	}
	n.srv.Stop()
	r := e.submit(t, turnBody("wi-no-nats", "hello"))
	if we := r.wireError(t); r.status != http.StatusServiceUnavailable || !strings.Contains(we.Message, "lost its NATS connection") {
		t.Errorf("status %d %+v, want 503 saying the edge lost NATS", r.status, we)
	}
}
