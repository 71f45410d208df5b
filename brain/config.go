package brain

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"n8nbrain/nats/stream"
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
	// Streams sizes TURNS and RESULTS (BRAIN_STREAM_MAX_AGE, BRAIN_ACK_WAIT).
	Streams stream.Config
	// DBConnsPerTenant and DBMaxConns bound tenant database connections.
	// BRAIN_DB_CONNS_PER_TENANT (default 4), BRAIN_DB_MAX_CONNS (default 64).
	DBConnsPerTenant int32
	DBMaxConns       int
	// RegistryRefresh is the safety-net reload interval of the registry. Default 30s.
	RegistryRefresh time.Duration
	// OpsAddr serves /healthz, /readyz and /metrics. BRAIN_OPS_ADDR, default off.
	OpsAddr string
	// OpsListener, when set, is used instead of listening on OpsAddr (tests).
	OpsListener net.Listener
	// Hooks inject faults in tests; nil in production.
	Hooks Hooks
}

// Hooks are fault-injection points for tests. A hook returning an error
// makes the replica drop the turn at that point as if it had crashed: no
// reply, no ack; JetStream redelivers it after the ack wait.
type Hooks struct {
	AfterStepFunc   func(tenant registry.TenantID, workItemID string, turn int, step string) error
	AfterCommitFunc func(tenant registry.TenantID, workItemID string, turn int) error
}

func (c Config) withDefaults() Config {
	if c.Replica == "" {
		c.Replica, _ = os.Hostname()
	}
	if c.Workers == 0 {
		c.Workers = 16
	}
	if c.TurnTimeout == 0 {
		c.TurnTimeout = 2 * time.Minute
	}
	if c.MaxDeliveries == 0 {
		c.MaxDeliveries = 10
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 10 * time.Second
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
	if c.Workers < 1 || c.Workers > 1024 {
		errs = append(errs, fmt.Errorf("BRAIN_WORKERS must be between 1 and 1024, got %d", c.Workers))
	}
	return errors.Join(errs...)
}

// ConfigFromEnv reads the configuration from the environment.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		NATSURL:     getenv("BRAIN_NATS_URL"),
		CredsFile:   getenv("BRAIN_NATS_CREDS"),
		RegistryURL: getenv("BRAIN_REGISTRY_URL"),
		Replica:     getenv("BRAIN_REPLICA"),
		OpsAddr:     getenv("BRAIN_OPS_ADDR"),
	}
	var errs []error
	key := getenv("BRAIN_SEALING_KEY")
	if f := getenv("BRAIN_SEALING_KEY_FILE"); f != "" && key == "" {
		b, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("BRAIN_SEALING_KEY_FILE: %w", err))
		}
		key = string(b)
	}
	if key != "" {
		k, err := registry.ParseKey(key)
		if err != nil {
			errs = append(errs, fmt.Errorf("BRAIN_SEALING_KEY: %w", err))
		}
		c.SealingKey = k
	}
	intVar := func(name string, dst *int) {
		if v := getenv(name); v != "" {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				errs = append(errs, fmt.Errorf("%s must be an integer, got %q", name, v))
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
	c.DBConnsPerTenant = int32(perTenant)
	durVar("BRAIN_TURN_TIMEOUT", &c.TurnTimeout)
	durVar("BRAIN_STREAM_MAX_AGE", &c.Streams.MaxAge)
	durVar("BRAIN_ACK_WAIT", &c.Streams.AckWait)
	return c, errors.Join(errs...)
}
