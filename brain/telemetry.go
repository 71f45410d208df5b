package brain

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"n8nbrain/brain/internal/model"
	"n8nbrain/brain/internal/turn"
	"n8nbrain/internal/telemetry"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// Why these metrics live in prometheus/client_golang and not OpenTelemetry
// metrics: client_golang is already the brain's exposition library (its
// collectors read the scheduler, the pools and the model's totals at scrape
// time), it has histograms, and it needs no SDK pipeline to run: an
// observation is an atomic add. OpenTelemetry is used for traces only.

// Stages of a turn in the brain (label stage of brain_turn_stage_seconds).
const (
	// StageQueue: from JetStream storing the turn to this replica receiving it.
	StageQueue = "queue"
	// StageSchedule: waiting in this replica's fair scheduler for a worker.
	StageSchedule = "schedule"
	// StageDecide: the engine, model calls included.
	StageDecide = "decide"
	// StageCommit: the turn's one transaction.
	StageCommit = "commit"
	// StageReply: storing the reply in RESULTS (the PubAck).
	StageReply = "reply"
	// StageProcess: from a worker taking the turn to its ack: all the
	// brain's own work, load, decide, commit and reply.
	StageProcess = "process"
)

// Outcomes of a turn (label outcome of brain_turns_total).
const (
	OutcomeDecided  = "decided"  // reason: the decision's status
	OutcomeReplayed = "replayed" // reason: the stored decision's status
	OutcomeRejected = "rejected" // reason: the error's reason, else its code
	OutcomeRetried  = "retried"  // a transient failure; JetStream redelivers it
	OutcomeHeld     = "held"     // its tenant's database does not answer; held until it does (held.go)
	OutcomeDropped  = "dropped"  // no reply could be published; redelivered
)

// instruments are the replica's histograms and counters observed on the
// hot path. Each replica has its own (and its own registry), so parallel
// tests and several replicas in one process never share a series.
type instruments struct {
	stage     *prometheus.HistogramVec
	turns     *prometheus.CounterVec
	backlog   *prometheus.GaugeVec
	modelCall *prometheus.HistogramVec
	apiCalls  *prometheus.HistogramVec
	apiPauses *prometheus.CounterVec
	timers    *prometheus.CounterVec
}

func newInstruments() *instruments {
	return &instruments{
		stage: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "brain_turn_stage_seconds",
			Help:    "Where a turn's time goes on this replica, by tenant and stage (queue, schedule, decide, commit, reply, process).",
			Buckets: telemetry.LatencyBuckets}, []string{"tenant", "stage"}),
		turns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "brain_turns_total",
			Help: "Turns answered or abandoned by this replica, by tenant, outcome (decided, replayed, rejected, retried, dropped) " +
				"and reason (a decision's status, an error's reason or code)."}, []string{"tenant", "outcome", "reason"}),
		backlog: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "brain_tenant_turns_backlog",
			Help: "Turns still waiting in the tenant's stream after the last turn this replica received (JetStream's pending count)."},
			[]string{"tenant"}),
		modelCall: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "brain_model_call_seconds",
			Help:    "Model HTTP calls' latency, by tenant and outcome (ok, invalid_output, error, timeout).",
			Buckets: telemetry.LatencyBuckets}, []string{"tenant", "outcome"}),
		apiCalls: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "brain_api_call_seconds",
			Help:    "Tenant API calls answered by this replica, by tenant, method and result (ok, or the error's code).",
			Buckets: telemetry.LatencyBuckets}, []string{"tenant", "method", "result"}),
		apiPauses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "brain_tenant_api_paused_total",
			Help: "Times this replica stopped taking a tenant's API calls for a while because it kept flooding them (see the README's fair scheduling)."},
			[]string{"tenant"}),
		timers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "brain_timers_total",
			Help: "Timers (approval expiry, outbox re-delivery) handled by this replica, by kind and result (ok, failed)."},
			[]string{"kind", "result"}),
	}
}

func (in *instruments) collectors() []prometheus.Collector {
	return []prometheus.Collector{in.stage, in.turns, in.backlog, in.modelCall, in.apiCalls, in.apiPauses, in.timers}
}

// observeStage records one stage of a turn; negative durations (clocks of
// the NATS server and this host apart) count as zero.
func (in *instruments) observeStage(tenant, stage string, d time.Duration) {
	in.stage.WithLabelValues(tenant, stage).Observe(max(d, 0).Seconds())
}

// turnDone counts a turn's outcome.
func (in *instruments) turnDone(tenant, outcome, reason string) {
	in.turns.WithLabelValues(tenant, outcome, reason).Inc()
}

// answered counts an answer and records the stages the turn reached.
func (in *instruments) answered(tenant string, ans turn.Answer) {
	switch {
	case ans.OK && ans.Replayed:
		in.turnDone(tenant, OutcomeReplayed, string(ans.Status))
	case ans.OK && ans.Status == "":
		// A redelivered message answered with its own stored bytes.
		in.turnDone(tenant, OutcomeReplayed, "")
	case ans.OK:
		in.turnDone(tenant, OutcomeDecided, string(ans.Status))
	default:
		in.turnDone(tenant, OutcomeRejected, errorReason(ans.Error))
	}
	if ans.Timings.Decide > 0 {
		in.observeStage(tenant, StageDecide, ans.Timings.Decide)
	}
	if ans.Timings.Commit > 0 {
		in.observeStage(tenant, StageCommit, ans.Timings.Commit)
	}
}

// errorReason is an error's reason, else its code: a closed set, never text.
func errorReason(e *wire.Error) string {
	switch {
	case e == nil:
		return ""
	case e.Reason != "":
		return e.Reason
	}
	return string(e.Code)
}

// modelCallObserved is the capture stage's CallObservedFunc.
func (in *instruments) modelCallObserved(tenant registry.TenantID, outcome model.Outcome, d time.Duration) {
	in.modelCall.WithLabelValues(string(tenant), string(outcome)).Observe(d.Seconds())
}
