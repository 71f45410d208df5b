package tests

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"n8nbrain/brain"
	"n8nbrain/nats/account"
)

// A brain replica whose NATS user is revoked must not live on as a zombie:
// its /healthz fails while the server refuses the credential, Run returns an
// error once nats.go gives up (main exits 1 and the supervisor restarts
// it), and a replica started with a valid credential decides turns again.
func TestRevokedBrainStops(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("revoked-brain"))
	ea := s.startEdge(a, nil)

	ops, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opsURL := "http://" + ops.Addr().String()
	cfg := s.stack.BrainConfig("doomed")
	cfg.OpsListener = ops
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- brain.Run(ctx, cfg, slog.New(s.logs.handler()).With("component", "brain")) }()

	ea.submit(quoteEmail("<before-revocation@x>")).reply(t)
	if res, err := http.Get(opsURL + "/healthz"); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("healthz before the revocation: %v %v", res, err)
	}

	creds, err := os.ReadFile(s.stack.BrainCreds)
	if err != nil {
		t.Fatal(err)
	}
	user, err := account.CredsUser(creds)
	if err != nil {
		t.Fatal(err)
	}
	revoked, err := s.stack.Operator.RevokeUser(s.stack.Brain, user, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.stack.NATS.PutAccount(revoked.Public, revoked.JWT); err != nil {
		t.Fatal(err)
	}

	// The server kicks the user at once; nats.go tries twice more,
	// ReconnectWait (2s) apart, before it closes the connection: /healthz
	// must fail in that window (it is polled every 20ms).
	eventually(t, 10*time.Second, "the revoked brain's /healthz to answer 503", func() bool {
		res, err := http.Get(opsURL + "/healthz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusServiceUnavailable
	})

	select {
	case err := <-done:
		if err == nil || !errors.Is(err, nats.ErrAuthorization) || !strings.Contains(err.Error(), "closed for good") {
			t.Fatalf("Run returned %v; want the connection closed for good with the authorization error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run still running 30s after the brain's credential was revoked: a zombie")
	}

	// A new brain user (what ops would issue) and a restarted replica.
	if _, err := s.stack.IDs.WriteBrainCreds(); err != nil {
		t.Fatal(err)
	}
	s.startBrain("restarted", nil)
	if rep := ea.submit(quoteEmail("<after-restart@x>")).reply(t); rep.Turn != 1 || rep.Action == nil {
		t.Fatalf("restarted brain: %+v", rep)
	}
}
