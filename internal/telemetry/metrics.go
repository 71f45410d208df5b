package telemetry

import (
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// LatencyBuckets are the upper bounds, in seconds, of every latency
// histogram: a turn without the model takes about a millisecond and its
// stages tens to hundreds of microseconds, a model call takes seconds, a
// turn's deadline is two minutes.
var LatencyBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
}

// NATSCollectors report a NATS connection's state: connected (1) or not,
// its status as a label, and its reconnects.
func NATSCollectors(prefix string, nc *nats.Conn) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: prefix + "_nats_connected",
			Help: "1 while the NATS connection is connected, 0 while it is reconnecting or closed."},
			func() float64 {
				if nc.Status() == nats.CONNECTED {
					return 1
				}
				return 0
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: prefix + "_nats_reconnects_total",
			Help: "Times the NATS connection reconnected."}, func() float64 { return float64(nc.Stats().Reconnects) }),
	}
}
