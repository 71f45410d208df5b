package devstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"n8nbrain/brain"

	"n8nbrain/deploy/localpg"
	"n8nbrain/internal/testdb"
)

// Ctrl-C stops what make dev started: its Postgres too, unless the cluster
// was running before (make test starts it and leaves it running), and the
// last lines it prints say which.
func TestUpStopsThePostgresItStarted(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping a test that runs the development stack on a Postgres cluster of its own")
	}
	o := UpOptions{Dir: filepath.Join(testdb.ServerDir(t), "data"), PGPort: testdb.FreePort(t), NATSPort: testdb.FreePort(t),
		EdgeAddr: "127.0.0.1:0", OpsAddr: "127.0.0.1:0", Replicas: 1, Getenv: func(string) string { return "" }}
	pgCfg := localpg.Config{Dir: filepath.Join(o.Dir, "pg"), Port: o.PGPort}

	t.Run("StartedByUp", func(t *testing.T) {
		printed := runUpUntilServing(t, o)
		if !strings.Contains(printed, "Ctrl-C stops everything, Postgres too;") {
			t.Errorf("the stack does not say Ctrl-C stops its Postgres:\n%s", printed)
		}
		// The README's import command for make dev: both variants.
		if !strings.Contains(printed, "deploy/n8n/import.sh "+filepath.Join(o.Dir, "n8n")+" webhook\n") {
			t.Errorf("the stack does not print the README's n8n import command:\n%s", printed)
		}
		if connects(t, pgCfg) {
			t.Fatal("Postgres still accepts connections after the stack it started has stopped")
		}
	})

	t.Run("RunningBefore", func(t *testing.T) {
		inst, err := localpg.Ensure(t.Context(), pgCfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := inst.Stop(context.Background()); err != nil {
				t.Errorf("stop: %v", err)
			}
		})
		printed := runUpUntilServing(t, o)
		if !strings.Contains(printed, "except Postgres, which was running before") {
			t.Errorf("the stack does not say it leaves the running Postgres alone:\n%s", printed)
		}
		if !connects(t, pgCfg) {
			t.Fatal("the stack stopped a Postgres it had not started")
		}
	})
}

// A second make dev, or anything else on the stack's ports, is refused at
// once with the flag to change, before any Postgres or NATS is started.
func TestUpRefusesATakenPort(t *testing.T) {
	for _, flag := range []string{"-edge-addr", "-edge-metrics-addr", "-ops-addr", "-nats-port"} {
		t.Run(flag, func(t *testing.T) {
			taken, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer taken.Close()
			dir := t.TempDir()
			o := UpOptions{Dir: dir, PGPort: testdb.FreePort(t), NATSPort: testdb.FreePort(t), EdgeAddr: "127.0.0.1:0",
				OpsAddr: "127.0.0.1:0", Replicas: 1, Getenv: func(string) string { return "" }}
			switch flag {
			case "-edge-addr":
				o.EdgeAddr = taken.Addr().String()
			case "-edge-metrics-addr":
				o.EdgeMetricsAddr = taken.Addr().String()
			case "-ops-addr":
				o.OpsAddr = taken.Addr().String()
			case "-nats-port":
				o.NATSPort = taken.Addr().(*net.TCPAddr).Port
			}
			start := time.Now()
			err = Up(t.Context(), o, io.Discard, slog.New(slog.DiscardHandler))
			if err == nil || !strings.Contains(err.Error(), flag) || !strings.Contains(err.Error(), taken.Addr().String()) {
				t.Fatalf("Up with %s taken: %v, want an error naming %s and the address", flag, err, flag)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("the refusal took %v", d)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("Up refused but created %d entries in its state folder first", len(entries))
			}
		})
	}
}

// A Postgres port held by another server (here a program that is not
// Postgres at all) is refused before anything else starts, naming the port
// and how to choose another.
func TestUpRefusesATakenPostgresPort(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping a test that needs the Postgres binaries")
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	go func() {
		for {
			c, err := taken.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := taken.Addr().(*net.TCPAddr).Port
	o := UpOptions{Dir: filepath.Join(testdb.ServerDir(t), "data"), PGPort: port, NATSPort: testdb.FreePort(t),
		EdgeAddr: "127.0.0.1:0", OpsAddr: "127.0.0.1:0", Replicas: 1, Getenv: func(string) string { return "" }}
	err = Up(t.Context(), o, io.Discard, slog.New(slog.DiscardHandler))
	if !errors.Is(err, localpg.ErrPortInUse) {
		t.Fatalf("Up with the Postgres port taken: %v, want localpg.ErrPortInUse", err)
	}
	for _, want := range []string{fmt.Sprintf("port %d", port), fmt.Sprintf("make dev PG_PORT=%d", port+1), "-pg-port"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Up with the Postgres port taken: %v; want an error saying %q", err, want)
		}
	}
	if _, statErr := os.Stat(filepath.Join(o.Dir, "pg", "data", "PG_VERSION")); statErr == nil {
		t.Error("Up initialised a cluster it could never start")
	}
	if _, statErr := os.Stat(filepath.Join(o.Dir, "stack")); statErr == nil {
		t.Error("Up went on to set up the stack after Postgres was refused")
	}
}

// Two of the stack's listeners given the same address are refused at once,
// naming both flags: the second would fail only once the rest had started.
func TestUpRefusesTheSameAddressTwice(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", testdb.FreePort(t))
	o := UpOptions{Dir: t.TempDir(), PGPort: testdb.FreePort(t), NATSPort: testdb.FreePort(t), EdgeAddr: addr,
		EdgeMetricsAddr: addr, OpsAddr: "127.0.0.1:0", Replicas: 1, Getenv: func(string) string { return "" }}
	err := Up(t.Context(), o, io.Discard, slog.New(slog.DiscardHandler))
	for _, want := range []string{"-edge-addr", "-edge-metrics-addr", addr} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Up with -edge-addr and -edge-metrics-addr both %s: %v; want an error naming %q", addr, err, want)
		}
	}
	if entries, _ := os.ReadDir(o.Dir); len(entries) != 0 {
		t.Errorf("Up refused but created %d entries in its state folder first", len(entries))
	}
}

// runUpUntilServing runs Up until it prints that the stack is up, then
// cancels it as Ctrl-C does, and returns what it printed.
func runUpUntilServing(t *testing.T, o UpOptions) string {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out := &signalBuffer{up: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- Up(ctx, o, out, slog.New(slog.DiscardHandler)) }()
	select {
	case <-out.up:
	case err := <-done:
		t.Fatalf("Up returned before the stack was up: %v\n%s", err, out.String())
	case <-time.After(3 * time.Minute):
		t.Fatalf("the stack did not come up in 3 minutes:\n%s", out.String())
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Up after Ctrl-C: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("Up did not return within 2 minutes of Ctrl-C")
	}
	return out.String()
}

// connects reports whether the cluster of cfg accepts the admin's connection.
func connects(t *testing.T, cfg localpg.Config) bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cfg.Dir, "admin-url"))
	if err != nil {
		t.Fatalf("the admin URL file: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, strings.TrimSpace(string(b)))
	if err != nil {
		return false
	}
	conn.Close(ctx)
	return true
}

// signalBuffer keeps what Up prints and closes up once it says the stack is up.
type signalBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	up   chan struct{}
	once sync.Once
}

func (b *signalBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if strings.Contains(b.buf.String(), "The development stack is up.") {
		b.once.Do(func() { close(b.up) })
	}
	return len(p), nil
}

func (b *signalBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// The replicas make dev runs connect to tenant databases without trying
// TLS (its cluster serves none), as the README says, unless
// BRAIN_DB_SSLMODE asks for something else; the stack's own NATS, creds,
// registry and sealing key replace the environment's.
func TestWithStackKeepsTheStacksTLSSetting(t *testing.T) {
	own := brain.Config{NATSURL: "nats://127.0.0.1:1", CredsFile: "/s/brain.creds", RegistryURL: "postgres://r@x/reg",
		SealingKey: []byte("k"), Replica: "dev-1", DBSSLMode: "disable"}
	if got := withStack(brain.Config{TenantWorkers: 7}, own); got.DBSSLMode != "disable" || got.TenantWorkers != 7 ||
		got.NATSURL != own.NATSURL || got.CredsFile != own.CredsFile || got.RegistryURL != own.RegistryURL || got.Replica != "dev-1" {
		t.Errorf("BRAIN_DB_SSLMODE unset: %+v", got)
	}
	if got := withStack(brain.Config{DBSSLMode: "require"}, own); got.DBSSLMode != "require" {
		t.Errorf("BRAIN_DB_SSLMODE=require became %q", got.DBSSLMode)
	}
}
