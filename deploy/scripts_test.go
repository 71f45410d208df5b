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
	"testing"
	"time"

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

func kind(service bool) string {
	if service {
		return "service"
	}
	return "stream"
}

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }

func checkPerms(t *testing.T, script string, arrays map[string][]string, prefix string, r account.Role) {
	t.Helper()
	p := account.Permissions(r)
	for name, want := range map[string][]string{
		prefix + "_ALLOW_PUB": p.Pub.Allow, prefix + "_DENY_PUB": p.Pub.Deny, prefix + "_ALLOW_SUB": p.Sub.Allow,
	} {
		if got := arrays[name]; !slices.Equal(sorted(got), sorted(want)) {
			t.Errorf("%s %s\n got %q\nwant %q (account.Permissions)", script, name, got, want)
		}
	}
	if len(p.Sub.Deny) != 0 {
		t.Errorf("%s: the role denies subscriptions %q: the script sets none", script, p.Sub.Deny)
	}
}

// TestStreamsAccountScriptMatchesTheCode keeps deploy/nsc-streams-account.sh
// in step with subjects.StreamsExports and account.Permissions(RoleProvisioner).
func TestStreamsAccountScriptMatchesTheCode(t *testing.T) {
	arrays, scalars := shellArrays(t, "nsc-streams-account.sh")
	var want []string
	for _, e := range subjects.StreamsExports() {
		response := "single"
		if e.Streamed {
			response = "stream"
		}
		if e.Private != (e.TokenPosition == 0) {
			t.Fatalf("export %s: private exports have no token position, public ones have one", e.Name)
		}
		want = append(want, fmt.Sprintf("%s|%s|%d|%s|%s", e.Name, kind(e.IsService), e.TokenPosition, response, e.Subject))
	}
	if got := arrays["EXPORTS"]; !slices.Equal(sorted(got), sorted(want)) {
		t.Errorf("nsc-streams-account.sh EXPORTS\n got %q\nwant %q (subjects.StreamsExports)", got, want)
	}
	checkPerms(t, "nsc-streams-account.sh", arrays, "PROVISIONER", account.RoleProvisioner)
	if got, err := time.ParseDuration(scalars["RESPONSE_THRESHOLD"]); err != nil || got != account.StreamedResponseThreshold {
		t.Errorf("RESPONSE_THRESHOLD=%q (%v), want %s (account.StreamedResponseThreshold)", scalars["RESPONSE_THRESHOLD"], err, account.StreamedResponseThreshold)
	}
}

// TestBrainAccountScriptMatchesTheCode keeps deploy/nsc-brain-account.sh in
// step with subjects.BrainExports, subjects.BrainImports and
// account.Permissions(RoleBrain).
func TestBrainAccountScriptMatchesTheCode(t *testing.T) {
	arrays, scalars := shellArrays(t, "nsc-brain-account.sh")
	var want []string
	for _, e := range subjects.BrainExports() {
		want = append(want, fmt.Sprintf("%s|%s|%d|%s", e.Name, kind(e.IsService), e.TokenPosition, e.Subject))
	}
	if got := arrays["EXPORTS"]; !slices.Equal(sorted(got), sorted(want)) {
		t.Errorf("nsc-brain-account.sh EXPORTS\n got %q\nwant %q (subjects.BrainExports)", got, want)
	}
	want = nil
	for _, im := range subjects.BrainImports() {
		if !im.IsService || im.From != subjects.AccountStreams {
			t.Fatalf("import %s: the script imports services from STREAMS only", im.Name)
		}
		want = append(want, fmt.Sprintf("%s|%s|%s", im.Name, im.Subject, im.Local))
	}
	if got := arrays["IMPORTS"]; !slices.Equal(sorted(got), sorted(want)) {
		t.Errorf("nsc-brain-account.sh IMPORTS\n got %q\nwant %q (subjects.BrainImports)", got, want)
	}
	checkPerms(t, "nsc-brain-account.sh", arrays, "BRAIN", account.RoleBrain)
	p := account.Permissions(account.RoleBrain)
	if p.Resp == nil || strconv.Itoa(p.Resp.MaxMsgs) != scalars["BRAIN_MAX_RESPONSES"] || p.Resp.Expires != 0 {
		t.Errorf("response permission %+v, script BRAIN_MAX_RESPONSES=%q", p.Resp, scalars["BRAIN_MAX_RESPONSES"])
	}
}

// TestOnboardTenantScriptMatchesTheCode keeps deploy/nsc-onboard-tenant.sh
// in step with subjects.TenantImports, account.Permissions(RoleEdge) and the
// tenant account's bounds.
func TestOnboardTenantScriptMatchesTheCode(t *testing.T) {
	arrays, scalars := shellArrays(t, "nsc-onboard-tenant.sh")
	const acc = "{ACC}"
	var want []string
	for _, im := range subjects.TenantImports(acc) {
		from := map[string]string{subjects.AccountStreams: "streams", subjects.AccountBrain: "brain"}[im.From]
		want = append(want, fmt.Sprintf("%s|%s|%s|%s|%s", im.Name, from, kind(im.IsService), im.Subject, im.Local))
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
	// The tenant account's bounds.
	_, sysPub, _ := account.NewAccountKey(nil)
	op, err := account.NewOperator("t", nil, sysPub)
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
	tn, err := op.TenantAccount("t", nil, br.Public, st.Public)
	if err != nil {
		t.Fatal(err)
	}
	ac, err := jwt.DecodeAccountClaims(tn.JWT)
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]int64{"TENANT_MAX_CONNS": ac.Limits.Conn, "TENANT_MAX_PAYLOAD": ac.Limits.Payload, "TENANT_MAX_SUBS": ac.Limits.Subs} {
		if strconv.FormatInt(v, 10) != scalars[name] {
			t.Errorf("tenant bound %s: account.TenantAccount %d, script %q", name, v, scalars[name])
		}
	}
}

func TestScriptsAreValidBash(t *testing.T) {
	for _, s := range []string{"nsc-streams-account.sh", "nsc-brain-account.sh", "nsc-onboard-tenant.sh", "ensure-postgres.sh"} {
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
