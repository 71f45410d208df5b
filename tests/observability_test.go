package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"n8nbrain/brain"
	"n8nbrain/edge"
	"n8nbrain/internal/ollamafake"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// scrape reads a /metrics endpoint, parsed (so a malformed exposition fails
// the test), and its raw text.
func scrape(t *testing.T, base string) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	res, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s/metrics: %d %v", base, res.StatusCode, err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parse %s/metrics: %v", base, err)
	}
	return fams, string(b)
}

// labelText is every name, help text and label of fams, without the
// samples' values.
func labelText(fams map[string]*dto.MetricFamily) string {
	var b strings.Builder
	for name, f := range fams {
		b.WriteString(name + "\n" + f.GetHelp() + "\n")
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				b.WriteString(l.GetName() + "=" + l.GetValue() + "\n")
			}
		}
	}
	return b.String()
}

// series returns the metrics of family name whose labels include want.
func series(fams map[string]*dto.MetricFamily, name string, want map[string]string) []*dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
	var out []*dto.Metric
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		ok := true
		for k, v := range want {
			if got[k] != v {
				ok = false
			}
		}
		if ok {
			out = append(out, m)
		}
	}
	return out
}

// histCount is the observation count of the one histogram series of name
// with labels want (0 when there is none).
func histCount(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) uint64 {
	t.Helper()
	ms := series(fams, name, want)
	if len(ms) > 1 {
		t.Fatalf("%s%v: %d series, want one", name, want, len(ms))
	}
	if len(ms) == 0 {
		return 0
	}
	return ms[0].GetHistogram().GetSampleCount()
}

// value is the value of the one counter or gauge series of name with labels
// want; ok is false when there is none.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	ms := series(fams, name, want)
	if len(ms) != 1 {
		return 0, false
	}
	m := ms[0]
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue(), true
	case m.Gauge != nil:
		return m.GetGauge().GetValue(), true
	}
	return 0, false
}

// scrapeRaw reads a /metrics endpoint and returns its size.
func scrapeRaw(ctx context.Context, base string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	n, err := io.Copy(io.Discard, res.Body)
	return int(n), err
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// A real turn through the real edge and brain moves every stage histogram
// on both sides, with the tenant's id as a label and no content anywhere;
// replays, 409s and the approval it left waiting are counted; the edge's
// metrics are on their own listener, never n8n's API.
func TestMetricsOfARealTurn(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	id := "obs-" + randomHex(3)
	tn := s.tenant(modelSpec(id))
	fake := ollamafake.New(t, answerFunc(goodClassify, goodDraft))
	_, ops := s.startModelBrain("r1", fake, nil)
	mln := listen(t)
	ec := s.startEdge(tn, func(c *edge.Config) { c.MetricsListener = mln })
	edgeMetrics := "http://" + mln.Addr().String()

	req := pergola("<metrics-" + randomHex(4) + "@customer.example>")
	if rep := ec.submit(req).reply(t); rep.Status != wire.WorkItemStatusAwaitingApproval {
		t.Fatalf("status %s, want awaiting_approval", rep.Status)
	}
	if rep := ec.submit(req).reply(t); !rep.Replayed {
		t.Fatal("the repeat was not a replay")
	}
	other := *req
	other.Email = &wire.Email{MessageID: req.Email.MessageID, From: req.Email.From, Subject: "Another payload", Body: "different"}
	if e := ec.submit(&other).error(t, http.StatusConflict); e.Reason != wire.ReasonIdempotencyKeyReused {
		t.Fatalf("reason %s", e.Reason)
	}

	// The brain: every stage of the decided turn, by tenant.
	var bf map[string]*dto.MetricFamily
	var braw string
	eventually(t, 10*time.Second, "the brain's turn metrics", func() bool {
		bf, braw = scrape(t, ops)
		v, _ := value(bf, "brain_turns_total", map[string]string{"tenant": id, "outcome": "decided", "reason": "awaiting_approval"})
		return v >= 1
	})
	for _, stage := range []string{brain.StageQueue, brain.StageSchedule, brain.StageDecide, brain.StageCommit, brain.StageReply, brain.StageProcess} {
		if n := histCount(t, bf, "brain_turn_stage_seconds", map[string]string{"tenant": id, "stage": stage}); n < 1 {
			t.Errorf("brain_turn_stage_seconds{tenant=%q,stage=%q} has %d observations, want at least 1", id, stage, n)
		}
	}
	// The replay and the 409 were answered by the edge from the stored
	// reply: the brain decided one turn and committed once.
	if n := histCount(t, bf, "brain_turn_stage_seconds", map[string]string{"tenant": id, "stage": brain.StageCommit}); n != 1 {
		t.Errorf("commit observed %d times, want 1", n)
	}
	if v, _ := value(bf, "brain_turns_total", map[string]string{"tenant": id, "outcome": "decided", "reason": "awaiting_approval"}); v != 1 {
		t.Errorf("brain_turns_total decided/awaiting_approval = %v, want 1", v)
	}
	if ms := series(bf, "brain_turns_total", map[string]string{"tenant": id}); len(ms) != 1 {
		t.Errorf("brain_turns_total has %d series for the tenant, want 1", len(ms))
	}
	if n := histCount(t, bf, "brain_model_call_seconds", map[string]string{"tenant": id, "outcome": "ok"}); n != 2 {
		t.Errorf("brain_model_call_seconds{outcome=ok} has %d observations, want 2 (classify, draft)", n)
	}
	if v, ok := value(bf, "brain_nats_connected", nil); !ok || v != 1 {
		t.Errorf("brain_nats_connected = %v (%v), want 1", v, ok)
	}

	// The edge: its stages, the 200, the replay and the 409, labelled with
	// the tenant.
	ef, eraw := scrape(t, edgeMetrics)
	for _, stage := range []string{edge.StageIntake, edge.StagePublish, edge.StageAwait, edge.StageTotal} {
		if n := histCount(t, ef, "edge_turn_stage_seconds", map[string]string{"tenant": id, "stage": stage}); n < 1 {
			t.Errorf("edge_turn_stage_seconds{tenant=%q,stage=%q} has %d observations, want at least 1", id, stage, n)
		}
	}
	for _, c := range []struct{ status, outcome string }{{"200", "decided"}, {"200", "replayed"}, {"409", wire.ReasonIdempotencyKeyReused}} {
		if v, _ := value(ef, "edge_turns_total", map[string]string{"tenant": id, "status": c.status, "outcome": c.outcome}); v != 1 {
			t.Errorf("edge_turns_total{status=%s,outcome=%s} = %v, want 1", c.status, c.outcome, v)
		}
	}
	if v, ok := value(ef, "edge_nats_connected", map[string]string{"tenant": id}); !ok || v != 1 {
		t.Errorf("edge_nats_connected = %v (%v), want 1", v, ok)
	}

	// The approval the turn left waiting is counted, young, by tenant.
	eventually(t, 10*time.Second, "the pending approval in the brain's metrics", func() bool {
		bf, braw = scrape(t, ops)
		v, _ := value(bf, "brain_approvals_pending", map[string]string{"tenant": id, "age": "lt15m"})
		return v == 1
	})
	if v, ok := value(bf, "brain_outbox_lag_seconds", map[string]string{"tenant": id}); !ok || v < 0 {
		t.Errorf("brain_outbox_lag_seconds = %v (%v)", v, ok)
	}

	// Content never: neither the e-mail, nor the work item id, nor the draft,
	// in any name, help text or label. The raw text is searched too, but not
	// for the access code: a sample's value (a byte count, a sum of
	// seconds) may hold its four digits by chance.
	labels := labelText(bf) + labelText(ef)
	for _, secret := range []string{req.WorkItemID, req.Email.Subject, req.Email.Body, req.Email.From, "sam@customer.example", "pergola", "2231"} {
		if strings.Contains(labels, secret) {
			t.Errorf("a metric's name, help or labels carry content %q", secret)
		}
		if secret != "2231" && (strings.Contains(braw, secret) || strings.Contains(eraw, secret)) {
			t.Errorf("a metric carries content %q", secret)
		}
	}

	// /metrics is not on n8n's API listener, and the metrics listener
	// serves nothing else.
	if r := ec.do(http.MethodGet, "/metrics", nil); r.Status != http.StatusNotFound {
		t.Errorf("GET /metrics on the API listener: %d, want 404", r.Status)
	}
	res, err := http.Post(edgeMetrics+"/v1/turns", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound {
		t.Errorf("POST /v1/turns on the metrics listener: %d, want 404", res.StatusCode)
	}
}

// spanSet is what one process exported.
type spanSet []sdktrace.ReadOnlySpan

func (ss spanSet) named(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range ss {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans named %q, want 1; spans: %s", len(found), name, ss)
	}
	return found[0]
}

func (ss spanSet) String() string {
	var names []string
	for _, s := range ss {
		names = append(names, s.Name())
	}
	return strings.Join(names, ", ")
}

func recorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

// One turn is one trace: n8n's traceparent is the parent of the edge's
// request span; the edge's publish span travels in the turn's NATS headers
// (stored in the stream) and is the parent of the brain's turn span, whose
// stages, SQL and model calls are its children; the reply carries the
// brain's trace context back, linked from the edge's wait. The edge and the
// brain have a tracer provider each, as two processes would. The log lines
// of the turn carry the trace id on both sides.
func TestOneTraceSpansEdgeAndBrain(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	tn := s.tenant(modelSpec("trace-" + randomHex(3)))
	fake := ollamafake.New(t, answerFunc(goodClassify, goodDraft))
	brainTP, brainSpans := recorder(t)
	edgeTP, edgeSpans := recorder(t)
	s.startModelBrain("r1", fake, func(c *brain.Config) { c.TracerProvider = brainTP })
	ec := s.startEdge(tn, func(c *edge.Config) { c.TracerProvider = edgeTP })

	const n8nTrace, n8nSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req := pergola("<trace-" + randomHex(4) + "@customer.example>")
	body, _ := json.Marshal(req)
	hreq, _ := http.NewRequest(http.MethodPost, ec.base+"/v1/turns", bytes.NewReader(body))
	hreq.Header.Set("Authorization", "Bearer "+ec.token)
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("traceparent", "00-"+n8nTrace+"-"+n8nSpan+"-01")
	res, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}

	// Spans end as their work ends: the brain's after its ack, the edge's
	// request span after the response is written.
	var es, bs spanSet
	eventually(t, 10*time.Second, "the edge's and the brain's spans", func() bool {
		es, bs = spanSet(edgeSpans.GetSpans().Snapshots()), spanSet(brainSpans.GetSpans().Snapshots())
		has := func(ss spanSet, name string) bool {
			for _, s := range ss {
				if s.Name() == name {
					return true
				}
			}
			return false
		}
		return has(es, "POST /v1/turns") && has(bs, "brain turn")
	})
	for _, sp := range append(append(spanSet{}, es...), bs...) {
		if got := sp.SpanContext().TraceID().String(); got != n8nTrace {
			t.Errorf("span %q is in trace %s, want n8n's %s", sp.Name(), got, n8nTrace)
		}
	}
	server := es.named(t, "POST /v1/turns")
	if server.Parent().SpanID().String() != n8nSpan || !server.Parent().IsRemote() {
		t.Errorf("the edge's request span has parent %s (remote %v), want n8n's %s", server.Parent().SpanID(), server.Parent().IsRemote(), n8nSpan)
	}
	publish := es.named(t, "publish turn")
	await := es.named(t, "await reply")
	for _, sp := range []sdktrace.ReadOnlySpan{publish, await} {
		if sp.Parent().SpanID() != server.SpanContext().SpanID() {
			t.Errorf("edge span %q is not a child of the request span", sp.Name())
		}
	}
	// The trace context is stored with the turn in its stream, so a
	// redelivery (another replica, after a crash) joins the same trace.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := s.stack.Streams.JS.Stream(ctx, subjects.TurnsStream(tn.Account.Public))
	if err != nil {
		t.Fatal(err)
	}
	stored, err := st.GetLastMsgForSubject(ctx, subjects.Turn(tn.Account.Public, subjects.TurnKey(req.WorkItemID, req.Turn)))
	if err != nil {
		t.Fatal(err)
	}
	if want := "00-" + n8nTrace + "-" + publish.SpanContext().SpanID().String() + "-01"; stored.Header.Get("traceparent") != want {
		t.Errorf("the stored turn's traceparent is %q, want %q", stored.Header.Get("traceparent"), want)
	}
	turnSpan := bs.named(t, "brain turn")
	if turnSpan.Parent().SpanID() != publish.SpanContext().SpanID() || !turnSpan.Parent().IsRemote() {
		t.Errorf("the brain's turn span has parent %s, want the edge's publish span %s, across NATS", turnSpan.Parent().SpanID(), publish.SpanContext().SpanID())
	}
	if turnSpan.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("brain turn kind %s", turnSpan.SpanKind())
	}
	for _, name := range []string{"jetstream wait", "scheduler wait", "decide", "commit", "publish reply"} {
		if sp := bs.named(t, name); sp.Parent().SpanID() != turnSpan.SpanContext().SpanID() {
			t.Errorf("brain span %q is not a child of the turn span", name)
		}
	}
	decide := bs.named(t, "decide")
	chats := 0
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, sp := range bs {
		byID[sp.SpanContext().SpanID()] = sp
	}
	for _, sp := range bs {
		switch {
		case sp.Name() == "model chat":
			chats++
			if sp.Parent().SpanID() != decide.SpanContext().SpanID() {
				t.Errorf("a model call is not within decide")
			}
		case strings.HasPrefix(sp.Name(), "sql "):
			// Every SQL span hangs from a span of this trace on the brain.
			// (Turn 1 writes without reading first, so its only SQL is
			// the commit's batch, checked below.)
			if _, ok := byID[sp.Parent().SpanID()]; !ok {
				t.Errorf("SQL span %q has a parent outside the brain's spans", sp.Name())
				continue
			}
			for _, a := range sp.Attributes() {
				if strings.Contains(a.Value.String(), "pergola") {
					t.Errorf("SQL span %q carries content in %s", sp.Name(), a.Key)
				}
			}
		}
	}
	if chats != 2 {
		t.Errorf("%d model chat spans, want 2 (classify, draft)", chats)
	}
	commit := bs.named(t, "commit")
	batch := bs.named(t, "sql batch")
	if batch.Parent().SpanID() != commit.SpanContext().SpanID() {
		t.Error("the turn's batch is not within commit")
	}
	// The reply's trace context is linked from the edge's wait.
	reply := bs.named(t, "publish reply")
	linked := false
	for _, l := range await.Links() {
		if l.SpanContext.SpanID() == reply.SpanContext().SpanID() {
			linked = true
		}
	}
	if !linked {
		t.Errorf("the edge's await span has no link to the brain's reply (links %v)", await.Links())
	}

	// Logs: the brain's turn line and the edge's request line carry the trace id.
	logs := s.logs.String()
	var brainLine, edgeLine bool
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, `"trace_id":"`+n8nTrace+`"`) {
			continue
		}
		brainLine = brainLine || strings.Contains(line, `"msg":"turn answered"`)
		edgeLine = edgeLine || (strings.Contains(line, `"msg":"http request"`) && strings.Contains(line, `"route":"POST /v1/turns"`))
	}
	if !brainLine || !edgeLine {
		t.Errorf("trace_id on the brain's turn line: %v, on the edge's request line: %v", brainLine, edgeLine)
	}
}

// Without a tracer provider nothing is traced: the turn stored in the
// stream and its stored reply carry no trace context, even when n8n sent
// one, and no log line has a trace id.
func TestTracingOffByDefault(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	tn := s.tenant(spec("notrace-" + randomHex(3)))
	s.startBrain("r1", nil)
	ec := s.startEdge(tn, nil)
	req := quoteEmail("<notrace-" + randomHex(4) + "@customer.example>")
	body, _ := json.Marshal(req)
	hreq, _ := http.NewRequest(http.MethodPost, ec.base+"/v1/turns", bytes.NewReader(body))
	hreq.Header.Set("Authorization", "Bearer "+ec.token)
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	res, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	key := subjects.TurnKey(req.WorkItemID, req.Turn)
	for stream, subject := range map[string]string{
		subjects.TurnsStream(tn.Account.Public):   subjects.Turn(tn.Account.Public, key),
		subjects.ResultsStream(tn.Account.Public): subjects.Reply(tn.Account.Public, key),
	} {
		st, err := s.stack.Streams.JS.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		m, err := st.GetLastMsgForSubject(ctx, subject)
		if err != nil {
			t.Fatalf("%s: %v", subject, err)
		}
		if tp := m.Header.Get("traceparent"); tp != "" {
			t.Errorf("%s carries traceparent %q with tracing off", subject, tp)
		}
	}
	if strings.Contains(s.logs.String(), "trace_id") {
		t.Error("a log line carries a trace id with tracing off")
	}
}
