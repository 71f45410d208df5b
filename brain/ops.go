package brain

import (
	"fmt"
	"net/http"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
	mux.Handle("GET /metrics", promhttp.HandlerFor(b.newMetrics(), promhttp.HandlerOpts{}))
	return mux
}
