package tests

import (
	"context"
	"net"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"n8nbrain/brain"
	"n8nbrain/edge"
)

// The cost of observability on the hot path (BENCHMARKS.md, "What
// observability costs"). Metrics are always on; BenchmarkTurn is the turn
// with tracing off (the default: a no-op tracer provider). These are the
// same turn with tracing on, exporting through the SDK's batch processor,
// as in production, into an in-memory exporter (no network: the cost
// measured is the spans', not a collector's), and with the metrics
// listeners being scraped meanwhile.

// BenchmarkTurnTracing: the full turn, one caller, tracing on in the edge
// and the brain.
func BenchmarkTurnTracing(b *testing.B) {
	edgeExp, brainExp := tracedTurns(b)
	if len(edgeExp.GetSpans()) == 0 || len(brainExp.GetSpans()) == 0 {
		b.Fatal("tracing was on but no span was exported")
	}
	b.ReportMetric(float64(len(edgeExp.GetSpans())+len(brainExp.GetSpans()))/float64(b.N+benchWarmup), "spans/turn")
}

// tracedTurns measures the HTTP turn on a stack with tracing on in the edge
// and the brain (the SDK's batch processor with opts, into in-memory
// exporters) and returns the exporters, flushed.
func tracedTurns(b *testing.B, opts ...sdktrace.BatchSpanProcessorOption) (edgeExp, brainExp *tracetest.InMemoryExporter) {
	bs := newBenchStack(b)
	edgeExp, brainExp = tracetest.NewInMemoryExporter(), tracetest.NewInMemoryExporter()
	edgeTP := sdktrace.NewTracerProvider(sdktrace.WithBatcher(edgeExp, opts...))
	brainTP := sdktrace.NewTracerProvider(sdktrace.WithBatcher(brainExp, opts...))
	b.Cleanup(func() {
		_ = edgeTP.Shutdown(context.Background())
		_ = brainTP.Shutdown(context.Background())
	})
	bs.s.startBrain("bench-1", func(c *brain.Config) {
		c.RegistryRefresh = 0
		c.TracerProvider = brainTP
	})
	bs.edge = bs.s.startEdge(bs.tn, func(c *edge.Config) { c.TracerProvider = edgeTP })
	measure(b, bs.httpTurn()).report(b, "")
	_ = edgeTP.ForceFlush(context.Background())
	_ = brainTP.ForceFlush(context.Background())
	return edgeExp, brainExp
}

// BenchmarkTurnScraped: the full turn, one caller, tracing off, while both
// /metrics endpoints are scraped every 100 ms (150 times Prometheus's
// default rate), so the scrape's cost shows up if it matters.
func BenchmarkTurnScraped(b *testing.B) {
	bs := newBenchStack(b)
	opsLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	metLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	bs.s.startBrain("bench-1", func(c *brain.Config) {
		c.RegistryRefresh = 0
		c.OpsListener = opsLn
	})
	bs.edge = bs.s.startEdge(bs.tn, func(c *edge.Config) { c.MetricsListener = metLn })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for _, u := range []string{"http://" + opsLn.Addr().String(), "http://" + metLn.Addr().String()} {
				if _, err := scrapeRaw(ctx, u); err != nil && ctx.Err() == nil {
					b.Errorf("scrape %s: %v", u, err)
				}
			}
		}
	}()
	measure(b, bs.httpTurn()).report(b, "")
	cancel()
	<-done
}

// BenchmarkTurnTimeline: the turn's critical path from its spans, one
// caller, tracing on (which adds its own cost: read the shares, not the
// sum against BenchmarkTurn). Each turn's edge and brain spans share a
// trace; the p50 of each step between their boundaries says where a
// sequential turn's time goes, including the waits no CPU profile shows
// (hand-offs between goroutines, processes and cores).
func BenchmarkTurnTimeline(b *testing.B) {
	// Every span kept: the default queue drops spans when full.
	edgeExp, brainExp := tracedTurns(b, sdktrace.WithMaxQueueSize(1<<16))
	type bounds struct{ start, end time.Time }
	turns := map[[16]byte]map[string]bounds{}
	for _, s := range append(edgeExp.GetSpans(), brainExp.GetSpans()...) {
		id := [16]byte(s.SpanContext.TraceID())
		if turns[id] == nil {
			turns[id] = map[string]bounds{}
		}
		turns[id][s.Name] = bounds{s.StartTime, s.EndTime}
	}
	// The steps, in order along the turn; each is the time from one span
	// boundary (a span's start, or its end) to the next.
	type mark struct {
		span string
		end  bool
	}
	at := func(m map[string]bounds, k mark) (time.Time, bool) {
		bd, ok := m[k.span]
		if k.end {
			return bd.end, ok
		}
		return bd.start, ok
	}
	steps := []struct {
		name     string
		from, to mark
	}{
		{"1_http_in_to_publish", mark{routeSpan, false}, mark{"publish turn", false}},
		{"2_publish_to_stored", mark{"publish turn", false}, mark{"jetstream wait", false}},
		{"3_stored_to_brain", mark{"jetstream wait", false}, mark{"jetstream wait", true}},
		{"4_brain_to_worker", mark{"scheduler wait", false}, mark{"scheduler wait", true}},
		{"5_worker_to_decide", mark{"scheduler wait", true}, mark{"decide", false}},
		{"6_decide", mark{"decide", false}, mark{"decide", true}},
		{"7_decide_to_commit", mark{"decide", true}, mark{"commit", false}},
		{"8_commit", mark{"commit", false}, mark{"commit", true}},
		{"9_commit_to_publish_reply", mark{"commit", true}, mark{"publish reply", false}},
		{"10_publish_reply_to_edge_has_it", mark{"publish reply", false}, mark{"await reply", true}},
		{"11_edge_has_it_to_http_out", mark{"await reply", true}, mark{routeSpan, true}},
	}
	all := latencies{}
	per := make([]latencies, len(steps))
	for _, m := range turns {
		d := make([]time.Duration, len(steps))
		complete := true
		for i, st := range steps {
			from, ok1 := at(m, st.from)
			to, ok2 := at(m, st.to)
			complete = complete && ok1 && ok2
			d[i] = to.Sub(from)
		}
		if !complete {
			continue
		}
		for i := range steps {
			per[i] = append(per[i], d[i])
		}
		all = append(all, m[routeSpan].end.Sub(m[routeSpan].start))
	}
	if len(all) < b.N/2 {
		b.Fatalf("%d complete turn traces of %d turns: spans were lost", len(all), b.N)
	}
	b.ReportMetric(us(all.pct(0.5)), "edge_http_p50_us")
	for i, st := range steps {
		b.ReportMetric(us(per[i].pct(0.5)), st.name+"_p50_us")
	}
}

// routeSpan is the edge's server span of POST /v1/turns.
const routeSpan = "POST /v1/turns"
