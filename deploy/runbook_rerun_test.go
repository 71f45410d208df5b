package deploy_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"n8nbrain/provision/admin"
)

// step runs a block (its stand-in without -tags nsc); any failure fails the
// test.
func (rb *runbook) step(b runbookBlock) {
	rb.t.Helper()
	if b.kind == "nsc" && !realNSC {
		if err := rb.stands.run(b.name); err != nil {
			rb.t.Fatalf("README.md:%d (nsc %s, stood in) failed: %v", b.line, b.name, err)
		}
		return
	}
	rb.run(b)
}

// stepErr runs a block that may fail, in a subshell, and returns how it
// failed.
func (rb *runbook) stepErr(b runbookBlock) error {
	rb.t.Helper()
	if b.kind == "nsc" && !realNSC {
		return rb.stands.run(b.name)
	}
	return rb.try(b, true)
}

// getenv is the runbook shell's variable k.
func (rb *runbook) getenv(k string) string {
	if v := rb.r.Vars[k]; v.IsSet() {
		return v.String()
	}
	return ""
}

// runbookState is what running a block may change, by name: each file
// under $OPS_DIR (its mode and a digest of its content, NATS identities by
// their claims), the registry as brainctl shows it, and how many of the
// programs the runbook started are running or have failed.
type runbookState map[string]string

// jwtRe finds JWTs: account and operator files, .creds, the resolver's store.
var jwtRe = regexp.MustCompile(`eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+`)

// claimsOf replaces each JWT in b by its claims without what changes
// whenever nsc signs the same thing again: the issue time, the JWT id, and
// the times of revocations (a revocation repeated moves its time forward,
// still revoking every JWT issued before).
func claimsOf(b []byte) []byte {
	return jwtRe.ReplaceAllFunc(b, func(tok []byte) []byte {
		parts := strings.Split(string(tok), ".")
		raw, err := base64.RawURLEncoding.DecodeString(parts[1])
		if err != nil {
			return tok
		}
		var c map[string]any
		if json.Unmarshal(raw, &c) != nil {
			return tok
		}
		delete(c, "iat")
		delete(c, "jti")
		if n, ok := c["nats"].(map[string]any); ok {
			if rev, ok := n["revocations"].(map[string]any); ok {
				for k := range rev {
					rev[k] = "revoked"
				}
			}
		}
		out, _ := json.Marshal(c) // maps marshal with sorted keys
		return out
	})
}

func (rb *runbook) state() runbookState {
	rb.t.Helper()
	st := runbookState{}
	dir := rb.env["OPS_DIR"]
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			if rel == filepath.Join("nats", "jetstream") { // turns and replies, not settings
				return fs.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(rel, ".pid") { // the job a program runs as: a second start changes it
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			st["pid "+rel] = strings.TrimSpace(string(b))
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(claimsOf(b))
		st["file "+rel] = fmt.Sprintf("%v %s", info.Mode().Perm(), hex.EncodeToString(sum[:8]))
		return nil
	})
	if err != nil {
		rb.t.Fatalf("read %s: %v", dir, err)
	}
	if rb.getenv("BRAINCTL_ADMIN_URL") != "" {
		list := rb.brainctl("tenant", "list", "--json")
		st["brainctl tenant list"] = list
		var l struct{ Tenants []struct{ ID string } }
		if json.Unmarshal([]byte(list), &l) == nil {
			for _, tn := range l.Tenants {
				st["brainctl tenant show "+tn.ID] = rb.brainctl("tenant", "show", tn.ID, "--json")
				st["brainctl rules export "+tn.ID] = rb.brainctl("rules", "export", tn.ID, "--format", "json")
			}
		}
	}
	rb.mu.Lock()
	running := 0
	for _, j := range rb.jobs {
		select {
		case <-j.done:
		default:
			running++
		}
	}
	rb.mu.Unlock()
	st["programs running"] = fmt.Sprint(running)
	st["programs failed"] = fmt.Sprint(strings.Count(rb.out.String(), "program failed:"))
	return st
}

// brainctl runs brainctl with the runbook shell's settings and returns its
// exit code and output.
func (rb *runbook) brainctl(args ...string) string {
	var out strings.Builder
	code := admin.Main(rb.ctx, args, admin.Env{Getenv: rb.getenv, Stdout: &out, Stderr: &out})
	return fmt.Sprintf("exit %d: %s", code, out.String())
}

// sameState fails the test, naming the block, unless before and after
// agree. A block that stops a program to start it again (kill "$(cat
// PIDFILE)") may change that program's pid file, and only such a block.
func (rb *runbook) sameState(b runbookBlock, what string, before, after runbookState) {
	rb.t.Helper()
	var diff []string
	for k, v := range before {
		if rel, ok := strings.CutPrefix(k, "pid "); ok && strings.Contains(b.code, `kill "$(cat "$OPS_DIR/`+filepath.ToSlash(rel)+`")"`) {
			continue
		}
		if w, ok := after[k]; !ok {
			diff = append(diff, fmt.Sprintf("%s: gone (was %s)", k, v))
		} else if w != v {
			if strings.HasPrefix(k, "brainctl ") {
				diff = append(diff, fmt.Sprintf("%s:\n  was: %s\n  now: %s", k, v, w))
			} else {
				diff = append(diff, fmt.Sprintf("%s: was %s, now %s", k, v, w))
			}
		}
	}
	for k, w := range after {
		if _, ok := before[k]; !ok {
			diff = append(diff, fmt.Sprintf("%s: new (%s)", k, w))
		}
	}
	if len(diff) > 0 {
		slices.Sort(diff)
		rb.t.Fatalf("README.md:%d (%s block): %s changed what the first run left:\n%s\n%s", b.line, strings.TrimSpace(b.kind+" "+b.name), what,
			strings.Join(diff, "\n"), tail(rb.out.String(), 3000))
	}
}

// keep copies a file of $OPS_DIR (a user's .creds, before a rotation puts
// the new user's over it) and returns the copy's path.
func (rb *runbook) keep(rel string) string {
	rb.t.Helper()
	b, err := os.ReadFile(filepath.Join(rb.env["OPS_DIR"], rel))
	if err != nil {
		rb.t.Fatal(err)
	}
	p := filepath.Join(rb.t.TempDir(), filepath.Base(rel))
	if err := os.WriteFile(p, b, 0o600); err != nil {
		rb.t.Fatal(err)
	}
	return p
}

// userConn is a connection of a user about to be revoked.
type userConn struct {
	who    string
	nc     *nats.Conn
	closed chan struct{}

	mu       sync.Mutex
	asyncErr error // what the server said before it closed the connection
}

// connectAs connects with a user's .creds, which must work, and never
// reconnects: the server closing it is what a revocation does.
func (rb *runbook) connectAs(creds, who string) *userConn {
	rb.t.Helper()
	uc := &userConn{who: who, closed: make(chan struct{})}
	nc, err := nats.Connect(rb.env["NATS_URL"], nats.UserCredentials(creds), nats.Name("runbook-old-"+who),
		nats.NoReconnect(), nats.ClosedHandler(func(*nats.Conn) { close(uc.closed) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			uc.mu.Lock()
			defer uc.mu.Unlock()
			if uc.asyncErr == nil {
				uc.asyncErr = err
			}
		}))
	if err != nil {
		rb.t.Fatalf("the %s user about to be revoked cannot connect: %v", who, err)
	}
	uc.nc = nc
	rb.t.Cleanup(nc.Close)
	return uc
}

// wantClosed fails unless the server has closed the revoked user's
// connection, saying it was revoked.
func (uc *userConn) wantClosed(t *testing.T) {
	t.Helper()
	select {
	case <-uc.closed:
	case <-time.After(15 * time.Second):
		t.Fatalf("the revoked %s user is still connected 15 s after its revocation (status %v)", uc.who, uc.nc.Status())
	}
	uc.mu.Lock()
	defer uc.mu.Unlock()
	if !errors.Is(uc.asyncErr, nats.ErrAuthRevoked) {
		t.Fatalf("the revoked %s user's connection was closed with %v, want %v", uc.who, uc.asyncErr, nats.ErrAuthRevoked)
	}
}

// wantRefused fails unless the server refuses a new connection with the
// user's .creds as an authorization failure.
func (rb *runbook) wantRefused(creds, who string) {
	rb.t.Helper()
	nc, err := nats.Connect(rb.env["NATS_URL"], nats.UserCredentials(creds), nats.NoReconnect(), nats.Timeout(5*time.Second))
	if err == nil {
		nc.Close()
		rb.t.Fatalf("the revoked %s user's .creds still connect", who)
	}
	if !errors.Is(err, nats.ErrAuthorization) {
		rb.t.Fatalf("the revoked %s user's .creds: %v, want an authorization violation", who, err)
	}
}
