package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/nats/account"
	"n8nbrain/nats/embed"
	"n8nbrain/nats/stream"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

const testToken = "test-token-0123456789abcdef"

// testNATS is a real embedded NATS server in operator mode with the same
// accounts the dev stack uses: SYS, STREAMS with the tenants' streams, BRAIN
// importing their consumer API, and one tenant importing both.
type testNATS struct {
	srv        *embed.Server
	op         *account.Operator // signs account JWTs (revocations)
	tenant     *account.Account
	edgeCreds  string // path of the edge .creds
	brainCreds string
	// brainNC and brainJS are a brain replica's: through BRAIN's imports.
	brainNC *nats.Conn
	brainJS jetstream.JetStream
	// streamsNC and streamsJS act inside STREAMS with no limits: the test's
	// own hands on the tenant's streams.
	streamsNC *nats.Conn
	streamsJS jetstream.JetStream
}

// startNATS starts the server; with streams set it also creates the
// tenant's streams and the brain's consumer, as provisioning does.
func startNATS(t *testing.T, streams bool) *testNATS {
	t.Helper()
	sysKP, sysPub, err := account.NewAccountKey(nil)
	must(t, err)
	op, err := account.NewOperator("OP", nil, sysPub)
	must(t, err)
	sys, err := op.SystemAccount(sysKP)
	must(t, err)
	st, err := op.StreamsAccount(nil)
	must(t, err)
	brain, err := op.BrainAccount(nil, st)
	must(t, err)
	tenant, err := op.TenantAccount("TENANT_A", nil, brain.Public, st.Public)
	must(t, err)

	srv, err := embed.Start(embed.Config{
		StoreDir:      t.TempDir(),
		OperatorJWT:   op.JWT,
		SystemAccount: sys.Public,
		Accounts:      map[string]string{sys.Public: sys.JWT, st.Public: st.JWT, brain.Public: brain.JWT, tenant.Public: tenant.JWT},
	})
	must(t, err)
	t.Cleanup(srv.Stop)

	dir := t.TempDir()
	n := &testNATS{
		srv:        srv,
		op:         op,
		tenant:     tenant,
		edgeCreds:  writeCreds(t, dir, tenant, "edge", account.RoleEdge),
		brainCreds: writeCreds(t, dir, brain, "brain", account.RoleBrain),
	}
	n.brainNC = n.connect(t, n.brainCreds)
	n.brainJS, err = jetstream.NewWithAPIPrefix(n.brainNC, subjects.StreamsAPIPrefix)
	must(t, err)
	n.streamsNC = n.connect(t, writeCreds(t, dir, st, "test", account.RoleUnrestricted))
	n.streamsJS, err = jetstream.New(n.streamsNC)
	must(t, err)
	if streams {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		must(t, stream.EnsureTenant(ctx, n.streamsJS, stream.Config{Memory: true, AckWait: 2 * time.Second}, tenant.Public, stream.Limits{}))
	}
	return n
}

func writeCreds(t *testing.T, dir string, acc *account.Account, user string, role account.Role) string {
	t.Helper()
	creds, err := account.UserCreds(acc, user, role)
	must(t, err)
	p := filepath.Join(dir, acc.Name+"-"+user+".creds")
	must(t, os.WriteFile(p, creds, 0o600))
	return p
}

func (n *testNATS) connect(t *testing.T, creds string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(n.srv.ClientURL(), nats.UserCredentials(creds), nats.Name("test"))
	must(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// turnCount is how many messages the TURNS stream holds for a key.
func (n *testNATS) turnCount(t *testing.T, key string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := n.streamsJS.Stream(ctx, subjects.TurnsStream(n.tenant.Public))
	must(t, err)
	subj := subjects.Turn(n.tenant.Public, key)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subj))
	must(t, err)
	return info.State.Subjects[subj]
}

// turnMsg is a turn as the fake brain received it.
type turnMsg struct {
	Key string
	Seq uint64 // TURNS stream sequence
	N   int    // how many distinct messages of this key so far, this one included
	Req *wire.TurnSubmitRequest
	FP  string
}

// fakeAnswer is what the fake brain replies; nil means no reply.
type fakeAnswer struct {
	Status string // wire.StatusOK or wire.StatusError
	Body   []byte
}

// fakeBrain speaks the brain's side of the wire protocol and nothing else:
// it consumes TURNS and publishes a reply with the three headers, through
// JetStream, to brain.reply.<account>.<key>.
type fakeBrain struct {
	t        *testing.T
	n        *testNATS
	answer   func(turnMsg) *fakeAnswer
	received chan turnMsg
	replied  chan turnMsg

	mu   sync.Mutex
	seen map[string]map[uint64]bool
}

// startFakeBrain consumes turns with answer deciding each reply.
func startFakeBrain(t *testing.T, n *testNATS, answer func(turnMsg) *fakeAnswer) *fakeBrain {
	t.Helper()
	fb := &fakeBrain{
		t: t, n: n, answer: answer,
		received: make(chan turnMsg, 256),
		replied:  make(chan turnMsg, 256),
		seen:     map[string]map[uint64]bool{},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := n.brainJS.Consumer(ctx, subjects.TurnsStream(n.tenant.Public), subjects.TurnsConsumer)
	must(t, err)
	cc, err := cons.Consume(fb.handle)
	must(t, err)
	t.Cleanup(cc.Stop)
	return fb
}

func (fb *fakeBrain) handle(m jetstream.Msg) {
	acc, key, err := subjects.ParseTurn(m.Subject())
	if err != nil || acc != fb.n.tenant.Public {
		fb.t.Errorf("fake brain: turn on %q (account %q): %v", m.Subject(), acc, err)
		_ = m.Term()
		return
	}
	md, err := m.Metadata()
	if err != nil {
		fb.t.Errorf("fake brain: metadata: %v", err)
		return
	}
	req, err := wire.DecodeTurnSubmitRequest(m.Data())
	if err != nil {
		fb.t.Errorf("fake brain: the edge published an invalid turn: %v", err)
		_ = m.Term()
		return
	}
	fb.mu.Lock()
	if fb.seen[key] == nil {
		fb.seen[key] = map[uint64]bool{}
	}
	fb.seen[key][md.Sequence.Stream] = true
	tm := turnMsg{Key: key, Seq: md.Sequence.Stream, N: len(fb.seen[key]), Req: req, FP: wire.Fingerprint(req)}
	fb.mu.Unlock()
	fb.received <- tm
	if a := fb.answer(tm); a != nil {
		fb.reply(key, tm.Seq, tm.FP, a)
		fb.replied <- tm
	}
	_ = m.Ack()
}

// reply publishes a reply as the brain does: stored in RESULTS and pushed
// live to the tenant through the stream export.
func (fb *fakeBrain) reply(key string, seq uint64, fp string, a *fakeAnswer) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg := &nats.Msg{Subject: subjects.Reply(fb.n.tenant.Public, key), Data: a.Body, Header: nats.Header{}}
	msg.Header.Set(wire.HeaderStatus, a.Status)
	msg.Header.Set(wire.HeaderFingerprint, fp)
	msg.Header.Set(wire.HeaderTurnSeq, strconv.FormatUint(seq, 10))
	if _, err := fb.n.brainJS.PublishMsg(ctx, msg); err != nil {
		fb.t.Errorf("fake brain: publish reply: %v", err)
	}
}

// seenCount is how many distinct turn messages of key the brain received.
func (fb *fakeBrain) seenCount(key string) int {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return len(fb.seen[key])
}

// next waits for the next value on ch.
func next[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// decision is the fake brain's decision for a turn, indented so a test can
// tell the edge serves the brain's bytes untouched.
func decision(req *wire.TurnSubmitRequest) []byte {
	b, err := json.MarshalIndent(wire.TurnSubmitReply{
		WorkItemID:       req.WorkItemID,
		Turn:             req.Turn,
		NextTurn:         req.Turn + 1,
		CatalogueVersion: 1,
		Status:           wire.WorkItemStatusAwaitingApproval,
		Assessment:       wire.Assessment{Category: "quote_request", Priority: "high", Confidence: 0.82, Source: "model"},
		Action: &wire.Action{Name: "draft_reply", Params: json.RawMessage(`{"tone": "apologetic"}`),
			RequiresApproval: true, ApprovalID: "appr-" + strconv.Itoa(req.Turn)},
	}, "", "  ")
	if err != nil {
		panic(err)
	}
	return b
}

func decide(tm turnMsg) *fakeAnswer {
	return &fakeAnswer{Status: wire.StatusOK, Body: decision(tm.Req)}
}

func errorBody(e *wire.Error) []byte {
	b, err := json.Marshal(wire.ErrorReply{Error: e})
	if err != nil {
		panic(err)
	}
	return b
}

// testEdge is a running edge, started with Serve on a loopback listener.
type testEdge struct {
	url    string
	client *http.Client
	logs   *lockedBuffer
	// stop ends Serve and waits for it to return nil; cleanup calls it too.
	// An error Serve returned by itself is the test's to check with ended;
	// stop reports it when the test did not.
	stop func()
	// exited is closed when Serve has returned, with serveErr.
	exited   chan struct{}
	serveErr error
	observed atomic.Bool // ended saw Serve's return
}

func startEdge(t *testing.T, n *testNATS, edit func(*Config)) *testEdge {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	cfg := Config{
		TenantID:       "client-zero",
		NATSURL:        n.srv.ClientURL(),
		CredsFile:      n.edgeCreds,
		Token:          testToken,
		TurnWait:       5 * time.Second,
		PublishTimeout: 2 * time.Second,
	}
	if edit != nil {
		edit(&cfg)
	}
	logs := newLockedBuffer()
	logger := slog.New(slog.NewJSONHandler(io.MultiWriter(logs, t.Output()), &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	e := &testEdge{url: "http://" + ln.Addr().String(), client: &http.Client{Timeout: 30 * time.Second}, logs: logs,
		exited: make(chan struct{})}
	go func() {
		e.serveErr = Serve(ctx, ln, cfg, logger)
		close(e.exited)
	}()
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			select {
			case <-e.exited:
				cancel()
				if e.serveErr != nil && !e.observed.Load() {
					t.Errorf("Serve returned %v before its context ended", e.serveErr)
				}
				return
			default:
			}
			cancel()
			select {
			case <-e.exited:
				if e.serveErr != nil {
					t.Errorf("Serve returned %v after its context ended, want nil", e.serveErr)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("Serve did not return after its context ended")
			}
		})
	}
	t.Cleanup(e.stop)
	// The listener queues connections until Serve accepts; readiness is
	// checked by the first request, which waits for it.
	return e
}

// ended waits up to d for Serve to return by itself, and returns its error;
// ok is false if it is still running.
func (e *testEdge) ended(d time.Duration) (err error, ok bool) {
	select {
	case <-e.exited:
		e.observed.Store(true)
		return e.serveErr, true
	case <-time.After(d):
		return nil, false
	}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) wireError(t *testing.T) *wire.Error {
	t.Helper()
	var er wire.ErrorReply
	if err := json.Unmarshal(r.body, &er); err != nil || er.Error == nil || er.Error.Code == "" {
		t.Fatalf("body %s is not a wire.ErrorReply (%v)", r.body, err)
	}
	return er.Error
}

func (r response) reply(t *testing.T) wire.TurnSubmitReply {
	t.Helper()
	var rep wire.TurnSubmitReply
	if err := json.Unmarshal(r.body, &rep); err != nil {
		t.Fatalf("body %s is not a decision: %v", r.body, err)
	}
	return rep
}

func (e *testEdge) do(t *testing.T, method, path string, body []byte, header map[string]string) response {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, bytes.NewReader(body))
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+testToken)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := e.client.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", method, path, err)
		return response{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(t, err)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q, want application/json", method, path, ct)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

func (e *testEdge) submit(t *testing.T, body []byte) response {
	t.Helper()
	return e.do(t, http.MethodPost, "/v1/turns", body, nil)
}

// turnBody is a valid turn 1 for a work item.
func turnBody(workItem, emailBody string) []byte {
	b, err := json.Marshal(map[string]any{
		"work_item_id": workItem,
		"turn":         1,
		"email": map[string]any{
			"message_id": "<" + workItem + "@mail.example>",
			"from":       "Customer <customer@example.com>",
			"to":         []string{"office@client-zero.example"},
			"subject":    "Quote for a new hot water system",
			"body":       emailBody,
		},
	})
	if err != nil {
		panic(err)
	}
	return b
}

// keyOf is the turn key the edge derives for a body.
func keyOf(t *testing.T, body []byte) (string, *wire.TurnSubmitRequest) {
	t.Helper()
	req, err := wire.DecodeTurnSubmitRequest(body)
	must(t, err)
	return subjects.TurnKey(req.WorkItemID, req.Turn), req
}

// lockedBuffer collects an edge's log and lets a test wait for a line.
type lockedBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	written chan struct{} // signalled after every write
}

func newLockedBuffer() *lockedBuffer { return &lockedBuffer{written: make(chan struct{}, 1)} }

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	select {
	case b.written <- struct{}{}:
	default:
	}
	return n, err
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor waits until the log contains s.
func (b *lockedBuffer) waitFor(t *testing.T, s string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for !strings.Contains(b.String(), s) {
		select {
		case <-b.written:
		case <-deadline:
			t.Fatalf("the log never showed %q", s)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// apiCall is a tenant API call as the fake brain received it.
type apiCall struct {
	Method string
	Body   []byte
}

// approvalID of a call's request, when it has one.
func (c apiCall) approvalID() string {
	var req struct {
		ApprovalID string `json:"approval_id"`
	}
	_ = json.Unmarshal(c.Body, &req)
	return req.ApprovalID
}

// decide decodes an approval.decide request strictly, as the brain does.
func (c apiCall) decide(t *testing.T) wire.ApprovalDecideRequest {
	t.Helper()
	if c.Method != subjects.APIApprovalDecide {
		t.Fatalf("the brain got %s, want %s", c.Method, subjects.APIApprovalDecide)
	}
	var req wire.ApprovalDecideRequest
	if err := wire.DecodeAPI(c.Body, &req); err != nil {
		t.Fatalf("the edge sent a decide request the brain refuses: %v", err)
	}
	if err := req.Validate(); err != nil {
		t.Fatalf("the edge sent an invalid decide request: %v", err)
	}
	return req
}

// apiAnswer is the fake brain's reply to an API call: Error, or Reply
// encoded as JSON. A zero apiAnswer means no reply at all.
type apiAnswer struct {
	Reply any
	Error *wire.Error
}

// fakeAPI answers the tenant API as the brain does: a queue subscription
// on brain.api.*.> in the BRAIN account, replying with Brain-Status.
type fakeAPI struct {
	calls chan apiCall
}

func startFakeAPI(t *testing.T, n *testNATS, answer func(apiCall) apiAnswer) *fakeAPI {
	t.Helper()
	fa := &fakeAPI{calls: make(chan apiCall, 256)}
	sub, err := n.brainNC.QueueSubscribe(subjects.APIQueueSubject(), subjects.APIQueue, func(m *nats.Msg) {
		acc, method, err := subjects.ParseAPI(m.Subject)
		if err != nil || acc != n.tenant.Public {
			t.Errorf("fake brain: API call on %q (account %q): %v", m.Subject, acc, err)
			return
		}
		c := apiCall{Method: method, Body: m.Data}
		fa.calls <- c
		a := answer(c)
		out := nats.NewMsg(m.Reply)
		switch {
		case a.Error != nil:
			out.Header.Set(wire.HeaderStatus, wire.StatusError)
			out.Data = errorBody(a.Error)
		case a.Reply != nil:
			out.Header.Set(wire.HeaderStatus, wire.StatusOK)
			if out.Data, err = json.Marshal(a.Reply); err != nil {
				t.Errorf("fake brain: encode reply: %v", err)
				return
			}
		default:
			return
		}
		if err := m.RespondMsg(out); err != nil {
			t.Errorf("fake brain: respond: %v", err)
		}
	})
	must(t, err)
	must(t, n.brainNC.Flush())
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return fa
}

// none reports an API call that should not have happened.
func (fa *fakeAPI) none(t *testing.T, what string) {
	t.Helper()
	select {
	case c := <-fa.calls:
		t.Errorf("%s: the brain got %s %s", what, c.Method, c.Body)
	default:
	}
}

// publishEvent publishes an event as the brain's outbox forwarder does:
// core NATS, on brain.event.<account>.<event_id>, the payload as stored.
func (n *testNATS) publishEvent(t *testing.T, id string, payload []byte) {
	t.Helper()
	must(t, n.brainNC.Publish(subjects.Event(n.tenant.Public, id), payload))
	must(t, n.brainNC.Flush())
}

// testUUID is a valid approval or event id, distinct per n.
func testUUID(n int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", n) }

// sampleApproval is a pending draft_reply approval.
func sampleApproval(id string) wire.Approval {
	proposed := []byte(`{"body":"Hello,\nwe can quote on Tuesday.\nRegards","subject":"Re: Quote for a new hot water system","tone":"friendly"}`)
	now := time.Now().UTC().Truncate(time.Second)
	return wire.Approval{
		ID: id, WorkItemID: "<CAF=wi-review@mail.example>", Turn: 1, Action: "draft_reply", CatalogueVersion: 1,
		ApprovalMode: "review_app", Proof: wire.ProofExactText, Status: wire.ApprovalStatusPending,
		Proposed: proposed, ProposedSHA256: wire.ContentSHA256(proposed),
		ExpiresAt: now.Add(24 * time.Hour), CreatedAt: now.Add(-time.Minute),
		Assessment: &wire.Assessment{Category: "quote_request", Priority: "high", Confidence: 0.82, Source: "model"},
		Sender:     "Customer <customer@example.com>", Subject: "Quote for a new <b>hot water</b> system",
		Recipient: "customer@example.com",
	}
}

// sampleEmail is the e-mail of sampleApproval, with markup to escape.
func sampleEmail() *wire.Email {
	return &wire.Email{
		From:    "Customer <customer@example.com>",
		To:      []string{"office@client-zero.example"},
		Subject: "Quote for a new <b>hot water</b> system",
		Body:    "Hi,\n<script>alert('pwned')</script>\nplease quote. Tom & Jerry",
	}
}
