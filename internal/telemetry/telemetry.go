// Package telemetry is what the brain and the edge share to trace a turn
// across processes: the OpenTelemetry tracer provider (OTLP over HTTP, off
// unless configured), W3C trace context in NATS headers, a pgx tracer for
// SQL spans, and the trace id for log lines.
//
// Tracing is off by default. When it is off every process runs with a
// no-op tracer provider: instrumented code starts no-op spans, NATS headers
// get no traceparent and pgx has no tracer, so the hot path pays close to
// nothing (BENCHMARKS.md has the figures). Spans are started from the
// tracer of the span already in the context (Start), so packages deep in
// the brain need no tracer passed down: a turn that is not traced makes
// them start nothing.
//
// Why OpenTelemetry with the OTLP/HTTP exporter: the standard API every
// backend (Jaeger, Tempo, Honeycomb, an OpenTelemetry Collector) accepts,
// W3C trace context as n8n's own OpenTelemetry support propagates it, and
// HTTP rather than gRPC so no extra port or TLS setup is needed for a
// collector; the exporter reads the standard OTEL_EXPORTER_OTLP_* settings.
package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Scope is the instrumentation scope of every span this module starts.
const Scope = "n8nbrain"

// Enabled reports whether the environment turns tracing on: the standard
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set,
// and OTEL_SDK_DISABLED is not "true". That is the one setting; the
// exporter reads the other OTEL_EXPORTER_OTLP_* variables (headers,
// timeout, protocol details) itself, and the SDK reads OTEL_TRACES_SAMPLER.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Provider is a tracer provider and how to stop it.
type Provider struct {
	trace.TracerProvider
	// Shutdown flushes spans not yet exported and stops the exporter.
	Shutdown func(context.Context) error
}

// Off is the no-op provider: tracing disabled.
func Off() Provider {
	return Provider{TracerProvider: noop.NewTracerProvider(), Shutdown: func(context.Context) error { return nil }}
}

// FromEnv returns the OTLP/HTTP provider when Enabled, else Off. service
// names the process in traces (service.name; OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES override and add to it).
func FromEnv(ctx context.Context, getenv func(string) string, service string) (Provider, error) {
	if !Enabled(getenv) {
		return Off(), nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return Provider{}, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.Merge(resource.NewSchemaless(semconv.ServiceName(service)), resource.Environment())
	if err != nil {
		return Provider{}, fmt.Errorf("trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return Provider{TracerProvider: tp, Shutdown: tp.Shutdown}, nil
}

// IsOn reports whether tp records anything (it is not the no-op provider).
func IsOn(tp trace.TracerProvider) bool {
	if tp == nil {
		return false
	}
	_, off := tp.(noop.TracerProvider)
	return !off
}

// Propagator is W3C trace context (traceparent, tracestate): what n8n sends
// and what travels in NATS headers.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Start starts a span with the tracer of the span in ctx: a no-op span when
// ctx carries no recording span (tracing off, or work outside a turn).
func Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return trace.SpanFromContext(ctx).TracerProvider().Tracer(Scope).Start(ctx, name, opts...)
}

// End ends span, recording err (if any) as its status.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// HeaderCarrier carries trace context in NATS message headers.
type HeaderCarrier nats.Header

// Get returns the first value of key.
func (c HeaderCarrier) Get(key string) string { return nats.Header(c).Get(key) }

// Set sets key to value.
func (c HeaderCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }

// Keys lists the header names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// maxTraceState bounds the tracestate carried into NATS: a turn's headers
// must leave its payload room under the account's payload limit, and
// n8n's tracestate is for n8n's own vendors, not ours.
const maxTraceState = 512

// Inject writes ctx's trace context into h (nothing when ctx has no valid
// span context). A tracestate longer than maxTraceState is left out.
func Inject(ctx context.Context, h nats.Header) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	Propagator.Inject(ctx, HeaderCarrier(h))
	if len(h.Get("tracestate")) > maxTraceState {
		h.Del("tracestate")
	}
}

// Extract returns ctx with the remote span context found in h, if any.
func Extract(ctx context.Context, h nats.Header) context.Context {
	if h == nil || h.Get("traceparent") == "" {
		return ctx
	}
	return Propagator.Extract(ctx, HeaderCarrier(h))
}

// RemoteSpanContext is the span context carried in h (invalid when none).
func RemoteSpanContext(h nats.Header) trace.SpanContext {
	return trace.SpanContextFromContext(Extract(context.Background(), h))
}

// LogAttr is the trace_id log attribute of ctx's span; ok is false when ctx
// is not traced.
func LogAttr(ctx context.Context) (slog.Attr, bool) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return slog.Attr{}, false
	}
	return slog.String("trace_id", sc.TraceID().String()), true
}

// With adds ctx's trace_id to log, when ctx is traced.
func With(ctx context.Context, log *slog.Logger) *slog.Logger {
	if a, ok := LogAttr(ctx); ok {
		return log.With(a)
	}
	return log
}

// SQLAttrs are the attributes of a SQL span: the statement's operation and
// its text (parameterised: values are never in the text, so no content is).
func sqlAttrs(sql string) []attribute.KeyValue {
	return []attribute.KeyValue{
		semconv.DBSystemNamePostgreSQL,
		semconv.DBOperationName(operation(sql)),
		semconv.DBQueryText(clip(sql, 2048)),
	}
}

// batchSize is the number of statements in a SQL batch.
var batchSize = attribute.Key("db.operation.batch.size")

// operation is the first word of a statement, upper case (SELECT, INSERT).
func operation(sql string) string {
	op, _, _ := strings.Cut(strings.TrimSpace(sql), " ")
	if op == "" {
		return "BATCH"
	}
	return strings.ToUpper(clip(op, 16))
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
