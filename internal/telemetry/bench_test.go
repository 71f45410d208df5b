package telemetry

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// turnSpans starts and ends the spans of one turn as the edge and the brain
// do (11 spans, the trace context injected into and extracted from NATS
// headers twice), all in one process.
func turnSpans(tp trace.TracerProvider) {
	ctx, server := tp.Tracer(Scope).Start(context.Background(), "POST /v1/turns")
	pctx, publish := Start(ctx, "publish turn")
	h := nats.Header{}
	Inject(pctx, h)
	publish.End()
	actx, await := Start(ctx, "await reply")
	bctx, turn := tp.Tracer(Scope).Start(Extract(context.Background(), h), "brain turn")
	for _, name := range []string{"jetstream wait", "scheduler wait", "sql SELECT", "decide", "commit", "sql batch"} {
		_, s := Start(bctx, name)
		s.End()
	}
	rctx, reply := Start(bctx, "publish reply")
	rh := nats.Header{}
	Inject(rctx, rh)
	reply.End()
	turn.End()
	if sc := RemoteSpanContext(rh); sc.IsValid() {
		trace.SpanFromContext(actx).AddLink(trace.Link{SpanContext: sc})
	}
	await.End()
	server.End()
}

// BenchmarkTurnSpans is the CPU cost of one turn's spans with tracing off
// (the no-op provider) and on (the SDK's batch processor, as in production,
// into an in-memory exporter that is reset as it fills).
func BenchmarkTurnSpans(b *testing.B) {
	b.Run("Off", func(b *testing.B) {
		tp := Off().TracerProvider
		b.ReportAllocs()
		for b.Loop() {
			turnSpans(tp)
		}
	})
	b.Run("On", func(b *testing.B) {
		exp := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
		b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			turnSpans(tp)
			if i++; i%1000 == 0 {
				exp.Reset()
			}
		}
	})
}
