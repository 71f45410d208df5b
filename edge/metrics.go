package edge

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"n8nbrain/internal/telemetry"
)

// Stages of a turn at the edge (label stage of edge_turn_stage_seconds).
const (
	// StageIntake: from the request's arrival to the turn ready to
	// publish (authentication, the strict decode, the canonical payload).
	StageIntake = "intake"
	// StagePublish: publishing the turn until JetStream's PubAck, retries included.
	StagePublish = "publish"
	// StageAwait: from the PubAck to the brain's answer (or the 202).
	StageAwait = "await"
	// StageTotal: the whole request, as n8n sees it less the network.
	StageTotal = "total"
)

// metrics are one edge's Prometheus metrics, in a registry of its own (never
// the global default one), served on the metrics listener only.
type metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.HistogramVec
	turns    *prometheus.CounterVec
	stage    *prometheus.HistogramVec
	inflight prometheus.Gauge
	ackBatch prometheus.Histogram
}

// newMetrics registers the edge's metrics. The tenant label is the edge's
// EDGE_TENANT_ID (a label only, as in logs), when set.
func newMetrics(tenant string, nc *nats.Conn) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "edge_http_request_seconds",
			Help:    "HTTP requests the edge answered, by route and status.",
			Buckets: telemetry.LatencyBuckets}, []string{"route", "status"}),
		turns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "edge_turns_total",
			Help: "Turns submitted by n8n (POST /v1/turns), by HTTP status and outcome: decided, replayed, pending (202), " +
				"or the error's reason or code (idempotency_key_reused, turn_out_of_sequence, tenant_quota_exceeded, unavailable, …)."},
			[]string{"status", "outcome"}),
		stage: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "edge_turn_stage_seconds",
			Help:    "Where a turn's time goes at the edge, by stage (intake, publish, await, total).",
			Buckets: telemetry.LatencyBuckets}, []string{"stage"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edge_turns_inflight",
			Help: "Turn requests being answered now (waiting for the brain included)."}),
		ackBatch: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "edge_event_ack_batch_events",
			Help:    "Events acknowledged to the brain per api.event.ack call: the calls are the count, the events the sum.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 9)}), // 1 … 256
	}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var r prometheus.Registerer = m.reg
	if tenant != "" {
		r = prometheus.WrapRegistererWith(prometheus.Labels{"tenant": tenant}, r)
	}
	r.MustRegister(m.requests, m.turns, m.stage, m.inflight, m.ackBatch)
	r.MustRegister(telemetry.NATSCollectors("edge", nc)...)
	return m
}

// turnStarted counts a turn in flight until the function it returns is called.
func (m *metrics) turnStarted() (done func()) {
	if m == nil {
		return func() {}
	}
	m.inflight.Inc()
	return m.inflight.Dec
}

func (m *metrics) observeStage(stage string, d time.Duration) {
	if m != nil {
		m.stage.WithLabelValues(stage).Observe(d.Seconds())
	}
}

func (m *metrics) observeAckBatch(events int) {
	if m != nil {
		m.ackBatch.Observe(float64(events))
	}
}

// routeTurnSubmit is the route whose requests are turns.
const routeTurnSubmit = "POST /v1/turns"

// request records an answered request; attrs are what its handler noted
// for the log line (error_reason, pending, replayed …).
func (m *metrics) request(route string, status int, attrs []slog.Attr, d time.Duration) {
	if m == nil {
		return
	}
	code := strconv.Itoa(status)
	m.requests.WithLabelValues(route, code).Observe(d.Seconds())
	if route != routeTurnSubmit {
		return
	}
	m.stage.WithLabelValues(StageTotal).Observe(d.Seconds())
	m.turns.WithLabelValues(code, turnOutcomeLabel(attrs)).Inc()
}

// turnOutcomeLabel names a turn request's outcome from its log attributes: the
// error's reason or code, pending, replayed or decided. Every value is from
// a closed set: the codes and reasons are the wire package's constants.
func turnOutcomeLabel(attrs []slog.Attr) string {
	var code, reason string
	pending, replayed := false, false
	for _, a := range attrs {
		switch a.Key {
		case "error_reason":
			reason = a.Value.String()
		case "error_code":
			code = a.Value.String()
		case "pending":
			pending = a.Value.Bool()
		case "replayed":
			replayed = a.Value.Bool()
		}
	}
	switch {
	case reason != "":
		return reason
	case code != "":
		return code
	case pending:
		return "pending"
	case replayed:
		return "replayed"
	}
	return "decided"
}

// serveMetrics serves GET /metrics on ln (the metrics listener, never the
// API's) until stop is called.
func serveMetrics(ln net.Listener, m *metrics, logger *slog.Logger) (stop func()) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, MaxHeaderBytes: 8 << 10,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("metrics listener", "error", err)
		}
	}()
	logger.Info("metrics listening", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}
}
