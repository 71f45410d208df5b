package telemetry

import (
	"context"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// PgxTracer makes a client span of every query and batch run within a
// traced context (a turn, an API call); queries outside one (the registry's
// reloads, pool health checks) make none, so tracing adds no root spans of
// its own. Set it as pgx.ConnConfig.Tracer only when tracing is on.
//
// Why our own and not otelpgx: the contrib module is not among the modules
// our Go proxy serves, and the part we need is these forty lines: no query
// arguments (they carry e-mail content), the statement text (parameterised)
// and its operation.
type PgxTracer struct{}

var (
	_ pgx.QueryTracer = PgxTracer{}
	_ pgx.BatchTracer = PgxTracer{}
)

type pgxSpanKey struct{}

func startSQL(ctx context.Context, name string, attrs ...attribute.KeyValue) context.Context {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx
	}
	ctx, span := Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	return context.WithValue(ctx, pgxSpanKey{}, span)
}

func endSQL(ctx context.Context, err error) {
	if span, ok := ctx.Value(pgxSpanKey{}).(trace.Span); ok {
		End(span, err)
	}
}

// TraceQueryStart starts the span of one query.
func (PgxTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return startSQL(ctx, "sql "+operation(data.SQL), sqlAttrs(data.SQL)...)
}

// TraceQueryEnd ends it.
func (PgxTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	endSQL(ctx, data.Err)
}

// TraceBatchStart starts the span of a batch (a turn's one transaction).
func (PgxTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	n := 0
	if data.Batch != nil {
		n = data.Batch.Len()
	}
	return startSQL(ctx, "sql batch", semconv.DBSystemNamePostgreSQL, batchSize.Int(n))
}

// TraceBatchQuery notes each statement of the batch as an event.
func (PgxTracer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.AddEvent("sql "+operation(data.SQL), trace.WithAttributes(sqlAttrs(data.SQL)...))
	if data.Err != nil {
		span.RecordError(data.Err)
	}
}

// TraceBatchEnd ends the batch's span.
func (PgxTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	endSQL(ctx, data.Err)
}
