package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/interp"
	"mvdan.cc/sh/v3/syntax"

	"n8nbrain/brain"
	"n8nbrain/edge"
	"n8nbrain/internal/testdb"
	"n8nbrain/provision"
	"n8nbrain/provision/admin"
)

// A block of deploy/README.md: its kind (shell, nsc, manual), the name of
// an nsc block, where it starts, and its code.
type runbookBlock struct {
	kind, name string
	line       int
	code       string
}

var markerRe = regexp.MustCompile(`^<!-- runbook: (shell|nsc|manual)(?: ([a-z0-9-]+))? -->$`)

// runbookBlocks extracts the runbook's shell blocks. Every one must carry a
// marker saying how it is tested, so none is skipped silently.
func runbookBlocks(t *testing.T) []runbookBlock {
	t.Helper()
	f, err := os.Open("README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var blocks []runbookBlock
	var pending *runbookBlock
	var cur *runbookBlock
	var code strings.Builder
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur != nil && line == "```":
			cur.code = code.String()
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			code.WriteString(line + "\n")
		case strings.HasPrefix(line, "<!-- runbook:"):
			m := markerRe.FindStringSubmatch(line)
			if m == nil || (m[1] == "nsc") != (m[2] != "") {
				t.Fatalf("README.md:%d: marker %q: want <!-- runbook: shell|manual --> or <!-- runbook: nsc NAME -->", n, line)
			}
			pending = &runbookBlock{kind: m[1], name: m[2]}
		case strings.HasPrefix(line, "```"):
			if line != "```sh" {
				t.Fatalf("README.md:%d: the runbook's code blocks are ```sh", n)
			}
			if pending == nil {
				t.Fatalf("README.md:%d: a ```sh block without a <!-- runbook: … --> marker", n)
			}
			cur, pending = pending, nil
			cur.line = n + 1
			code.Reset()
		case pending != nil && strings.TrimSpace(line) != "":
			t.Fatalf("README.md:%d: a runbook marker must be followed by its ```sh block", n)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return blocks
}

// runbook runs the runbook's blocks in one shell (mvdan.cc/sh), as an
// operator would in one terminal, from the repository's root. brainctl,
// nats-server, brain and edge run in this process (started by the
// commands as written, with the shell's environment); every other command
// (curl, install, tr, …) is the real one. nsc blocks run with the real nsc
// (-tags nsc) or are stood in for (standIn).
type runbook struct {
	t      *testing.T
	ctx    context.Context
	r      *interp.Runner
	out    syncBuffer // everything the blocks and the programs printed
	procs  sync.WaitGroup
	mu     sync.Mutex
	jobs   []*job // the shell's background jobs, g1, g2, … as $! names them
	stands *standIns
	env    map[string]string
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
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

func newRunbook(t *testing.T) *runbook {
	t.Helper()
	adminURL := testdb.AdminURL(t)
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rb := &runbook{t: t, ctx: ctx}
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { // the tenant's n8n webhook
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	prefix := fmt.Sprintf("rb%d_", time.Now().UnixNano()%1_000_000)
	home := t.TempDir()
	rb.env = map[string]string{
		"PATH":            os.Getenv("PATH"),
		"HOME":            home,
		"OPS_DIR":         filepath.Join(home, "srv"),
		"NATS_URL":        fmt.Sprintf("nats://127.0.0.1:%d", freePort(t)),
		"NATS_MONITOR":    fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"PG_ADMIN_URL":    adminURL,
		"BRAIN_OPS_ADDR":  fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"ACME_EDGE_ADDR":  fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"ACME_N8N_URL":    hook.URL,
		"BRAINCTL_PREFIX": prefix, // names its databases and roles apart from other tests'
	}
	t.Cleanup(func() {
		cancel()
		rb.procs.Wait()
		hook.Close()
		if t.Failed() || os.Getenv("RUNBOOK_OUTPUT") != "" {
			t.Logf("runbook output:\n%s", rb.out.String())
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := (&provision.Ops{AdminURL: adminURL, Prefix: prefix}).DropPrefixed(ctx); err != nil {
			t.Errorf("drop the runbook's databases: %v", err)
		}
	})
	var envList []string
	for k, v := range rb.env {
		envList = append(envList, k+"="+v)
	}
	rb.r, err = interp.New(
		interp.Env(expand.ListEnviron(envList...)),
		interp.Dir(root),
		interp.StdIO(nil, &rb.out, &rb.out),
		interp.ExecHandlers(rb.exec),
		// kill is a shell builtin the interpreter lacks: hand it to exec.
		interp.CallHandler(func(_ context.Context, args []string) ([]string, error) {
			if args[0] == "kill" {
				args = append([]string{"kill-job"}, args[1:]...)
			}
			return args, nil
		}),
		interp.Params("-e"),
	)
	if err != nil {
		t.Fatal(err)
	}
	return rb
}

// run runs one block; a failing command fails the test, naming the block.
func (rb *runbook) run(b runbookBlock) {
	rb.t.Helper()
	if err := rb.try(b, false); err != nil {
		rb.t.Fatalf("README.md:%d (%s block) failed: %v\n%s", b.line, b.kind, err, tail(rb.out.String(), 4000))
	}
}

// try runs one block and returns its failure. In a subshell, a failure
// ends the block only and its variables stay its own.
func (rb *runbook) try(b runbookBlock, subshell bool) error {
	rb.t.Helper()
	code := b.code
	if subshell {
		code = "(\n" + code + ")\n"
	}
	f, err := syntax.NewParser().Parse(strings.NewReader(code), fmt.Sprintf("README.md:%d", b.line))
	if err != nil {
		rb.t.Fatalf("README.md:%d: %v", b.line, err)
	}
	fmt.Fprintf(&rb.out, "\n### README.md:%d (%s %s)\n", b.line, b.kind, b.name)
	return rb.r.Run(rb.ctx, f)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// exec runs the programs this repository builds, and nats-server, in this
// process; anything else is the real command.
func (rb *runbook) exec(next interp.ExecHandlerFunc) interp.ExecHandlerFunc {
	return func(ctx context.Context, args []string) error {
		hc := interp.HandlerCtx(ctx)
		getenv := func(k string) string {
			if v := hc.Env.Get(k); v.IsSet() && v.Exported {
				return v.String()
			}
			return ""
		}
		log := slog.New(slog.NewTextHandler(&rb.out, &slog.HandlerOptions{Level: slog.LevelWarn}))
		switch args[0] {
		case "brainctl":
			code := admin.Main(ctx, args[1:], admin.Env{Getenv: getenv, Stdin: hc.Stdin, Stdout: hc.Stdout, Stderr: hc.Stderr})
			if code != 0 {
				return interp.ExitStatus(uint8(code))
			}
			return nil
		case "nats-server":
			if len(args) != 3 || args[1] != "-c" {
				return fmt.Errorf("the runbook starts nats-server as 'nats-server -c FILE', not %q", args)
			}
			return rb.process(ctx, func(ctx context.Context) error { return runNATS(ctx, args[2]) })
		case "brain":
			cfg, err := brain.ConfigFromEnv(getenv)
			if err != nil {
				return err
			}
			return rb.process(ctx, func(ctx context.Context) error { return brain.Run(ctx, cfg, log.With("program", "brain")) })
		case "edge":
			cfg, err := edge.ConfigFromEnv(getenv)
			if err != nil {
				return err
			}
			return rb.process(ctx, func(ctx context.Context) error {
				// Listening is part of the program: a second edge on the
				// same address is a job that fails, as the real one would.
				ln, err := net.Listen("tcp", cfg.Addr)
				if err != nil {
					return err
				}
				return edge.Serve(ctx, ln, cfg, log.With("program", "edge"))
			})
		case "kill-job":
			j, probe, ok := rb.job(args)
			if !ok {
				return next(ctx, append([]string{"kill"}, args[1:]...))
			}
			select {
			case <-j.done:
				return interp.ExitStatus(1) // no such process
			default:
			}
			if !probe {
				j.stop()
			}
			return nil
		case "nsc":
			if !realNSC {
				return errors.New("nsc runs only in 'runbook: nsc' blocks")
			}
		}
		if strings.Contains(args[0], "nsc-") && !realNSC {
			return fmt.Errorf("%s runs only in 'runbook: nsc' blocks", args[0])
		}
		return next(ctx, args)
	}
}

// job is a program the runbook started in the background.
type job struct {
	stop func()
	done chan struct{}
}

// job finds the background job of 'kill [-0] gN' ($! of this shell).
func (rb *runbook) job(args []string) (j *job, probe, ok bool) {
	rest := args[1:]
	if len(rest) == 2 && rest[0] == "-0" {
		probe, rest = true, rest[1:]
	}
	if len(rest) != 1 || !strings.HasPrefix(rest[0], "g") {
		return nil, false, false
	}
	n, err := strconv.Atoi(rest[0][1:])
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if err != nil || n < 1 || n > len(rb.jobs) {
		return nil, false, false
	}
	return rb.jobs[n-1], probe, true
}

// process runs a long-lived program until the test ends or kill stops it
// (the shell's background job waits for it, as for a real process). Each
// is the next of the shell's background jobs: the runbook starts each with
// its own '&' and waits for it to be ready before the next, so the n-th
// process is the job $! calls gn.
func (rb *runbook) process(ctx context.Context, run func(context.Context) error) error {
	rb.procs.Add(1)
	defer rb.procs.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	j := &job{stop: cancel, done: make(chan struct{})}
	defer close(j.done)
	rb.mu.Lock()
	rb.jobs = append(rb.jobs, j)
	rb.mu.Unlock()
	err := run(ctx)
	if ctx.Err() != nil {
		return nil // stopped by kill or with the test
	}
	if err == nil {
		err = errors.New("exited")
	}
	fmt.Fprintf(&rb.out, "program failed: %v\n", err)
	return err
}

// runNATS is `nats-server -c FILE`: the configuration file parsed and
// served by the nats-server package this module pins.
func runNATS(ctx context.Context, conf string) error {
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		return fmt.Errorf("nats-server -c %s: %w", conf, err)
	}
	opts.NoSigs = true
	srv, err := server.NewServer(opts)
	if err != nil {
		return err
	}
	go srv.Start()
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	if !srv.ReadyForConnections(10 * time.Second) {
		return errors.New("nats-server not ready")
	}
	<-ctx.Done()
	return nil
}

// TestRunbook follows deploy/README.md from a fresh machine to a tenant
// onboarded, served, its users and the brain's rotated, the sealing key
// rotated, and the tenant offboarded: every shell block as written, in
// order, against a real Postgres and a real NATS server configured by the
// runbook's own file. Without -tags nsc the nsc blocks are stood in for by
// the same identities made with package account and pushed to the
// server's resolver; with it, they run the real nsc.
//
// Every block runs twice in a row, and the second run must leave the
// files, the registry and the running programs as the first did (re-running
// any step is safe). After each rotation the old user's .creds are refused
// and its open connection is closed; re-running the onboarding that made
// that user is refused and un-revokes nothing.
func TestRunbook(t *testing.T) {
	blocks := runbookBlocks(t)
	rb := newRunbook(t)
	rb.stands = newStandIns(rb)
	named := map[string]runbookBlock{}
	for _, b := range blocks {
		if b.name != "" {
			named[b.name] = b
		}
	}
	// The users each rotation replaces: their .creds are kept before the
	// new user's are installed over them, to try once they are revoked.
	rotated := map[string]struct{ made, revoked, user string }{
		"edge":  {made: "tenant-acme", revoked: "revoke-edge", user: "creds/acme-edge.creds"},
		"brain": {made: "accounts", revoked: "revoke-brain", user: "creds/brain.creds"},
	}
	old := map[string]string{}      // rotated user → a copy of its .creds
	watch := map[string]*userConn{} // rotated user → a connection it holds until revoked
	ran := map[string]int{}
	for _, b := range blocks {
		if b.kind == "manual" {
			ran["manual (not run)"]++
			continue
		}
		for who, r := range rotated {
			if b.name == r.revoked {
				watch[who] = rb.connectAs(old[who], who)
			}
		}
		rb.step(b)
		first := rb.state()
		rb.step(b)
		rb.sameState(b, "running the block again", first, rb.state())
		switch {
		case b.kind == "nsc" && !realNSC:
			ran["nsc (stood in), twice"]++
		default:
			ran[b.kind+", twice"]++
		}
		for who, r := range rotated {
			switch b.name {
			case r.made:
				old[who] = rb.keep(r.user)
			case r.revoked:
				watch[who].wantClosed(t)
				rb.wantRefused(old[who], who)
				// Onboarding again would issue the revoked user anew: refused.
				before := rb.state()
				if err := rb.stepErr(named[r.made]); err == nil {
					t.Fatalf("README.md:%d (nsc %s) run again after %s's revocation succeeded: it must refuse the revoked user", named[r.made].line, r.made, who)
				}
				rb.sameState(named[r.made], "the refused re-run after "+who+"'s revocation", before, rb.state())
				rb.wantRefused(old[who], who)
			}
		}
	}
	t.Logf("runbook blocks: %v", ran)
	if ran["shell, twice"] < 10 {
		t.Fatalf("only %d shell blocks ran: the runbook lost its markers?", ran["shell, twice"])
	}

	// After offboarding: no tenant in the registry, its database gone.
	c := &strings.Builder{}
	code := admin.Main(context.Background(), []string{"tenant", "list", "--json"}, admin.Env{Getenv: rb.getenv, Stdout: c, Stderr: c})
	if code != 0 || !strings.Contains(c.String(), `"tenants": []`) {
		t.Fatalf("tenants after offboarding: exit %d\n%s", code, c)
	}
}
