package localpg

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	// DefaultPort is the port the local cluster listens on unless told
	// otherwise; far from 5432 so it never meets a system cluster.
	DefaultPort = 55432
	// AdminUser is the bootstrap superuser initdb creates.
	AdminUser = "brain_admin"

	// Files and folders inside Config.Dir.
	dataDir      = "data"
	socketDir    = "run"
	logFile      = "postgres.log"
	passwordFile = "admin-password"
	urlFile      = "admin-url"
	lockFile     = "ensure.lock"

	readyTimeout = 30 * time.Second
	lockTimeout  = 2 * time.Minute
)

// Config says where the cluster lives. The zero value of every field but Dir
// means its default.
type Config struct {
	// Dir is the data folder root (".data/pg"). It holds data/, run/ (the
	// socket folder), postgres.log, admin-password and admin-url.
	Dir string
	// Port is the TCP port on 127.0.0.1; default DefaultPort.
	Port int
	// BinDir holds initdb, pg_ctl and postgres. Empty: $PG_BIN, then
	// `pg_config --bindir`, then the newest /usr/lib/postgresql/*/bin.
	BinDir string
	// Logger may be nil.
	Logger *slog.Logger
}

// Instance is a running local cluster.
type Instance struct {
	Dir           string // absolute data folder root
	Port          int
	AdminUser     string
	AdminPassword string
	// Started is true when this Ensure started the server, false when it
	// was running already (another process started it and may still use it).
	Started bool

	srv server
}

// AdminURL is the bootstrap superuser's URL, for the ops tooling and tests.
func (i *Instance) AdminURL() string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(i.AdminUser, i.AdminPassword),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(i.Port)),
		Path:     "/postgres",
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// AdminURLFile is where Ensure writes AdminURL (0600), for scripts such as
// the Makefile that need the URL without linking this package.
func (i *Instance) AdminURLFile() string { return filepath.Join(i.Dir, urlFile) }

// Ensure makes the cluster in cfg.Dir run: it initialises the folder when it
// is empty, starts the server unless it already runs, and waits until it
// accepts connections. Calling it again while the cluster runs reuses it.
func Ensure(ctx context.Context, cfg Config) (*Instance, error) {
	if cfg.Dir == "" {
		return nil, errors.New("localpg: Config.Dir is required")
	}
	if cfg.Port == 0 {
		cfg.Port = DefaultPort
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("localpg: data folder: %w", err)
	}
	bin, err := findBinDir(cfg.BinDir, os.Getenv("PG_BIN"))
	if err != nil {
		return nil, err
	}
	osUser, err := serverUser()
	if err != nil {
		return nil, err
	}
	// A unix socket path is limited to 107 bytes; say so before postgres
	// fails with a less obvious message.
	if sock := filepath.Join(dir, socketDir, ".s.PGSQL."+strconv.Itoa(cfg.Port)); len(sock) > 107 {
		return nil, fmt.Errorf("localpg: socket path %s is longer than 107 bytes: use a shorter data folder", sock)
	}
	srv := server{dir: dir, port: cfg.Port, bin: bin, user: osUser, log: log}
	if err := srv.prepareDir(); err != nil {
		return nil, err
	}
	unlock, err := lockDir(ctx, filepath.Join(dir, lockFile))
	if err != nil {
		return nil, err
	}
	defer unlock()

	pw, err := srv.adminPassword()
	if err != nil {
		return nil, err
	}
	inst := &Instance{Dir: dir, Port: cfg.Port, AdminUser: AdminUser, AdminPassword: pw, srv: srv}

	probeErr := inst.probe(ctx)
	switch {
	case probeErr == nil:
		log.Info("postgres already running", "dir", dir, "port", cfg.Port)
		return inst, inst.writeURLFile()
	case errors.Is(probeErr, ErrPortInUse):
		return nil, fmt.Errorf("localpg: %w", probeErr)
	}
	// When this folder's cluster does not run and something else holds the
	// port, its server could never start there: say so now, not after an
	// initdb and a failed start.
	if running, err := srv.running(ctx); err == nil && !running && portTaken(cfg.Port) {
		return nil, fmt.Errorf("localpg: port %d on 127.0.0.1 is taken by a server that is not the cluster in %s "+
			"(connecting to it as this cluster's admin: %v): %w", cfg.Port, dir, probeErr, ErrPortInUse)
	}
	if !srv.initialised() {
		if err := srv.initdb(ctx, pw); err != nil {
			return nil, err
		}
		log.Info("postgres cluster initialised", "dir", dir)
	}
	if err := srv.start(ctx); err != nil {
		return nil, err
	}
	if err := inst.waitReady(ctx); err != nil {
		return nil, err
	}
	log.Info("postgres running", "dir", dir, "port", cfg.Port)
	inst.Started = true
	return inst, inst.writeURLFile()
}

// Stop shuts the cluster down (fast mode: open sessions are disconnected).
// Stopping a cluster that does not run is not an error.
func (i *Instance) Stop(ctx context.Context) error {
	running, err := i.srv.running(ctx)
	if err != nil || !running {
		return err
	}
	if out, err := i.srv.run(ctx, "pg_ctl", "-D", i.srv.data(), "-m", "fast", "-w", "-t", "60", "stop"); err != nil {
		return fmt.Errorf("localpg: pg_ctl stop: %w: %s", err, bytes.TrimSpace(out))
	}
	i.srv.log.Info("postgres stopped", "dir", i.Dir)
	return nil
}

func (i *Instance) writeURLFile() error {
	if err := writeFileAtomic(i.AdminURLFile(), []byte(i.AdminURL()+"\n"), 0o600); err != nil {
		return fmt.Errorf("localpg: write %s: %w", urlFile, err)
	}
	return nil
}

// probe connects once and checks that the server on the port is this
// folder's cluster, not another one.
func (i *Instance) probe(ctx context.Context) error {
	cc, err := pgx.ParseConfig(i.AdminURL())
	if err != nil {
		return err
	}
	cc.ConnectTimeout = 2 * time.Second
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var got string
	if err := conn.QueryRow(ctx, `SHOW data_directory`).Scan(&got); err != nil {
		return err
	}
	if !samePath(got, i.srv.data()) {
		return &foreignClusterError{port: i.Port, dataDir: got}
	}
	return nil
}

// ErrPortInUse is the error of Ensure when the port is served by another
// cluster or held by another program: stop it, or choose another port.
var ErrPortInUse = errors.New("stop that server or choose another port")

type foreignClusterError struct {
	port    int
	dataDir string
}

func (e *foreignClusterError) Error() string {
	return fmt.Sprintf("port %d is served by another cluster (data directory %s): %v", e.port, e.dataDir, ErrPortInUse)
}

func (e *foreignClusterError) Is(target error) bool { return target == ErrPortInUse }

// portTaken says whether something already listens on port of 127.0.0.1,
// where the cluster listens.
func portTaken(port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return errors.Is(err, syscall.EADDRINUSE)
	}
	ln.Close()
	return false
}

// waitReady polls with backoff until the server accepts connections, for at
// most readyTimeout. Only "not up yet" errors are retried.
func (i *Instance) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(readyTimeout)
	wait := 25 * time.Millisecond
	for {
		err := i.probe(ctx)
		if err == nil {
			return nil
		}
		if !retryable(err) || time.Now().After(deadline) {
			return fmt.Errorf("localpg: postgres in %s does not accept connections on port %d: %w%s",
				i.Dir, i.Port, err, i.srv.logTail())
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}

func retryable(err error) bool {
	if _, ok := errors.AsType[*foreignClusterError](err); ok {
		return false
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		// cannot_connect_now: starting up, in recovery or shutting down.
		return pgErr.Code == "57P03"
	}
	return true
}

// server runs the cluster's programs as the OS user that owns it.
type server struct {
	dir  string
	port int
	bin  string
	user *osUser // nil: the current user
	log  *slog.Logger
}

// osUser is the unprivileged account postgres runs as when we are root
// (postgres refuses to run as root).
type osUser struct {
	name     string
	uid, gid uint32
	home     string
}

func serverUser() (*osUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		u, err = user.Lookup("nobody")
		if err != nil {
			return nil, errors.New("localpg: running as root, and neither a postgres nor a nobody OS user exists to run the server as")
		}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("localpg: OS user %s has a non-numeric uid or gid", u.Username)
	}
	return &osUser{name: u.Username, uid: uint32(uid), gid: uint32(gid), home: u.HomeDir}, nil
}

func (s server) data() string { return filepath.Join(s.dir, dataDir) }

func (s server) initialised() bool {
	_, err := os.Stat(filepath.Join(s.data(), "PG_VERSION"))
	return err == nil
}

// prepareDir creates the folder, 0700 and owned by the server's OS user, and
// checks that user can reach it.
func (s server) prepareDir() error {
	if err := os.MkdirAll(filepath.Dir(s.dir), 0o755); err != nil {
		return fmt.Errorf("localpg: create %s: %w", filepath.Dir(s.dir), err)
	}
	if err := os.Mkdir(s.dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("localpg: create %s: %w", s.dir, err)
	}
	if err := os.Chmod(s.dir, 0o700); err != nil {
		return fmt.Errorf("localpg: chmod %s: %w", s.dir, err)
	}
	if err := s.mkdirOwned(filepath.Join(s.dir, socketDir)); err != nil {
		return err
	}
	if s.user == nil {
		return nil
	}
	for p := filepath.Dir(s.dir); ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("localpg: %w", err)
		}
		if !s.user.canTraverse(st) {
			return fmt.Errorf("localpg: OS user %s, which runs postgres, cannot reach %s: folder %s has mode %v "+
				"(chmod o+x it, or put the data folder elsewhere)", s.user.name, s.dir, p, st.Mode().Perm())
		}
		if p == filepath.Dir(p) {
			break
		}
	}
	st, err := os.Stat(s.dir)
	if err != nil {
		return fmt.Errorf("localpg: %w", err)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Uid == s.user.uid {
		return nil
	}
	// The folder is not the server user's yet (first run, or made by hand):
	// hand over the tree, except the files that belong to the invoker.
	return filepath.WalkDir(s.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n := filepath.Base(p); p != s.dir && (n == passwordFile || n == urlFile || n == lockFile) {
			return nil
		}
		if err := os.Lchown(p, int(s.user.uid), int(s.user.gid)); err != nil {
			return fmt.Errorf("localpg: chown %s: %w", p, err)
		}
		return nil
	})
}

func (u *osUser) canTraverse(st fs.FileInfo) bool {
	m := st.Mode().Perm()
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return m&0o001 != 0
	}
	switch {
	case sys.Uid == u.uid:
		return m&0o100 != 0
	case sys.Gid == u.gid:
		return m&0o010 != 0
	default:
		return m&0o001 != 0
	}
}

func (s server) mkdirOwned(p string) error {
	if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("localpg: create %s: %w", p, err)
	}
	return s.chown(p)
}

func (s server) chown(p string) error {
	if s.user == nil {
		return nil
	}
	if err := os.Chown(p, int(s.user.uid), int(s.user.gid)); err != nil {
		return fmt.Errorf("localpg: chown %s: %w", p, err)
	}
	return nil
}

// adminPassword reads the stored bootstrap password, or creates one for a
// cluster that has not been initialised yet.
func (s server) adminPassword() (string, error) {
	p := filepath.Join(s.dir, passwordFile)
	b, err := os.ReadFile(p)
	if err == nil {
		pw := strings.TrimSpace(string(b))
		if pw == "" {
			return "", fmt.Errorf("localpg: %s is empty", p)
		}
		return pw, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("localpg: read admin password: %w", err)
	}
	if s.initialised() {
		return "", fmt.Errorf("localpg: the cluster in %s has no %s file: stop it and remove the folder to start afresh",
			s.dir, passwordFile)
	}
	pw := randomPassword()
	if err := writeFileAtomic(p, []byte(pw+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("localpg: write admin password: %w", err)
	}
	return pw, nil
}

func randomPassword() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

const (
	settingsBegin = "# BEGIN n8nbrain localpg: written by deploy/localpg, edits inside this block are overwritten"
	settingsEnd   = "# END n8nbrain localpg"
)

func (s server) initdb(ctx context.Context, pw string) error {
	data := s.data()
	// A data folder without PG_VERSION is what an interrupted initdb leaves.
	if err := os.RemoveAll(data); err != nil {
		return fmt.Errorf("localpg: remove incomplete %s: %w", data, err)
	}
	// initdb reads the password from a file the server's OS user can read.
	pwFile := filepath.Join(s.dir, ".initdb-password")
	if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
		return fmt.Errorf("localpg: write initdb password file: %w", err)
	}
	defer os.Remove(pwFile)
	if err := s.chown(pwFile); err != nil {
		return err
	}
	out, err := s.run(ctx, "initdb", "-D", data, "-U", AdminUser, "--auth=scram-sha-256", "--pwfile="+pwFile,
		"-E", "UTF8", "--locale=C")
	if err != nil {
		return fmt.Errorf("localpg: initdb: %w: %s", err, bytes.TrimSpace(out))
	}
	// Loopback TCP must ask for the password with SCRAM; initdb's
	// --auth=scram-sha-256 writes that line, and we rely on it.
	hba, err := os.ReadFile(filepath.Join(data, "pg_hba.conf"))
	if err != nil {
		return fmt.Errorf("localpg: read pg_hba.conf: %w", err)
	}
	if !hbaHasScramLoopback(hba) {
		return fmt.Errorf("localpg: pg_hba.conf written by initdb has no `host all all 127.0.0.1/32 scram-sha-256` line")
	}
	return nil
}

func hbaHasScramLoopback(hba []byte) bool {
	for line := range strings.Lines(string(hba)) {
		f := strings.Fields(line)
		if slices.Equal(f, []string{"host", "all", "all", "127.0.0.1/32", "scram-sha-256"}) {
			return true
		}
	}
	return false
}

// writeSettings puts our settings at the end of postgresql.conf (later lines
// win), replacing the block a previous run wrote.
func (s server) writeSettings() error {
	p := filepath.Join(s.data(), "postgresql.conf")
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("localpg: read postgresql.conf: %w", err)
	}
	conf := string(b)
	if i := strings.Index(conf, settingsBegin); i >= 0 {
		if j := strings.Index(conf[i:], settingsEnd); j >= 0 {
			conf = conf[:i] + strings.TrimPrefix(conf[i+j+len(settingsEnd):], "\n")
		}
	}
	if !strings.HasSuffix(conf, "\n") {
		conf += "\n"
	}
	block := strings.Join([]string{
		settingsBegin,
		"listen_addresses = '127.0.0.1'",
		"port = " + strconv.Itoa(s.port),
		"unix_socket_directories = " + confString(filepath.Join(s.dir, socketDir)),
		"max_connections = 400",
		"shared_buffers = 128MB",
		// Benchmarks measure real commits: keep durability on.
		"fsync = on",
		"synchronous_commit = on",
		settingsEnd,
	}, "\n") + "\n"
	if conf+block == string(b) {
		return nil
	}
	// WriteFile keeps the file's owner (the server's OS user).
	if err := os.WriteFile(p, []byte(conf+block), 0o600); err != nil {
		return fmt.Errorf("localpg: write postgresql.conf: %w", err)
	}
	return nil
}

func confString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// running asks pg_ctl whether the postmaster named in postmaster.pid is alive.
func (s server) running(ctx context.Context) (bool, error) {
	out, err := s.run(ctx, "pg_ctl", "-D", s.data(), "status")
	if err == nil {
		return true, nil
	}
	// 3: no server running; 4: no accessible data directory.
	if ee, ok := errors.AsType[*exec.ExitError](err); ok && (ee.ExitCode() == 3 || ee.ExitCode() == 4) {
		return false, nil
	}
	return false, fmt.Errorf("localpg: pg_ctl status: %w: %s", err, bytes.TrimSpace(out))
}

func (s server) start(ctx context.Context) error {
	running, err := s.running(ctx)
	if err != nil {
		return err
	}
	pidPath := filepath.Join(s.data(), "postmaster.pid")
	if running {
		pid, port := readPidFile(pidPath)
		switch {
		case pid > 0 && !isPostgres(pid):
			// After a crash or a container restart the old postmaster's pid
			// can belong to an unrelated process of the same user; both
			// pg_ctl and postgres would then take the cluster for running.
			s.log.Warn("removing stale postmaster.pid", "dir", s.dir, "pid", pid)
			if err := os.Remove(pidPath); err != nil {
				return fmt.Errorf("localpg: remove stale postmaster.pid: %w", err)
			}
			running = false
		case port != 0 && port != s.port:
			return fmt.Errorf("localpg: the cluster in %s runs on port %d, not %d: stop it first", s.dir, port, s.port)
		}
	}
	if running {
		return nil // starting up or recovering; waitReady waits for it
	}
	if err := s.removeStaleSocketLocks(); err != nil {
		return err
	}
	if err := s.writeSettings(); err != nil {
		return err
	}
	out, err := s.run(ctx, "pg_ctl", "-D", s.data(), "-l", filepath.Join(s.dir, logFile), "-w", "-t", "60", "start")
	if err != nil {
		return fmt.Errorf("localpg: pg_ctl start: %w: %s%s", err, bytes.TrimSpace(out), s.logTail())
	}
	return nil
}

// removeStaleSocketLocks removes socket lock files (run/.s.PGSQL.<port>.lock)
// a dead postmaster left: postgres refuses to start while the pid they name
// looks alive, which a zombie or a reused pid does.
func (s server) removeStaleSocketLocks() error {
	locks, _ := filepath.Glob(filepath.Join(s.dir, socketDir, ".s.PGSQL.*.lock"))
	for _, l := range locks {
		if pid, _ := readPidFile(l); pid > 0 && isPostgres(pid) {
			continue
		}
		s.log.Warn("removing stale socket lock file", "file", l)
		if err := os.Remove(l); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("localpg: remove stale %s: %w", l, err)
		}
	}
	return nil
}

// readPidFile returns the pid (line 1) and port (line 4) of postmaster.pid.
func readPidFile(p string) (pid, port int) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, 0
	}
	lines := strings.Split(string(b), "\n")
	pid, _ = strconv.Atoi(strings.TrimSpace(lines[0]))
	if len(lines) > 3 {
		port, _ = strconv.Atoi(strings.TrimSpace(lines[3]))
	}
	return pid, port
}

// isPostgres reports whether pid is a live postgres process. A zombie is
// not: where PID 1 does not reap, a crashed postmaster stays one, and kill(pid,
// 0) still succeeds for it. Without /proc it cannot tell and says yes,
// leaving the decision to postgres.
func isPostgres(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat("/proc/self/stat"); err == nil {
			return false // /proc works and the process is gone
		}
		return true
	}
	if err != nil {
		return true
	}
	// "pid (comm) state ...": comm may hold spaces and parentheses.
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open || end+2 >= len(b) {
		return true
	}
	comm, state := string(b[open+1:end]), b[end+2]
	if state == 'Z' || state == 'X' {
		return false
	}
	return comm == "postgres" || comm == "postmaster"
}

// logTail returns the end of postgres.log for error messages.
func (s server) logTail() string {
	f, err := os.Open(filepath.Join(s.dir, logFile))
	if err != nil {
		return ""
	}
	defer f.Close()
	const max = 2000
	if st, err := f.Stat(); err == nil && st.Size() > max {
		if _, err := f.Seek(-max, io.SeekEnd); err != nil {
			return ""
		}
	}
	b, _ := io.ReadAll(f)
	if len(bytes.TrimSpace(b)) == 0 {
		return ""
	}
	return "\n--- end of " + filepath.Join(s.dir, logFile) + " ---\n" + string(bytes.TrimSpace(b))
}

// run runs one of the server programs as the server's OS user, in the data
// folder root, without the caller's PG* variables (PGDATA, PGPORT, ...).
func (s server) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "PG") })
	if s.user != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: s.user.uid, Gid: s.user.gid}}
		env = slices.DeleteFunc(env, func(kv string) bool {
			return strings.HasPrefix(kv, "HOME=") || strings.HasPrefix(kv, "USER=") || strings.HasPrefix(kv, "LOGNAME=")
		})
		env = append(env, "HOME="+s.user.home, "USER="+s.user.name, "LOGNAME="+s.user.name)
	}
	cmd.Env = env
	return cmd.CombinedOutput()
}

func findBinDir(explicit, env string) (string, error) {
	hasInitdb := func(dir string) bool {
		st, err := os.Stat(filepath.Join(dir, "initdb"))
		return err == nil && !st.IsDir()
	}
	for _, c := range []struct{ dir, from string }{{explicit, "Config.BinDir"}, {env, "PG_BIN"}} {
		if c.dir == "" {
			continue
		}
		if !hasInitdb(c.dir) {
			return "", fmt.Errorf("localpg: %s=%s has no initdb", c.from, c.dir)
		}
		return c.dir, nil
	}
	if pgConfig, err := exec.LookPath("pg_config"); err == nil {
		if out, err := exec.Command(pgConfig, "--bindir").Output(); err == nil {
			if dir := strings.TrimSpace(string(out)); hasInitdb(dir) {
				return dir, nil
			}
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(d string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(d)), 64)
		return v
	}
	slices.SortFunc(dirs, func(a, b string) int {
		switch va, vb := version(a), version(b); {
		case va > vb:
			return -1
		case va < vb:
			return 1
		}
		return 0
	})
	for _, d := range dirs {
		if hasInitdb(d) {
			return d, nil
		}
	}
	return "", errors.New("localpg: no Postgres server binaries found (looked for initdb in $PG_BIN, " +
		"`pg_config --bindir` and /usr/lib/postgresql/*/bin): install them with `apt-get install -y postgresql` " +
		"or set PG_BIN to the folder holding initdb")
}

// lockDir serialises Ensure calls on one folder across processes (parallel
// test binaries of one `make test`).
func lockDir(ctx context.Context, p string) (unlock func(), err error) {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("localpg: open lock file: %w", err)
	}
	deadline := time.Now().Add(lockTimeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("localpg: lock %s: %w", p, err)
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			f.Close()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

func writeFileAtomic(p string, b []byte, perm fs.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), p)
}

func samePath(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	ra, err1 := filepath.EvalSymlinks(a)
	rb, err2 := filepath.EvalSymlinks(b)
	return err1 == nil && err2 == nil && ra == rb
}

// Crash stops the cluster as a crash would (pg_ctl's immediate mode: no
// checkpoint, every process quits at once, and the next start replays the
// WAL). For tests of what survives a database crash; Ensure starts the
// cluster again.
func (i *Instance) Crash(ctx context.Context) error {
	if out, err := i.srv.run(ctx, "pg_ctl", "-D", i.srv.data(), "-m", "immediate", "-w", "-t", "60", "stop"); err != nil {
		return fmt.Errorf("localpg: pg_ctl stop -m immediate: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// PostmasterPID is the pid postmaster.pid names (0 when there is none), for
// tests that kill the server outright.
func (i *Instance) PostmasterPID() int {
	pid, _ := readPidFile(filepath.Join(i.srv.data(), "postmaster.pid"))
	return pid
}
