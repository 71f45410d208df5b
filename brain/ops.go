package brain

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"

	"n8nbrain/brain/internal/model"
)

// opsRoutes serves the replica's operational endpoints.
func (b *brain) opsRoutes() http.Handler {
	mux := http.NewServeMux()
	// Liveness fails once the NATS connection is closed for good or the
	// server refuses the credential: neither mends itself, and the replica
	// stops with an error as soon as nats.go gives up.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if err := b.natsWatch.Err(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			body, _ := json.Marshal(map[string]string{"status": "unhealthy", "error": err.Error()})
			_, _ = w.Write(body)
			return
		}
		fmt.Fprint(w, `{"status":"ok"}`)
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if b.nc.Status() != nats.CONNECTED {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, `{"status":"nats %s"}`, b.nc.Status())
			return
		}
		fmt.Fprint(w, `{"status":"ready"}`)
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		c := &b.proc.Counters
		for _, m := range []struct {
			name, help string
			v          int64
		}{
			{"brain_turns_decided_total", "Turns decided and committed.", c.Decided.Load()},
			{"brain_turns_replayed_total", "Turns answered from a stored decision.", c.Replayed.Load()},
			{"brain_turns_rejected_total", "Turns answered with an error.", c.Rejected.Load()},
			{"brain_turns_tenant_mismatch_total", "Turns whose body named another tenant than the NATS account.", c.TenantMismatch.Load()},
			{"brain_turns_key_reused_total", "Turns reusing a decided idempotency key with another payload.", c.KeyReused.Load()},
			{"brain_items_halted_total", "Work items halted at the turn ceiling.", c.Halted.Load()},
		} {
			fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", m.name, m.help, m.name, m.name, m.v)
		}
		b.modelMetrics(w)
	})
	return mux
}

// modelMetrics writes the model's use per tenant (tenant ids as labels,
// never content) and the circuit breaker's state. Nothing without a model.
func (b *brain) modelMetrics(w io.Writer) {
	if b.stage == nil {
		return
	}
	usage := b.stage.Usage()
	fmt.Fprint(w, "# HELP brain_model_tokens_total Model tokens (prompt and output) used, by tenant.\n# TYPE brain_model_tokens_total counter\n")
	for _, u := range usage {
		fmt.Fprintf(w, "brain_model_tokens_total{tenant=%s} %d\n", label(string(u.Tenant)), u.Tokens)
	}
	fmt.Fprint(w, "# HELP brain_model_calls_total Model calls by tenant and outcome (ok, invalid_output, error, timeout).\n# TYPE brain_model_calls_total counter\n")
	for _, u := range usage {
		for _, o := range slices.Sorted(maps.Keys(u.Calls)) {
			fmt.Fprintf(w, "brain_model_calls_total{tenant=%s,outcome=%s} %d\n", label(string(u.Tenant)), label(string(o)), u.Calls[o])
		}
	}
	fmt.Fprint(w, "# HELP brain_model_escalations_total Items escalated to a human because of the model, by tenant and reason.\n# TYPE brain_model_escalations_total counter\n")
	for _, u := range usage {
		for _, r := range slices.Sorted(maps.Keys(u.Escalations)) {
			fmt.Fprintf(w, "brain_model_escalations_total{tenant=%s,reason=%s} %d\n", label(string(u.Tenant)), label(r), u.Escalations[r])
		}
	}
	open := 0
	if b.model.BreakerState() != model.BreakerClosed {
		open = 1
	}
	fmt.Fprintf(w, "# HELP brain_model_breaker_open 1 while the model circuit breaker refuses calls.\n# TYPE brain_model_breaker_open gauge\nbrain_model_breaker_open %d\n", open)
}

// label quotes a Prometheus label value.
func label(v string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v) + `"`
}
