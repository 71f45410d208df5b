//go:build nsc

package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
)

// TestNSCReRunKeepsARevokedUserRevoked runs the scripts with the real nsc,
// revokes their users as an operator would (nsc revocations add-user), and
// runs the scripts again: they must refuse, leaving the user's JWT, its
// .creds and the revocation as they were (re-signing the user would have
// un-revoked it). The remedy they print (delete the user, run again) gives
// a new user with a new key while the revocation keeps refusing the old one.
func TestNSCReRunKeepsARevokedUserRevoked(t *testing.T) {
	if _, err := exec.LookPath("nsc"); err != nil {
		t.Fatal("this test runs the real nsc (build tag nsc): install nsc first")
	}
	home := t.TempDir()
	env := append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, "config"),
		"XDG_DATA_HOME="+filepath.Join(home, "data"), "NKEYS_PATH="+filepath.Join(home, "nkeys"), "NSC_NO_GIT_IGNORE=1")
	exe := func(name string, args ...string) (string, error) {
		cmd := exec.Command(name, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exe(name, args...)
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return out
	}
	userClaims := func(acct, name string) (string, *jwt.UserClaims) {
		t.Helper()
		raw := lastLine(run("nsc", "describe", "user", "--account", acct, "--name", name, "--raw"))
		uc, err := jwt.DecodeUserClaims(raw)
		if err != nil {
			t.Fatal(err)
		}
		return raw, uc
	}
	accountClaims := func(acct string) *jwt.AccountClaims {
		t.Helper()
		ac, err := jwt.DecodeAccountClaims(lastLine(run("nsc", "describe", "account", "--name", acct, "--raw")))
		if err != nil {
			t.Fatal(err)
		}
		return ac
	}

	run("nsc", "add", "operator", "--name", "ops", "--sys")
	brainCreds, edgeCreds := filepath.Join(home, "brain.creds"), filepath.Join(home, "acme-edge.creds")
	run("./nsc-streams-account.sh", "--no-push", "--creds", filepath.Join(home, "provisioner.creds"), "ops")
	run("./nsc-brain-account.sh", "--no-push", "--creds", brainCreds, "ops")
	accountKey := func(name string) string {
		return strings.Trim(strings.TrimSpace(run("nsc", "describe", "account", "--name", name, "--field", "sub")), `"`)
	}
	onboard := []string{"--no-push", "--creds", edgeCreds, "acme", "ops", accountKey("BRAIN"), accountKey("STREAMS")}
	run("./nsc-onboard-tenant.sh", onboard...)

	for _, tc := range []struct {
		script, acct, user, creds string
		args                      []string
	}{
		{"./nsc-onboard-tenant.sh", "acme", "edge", edgeCreds, onboard},
		{"./nsc-brain-account.sh", "BRAIN", "brain", brainCreds, []string{"--no-push", "--creds", brainCreds, "ops"}},
	} {
		run("nsc", "revocations", "add-user", "--account", tc.acct, "--name", tc.user)
		rawBefore, uc := userClaims(tc.acct, tc.user)
		if !accountClaims(tc.acct).IsClaimRevoked(uc) {
			t.Fatalf("%s/%s is not revoked after nsc revocations add-user", tc.acct, tc.user)
		}
		credsBefore, err := os.ReadFile(tc.creds)
		if err != nil {
			t.Fatal(err)
		}

		out, err := exe(tc.script, tc.args...)
		if err == nil || !strings.Contains(out, "is revoked") || !strings.Contains(out, "nsc delete user --account "+tc.acct+" --name "+tc.user) {
			t.Fatalf("%s re-run on a revoked %s user: %v\n%s", tc.script, tc.user, err, out)
		}
		rawAfter, uc := userClaims(tc.acct, tc.user)
		if rawAfter != rawBefore || !accountClaims(tc.acct).IsClaimRevoked(uc) {
			t.Fatalf("%s re-signed the revoked %s user or dropped its revocation", tc.script, tc.user)
		}
		if credsAfter, _ := os.ReadFile(tc.creds); string(credsAfter) != string(credsBefore) {
			t.Fatalf("%s rewrote %s for a revoked user", tc.script, tc.creds)
		}

		// The remedy it prints: a new user, a new key; the old key stays revoked.
		run("nsc", "delete", "user", "--account", tc.acct, "--name", tc.user)
		run(tc.script, tc.args...)
		_, fresh := userClaims(tc.acct, tc.user)
		ac := accountClaims(tc.acct)
		if fresh.Subject == uc.Subject || ac.IsClaimRevoked(fresh) || !ac.IsClaimRevoked(uc) {
			t.Fatalf("after the remedy: new key %v, new user revoked %v, old user revoked %v",
				fresh.Subject != uc.Subject, ac.IsClaimRevoked(fresh), ac.IsClaimRevoked(uc))
		}
	}
}
