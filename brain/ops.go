package brain

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// opsRoutes serves the replica's operational endpoints.
func (b *brain) opsRoutes() http.Handler {
	mux := http.NewServeMux()
	// Liveness fails once the NATS connection is closed for good or the
	// server refuses the credential: neither mends itself, and the replica
	// stops with an error as soon as nats.go gives up.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if err := errors.Join(b.natsWatch.Err(), b.apiWatch.Err()); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			body, _ := json.Marshal(map[string]string{"status": "unhealthy", "error": err.Error()})
			_, _ = w.Write(body)
			return
		}
		fmt.Fprint(w, `{"status":"ok"}`)
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		for _, c := range []struct {
			nc   *nats.Conn
			name string
		}{{b.nc, "nats"}, {b.apiNC, "nats (tenant API)"}} {
			if st := c.nc.Status(); st != nats.CONNECTED {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, `{"status":"%s %s"}`, c.name, st)
				return
			}
		}
		// A tenant whose database refuses the brain's connection (its role,
		// or the TLS required) is named here, but does not make the
		// replica unready: every other tenant is served.
		type problem struct {
			Tenant   string    `json:"tenant"`
			Problem  string    `json:"problem"`
			SQLState string    `json:"sqlstate,omitempty"`
			Since    time.Time `json:"since"`
		}
		var problems []problem
		for _, p := range b.dir.LoginProblems() {
			pr := problem{Tenant: string(p.Tenant), SQLState: p.SQLState, Since: p.Since.UTC(),
				Problem: "its database refuses the tenant's role (password, LOGIN or CONNECT changed outside provisioning): repair the role"}
			if p.TLS {
				pr.Problem = "its database cannot be reached with the TLS BRAIN_DB_SSLMODE requires (the server refuses TLS, " +
					"or its certificate does not verify): mend the server's TLS or the setting"
			}
			problems = append(problems, pr)
		}
		body, _ := json.Marshal(struct {
			Status         string    `json:"status"`
			TenantProblems []problem `json:"tenant_problems,omitempty"`
		}{"ready", problems})
		_, _ = w.Write(body)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(b.metrics, promhttp.HandlerOpts{}))
	return mux
}
