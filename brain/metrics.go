package brain

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"n8nbrain/brain/internal/model"
	"n8nbrain/brain/internal/tenancy"
	"n8nbrain/internal/telemetry"
)

// Why prometheus/client_golang: the de-facto standard exposition library,
// already in the module graph, with histograms, collectors that read state
// at scrape time (so the turn processor keeps plain atomics and no
// dependency on it), and the Go runtime's metrics for free.

// newMetrics registers the replica's metrics: the turn processor's
// counters, each tenant's turns queued and in flight on this replica, the
// model's use per tenant and the circuit breaker. Tenant ids are labels;
// no content ever is.
func (b *brain) newMetrics() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	c := &b.proc.Counters
	for _, m := range []struct {
		name, help string
		v          func() float64
	}{
		{"brain_turns_decided_total", "Turns decided and committed.", func() float64 { return float64(c.Decided.Load()) }},
		{"brain_turns_replayed_total", "Turns answered from a stored decision.", func() float64 { return float64(c.Replayed.Load()) }},
		{"brain_turns_rejected_total", "Turns answered with an error.", func() float64 { return float64(c.Rejected.Load()) }},
		{"brain_turns_tenant_mismatch_total", "Turns whose body named another tenant than the NATS account.", func() float64 { return float64(c.TenantMismatch.Load()) }},
		{"brain_turns_key_reused_total", "Turns reusing a decided idempotency key with another payload.", func() float64 { return float64(c.KeyReused.Load()) }},
		{"brain_items_halted_total", "Work items halted at the turn ceiling.", func() float64 { return float64(c.Halted.Load()) }},
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: m.name, Help: m.help}, m.v))
	}
	for scope, n := range map[string]*atomic.Int64{"all": &b.dir.Reloads.All, "tenant": &b.dir.Reloads.One} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "brain_registry_reloads_total",
			Help: "Registry reloads: of every tenant (all), or of the one tenant a change names (tenant).", ConstLabels: prometheus.Labels{"scope": scope}},
			func() float64 { return float64(n.Load()) }))
	}
	reg.MustRegister(b.inst.collectors()...)
	reg.MustRegister(telemetry.NATSCollectors("brain", b.nc)...)
	reg.MustRegister(telemetry.NATSCollectors("brain_api", b.apiNC)...)
	reg.MustRegister(&pendingCollector{b: b})
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "brain_tenants_consumed",
		Help: "Tenants whose turn consumer this replica is bound to."}, func() float64 { return float64(b.consumers.count()) }))
	reg.MustRegister(&tenantLoadCollector{b: b}, &tenantDBCollector{b: b})
	for _, g := range []struct {
		name, help string
		v          func(tenancy.PoolStats) int
	}{
		{"brain_db_pools_open", "Tenant database pools open on this replica (idle ones are closed).", func(s tenancy.PoolStats) int { return s.Pools }},
		{"brain_db_conns", "Tenant database connections of this replica, idle or in use (at most BRAIN_DB_MAX_CONNS).", func(s tenancy.PoolStats) int { return s.Conns }},
		{"brain_db_conns_in_use", "Tenant database connections of this replica in use.", func(s tenancy.PoolStats) int { return s.Acquired }},
		{"brain_db_conns_waiting", "Tenant database connections waiting for a place under BRAIN_DB_MAX_CONNS (above zero for long: raise the cap).", func(s tenancy.PoolStats) int { return s.Waiting }},
	} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: g.name, Help: g.help},
			func() float64 { return float64(g.v(b.dir.Stats())) }))
	}
	if b.stage != nil {
		reg.MustRegister(&modelCollector{b: b})
	}
	return reg
}

var (
	tenantQueuedDesc = prometheus.NewDesc("brain_tenant_turns_queued",
		"Turns of a tenant taken from its stream and waiting for a worker on this replica.", []string{"tenant"}, nil)
	tenantInflightDesc = prometheus.NewDesc("brain_tenant_turns_inflight",
		"Turns of a tenant being decided on this replica (at most BRAIN_TENANT_WORKERS).", []string{"tenant"}, nil)
	tenantHeldDesc = prometheus.NewDesc("brain_tenant_turns_held",
		"Turns of a tenant held on this replica until its database answers again; absent while it answers.", []string{"tenant"}, nil)
)

// tenantLoadCollector reads the fair scheduler and the held turns at scrape time. A tenant
// with nothing queued or in flight is not listed.
type tenantLoadCollector struct{ b *brain }

func (c *tenantLoadCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- tenantQueuedDesc
	ch <- tenantInflightDesc
	ch <- tenantHeldDesc
}

func (c *tenantLoadCollector) Collect(ch chan<- prometheus.Metric) {
	for acc, l := range c.b.sched.Loads() {
		id := acc
		if t, ok := c.b.dir.ByAccount(acc); ok {
			id = string(t.ID)
		}
		ch <- prometheus.MustNewConstMetric(tenantQueuedDesc, prometheus.GaugeValue, float64(l.Queued), id)
		ch <- prometheus.MustNewConstMetric(tenantInflightDesc, prometheus.GaugeValue, float64(l.Inflight), id)
	}
	for acc, n := range c.b.held.counts() {
		id := acc
		if t, ok := c.b.dir.ByAccount(acc); ok {
			id = string(t.ID)
		}
		ch <- prometheus.MustNewConstMetric(tenantHeldDesc, prometheus.GaugeValue, float64(n), id)
	}
}

var (
	modelTokensDesc = prometheus.NewDesc("brain_model_tokens_total",
		"Model tokens (prompt and output) used, by tenant.", []string{"tenant"}, nil)
	modelCallsDesc = prometheus.NewDesc("brain_model_calls_total",
		"Model calls by tenant and outcome (ok, invalid_output, error, timeout).", []string{"tenant", "outcome"}, nil)
	modelEscalationsDesc = prometheus.NewDesc("brain_model_escalations_total",
		"Items escalated to a human because of the model, by tenant and reason.", []string{"tenant", "reason"}, nil)
	breakerOpenDesc = prometheus.NewDesc("brain_model_breaker_open",
		"1 while the shared model circuit breaker (the server's health) refuses calls.", nil, nil)
	tenantBreakerOpenDesc = prometheus.NewDesc("brain_model_tenant_breaker_open",
		"1 while a tenant's own model circuit breaker (its unusable answers) refuses its calls; absent when closed.", []string{"tenant"}, nil)
)

// modelCollector reads the model stage's running totals at scrape time.
type modelCollector struct{ b *brain }

func (c *modelCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{modelTokensDesc, modelCallsDesc, modelEscalationsDesc, breakerOpenDesc, tenantBreakerOpenDesc} {
		ch <- d
	}
}

func (c *modelCollector) Collect(ch chan<- prometheus.Metric) {
	for _, u := range c.b.stage.Usage() {
		t := string(u.Tenant)
		ch <- prometheus.MustNewConstMetric(modelTokensDesc, prometheus.CounterValue, float64(u.Tokens), t)
		for o, n := range u.Calls {
			ch <- prometheus.MustNewConstMetric(modelCallsDesc, prometheus.CounterValue, float64(n), t, string(o))
		}
		for r, n := range u.Escalations {
			ch <- prometheus.MustNewConstMetric(modelEscalationsDesc, prometheus.CounterValue, float64(n), t, r)
		}
	}
	open := 0.0
	if c.b.model.BreakerState() != model.BreakerClosed {
		open = 1
	}
	ch <- prometheus.MustNewConstMetric(breakerOpenDesc, prometheus.GaugeValue, open)
	for _, t := range c.b.model.TenantBreakersOpen() {
		ch <- prometheus.MustNewConstMetric(tenantBreakerOpenDesc, prometheus.GaugeValue, 1, t)
	}
}

var (
	loginFailuresDesc = prometheus.NewDesc("brain_tenant_db_login_failures_total",
		"Connections to a tenant's database refused for good (the tenant's role, or the TLS required), by tenant.", []string{"tenant"}, nil)
	loginFailingDesc = prometheus.NewDesc("brain_tenant_db_login_failing",
		"1 while a tenant's database refuses the brain's connection (the tenant's role, or the TLS required).", []string{"tenant"}, nil)
)

// tenantDBCollector reports refused logins to tenant databases, by tenant.
type tenantDBCollector struct{ b *brain }

func (c *tenantDBCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- loginFailuresDesc
	ch <- loginFailingDesc
}

func (c *tenantDBCollector) Collect(ch chan<- prometheus.Metric) {
	failing := map[string]bool{}
	for _, p := range c.b.dir.LoginProblems() {
		failing[string(p.Tenant)] = true
	}
	for id, n := range c.b.dir.LoginFailures() {
		v := 0.0
		if failing[string(id)] {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(loginFailuresDesc, prometheus.CounterValue, float64(n), string(id))
		ch <- prometheus.MustNewConstMetric(loginFailingDesc, prometheus.GaugeValue, v, string(id))
	}
}
