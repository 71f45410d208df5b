package brain

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"n8nbrain/brain/internal/model"
	"n8nbrain/brain/internal/tenancy"
	"n8nbrain/registry"
)

// Config of one brain replica. The zero value of a field means its default.
// Only main builds it from the environment (ConfigFromEnv); tests build it
// directly.
type Config struct {
	NATSURL     string // BRAIN_NATS_URL (required)
	CredsFile   string // BRAIN_NATS_CREDS: the BRAIN account user's .creds file (required)
	RegistryURL string // BRAIN_REGISTRY_URL: the registry reader role (required)
	// SealingKey opens tenant database passwords sealed in the registry.
	// BRAIN_SEALING_KEY (64 hex characters) or BRAIN_SEALING_KEY_FILE.
	SealingKey []byte
	// PreviousSealingKey also opens them, during a rotation of the sealing
	// key (`brainctl seal-key rotate` re-seals every password with
	// SealingKey; then it is removed). BRAIN_SEALING_KEY_PREVIOUS or
	// BRAIN_SEALING_KEY_PREVIOUS_FILE; optional.
	PreviousSealingKey []byte
	// Replica names this replica in logs and its NATS connection. BRAIN_REPLICA, default the host name.
	Replica string
	// Workers is how many turns this replica decides at once. BRAIN_WORKERS, default 16.
	Workers int
	// TurnTimeout bounds one turn, model calls included. BRAIN_TURN_TIMEOUT, default 2m.
	TurnTimeout time.Duration
	// MaxDeliveries: a turn that failed for transient reasons this many
	// times is answered "unavailable" instead of being retried again. Default 10.
	MaxDeliveries int
	// ShutdownGrace is how long turns in flight may finish at shutdown. Default 10s.
	ShutdownGrace time.Duration
	// TurnHold is how long a turn waits on this replica for its tenant's
	// database to answer again before it goes back to JetStream (held.go). Default 15s.
	TurnHold time.Duration
	// TenantWorkers is the most workers one tenant may hold on this
	// replica, however many turns it has waiting: the rest stay free for
	// the other tenants. BRAIN_TENANT_WORKERS, default a quarter of Workers
	// (at least 1).
	TenantWorkers int
	// DBConnsPerTenant and DBMaxConns bound tenant database connections:
	// each tenant's pool, and the connections of every pool together (the
	// cap counts connections, not pools, so it must be at least one full
	// pool). BRAIN_DB_CONNS_PER_TENANT (default 4), BRAIN_DB_MAX_CONNS
	// (default 64). The registry reader's pool (4) is outside the cap.
	DBConnsPerTenant int32
	DBMaxConns       int
	// DBSSLMode is how tenant database connections use TLS, as libpq's
	// sslmode (tenancy.SSLModes). BRAIN_DB_SSLMODE, default prefer: TLS when
	// the server offers it, unverified. Use verify-full (with
	// BRAIN_DB_SSLROOTCERT, the CA certificates file; the system's roots
	// without it) when tenant databases are on other hosts, and disable
	// for servers without TLS, which spares each new connection the
	// refused TLS attempt.
	DBSSLMode     string
	DBSSLRootCert string
	// DBIdleTimeout closes a tenant's pool idle that long, so an idle tenant
	// holds no connection. BRAIN_DB_IDLE_TIMEOUT, default 2m.
	DBIdleTimeout time.Duration
	// RegistryRefresh is the safety-net reload interval of the registry
	// (changes arrive through LISTEN within moments). Default 2m.
	RegistryRefresh time.Duration
	// OpsAddr serves /healthz, /readyz and /metrics. BRAIN_OPS_ADDR, default off.
	OpsAddr string
	// OpsListener, when set, is used instead of listening on OpsAddr (tests).
	OpsListener net.Listener
	// ReconcileInterval is how long the timers' safety net takes to visit
	// every tenant once (timers bring expiries and event re-deliveries at
	// their time; this repairs a timer lost with a replica that died between
	// a commit and its wake-up). BRAIN_RECONCILE_INTERVAL, default 30m.
	ReconcileInterval time.Duration
	// EventRetryBase and EventRetryMax space re-publishes of an event no edge
	// acked (base·2^attempts, at most max). BRAIN_EVENT_RETRY_BASE (2s),
	// BRAIN_EVENT_RETRY_MAX (5m).
	EventRetryBase time.Duration
	EventRetryMax  time.Duration
	// Model configures the model stage; without a URL the brain runs rules only.
	Model ModelConfig
	// Hooks inject faults in tests; nil in production.
	Hooks Hooks
	// TracerProvider traces turns (OpenTelemetry); nil means tracing off.
	// cmd/brain builds it from the standard OTEL_EXPORTER_OTLP_* variables
	// (telemetry.FromEnv); tests pass one with an in-memory exporter.
	TracerProvider trace.TracerProvider
}

// ModelConfig is the model server and how the brain calls it. The zero
// value of a field means its default.
type ModelConfig struct {
	// URL of the Ollama server. BRAIN_OLLAMA_URL, else OLLAMA_HOST; empty
	// means no model: the brain runs rules only and escalates every item
	// that no confident rule decides.
	URL string
	// Name is the model for tenants whose registry entry names none.
	// BRAIN_MODEL, default DefaultModel.
	Name string
	// Timeout bounds one model call. BRAIN_MODEL_TIMEOUT, default 60s.
	Timeout time.Duration
	// KeepAlive is how long Ollama keeps the model loaded after a call.
	// BRAIN_MODEL_KEEP_ALIVE, default 30m.
	KeepAlive time.Duration
	// RetryDelay is the pause before the one retry of a failed call. Default 500ms.
	RetryDelay time.Duration
	// Concurrency bounds this replica's model calls in flight; the others
	// wait their turn here, within the turn's deadline, rather than in
	// Ollama's queue against the call timeout. BRAIN_MODEL_CONCURRENCY, default 2.
	Concurrency int
	// The circuit breaker opens when at least BreakerMinCalls calls in the
	// last BreakerWindow failed at BreakerFailureRatio or more, refuses calls
	// for BreakerCoolDown, then lets one probe through.
	// BRAIN_MODEL_BREAKER_WINDOW (30s), BRAIN_MODEL_BREAKER_MIN_CALLS (5),
	// BRAIN_MODEL_BREAKER_FAILURE_RATIO (0.5), BRAIN_MODEL_BREAKER_COOLDOWN (30s).
	BreakerWindow       time.Duration
	BreakerMinCalls     int
	BreakerFailureRatio float64
	BreakerCoolDown     time.Duration
}

// DefaultModel is the model used when neither BRAIN_MODEL nor the tenant
// names one: about 2.5 GB at Ollama's default 4-bit quantisation, so it
// runs on a CPU-only machine; good at following a JSON schema and
// instructions; Apache-2.0 (unlike qwen2.5:3b, whose licence is the Qwen
// Research licence). The client turns its thinking mode off.
const DefaultModel = "qwen3:4b"

// Hooks are fault-injection points for tests. A hook returning an error
// makes the replica drop the turn at that point as if it had crashed: no
// reply, no ack; JetStream redelivers it after the ack wait.
type Hooks struct {
	AfterStepFunc   func(tenant registry.TenantID, workItemID string, turn int, step string) error
	AfterCommitFunc func(tenant registry.TenantID, workItemID string, turn int) error
	// BeforeAPIFunc runs before a tenant API call is dispatched (a test
	// panics in it, as a bug in a handler would).
	BeforeAPIFunc func(tenant registry.TenantID, method string)
	// BeforeForwardFunc runs as a tenant's events are forwarded (by a
	// kick, a timer or the reconciliation pass; a test panics in it).
	BeforeForwardFunc func(tenant registry.TenantID)
}

func (c Config) withDefaults() Config {
	if c.Replica == "" {
		c.Replica, _ = os.Hostname()
	}
	if c.Workers == 0 {
		c.Workers = 16
	}
	if c.TenantWorkers == 0 {
		c.TenantWorkers = max(1, c.Workers/4)
	}
	if c.TurnTimeout == 0 {
		c.TurnTimeout = 2 * time.Minute
	}
	if c.MaxDeliveries == 0 {
		c.MaxDeliveries = 10
	}
	if c.TurnHold == 0 {
		c.TurnHold = 15 * time.Second
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	if c.ReconcileInterval == 0 {
		c.ReconcileInterval = 30 * time.Minute
	}
	if c.DBConnsPerTenant == 0 {
		c.DBConnsPerTenant = 4
	}
	if c.DBMaxConns == 0 {
		c.DBMaxConns = 64
	}
	if c.Model.Name == "" {
		c.Model.Name = DefaultModel
	}
	if c.Model.Timeout == 0 {
		c.Model.Timeout = 60 * time.Second
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.NATSURL == "" {
		errs = append(errs, errors.New("BRAIN_NATS_URL is required"))
	}
	if c.CredsFile == "" {
		errs = append(errs, errors.New("BRAIN_NATS_CREDS is required: the BRAIN account user's .creds file"))
	}
	if c.RegistryURL == "" {
		errs = append(errs, errors.New("BRAIN_REGISTRY_URL is required: the registry reader role's URL"))
	}
	if len(c.SealingKey) != registry.KeySize {
		errs = append(errs, fmt.Errorf("BRAIN_SEALING_KEY or BRAIN_SEALING_KEY_FILE is required: %d bytes as hex", registry.KeySize))
	}
	if len(c.PreviousSealingKey) != 0 && len(c.PreviousSealingKey) != registry.KeySize {
		errs = append(errs, fmt.Errorf("BRAIN_SEALING_KEY_PREVIOUS must be %d bytes as hex", registry.KeySize))
	}
	if c.Workers < 1 || c.Workers > 1024 {
		errs = append(errs, fmt.Errorf("BRAIN_WORKERS must be between 1 and 1024, got %d", c.Workers))
	}
	if c.TenantWorkers < 1 || c.TenantWorkers > c.Workers {
		errs = append(errs, fmt.Errorf("BRAIN_TENANT_WORKERS must be between 1 and BRAIN_WORKERS (%d), got %d", c.Workers, c.TenantWorkers))
	}
	if c.DBConnsPerTenant < 1 {
		errs = append(errs, fmt.Errorf("BRAIN_DB_CONNS_PER_TENANT must be at least 1, got %d", c.DBConnsPerTenant))
	} else if c.DBMaxConns < int(c.DBConnsPerTenant) {
		errs = append(errs, fmt.Errorf("BRAIN_DB_MAX_CONNS (%d) must be at least BRAIN_DB_CONNS_PER_TENANT (%d): "+
			"one busy tenant's pool could never reach its size", c.DBMaxConns, c.DBConnsPerTenant))
	}
	if c.DBSSLMode != "" && !slices.Contains(tenancy.SSLModes, c.DBSSLMode) {
		errs = append(errs, fmt.Errorf("BRAIN_DB_SSLMODE must be one of %s, got %q", strings.Join(tenancy.SSLModes, ", "), c.DBSSLMode))
	}
	if c.DBSSLRootCert != "" {
		if _, err := os.Stat(c.DBSSLRootCert); err != nil {
			errs = append(errs, fmt.Errorf("BRAIN_DB_SSLROOTCERT: %w", err))
		}
	}
	if c.Model.URL != "" {
		if _, err := model.ParseURL(c.Model.URL); err != nil {
			errs = append(errs, fmt.Errorf("BRAIN_OLLAMA_URL: %w", err))
		}
	}
	if r := c.Model.BreakerFailureRatio; r < 0 || r > 1 {
		errs = append(errs, fmt.Errorf("BRAIN_MODEL_BREAKER_FAILURE_RATIO must be between 0 and 1, got %v", r))
	}
	return errors.Join(errs...)
}

// ConfigFromEnv reads the configuration from the environment.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		NATSURL:       getenv("BRAIN_NATS_URL"),
		CredsFile:     getenv("BRAIN_NATS_CREDS"),
		RegistryURL:   getenv("BRAIN_REGISTRY_URL"),
		Replica:       getenv("BRAIN_REPLICA"),
		OpsAddr:       getenv("BRAIN_OPS_ADDR"),
		DBSSLMode:     strings.TrimSpace(getenv("BRAIN_DB_SSLMODE")),
		DBSSLRootCert: strings.TrimSpace(getenv("BRAIN_DB_SSLROOTCERT")),
		Model: ModelConfig{
			URL:  strings.TrimSpace(getenv("BRAIN_OLLAMA_URL")),
			Name: strings.TrimSpace(getenv("BRAIN_MODEL")),
		},
	}
	if c.Model.URL == "" {
		c.Model.URL = strings.TrimSpace(getenv("OLLAMA_HOST"))
	}
	var errs []error
	keyVar := func(name string) []byte {
		k, err := registry.ReadKey(getenv(name), getenv(name+"_FILE"))
		var pathErr *fs.PathError
		switch {
		case errors.Is(err, registry.ErrKeyGivenTwice):
			errs = append(errs, fmt.Errorf("both %s and %s_FILE are set: give the key one way", name, name))
		case errors.As(err, &pathErr):
			errs = append(errs, fmt.Errorf("%s_FILE: %w", name, err))
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		return k
	}
	c.SealingKey = keyVar("BRAIN_SEALING_KEY")
	c.PreviousSealingKey = keyVar("BRAIN_SEALING_KEY_PREVIOUS")
	// Every count here is positive; 0 in the Config means its default, so
	// a 0 (or less) written in the environment is refused rather than
	// silently read as the default.
	intVar := func(name string, dst *int) {
		if v := getenv(name); v != "" {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("%s must be an integer, got %q", name, v))
			case n < 1:
				errs = append(errs, fmt.Errorf("%s must be at least 1, got %d (unset it for the default)", name, n))
			}
			*dst = n
		}
	}
	durVar := func(name string, dst *time.Duration) {
		if v := getenv(name); v != "" {
			d, err := time.ParseDuration(strings.TrimSpace(v))
			if err != nil || d <= 0 {
				errs = append(errs, fmt.Errorf("%s must be a positive duration such as 30s, got %q", name, v))
			}
			*dst = d
		}
	}
	var perTenant int
	intVar("BRAIN_WORKERS", &c.Workers)
	intVar("BRAIN_DB_CONNS_PER_TENANT", &perTenant)
	intVar("BRAIN_DB_MAX_CONNS", &c.DBMaxConns)
	if perTenant < 0 || perTenant > 1000 {
		errs = append(errs, fmt.Errorf("BRAIN_DB_CONNS_PER_TENANT must be between 1 and 1000, got %d", perTenant))
	}
	c.DBConnsPerTenant = int32(perTenant)
	intVar("BRAIN_MODEL_CONCURRENCY", &c.Model.Concurrency)
	intVar("BRAIN_MODEL_BREAKER_MIN_CALLS", &c.Model.BreakerMinCalls)
	if v := getenv("BRAIN_MODEL_BREAKER_FAILURE_RATIO"); v != "" {
		r, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("BRAIN_MODEL_BREAKER_FAILURE_RATIO must be a number, got %q", v))
		case r <= 0 || r > 1:
			// 0 would be read as the default (0.5), not as "any failure".
			errs = append(errs, fmt.Errorf("BRAIN_MODEL_BREAKER_FAILURE_RATIO must be greater than 0 and at most 1, got %v", r))
		}
		c.Model.BreakerFailureRatio = r
	}
	durVar("BRAIN_MODEL_TIMEOUT", &c.Model.Timeout)
	durVar("BRAIN_MODEL_KEEP_ALIVE", &c.Model.KeepAlive)
	durVar("BRAIN_MODEL_BREAKER_WINDOW", &c.Model.BreakerWindow)
	durVar("BRAIN_MODEL_BREAKER_COOLDOWN", &c.Model.BreakerCoolDown)
	durVar("BRAIN_TURN_TIMEOUT", &c.TurnTimeout)
	durVar("BRAIN_RECONCILE_INTERVAL", &c.ReconcileInterval)
	durVar("BRAIN_DB_IDLE_TIMEOUT", &c.DBIdleTimeout)
	durVar("BRAIN_EVENT_RETRY_BASE", &c.EventRetryBase)
	durVar("BRAIN_EVENT_RETRY_MAX", &c.EventRetryMax)
	intVar("BRAIN_TENANT_WORKERS", &c.TenantWorkers)
	for _, gone := range []string{"BRAIN_SWEEP_INTERVAL", "BRAIN_EVENT_INTERVAL"} {
		if getenv(gone) != "" {
			errs = append(errs, fmt.Errorf("%s is no longer a setting: approval expiries and event re-deliveries come "+
				"to the brain by timers at their time; BRAIN_RECONCILE_INTERVAL is the safety net's period; unset it", gone))
		}
	}
	for _, moved := range []string{"BRAIN_STREAM_MAX_AGE", "BRAIN_ACK_WAIT"} {
		if getenv(moved) != "" {
			errs = append(errs, fmt.Errorf("%s is no longer a brain setting: each tenant's streams and consumer are "+
				"created by provisioning (turn window and quota per tenant in the registry, ack wait in the provisioning "+
				"configuration); unset it", moved))
		}
	}
	return c, errors.Join(errs...)
}
