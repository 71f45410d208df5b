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
