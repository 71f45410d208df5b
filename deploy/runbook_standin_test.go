package deploy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"n8nbrain/nats/account"
)

// standIns do what the runbook's nsc blocks do, with package account (the
// reference for the claims nsc writes; nsc_test.go checks they agree):
// the same files, the same users, the same accounts pushed to the same
// resolver over the system account, the same revocations. They run when
// nsc is not installed (CI), so that the rest of the runbook runs always.
// Run again, they do what the blocks and the nsc scripts do run again:
// keep what exists (the operator, the accounts, each user's key) and
// refuse to issue a revoked user anew.
type standIns struct {
	rb      *runbook
	op      *account.Operator
	sys     *account.Account
	streams *account.Account
	brain   *account.Account
	acme    *account.Account
	users   map[string]string // "account/user" → public key
	creds   map[string][]byte // "account/user" → its .creds
	revoked map[string]bool   // "account/user" revoked
}

func newStandIns(rb *runbook) *standIns {
	return &standIns{rb: rb, users: map[string]string{}, creds: map[string][]byte{}, revoked: map[string]bool{}}
}

// refusedError is a stand-in refusing, as the nsc scripts do, to issue a
// revoked user anew: the block fails and nothing changes.
type refusedError struct{ user, account string }

func (e refusedError) Error() string {
	return fmt.Sprintf("user %s of account %s is revoked: re-running would un-revoke it; it is left revoked", e.user, e.account)
}

func (s *standIns) path(rel string) string { return filepath.Join(s.rb.env["OPS_DIR"], rel) }

func (s *standIns) write(rel, data string, mode os.FileMode) {
	s.rb.t.Helper()
	if err := os.WriteFile(s.path(rel), []byte(data), mode); err != nil {
		s.rb.t.Fatal(err)
	}
}

// run does what nsc block name does. It fails the test on any error but a
// refusal, which it returns (the block, run for real, exits non-zero).
func (s *standIns) run(name string) error {
	t := s.rb.t
	t.Helper()
	fmt.Fprintf(&s.rb.out, "\n### nsc block %q stood in for\n", name)
	var err error
	switch name {
	case "operator":
		if s.op != nil { // nsc add operator is skipped: the same operator's files again
			s.write("nats/operator.jwt", s.op.JWT+"\n", 0o644)
			s.write("nats/sys.jwt", s.sys.JWT+"\n", 0o644)
			s.write("nats/sys.key", s.sys.Public+"\n", 0o644)
			break
		}
		var kp nkeys.KeyPair
		var sysPub string
		if kp, sysPub, err = account.NewAccountKey(nil); err != nil {
			break
		}
		if s.op, err = account.NewOperator("n8nbrain", nil, sysPub); err != nil {
			break
		}
		if s.sys, err = s.op.SystemAccount(kp); err != nil {
			break
		}
		s.write("nats/operator.jwt", s.op.JWT+"\n", 0o644)
		s.write("nats/sys.jwt", s.sys.JWT+"\n", 0o644)
		s.write("nats/sys.key", s.sys.Public+"\n", 0o644)
	case "accounts":
		if s.streams == nil {
			if s.streams, err = s.op.StreamsAccount(nil); err != nil {
				break
			}
			if s.brain, err = s.op.BrainAccount(nil, s.streams); err != nil {
				break
			}
		}
		s.push(s.streams)
		if err = s.userCreds(s.streams, "provisioner", account.RoleProvisioner, "creds/provisioner.creds"); err != nil {
			break
		}
		s.push(s.brain)
		if err = s.userCreds(s.brain, "brain", account.RoleBrain, "creds/brain.creds"); err != nil {
			break
		}
		s.write("accounts.env", fmt.Sprintf("BRAINCTL_BRAIN_ACCOUNT='%s'\nBRAINCTL_STREAMS_ACCOUNT='%s'\nBRAINCTL_SYSTEM_ACCOUNT='%s'\n",
			s.brain.Public, s.streams.Public, s.sys.Public), 0o644)
	case "tenant-acme":
		if s.acme == nil {
			if s.acme, err = s.op.TenantAccount("acme", nil, s.brain.Public, s.streams.Public); err != nil {
				break
			}
		}
		s.push(s.acme)
		if err = s.userCreds(s.acme, "edge", account.RoleEdge, "creds/acme-edge.creds"); err != nil {
			break
		}
		s.write("acme.account", s.acme.Public+"\n", 0o644)
	case "rotate-edge":
		err = s.userCreds(s.acme, "edge-2", account.RoleEdge, "creds/acme-edge-2.creds")
	case "revoke-edge":
		s.acme = s.revoke(s.acme, "edge")
	case "rotate-brain":
		err = s.userCreds(s.brain, "brain-2", account.RoleBrain, "creds/brain-2.creds")
	case "revoke-brain":
		s.brain = s.revoke(s.brain, "brain")
	case "offboard-acme":
		s.acme = s.revoke(s.acme, "edge-2")
	case "drop-acme":
		if s.acme != nil { // the block does nothing once nsc has no account acme
			s.remove(s.acme.Public)
			s.acme = nil
		}
	default:
		t.Fatalf("no stand-in for the runbook's nsc block %q: add one (and keep it doing what the block does)", name)
	}
	var refused refusedError
	if errors.As(err, &refused) {
		fmt.Fprintf(&s.rb.out, "stand-in refused: %v\n", err)
		return err
	}
	if err != nil {
		t.Fatalf("stand-in for nsc block %q: %v", name, err)
	}
	return nil
}

// userCreds writes a user's .creds as the nsc scripts do (upsert_user,
// then nsc generate creds): a new user the first time, the same user (the
// same key) after, and a refusal for a revoked user.
func (s *standIns) userCreds(acc *account.Account, user string, role account.Role, rel string) error {
	s.rb.t.Helper()
	id := acc.Name + "/" + user
	if s.revoked[id] {
		return refusedError{user: user, account: acc.Name}
	}
	if b, ok := s.creds[id]; ok {
		s.write(rel, string(b), 0o600)
		return nil
	}
	s.newCreds(acc, user, role, rel)
	return nil
}

// newCreds writes a new user's .creds and remembers its key.
func (s *standIns) newCreds(acc *account.Account, user string, role account.Role, rel string) {
	s.rb.t.Helper()
	b, err := account.UserCreds(acc, user, role)
	if err != nil {
		s.rb.t.Fatal(err)
	}
	tok, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		s.rb.t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		s.rb.t.Fatal(err)
	}
	s.users[acc.Name+"/"+user] = uc.Subject
	s.creds[acc.Name+"/"+user] = b
	s.write(rel, string(b), 0o600)
}

// revoke re-signs an account revoking one of its users (nsc revocations
// add-user) and pushes it.
func (s *standIns) revoke(acc *account.Account, user string) *account.Account {
	s.rb.t.Helper()
	pub, ok := s.users[acc.Name+"/"+user]
	if !ok {
		s.rb.t.Fatalf("stand-in: no user %s in %s", user, acc.Name)
	}
	prev, err := jwt.DecodeAccountClaims(acc.JWT)
	if err != nil {
		s.rb.t.Fatal(err)
	}
	seed, err := acc.Seed()
	if err != nil {
		s.rb.t.Fatal(err)
	}
	// A revocation covers JWTs issued up to its time, in whole seconds.
	next, err := s.op.SignTenantClaims(acc.Name, seed, func(c *jwt.AccountClaims) {
		*c = *prev
		c.RevokeAt(pub, time.Now().Add(time.Second))
	})
	if err != nil {
		s.rb.t.Fatal(err)
	}
	s.push(next)
	s.revoked[acc.Name+"/"+user] = true
	return next
}

// sysConn is a system account user's connection, as nsc push uses.
func (s *standIns) sysConn() *nats.Conn {
	s.rb.t.Helper()
	b, err := account.UserCreds(s.sys, "sys", account.RoleUnrestricted)
	if err != nil {
		s.rb.t.Fatal(err)
	}
	path := filepath.Join(s.rb.t.TempDir(), "sys.creds")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		s.rb.t.Fatal(err)
	}
	nc, err := nats.Connect(s.rb.env["NATS_URL"], nats.UserCredentials(path))
	if err != nil {
		s.rb.t.Fatalf("stand-in: connect as the system account: %v", err)
	}
	return nc
}

// push sends accounts to the server's resolver (nsc push).
func (s *standIns) push(accs ...*account.Account) {
	s.rb.t.Helper()
	nc := s.sysConn()
	defer nc.Close()
	for _, a := range accs {
		s.request(nc, "$SYS.REQ.CLAIMS.UPDATE", a.JWT, a.Name)
	}
}

// remove deletes an account from the resolver (nsc push --account-removal):
// a request signed by the operator.
func (s *standIns) remove(pub string) {
	s.rb.t.Helper()
	seed, err := s.op.Seed()
	if err != nil {
		s.rb.t.Fatal(err)
	}
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		s.rb.t.Fatal(err)
	}
	gc := jwt.NewGenericClaims(s.op.Public)
	gc.Data["accounts"] = []string{pub}
	tok, err := gc.Encode(kp)
	if err != nil {
		s.rb.t.Fatal(err)
	}
	nc := s.sysConn()
	defer nc.Close()
	s.request(nc, "$SYS.REQ.CLAIMS.DELETE", tok, pub)
}

func (s *standIns) request(nc *nats.Conn, subject, body, what string) {
	s.rb.t.Helper()
	m, err := nc.Request(subject, []byte(body), 5*time.Second)
	if err != nil {
		s.rb.t.Fatalf("stand-in: %s %s: %v", subject, what, err)
	}
	var res struct {
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &res); err != nil || res.Error != nil {
		s.rb.t.Fatalf("stand-in: %s %s: %s", subject, what, strings.TrimSpace(string(m.Data)))
	}
	fmt.Fprintf(&s.rb.out, "%s %s: %s\n", subject, what, strings.TrimSpace(string(m.Data)))
}
