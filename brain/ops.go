package brain

import (
	"fmt"
	"net/http"

	"github.com/nats-io/nats.go"
)

// opsRoutes serves the replica's operational endpoints.
func (b *brain) opsRoutes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
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
	})
	return mux
}
