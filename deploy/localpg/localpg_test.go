package localpg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestEnsure runs its own cluster in a temporary folder on a free port, so it
// never touches the shared one `make test` uses.
func TestEnsure(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping a test that initialises a Postgres cluster")
	}
	root := reachableDir(t)
	cfg := Config{Dir: filepath.Join(root, "pg"), Port: freePort(t)}
	ctx := t.Context()

	inst, err := Ensure(ctx, cfg)
	if err != nil {
		t.Fatalf("first Ensure: %v", err)
	}
	t.Cleanup(func() {
		if err := inst.Stop(context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	checkConnects(t, inst)
	if !inst.Started {
		t.Error("the first Ensure started the server but says it did not")
	}
	pid := postmasterPID(t, inst)

	t.Run("ReusesARunningCluster", func(t *testing.T) {
		again, err := Ensure(ctx, cfg)
		if err != nil {
			t.Fatalf("second Ensure: %v", err)
		}
		if again.AdminPassword != inst.AdminPassword {
			t.Errorf("second Ensure changed the admin password")
		}
		if again.Started {
			t.Error("the second Ensure reused the running server but says it started it")
		}
		if got := postmasterPID(t, again); got != pid {
			t.Errorf("postmaster pid %d after the second Ensure, want the running %d", got, pid)
		}
		b, err := os.ReadFile(again.AdminURLFile())
		if err != nil || strings.TrimSpace(string(b)) != again.AdminURL() {
			t.Errorf("%s holds %q (%v), want the admin URL", again.AdminURLFile(), b, err)
		}
	})

	t.Run("RefusesAPortServedByAnotherCluster", func(t *testing.T) {
		// Another folder's cluster on the same port: the running one refuses
		// its admin login. Ensure says so before an initdb, not after a
		// start that cannot bind.
		other := filepath.Join(root, "other")
		_, err := Ensure(ctx, Config{Dir: other, Port: cfg.Port})
		wantPortRefused(t, err, cfg.Port, other)
	})

	t.Run("RefusesAPortServedByAnotherClusterThatLetsItIn", func(t *testing.T) {
		// The same admin password in another folder: the login succeeds,
		// and the running server's data directory says it is not this one.
		other := filepath.Join(root, "same-password")
		if err := os.MkdirAll(other, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(other, passwordFile), []byte(inst.AdminPassword+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Ensure(ctx, Config{Dir: other, Port: cfg.Port})
		if _, ok := errors.AsType[*foreignClusterError](err); !ok || !errors.Is(err, ErrPortInUse) {
			t.Fatalf("Ensure on a port another cluster serves and lets it in: %v, want the other cluster named and ErrPortInUse", err)
		}
		if !strings.Contains(err.Error(), inst.srv.data()) {
			t.Errorf("error %q does not name the other cluster's data directory %s", err, inst.srv.data())
		}
	})

	t.Run("RestartsAfterACrash", func(t *testing.T) {
		pid := postmasterPID(t, inst)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitGone(t, pid)
		again, err := Ensure(ctx, cfg)
		if err != nil {
			t.Fatalf("Ensure after SIGKILL: %v", err)
		}
		if !again.Started {
			t.Error("Ensure after SIGKILL started the server but says it did not")
		}
		checkConnects(t, again)
	})

	t.Run("IgnoresAStalePidFileOfAnotherProcess", func(t *testing.T) {
		if err := inst.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		// A live process of the server's user holds the old pid, as after a
		// container restart: pg_ctl and postgres would take it for a server.
		sleeper := exec.Command("sleep", "60")
		if inst.srv.user != nil {
			sleeper.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: inst.srv.user.uid, Gid: inst.srv.user.gid}}
		}
		if err := sleeper.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
		pidFile := fmt.Sprintf("%d\n%s\n%d\n%d\n%s\n127.0.0.1\n  1234   5678\nready   \n",
			sleeper.Process.Pid, inst.srv.data(), time.Now().Unix(), cfg.Port, filepath.Join(inst.Dir, socketDir))
		pidPath := filepath.Join(inst.srv.data(), "postmaster.pid")
		if err := os.WriteFile(pidPath, []byte(pidFile), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := inst.srv.chown(pidPath); err != nil {
			t.Fatal(err)
		}
		again, err := Ensure(ctx, cfg)
		if err != nil {
			t.Fatalf("Ensure with a stale postmaster.pid: %v", err)
		}
		checkConnects(t, again)
	})

	t.Run("StopIsIdempotent", func(t *testing.T) {
		if err := inst.Stop(ctx); err != nil {
			t.Fatalf("stop: %v", err)
		}
		if err := inst.Stop(ctx); err != nil {
			t.Fatalf("stop a stopped cluster: %v", err)
		}
		if _, err := Ensure(ctx, cfg); err != nil {
			t.Fatalf("Ensure after Stop: %v", err)
		}
	})
}

// A port another program listens on (not Postgres) is refused at once, with
// the port named, and nothing is initialised.
func TestEnsureRefusesAPortHeldByAnotherProgram(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping a test that needs the Postgres binaries")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	dir := filepath.Join(reachableDir(t), "pg")
	_, err = Ensure(t.Context(), Config{Dir: dir, Port: port})
	wantPortRefused(t, err, port, dir)
}

// wantPortRefused checks that Ensure of the cluster in dir refused port
// with ErrPortInUse, naming the port, before initialising anything.
func wantPortRefused(t *testing.T, err error, port int, dir string) {
	t.Helper()
	if !errors.Is(err, ErrPortInUse) {
		t.Fatalf("Ensure on a port something else holds: %v, want ErrPortInUse", err)
	}
	if want := fmt.Sprintf("port %d", port); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name %s", err, want)
	}
	if _, statErr := os.Stat(filepath.Join(dir, dataDir, "PG_VERSION")); statErr == nil {
		t.Error("Ensure initialised a cluster it could never start")
	}
}

// reachableDir is a temporary folder the server's OS user can reach (the
// test's own t.TempDir sits in a folder only we may enter), removed after
// the test: testdb.ServerDir, which these tests cannot call (testdb
// imports this package).
func reachableDir(t *testing.T) string {
	t.Helper()
	root, err := os.MkdirTemp("", "localpg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestFindBinDirNamesWhatToInstall(t *testing.T) {
	_, err := findBinDir(filepath.Join(t.TempDir(), "nothing"), "")
	if err == nil || !strings.Contains(err.Error(), "Config.BinDir") {
		t.Fatalf("findBinDir with a missing BinDir: %v", err)
	}
}

func TestWriteSettingsReplacesItsBlock(t *testing.T) {
	dir := t.TempDir()
	s := server{dir: dir, port: 1111}
	if err := os.MkdirAll(s.data(), 0o700); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(s.data(), "postgresql.conf")
	if err := os.WriteFile(conf, []byte("max_wal_size = 1GB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.writeSettings(); err != nil {
		t.Fatal(err)
	}
	s.port = 2222
	if err := s.writeSettings(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(conf)
	got := string(b)
	if strings.Count(got, settingsBegin) != 1 || strings.Contains(got, "port = 1111") || !strings.Contains(got, "port = 2222") ||
		!strings.HasPrefix(got, "max_wal_size = 1GB\n") {
		t.Fatalf("postgresql.conf after two writes:\n%s", got)
	}
}

func checkConnects(t *testing.T, inst *Instance) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), inst.AdminURL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	var fsync string
	if err := conn.QueryRow(t.Context(), `SHOW fsync`).Scan(&fsync); err != nil || fsync != "on" {
		t.Fatalf("fsync = %q (%v), want on", fsync, err)
	}
}

func postmasterPID(t *testing.T, inst *Instance) int {
	t.Helper()
	pid, _ := readPidFile(filepath.Join(inst.srv.data(), "postmaster.pid"))
	if pid == 0 {
		t.Fatal("no postmaster.pid")
	}
	return pid
}

// waitGone waits until the killed postmaster is dead (gone or a zombie).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for isPostgres(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("postmaster %d still alive after SIGKILL", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// The operator's libpq variables are dropped, and with them the failures
// they cause in connections to the dev stack's own cluster. Not parallel:
// it sets them.
func TestIgnoreLibpqEnv(t *testing.T) {
	t.Setenv("PGSSLROOTCERT", "/nonexistent/root.crt")
	t.Setenv("PGSERVICE", "no-such-service")
	t.Setenv("PGTZ", "")
	const admin = "postgres://brain_admin:pw@127.0.0.1:55432/postgres?sslmode=disable"
	if _, err := pgx.ParseConfig(admin); err == nil {
		t.Fatal("the variables break nothing here, so this test proves nothing")
	}
	got := IgnoreLibpqEnv()
	if want := []string{"PGSSLROOTCERT", "PGSERVICE", "PGTZ"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("IgnoreLibpqEnv() = %v, want %v (in LibpqEnv's order)", got, want)
	}
	for _, k := range LibpqEnv {
		if v, ok := os.LookupEnv(k); ok {
			t.Errorf("%s is still set (%q)", k, v)
		}
	}
	if _, err := pgx.ParseConfig(admin); err != nil {
		t.Errorf("the admin URL after IgnoreLibpqEnv: %v", err)
	}
}
