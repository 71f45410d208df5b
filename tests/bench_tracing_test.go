package tests

import (
	"context"
	"net"
	"slices"
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
	bs := newBenchStack(b)
	edgeExp, brainExp := tracetest.NewInMemoryExporter(), tracetest.NewInMemoryExporter()
	edgeTP := sdktrace.NewTracerProvider(sdktrace.WithBatcher(edgeExp))
	brainTP := sdktrace.NewTracerProvider(sdktrace.WithBatcher(brainExp))
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
	if len(edgeExp.GetSpans()) == 0 || len(brainExp.GetSpans()) == 0 {
		b.Fatal("tracing was on but no span was exported")
	}
	b.ReportMetric(float64(len(edgeExp.GetSpans())+len(brainExp.GetSpans()))/float64(b.N+benchWarmup), "spans/turn")
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
	bs := newBenchStack(b)
	edgeExp, brainExp := tracetest.NewInMemoryExporter(), tracetest.NewInMemoryExporter()
	edgeTP := sdktrace.NewTracerProvider(sdktrace.WithBatcher(edgeExp, sdktrace.WithMaxQueueSize(1<<16)))
	brainTP := sdktrace.NewTracerProvider(sdktrace.WithBatcher(brainExp, sdktrace.WithMaxQueueSize(1<<16)))
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

	type bounds struct{ start, end time.Time }
	turns := map[[16]byte]map[string]bounds{}
	for _, s := range append(edgeExp.GetSpans(), brainExp.GetSpans()...) {
		id := [16]byte(s.SpanContext.TraceID())
		if turns[id] == nil {
			turns[id] = map[string]bounds{}
		}
		turns[id][s.Name] = bounds{s.StartTime, s.EndTime}
	}
	// The steps, in order along the turn; each is the time from one
	// boundary to the next.
	steps := []struct {
		name     string
		from, to func(map[string]bounds) time.Time
	}{
		{"1_http_in_to_publish", func(m map[string]bounds) time.Time { return m[routeSpan].start },
			func(m map[string]bounds) time.Time { return m["publish turn"].start }},
		{"2_publish_to_stored", func(m map[string]bounds) time.Time { return m["publish turn"].start },
			func(m map[string]bounds) time.Time { return m["jetstream wait"].start }},
		{"3_stored_to_brain", func(m map[string]bounds) time.Time { return m["jetstream wait"].start },
			func(m map[string]bounds) time.Time { return m["jetstream wait"].end }},
		{"4_brain_to_worker", func(m map[string]bounds) time.Time { return m["scheduler wait"].start },
			func(m map[string]bounds) time.Time { return m["scheduler wait"].end }},
		{"5_worker_to_decide", func(m map[string]bounds) time.Time { return m["scheduler wait"].end },
			func(m map[string]bounds) time.Time { return m["decide"].start }},
		{"6_decide", func(m map[string]bounds) time.Time { return m["decide"].start },
			func(m map[string]bounds) time.Time { return m["decide"].end }},
		{"7_decide_to_commit", func(m map[string]bounds) time.Time { return m["decide"].end },
			func(m map[string]bounds) time.Time { return m["commit"].start }},
		{"8_commit", func(m map[string]bounds) time.Time { return m["commit"].start },
			func(m map[string]bounds) time.Time { return m["commit"].end }},
		{"9_commit_to_publish_reply", func(m map[string]bounds) time.Time { return m["commit"].end },
			func(m map[string]bounds) time.Time { return m["publish reply"].start }},
		{"10_publish_reply_to_edge_has_it", func(m map[string]bounds) time.Time { return m["publish reply"].start },
			func(m map[string]bounds) time.Time { return m["await reply"].end }},
		{"11_edge_has_it_to_http_out", func(m map[string]bounds) time.Time { return m["await reply"].end },
			func(m map[string]bounds) time.Time { return m[routeSpan].end }},
	}
	all := latencies{}
	per := make([]latencies, len(steps))
	for _, m := range turns {
		complete := true
		for _, n := range []string{routeSpan, "publish turn", "await reply", "jetstream wait", "scheduler wait", "decide", "commit", "publish reply"} {
			if _, ok := m[n]; !ok {
				complete = false
			}
		}
		if !complete {
			continue
		}
		for i, st := range steps {
			per[i] = append(per[i], st.to(m).Sub(st.from(m)))
		}
		all = append(all, m[routeSpan].end.Sub(m[routeSpan].start))
	}
	if len(all) < b.N/2 {
		b.Fatalf("%d complete turn traces of %d turns: spans were lost", len(all), b.N)
	}
	slices.Sort(all)
	b.ReportMetric(us(all.pct(0.5)), "edge_http_p50_us")
	for i, st := range steps {
		slices.Sort(per[i])
		b.ReportMetric(us(per[i].pct(0.5)), st.name+"_p50_us")
	}
}

// routeSpan is the edge's server span of POST /v1/turns.
const routeSpan = "POST /v1/turns"
