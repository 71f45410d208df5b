package brain

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

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
		// A tenant whose database refuses its role is named here, but does
		// not make the replica unready: every other tenant is served.
		type problem struct {
			Tenant   string    `json:"tenant"`
			Problem  string    `json:"problem"`
			SQLState string    `json:"sqlstate"`
			Since    time.Time `json:"since"`
		}
		var problems []problem
		for _, p := range b.dir.LoginProblems() {
			problems = append(problems, problem{Tenant: string(p.Tenant), SQLState: p.SQLState, Since: p.Since.UTC(),
				Problem: "its database refuses the tenant's role (password, LOGIN or CONNECT changed outside provisioning): repair the role"})
		}
		body, _ := json.Marshal(struct {
			Status         string    `json:"status"`
			TenantProblems []problem `json:"tenant_problems,omitempty"`
		}{"ready", problems})
		_, _ = w.Write(body)
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
		b.tenantDBMetrics(w)
		b.modelMetrics(w)
	})
	return mux
}

// tenantDBMetrics writes the refused logins to tenant databases, by tenant.
func (b *brain) tenantDBMetrics(w io.Writer) {
	failures := b.dir.LoginFailures()
	failing := map[string]bool{}
	for _, p := range b.dir.LoginProblems() {
		failing[string(p.Tenant)] = true
	}
	ids := slices.Sorted(maps.Keys(failures))
	fmt.Fprint(w, "# HELP brain_tenant_db_login_failures_total Connections to a tenant's database refused for the tenant's role, by tenant.\n"+
		"# TYPE brain_tenant_db_login_failures_total counter\n")
	for _, id := range ids {
		fmt.Fprintf(w, "brain_tenant_db_login_failures_total{tenant=%s} %d\n", label(string(id)), failures[id])
	}
	fmt.Fprint(w, "# HELP brain_tenant_db_login_failing 1 while a tenant's database refuses the tenant's role.\n"+
		"# TYPE brain_tenant_db_login_failing gauge\n")
	for _, id := range ids {
		v := 0
		if failing[string(id)] {
			v = 1
		}
		fmt.Fprintf(w, "brain_tenant_db_login_failing{tenant=%s} %d\n", label(string(id)), v)
	}
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
