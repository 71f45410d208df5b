package edge

import (
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"n8nbrain/nats/account"
	"n8nbrain/wire"
)

// A revoked edge: while the server refuses its credential the probes fail;
// once nats.go gives up, a turn gets a 403 that n8n will not retry, and
// Serve returns an error (the command exits 1) instead of living on
// answering 503; an edge restarted with a valid credential works.
func TestRevokedCredentialStopsTheEdge(t *testing.T) {
	t.Parallel()
	n, e := answeringEdge(t)
	revokeEdgeUser(t, n, edgeUser(t, n))

	// The server kicks the user at once; nats.go tries again at once, then
	// once more a ReconnectWait (2s) later, before it closes the
	// connection: the probes run in that window, started by the log line.
	e.logs.waitFor(t, "nats: authentication revoked")
	for _, path := range []string{"/healthz", "/readyz"} {
		r := e.do(t, http.MethodGet, path, nil, map[string]string{"Authorization": ""})
		if r.status != http.StatusServiceUnavailable {
			t.Errorf("%s while revoked: %d %s, want 503", path, r.status, r.body)
		} else if we := r.wireError(t); we.Reason != wire.ReasonCredentialRefused {
			t.Errorf("%s while revoked: %+v, want reason %s", path, we, wire.ReasonCredentialRefused)
		}
	}
	// A turn in that window waits for nats.go to give up (the refusal might
	// have been a rotation's), then is refused for good.
	r := e.submit(t, turnBody("wi-after", "hello again"))
	if r.status != http.StatusForbidden || r.header.Get("Retry-After") != "" {
		t.Fatalf("turn while revoked: %d (Retry-After %q) %s; want 403 without Retry-After", r.status, r.header.Get("Retry-After"), r.body)
	}
	if we := r.wireError(t); we.Code != wire.CodeForbidden || we.Reason != wire.ReasonCredentialRefused || !strings.Contains(we.Message, "new credentials") {
		t.Errorf("turn while revoked: %+v", we)
	}

	if err, ended := e.ended(30 * time.Second); !ended {
		t.Fatal("Serve still running 30s after its credential was revoked: a zombie")
	} else if err == nil || !errors.Is(err, nats.ErrAuthorization) || !strings.Contains(err.Error(), "closed for good") {
		t.Fatalf("Serve returned %v; want the connection closed for good with the authorization error", err)
	}
	if _, err := http.Get(e.url + "/healthz"); err == nil {
		t.Error("the edge still answers after Serve returned")
	}

	// Restarted with a new user of the same account: it works again.
	rotateEdgeCreds(t, n, "edge-new")
	e2 := startEdge(t, n, nil)
	if r := e2.submit(t, turnBody("wi-restarted", "hello once more")); r.status != http.StatusOK {
		t.Fatalf("restarted edge with valid credentials: %d %s", r.status, r.body)
	}
	if r := e2.do(t, http.MethodGet, "/healthz", nil, nil); r.status != http.StatusOK {
		t.Errorf("restarted edge healthz: %d %s", r.status, r.body)
	}
}

// answeringEdge starts the test NATS, a brain and an edge, and checks that
// the edge answers a turn.
func answeringEdge(t *testing.T) (*testNATS, *testEdge) {
	t.Helper()
	n := startNATS(t, true)
	startFakeBrain(t, n, decide)
	e := startEdge(t, n, nil)
	if r := e.submit(t, turnBody("wi-before", "hello")); r.status != http.StatusOK {
		t.Fatalf("before the credential changed: %d %s", r.status, r.body)
	}
	return n, e
}

// stillServing fails t if Serve has returned.
func (e *testEdge) stillServing(t *testing.T, why string) {
	t.Helper()
	select {
	case <-e.exited:
		e.observed.Store(true)
		t.Fatalf("Serve stopped %s: %v", why, e.serveErr)
	default:
	}
}

// edgeUser is the public key of the user in the edge's .creds file.
func edgeUser(t *testing.T, n *testNATS) string {
	t.Helper()
	creds, err := os.ReadFile(n.edgeCreds)
	must(t, err)
	user, err := account.CredsUser(creds)
	must(t, err)
	return user
}

// revokeEdgeUser revokes a user of the edge's account.
func revokeEdgeUser(t *testing.T, n *testNATS, user string) {
	t.Helper()
	revoked, err := n.op.RevokeUser(n.tenant, user, time.Now())
	must(t, err)
	must(t, n.srv.PutAccount(revoked.Public, revoked.JWT))
	n.tenant = revoked
}

// rotateEdgeCreds puts a new user's .creds in place of the edge's file, as
// deploy/README.md section 7 does (install writes a new file over it).
func rotateEdgeCreds(t *testing.T, n *testNATS, user string) {
	t.Helper()
	fresh := writeCreds(t, t.TempDir(), n.tenant, user, account.RoleEdge)
	must(t, os.Rename(fresh, n.edgeCreds))
}

// The runbook's rotation: the new user's .creds in place, then the old user
// revoked. The server kicks the edge, which comes back at once as the new
// user, not a ReconnectWait (2s) later: a turn sent then is answered.
func TestRotatedCredentialReconnectsAtOnce(t *testing.T) {
	t.Parallel()
	n, e := answeringEdge(t)
	old := edgeUser(t, n)
	rotateEdgeCreds(t, n, "edge-2")
	kicked := time.Now()
	revokeEdgeUser(t, n, old)
	e.logs.waitFor(t, "nats: authentication revoked")
	e.logs.waitFor(t, "nats reconnected")
	if d := time.Since(kicked); d >= time.Second {
		t.Errorf("the edge came back %v after the revocation; want at once, well under nats.go's 2s ReconnectWait", d)
	}
	if r := e.submit(t, turnBody("wi-after", "hello again")); r.status != http.StatusOK {
		t.Fatalf("after the rotation: %d %s", r.status, r.body)
	}
	e.stillServing(t, "after a rotation")
}

// The old user revoked before the new .creds is in place: the edge's first
// reconnect is refused, and a turn sent then waits for the next one, which
// reads the file again and is accepted as the new user, instead of being
// answered 403 credential_refused while the refusal is not final.
func TestTurnWaitsForARefusalToSettle(t *testing.T) {
	t.Parallel()
	n, e := answeringEdge(t)
	revokeEdgeUser(t, n, edgeUser(t, n))
	e.logs.waitFor(t, "nats: authentication revoked")
	e.logs.waitFor(t, "nats: authorization violation") // the first reconnect, refused
	rotateEdgeCreds(t, n, "edge-2")
	if r := e.submit(t, turnBody("wi-during", "hello again")); r.status != http.StatusOK {
		t.Fatalf("turn sent while the refusal could still end in a reconnect: %d %s; want it to wait and be answered", r.status, r.body)
	}
	if !strings.Contains(e.logs.String(), "nats reconnected") {
		t.Error("the turn was answered but the log shows no reconnect")
	}
	e.stillServing(t, "though its credential file was rotated in time")
}
