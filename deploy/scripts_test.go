// Tests of the ops scripts in deploy/: the nsc onboarding scripts must
// create exactly the accounts, exports, imports and permissions that
// package account creates for the tests and the dev stack.
package deploy_test

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"

	"n8nbrain/nats/account"
	"n8nbrain/subjects"
)

// shellArrays returns the single-quoted elements of every NAME=( ... ) array
// and the value of every NAME=value assignment in a bash script.
func shellArrays(t *testing.T, path string) (arrays map[string][]string, scalars map[string]string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	arrays, scalars = map[string][]string{}, map[string]string{}
	arrayRe := regexp.MustCompile(`(?ms)^([A-Z_]+)=\((.*?)\)$`)
	for _, m := range arrayRe.FindAllStringSubmatch(string(b), -1) {
		var elems []string
		for _, q := range regexp.MustCompile(`'([^']*)'`).FindAllStringSubmatch(m[2], -1) {
			elems = append(elems, q[1])
		}
		arrays[m[1]] = elems
	}
	for _, m := range regexp.MustCompile(`(?m)^([A-Z_]+)=([^(\s]\S*)$`).FindAllStringSubmatch(string(b), -1) {
		scalars[m[1]] = m[2]
	}
	return arrays, scalars
}

func fields(t *testing.T, s string, n int) []string {
	t.Helper()
	f := strings.Split(s, "|")
	if len(f) != n {
		t.Fatalf("%q: want %d |-separated fields", s, n)
	}
	return f
}

func kind(service bool) string {
	if service {
		return "service"
	}
	return "stream"
}

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }

// TestBrainAccountScriptMatchesTheCode keeps deploy/nsc-brain-account.sh in
// step with subjects.BrainExports and account.Permissions(RoleBrain).
func TestBrainAccountScriptMatchesTheCode(t *testing.T) {
	arrays, scalars := shellArrays(t, "nsc-brain-account.sh")
	var want, got []string
	for _, e := range subjects.BrainExports() {
		want = append(want, fmt.Sprintf("%s|%s|%d|%s", e.Name, kind(e.IsService), e.TokenPosition, e.Subject))
	}
	got = arrays["EXPORTS"]
	if !slices.Equal(sorted(got), sorted(want)) {
		t.Errorf("nsc-brain-account.sh EXPORTS\n got %q\nwant %q (subjects.BrainExports)", got, want)
	}
	p := account.Permissions(account.RoleBrain)
	for name, want := range map[string][]string{
		"BRAIN_ALLOW_PUB": p.Pub.Allow, "BRAIN_DENY_PUB": p.Pub.Deny, "BRAIN_ALLOW_SUB": p.Sub.Allow,
	} {
		if got := arrays[name]; !slices.Equal(sorted(got), sorted(want)) {
			t.Errorf("nsc-brain-account.sh %s\n got %q\nwant %q (account.Permissions(RoleBrain))", name, got, want)
		}
	}
	if len(p.Sub.Deny) != 0 {
		t.Errorf("RoleBrain denies subscriptions %q: the script sets none", p.Sub.Deny)
	}
	if p.Resp == nil || strconv.Itoa(p.Resp.MaxMsgs) != scalars["BRAIN_MAX_RESPONSES"] || p.Resp.Expires != 0 {
		t.Errorf("response permission %+v, script BRAIN_MAX_RESPONSES=%q", p.Resp, scalars["BRAIN_MAX_RESPONSES"])
	}
}

// TestOnboardTenantScriptMatchesTheCode keeps deploy/nsc-onboard-tenant.sh
// in step with subjects.TenantImports and account.Permissions(RoleEdge).
func TestOnboardTenantScriptMatchesTheCode(t *testing.T) {
	arrays, scalars := shellArrays(t, "nsc-onboard-tenant.sh")
	const acc = "{ACC}"
	var want []string
	for _, im := range subjects.TenantImports(acc) {
		want = append(want, fmt.Sprintf("%s|%s|%s|%s", im.Name, kind(im.IsService), im.Subject, im.Local))
	}
	if got := arrays["IMPORTS"]; !slices.Equal(sorted(got), sorted(want)) {
		t.Errorf("nsc-onboard-tenant.sh IMPORTS\n got %q\nwant %q (subjects.TenantImports)", got, want)
	}
	p := account.Permissions(account.RoleEdge)
	for name, want := range map[string][]string{"EDGE_ALLOW_PUB": p.Pub.Allow, "EDGE_ALLOW_SUB": p.Sub.Allow} {
		if got := arrays[name]; !slices.Equal(sorted(got), sorted(want)) {
			t.Errorf("nsc-onboard-tenant.sh %s\n got %q\nwant %q (account.Permissions(RoleEdge))", name, got, want)
		}
	}
	if len(p.Pub.Deny) != 0 || len(p.Sub.Deny) != 0 || p.Resp != nil {
		t.Errorf("RoleEdge has denies or response permissions the script does not set: %+v", p)
	}
	// The tenant account's connection limit.
	_, sysPub, _ := account.NewAccountKey(nil)
	op, err := account.NewOperator("t", nil, sysPub)
	if err != nil {
		t.Fatal(err)
	}
	br, err := op.BrainAccount(nil)
	if err != nil {
		t.Fatal(err)
	}
	tn, err := op.TenantAccount("t", nil, br.Public)
	if err != nil {
		t.Fatal(err)
	}
	ac, err := jwt.DecodeAccountClaims(tn.JWT)
	if err != nil {
		t.Fatal(err)
	}
	if strconv.FormatInt(ac.Limits.Conn, 10) != scalars["TENANT_MAX_CONNS"] {
		t.Errorf("tenant connections: account.TenantAccount %d, script TENANT_MAX_CONNS=%q", ac.Limits.Conn, scalars["TENANT_MAX_CONNS"])
	}
}

func TestScriptsAreValidBash(t *testing.T) {
	for _, s := range []string{"nsc-brain-account.sh", "nsc-onboard-tenant.sh", "ensure-postgres.sh"} {
		if out, err := exec.Command("bash", "-n", s).CombinedOutput(); err != nil {
			t.Errorf("bash -n %s: %v\n%s", s, err, out)
		}
		if fi, err := os.Stat(s); err != nil || fi.Mode().Perm()&0o100 == 0 {
			t.Errorf("%s is not executable: %v %v", s, fi, err)
		}
		if _, err := exec.LookPath("shellcheck"); err == nil {
			if out, err := exec.Command("shellcheck", "-x", s).CombinedOutput(); err != nil {
				t.Errorf("shellcheck %s: %v\n%s", s, err, out)
			}
		}
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
