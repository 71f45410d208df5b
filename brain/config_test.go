package brain

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestModelConfigFromEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
		want ModelConfig // after defaults
		bad  bool
	}{
		{"RulesOnly", nil, ModelConfig{Name: DefaultModel, Timeout: 60 * time.Second}, false},
		{"BrainURLWins", map[string]string{"BRAIN_OLLAMA_URL": "http://ollama:11434", "OLLAMA_HOST": "0.0.0.0"},
			ModelConfig{URL: "http://ollama:11434", Name: DefaultModel, Timeout: 60 * time.Second}, false},
		{"OllamaHostFallback", map[string]string{"OLLAMA_HOST": "127.0.0.1:11434"},
			ModelConfig{URL: "127.0.0.1:11434", Name: DefaultModel, Timeout: 60 * time.Second}, false},
		{"Everything", map[string]string{"BRAIN_OLLAMA_URL": "http://o:1", "BRAIN_MODEL": "llama3.2:3b", "BRAIN_MODEL_TIMEOUT": "90s",
			"BRAIN_MODEL_KEEP_ALIVE": "1h", "BRAIN_MODEL_CONCURRENCY": "3", "BRAIN_MODEL_BREAKER_WINDOW": "1m",
			"BRAIN_MODEL_BREAKER_MIN_CALLS": "10", "BRAIN_MODEL_BREAKER_FAILURE_RATIO": "0.8", "BRAIN_MODEL_BREAKER_COOLDOWN": "5s"},
			ModelConfig{URL: "http://o:1", Name: "llama3.2:3b", Timeout: 90 * time.Second, KeepAlive: time.Hour, Concurrency: 3,
				BreakerWindow: time.Minute, BreakerMinCalls: 10, BreakerFailureRatio: 0.8, BreakerCoolDown: 5 * time.Second}, false},
		{"BadTimeout", map[string]string{"BRAIN_MODEL_TIMEOUT": "soon"}, ModelConfig{}, true},
		{"BadRatio", map[string]string{"BRAIN_MODEL_BREAKER_FAILURE_RATIO": "half"}, ModelConfig{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := ConfigFromEnv(func(k string) string { return tc.env[k] })
			if tc.bad {
				if err == nil {
					t.Fatal("accepted")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.withDefaults().Model; got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestModelConfigValidate(t *testing.T) {
	t.Parallel()
	base := Config{NATSURL: "nats://x", CredsFile: "c", RegistryURL: "postgres://x", SealingKey: make([]byte, 32)}
	for _, tc := range []struct {
		name  string
		model ModelConfig
		ok    bool
	}{
		{"None", ModelConfig{}, true},
		{"URL", ModelConfig{URL: "http://ollama:11434"}, true},
		{"HostOnly", ModelConfig{URL: "ollama"}, true},
		{"BadScheme", ModelConfig{URL: "ftp://ollama"}, false},
		{"RatioAboveOne", ModelConfig{URL: "ollama", BreakerFailureRatio: 2}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := base
			c.Model = tc.model
			if err := c.withDefaults().validate(); (err == nil) != tc.ok {
				t.Fatalf("validate: %v", err)
			}
		})
	}
}

// TestSealingKeysFromEnv: the current key and, during a rotation, the
// previous one, each from the variable or its _FILE.
func TestSealingKeysFromEnv(t *testing.T) {
	t.Parallel()
	cur, prev := strings.Repeat("ab", 32), strings.Repeat("cd", 32)
	file := filepath.Join(t.TempDir(), "previous.key")
	if err := os.WriteFile(file, []byte(prev+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		env        map[string]string
		cur, prev  string
		wantErrSub string
	}{
		{"CurrentOnly", map[string]string{"BRAIN_SEALING_KEY": cur}, cur, "", ""},
		{"Both", map[string]string{"BRAIN_SEALING_KEY": cur, "BRAIN_SEALING_KEY_PREVIOUS": prev}, cur, prev, ""},
		{"PreviousFromFile", map[string]string{"BRAIN_SEALING_KEY": cur, "BRAIN_SEALING_KEY_PREVIOUS_FILE": file}, cur, prev, ""},
		{"BadPrevious", map[string]string{"BRAIN_SEALING_KEY": cur, "BRAIN_SEALING_KEY_PREVIOUS": "xyz"}, "", "", "BRAIN_SEALING_KEY_PREVIOUS"},
		{"MissingPreviousFile", map[string]string{"BRAIN_SEALING_KEY": cur, "BRAIN_SEALING_KEY_PREVIOUS_FILE": file + ".gone"}, "", "", "BRAIN_SEALING_KEY_PREVIOUS_FILE"},
		// One would silently win over the other (a rotation with the old key still exported).
		{"ValueAndFile", map[string]string{"BRAIN_SEALING_KEY": cur, "BRAIN_SEALING_KEY_FILE": file}, "", "", "both BRAIN_SEALING_KEY and BRAIN_SEALING_KEY_FILE are set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := ConfigFromEnv(func(k string) string { return tc.env[k] })
			if tc.wantErrSub != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErrSub) {
					t.Fatalf("err %v, want one naming %s", err, tc.wantErrSub)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if hex.EncodeToString(c.SealingKey) != tc.cur || hex.EncodeToString(c.PreviousSealingKey) != tc.prev {
				t.Fatalf("keys %x / %x, want %s / %s", c.SealingKey, c.PreviousSealingKey, tc.cur, tc.prev)
			}
		})
	}
}

// TestDBConnsConfig: the cap on tenant connections must hold at least one
// tenant's pool, or no pool could ever open; that is a configuration
// error naming both settings, not a brain that waits for ever.
func TestDBConnsConfig(t *testing.T) {
	t.Parallel()
	base := map[string]string{"BRAIN_NATS_URL": "nats://x", "BRAIN_NATS_CREDS": "c", "BRAIN_REGISTRY_URL": "postgres://x",
		"BRAIN_SEALING_KEY": strings.Repeat("ab", 32)}
	for _, tc := range []struct {
		name                string
		perTenant, maxConns string
		want                string // in the error; empty: valid
		wantPer, wantMax    int
	}{
		{"Defaults", "", "", "", 4, 64},
		{"CapOfOnePool", "8", "8", "", 8, 8},
		{"CapBelowOnePool", "", "2", "BRAIN_DB_MAX_CONNS (2) must be at least BRAIN_DB_CONNS_PER_TENANT (4)", 0, 0},
		{"CapBelowSetPool", "10", "9", "BRAIN_DB_MAX_CONNS (9) must be at least BRAIN_DB_CONNS_PER_TENANT (10)", 0, 0},
		{"NegativePool", "-1", "", "BRAIN_DB_CONNS_PER_TENANT must be", 0, 0},
		{"HugePool", "5000000000", "", "BRAIN_DB_CONNS_PER_TENANT must be", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"BRAIN_DB_CONNS_PER_TENANT": tc.perTenant, "BRAIN_DB_MAX_CONNS": tc.maxConns}
			c, err := ConfigFromEnv(func(k string) string {
				if v, ok := env[k]; ok {
					return v
				}
				return base[k]
			})
			if err == nil {
				c = c.withDefaults()
				err = c.validate()
			}
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if int(c.DBConnsPerTenant) != tc.wantPer || c.DBMaxConns != tc.wantMax {
					t.Fatalf("per tenant %d, cap %d; want %d and %d", c.DBConnsPerTenant, c.DBMaxConns, tc.wantPer, tc.wantMax)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

func TestDBTLSConfig(t *testing.T) {
	t.Parallel()
	base := map[string]string{"BRAIN_NATS_URL": "nats://x", "BRAIN_NATS_CREDS": "c", "BRAIN_REGISTRY_URL": "postgres://x",
		"BRAIN_SEALING_KEY": strings.Repeat("ab", 32)}
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, []byte("not checked here: tenancy.Open parses it"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, mode, rootCert string
		want                 string // in the error; empty: valid
	}{
		{"Default", "", "", ""},
		{"VerifyFull", "verify-full", ca, ""},
		{"Disable", " disable ", "", ""},
		{"UnknownMode", "on", "", `BRAIN_DB_SSLMODE must be one of disable, allow, prefer, require, verify-ca, verify-full, got "on"`},
		{"MissingRootCert", "verify-full", "/nonexistent/ca.crt", "BRAIN_DB_SSLROOTCERT: stat /nonexistent/ca.crt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"BRAIN_DB_SSLMODE": tc.mode, "BRAIN_DB_SSLROOTCERT": tc.rootCert}
			c, err := ConfigFromEnv(func(k string) string {
				if v, ok := env[k]; ok {
					return v
				}
				return base[k]
			})
			if err == nil {
				err = c.withDefaults().validate()
			}
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c.DBSSLMode != strings.TrimSpace(tc.mode) || c.DBSSLRootCert != tc.rootCert {
					t.Fatalf("sslmode %q, root %q; want %q and %q", c.DBSSLMode, c.DBSSLRootCert, tc.mode, tc.rootCert)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// A count or ratio written as 0 in the environment is refused, naming the
// variable: 0 in the Config stands for the default, so reading it would
// silently run with something else than what the operator wrote.
func TestZeroFromTheEnvironmentIsRefused(t *testing.T) {
	t.Parallel()
	base := map[string]string{"BRAIN_NATS_URL": "nats://x", "BRAIN_NATS_CREDS": "c", "BRAIN_REGISTRY_URL": "postgres://x",
		"BRAIN_SEALING_KEY": strings.Repeat("ab", 32)}
	for _, name := range []string{"BRAIN_WORKERS", "BRAIN_TENANT_WORKERS", "BRAIN_DB_CONNS_PER_TENANT", "BRAIN_DB_MAX_CONNS",
		"BRAIN_MODEL_CONCURRENCY", "BRAIN_MODEL_BREAKER_MIN_CALLS", "BRAIN_MODEL_BREAKER_FAILURE_RATIO"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := ConfigFromEnv(func(k string) string {
				if k == name {
					return "0"
				}
				return base[k]
			})
			if err == nil || !strings.Contains(err.Error(), name+" must be") {
				t.Fatalf("%s=0: %v, want an error naming it", name, err)
			}
		})
	}
}
