package tests

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"n8nbrain/nats/account"
)

// credsUser is the public key of the user in a .creds file.
func credsUser(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		t.Fatal(err)
	}
	return uc.Subject
}

// rotateUser does what deploy/README.md (section 7) does to rotate a NATS
// user: a second user of the same account (both valid at once) is
// written over the .creds file the running program reads, then the old
// user is revoked and the account pushed, which closes the old user's
// connections; the program reconnects reading the file, as the new user.
func (s *system) rotateUser(acc *account.Account, path, newUser string, role account.Role) *account.Account {
	s.t.Helper()
	t := s.t.(*testing.T)
	old := credsUser(t, path)
	oldCreds := filepath.Join(t.TempDir(), "old.creds")
	if b, err := os.ReadFile(path); err != nil || os.WriteFile(oldCreds, b, 0o600) != nil {
		t.Fatalf("keep the old creds: %v", err)
	}
	b, err := account.UserCreds(acc, newUser, role)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".new", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	prev, err := jwt.DecodeAccountClaims(acc.JWT)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := acc.Seed()
	if err != nil {
		t.Fatal(err)
	}
	next, err := s.stack.Operator.SignTenantClaims(acc.Name, seed, func(c *jwt.AccountClaims) {
		*c = *prev
		c.RevokeAt(old, time.Now().Add(time.Second))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.stack.NATS.PutAccount(next.Public, next.JWT); err != nil {
		t.Fatal(err)
	}
	if credsUser(t, path) == old {
		t.Fatal("the creds file still holds the revoked user")
	}
	// The revocation holds: the old user is refused from now on.
	if nc, err := nats.Connect(s.stack.NATS.ClientURL(), nats.UserCredentials(oldCreds), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatalf("the revoked user %s still connects", old)
	}
	return next
}

// TestUserRotationWhileTurnsFlow: the runbook's rotation of an edge user
// and of the brain user, done while two tenants' turns flow through their
// edges: every turn is answered 200 throughout (the edge retries its
// publishes and waits for the decision while a connection comes back as
// the new user), and afterwards each program runs as the new user.
func TestUserRotationWhileTurnsFlow(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a, b := s.tenant(spec("rot-a")), s.tenant(spec("rot-b"))
	s.startBrain("r1", nil)
	tr := startTraffic(t, s.startEdge(a, nil), s.startEdge(b, nil))
	tr.flows(t, 20, "before the rotations")

	s.rotateUser(a.Account, a.EdgeCreds, "edge-2", account.RoleEdge)
	tr.flows(t, 20, "after rotating rot-a's edge user")

	s.stack.Brain = s.rotateUser(s.stack.Brain, s.stack.BrainCreds, "brain-2", account.RoleBrain)
	tr.flows(t, 20, "after rotating the brain user")
	tr.halt()
	if n := tr.failed.Load(); n != 0 {
		t.Fatalf("%d of %d turns failed during the rotations, first: %s", n, n+tr.ok.Load(), tr.failures[0])
	}
	t.Logf("%d turns answered during two user rotations, none failed", tr.ok.Load())
}
