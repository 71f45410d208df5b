package edge

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"n8nbrain/nats/account"
	"n8nbrain/wire"
)

// A revoked edge: while the server refuses its credential, n8n gets a 403
// it will not retry and the probes fail; once nats.go gives up, Serve
// returns an error (the command exits 1) instead of living on answering
// 503; an edge restarted with a valid credential works.
func TestRevokedCredentialStopsTheEdge(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	startFakeBrain(t, n, decide)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	logs := newLockedBuffer()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, ln, Config{TenantID: "client-zero", NATSURL: n.srv.ClientURL(), CredsFile: n.edgeCreds, Token: testToken,
			TurnWait: 5 * time.Second, PublishTimeout: 2 * time.Second},
			slog.New(slog.NewJSONHandler(io.MultiWriter(logs, t.Output()), nil)))
	}()
	e := &testEdge{url: "http://" + ln.Addr().String(), client: &http.Client{Timeout: 30 * time.Second}, logs: logs}
	if r := e.submit(t, turnBody("wi-before", "hello")); r.status != http.StatusOK {
		t.Fatalf("before the revocation: %d %s", r.status, r.body)
	}

	creds, err := os.ReadFile(n.edgeCreds)
	must(t, err)
	user, err := account.CredsUser(creds)
	must(t, err)
	revoked, err := n.op.RevokeUser(n.tenant, user, time.Now())
	must(t, err)
	must(t, n.srv.PutAccount(revoked.Public, revoked.JWT))

	// The server kicks the user at once; nats.go tries again twice,
	// ReconnectWait (2s) apart, before it closes the connection: the
	// checks below run in that window, started by the log line.
	logs.waitFor(t, "nats: authentication revoked")
	r := e.submit(t, turnBody("wi-after", "hello again"))
	if r.status != http.StatusForbidden || r.header.Get("Retry-After") != "" {
		t.Fatalf("turn while revoked: %d (Retry-After %q) %s; want 403 without Retry-After", r.status, r.header.Get("Retry-After"), r.body)
	}
	if we := r.wireError(t); we.Code != wire.CodeForbidden || we.Reason != wire.ReasonCredentialRefused || !strings.Contains(we.Message, "new credentials") {
		t.Errorf("turn while revoked: %+v", we)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		r := e.do(t, http.MethodGet, path, nil, map[string]string{"Authorization": ""})
		if r.status != http.StatusServiceUnavailable {
			t.Errorf("%s while revoked: %d %s, want 503", path, r.status, r.body)
		} else if we := r.wireError(t); we.Reason != wire.ReasonCredentialRefused {
			t.Errorf("%s while revoked: %+v, want reason %s", path, we, wire.ReasonCredentialRefused)
		}
	}

	select {
	case err := <-done:
		if err == nil || !errors.Is(err, nats.ErrAuthorization) || !strings.Contains(err.Error(), "closed for good") {
			t.Fatalf("Serve returned %v; want the connection closed for good with the authorization error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve still running 30s after its credential was revoked: a zombie")
	}
	if _, err := http.Get(e.url + "/healthz"); err == nil {
		t.Error("the edge still answers after Serve returned")
	}

	// Restarted with a new user of the same account: it works again.
	fresh := writeCreds(t, filepath.Dir(n.edgeCreds), revoked, "edge-new", account.RoleEdge)
	e2 := startEdge(t, n, func(c *Config) { c.CredsFile = fresh })
	if r := e2.submit(t, turnBody("wi-restarted", "hello once more")); r.status != http.StatusOK {
		t.Fatalf("restarted edge with valid credentials: %d %s", r.status, r.body)
	}
	if r := e2.do(t, http.MethodGet, "/healthz", nil, nil); r.status != http.StatusOK {
		t.Errorf("restarted edge healthz: %d %s", r.status, r.body)
	}
}
