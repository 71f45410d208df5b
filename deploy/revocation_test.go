package deploy_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"n8nbrain/nats/account"
)

// nscAccountJSON is an account JWT's claims as `nsc describe account --json`
// prints them: the JWT body decoded into a map and encoded with a one-space
// indent, HTML escaping off (nsc's cmd/describe.go bodyAsJson). compact
// prints it on one line, as a future nsc might.
func nscAccountJSON(t *testing.T, tok string, compact bool) []byte {
	t.Helper()
	parts := strings.Split(tok, ".")
	body, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if !compact {
		enc.SetIndent("", " ")
	}
	if err := enc.Encode(m); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func userKey(t *testing.T) string {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// tenantClaims signs a tenant account whose claims revoke the given keys.
func tenantClaims(t *testing.T, revoke ...string) string {
	t.Helper()
	_, sysPub, _ := account.NewAccountKey(nil)
	op, err := account.NewOperator("ops", nil, sysPub)
	if err != nil {
		t.Fatal(err)
	}
	st, err := op.StreamsAccount(nil)
	if err != nil {
		t.Fatal(err)
	}
	br, err := op.BrainAccount(nil, st)
	if err != nil {
		t.Fatal(err)
	}
	acc, err := op.TenantAccount("acme", nil, br.Public, st.Public)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range revoke {
		if k == jwt.All {
			ac, err := jwt.DecodeAccountClaims(acc.JWT)
			if err != nil {
				t.Fatal(err)
			}
			ac.RevokeAt(jwt.All, time.Now())
			acc, err = op.SignTenantClaims("acme", mustSeed(t, acc), func(c *jwt.AccountClaims) { *c = *ac })
			if err != nil {
				t.Fatal(err)
			}
			continue
		}
		if acc, err = op.RevokeUser(acc, k, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	return acc.JWT
}

func mustSeed(t *testing.T, a *account.Account) []byte {
	t.Helper()
	s, err := a.Seed()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// libCall runs a function of nsc-lib.sh in bash with stdin and extra
// environment, and returns its exit code and output.
func libCall(t *testing.T, stdin []byte, env []string, call string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{"-c", `set -euo pipefail; . ./nsc-lib.sh; ` + call + ` "$@"`, "lib"}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

// TestRevokesUser: the decision the nsc scripts take before re-signing a
// user, on account claims as nsc prints them.
func TestRevokesUser(t *testing.T) {
	t.Parallel()
	edge, other := userKey(t), userKey(t)
	for _, tc := range []struct {
		name    string
		revoke  []string
		revoked bool
	}{
		{"NoRevocations", nil, false},
		{"ThisUser", []string{edge}, true},
		{"AnotherUser", []string{other}, false},
		{"ThisAndAnother", []string{other, edge}, true},
		{"EveryUser", []string{jwt.All}, true},
	} {
		claims := tenantClaims(t, tc.revoke...)
		for _, compact := range []bool{false, true} {
			code, out := libCall(t, nscAccountJSON(t, claims, compact), nil, "revokes_user", edge)
			if want := map[bool]int{true: 0, false: 1}[tc.revoked]; code != want {
				t.Errorf("%s (compact %v): revokes_user exit %d, want %d\n%s", tc.name, compact, code, want, out)
			}
		}
	}
	if code, _ := libCall(t, nil, nil, "revokes_user", "not-a-key"); code != 2 {
		t.Errorf("revokes_user with a malformed key: exit %d, want 2", code)
	}
}

// TestUpsertUserKeepsARevokedUserRevoked runs upsert_user, what both
// scripts call for their user, against a stand-in for the nsc command that
// answers describe with the given claims and records every call: a revoked
// user must be refused with a message saying why and what to do, and never
// re-signed (nsc edit user would un-revoke it). The real nsc runs the same
// path in nsc_test.go (-tags nsc).
func TestUpsertUserKeepsARevokedUserRevoked(t *testing.T) {
	// The stand-in is written before t.Parallel, while no other test runs:
	// a process another test forks while the file is open for writing
	// would hold it open, and exec would fail with "text file busy" (the
	// script would then take describe's failure for a missing user).
	bin := t.TempDir()
	fake := `#!/usr/bin/env bash
echo "$*" >>"$NSC_CALLS"
case "$1 $2" in
"describe user") if [[ " $* " == *" --field sub "* ]]; then echo "\"$NSC_USER_KEY\""; fi ;;
"describe account") cat "$NSC_ACCOUNT_JSON" ;;
esac
`
	if err := os.WriteFile(filepath.Join(bin, "nsc"), []byte(fake), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Parallel()
	edge := userKey(t)
	for _, tc := range []struct {
		name    string
		revoke  []string
		refused bool
	}{
		{"Revoked", []string{edge}, true},
		{"NotRevoked", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			claims := filepath.Join(dir, "account.json")
			if err := os.WriteFile(claims, nscAccountJSON(t, tenantClaims(t, tc.revoke...), false), 0o600); err != nil {
				t.Fatal(err)
			}
			calls := filepath.Join(dir, "calls")
			env := []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "NSC_CALLS=" + calls, "NSC_USER_KEY=" + edge, "NSC_ACCOUNT_JSON=" + claims}
			code, out := libCall(t, nil, env, "upsert_user", "acme", "edge", "--allow-pub", "turn.>")
			b, err := os.ReadFile(calls)
			if err != nil {
				t.Fatal(err)
			}
			edited := strings.Contains(string(b), "edit user")
			if tc.refused {
				if code == 0 || edited || !strings.Contains(out, "revoked") || !strings.Contains(out, "nsc delete user --account acme --name edge") {
					t.Fatalf("revoked user: exit %d, edited %v, output:\n%s\ncalls:\n%s", code, edited, out, b)
				}
				return
			}
			if code != 0 || !edited {
				t.Fatalf("user not revoked: exit %d, edited %v, output:\n%s\ncalls:\n%s", code, edited, out, b)
			}
		})
	}
}
