package telemetry

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

func TestEnabled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
		want bool
	}{
		{"Unset", nil, false},
		{"Endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true},
		{"TracesEndpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{"Disabled", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "TRUE"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := Enabled(func(k string) string { return tc.env[k] }); got != tc.want {
				t.Errorf("Enabled = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestFromEnvOffIsNoop(t *testing.T) {
	t.Parallel()
	p, err := FromEnv(context.Background(), func(string) string { return "" }, "test")
	if err != nil {
		t.Fatal(err)
	}
	if IsOn(p.TracerProvider) {
		t.Fatal("tracing is on without an endpoint")
	}
	if !IsOn(sdktrace.NewTracerProvider()) || IsOn(noop.NewTracerProvider()) || IsOn(nil) {
		t.Fatal("IsOn misjudges a provider")
	}
}

// A span's context survives a NATS header round trip; an untraced context
// writes nothing; a long tracestate is left out.
func TestHeaderRoundTrip(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	ctx, span := tp.Tracer("test").Start(context.Background(), "publish")
	defer span.End()

	h := nats.Header{}
	Inject(context.Background(), h)
	if len(h) != 0 {
		t.Fatalf("an untraced context wrote headers %v", h)
	}
	Inject(ctx, h)
	got := RemoteSpanContext(h)
	if !got.IsRemote() || got.TraceID() != span.SpanContext().TraceID() || got.SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("round trip gave %v, want %v", got, span.SpanContext())
	}

	long, err := trace.ParseTraceState("vendor=" + strings.Repeat("a", 250) + ",other=" + strings.Repeat("b", 250) + ",third=" + strings.Repeat("c", 100))
	if err != nil {
		t.Fatal(err)
	}
	lctx := trace.ContextWithSpanContext(ctx, span.SpanContext().WithTraceState(long))
	h = nats.Header{}
	Inject(lctx, h)
	if h.Get("traceparent") == "" || h.Get("tracestate") != "" {
		t.Fatalf("headers %v: want traceparent and no tracestate over %d bytes", h, maxTraceState)
	}
}

// The pgx tracer makes spans only inside a recording span.
func TestPgxTracerOnlyWithinATrace(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	var tr PgxTracer
	c := tr.TraceQueryStart(context.Background(), nil, pgxStart("SELECT 1"))
	tr.TraceQueryEnd(c, nil, pgxEnd())
	if n := len(exp.GetSpans()); n != 0 {
		t.Fatalf("%d spans outside a trace", n)
	}
	ctx, root := tp.Tracer("test").Start(context.Background(), "turn")
	c = tr.TraceQueryStart(ctx, nil, pgxStart("select id from work_items where id = $1"))
	tr.TraceQueryEnd(c, nil, pgxEnd())
	root.End()
	spans := exp.GetSpans()
	if len(spans) != 2 || spans[0].Name != "sql SELECT" || spans[0].Parent.SpanID() != root.SpanContext().SpanID() {
		t.Fatalf("spans %v", spans)
	}
}

func pgxStart(sql string) pgx.TraceQueryStartData { return pgx.TraceQueryStartData{SQL: sql} }
func pgxEnd() pgx.TraceQueryEndData               { return pgx.TraceQueryEndData{} }
