package tests

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"n8nbrain/deploy/devstack"
	"n8nbrain/nats/account"
	"n8nbrain/provision"
	"n8nbrain/provision/admin"
	"n8nbrain/registry"
)

// ctl runs brainctl in-process against a system, with the environment an
// operator would export: the registry's admin URL, the sealing key, the
// STREAMS provisioner's credentials and the operator's own account keys.
type ctl struct {
	t   testing.TB
	env map[string]string
}

func (s *system) brainctl() *ctl {
	st := s.stack
	return &ctl{t: s.t, env: map[string]string{
		"BRAINCTL_ADMIN_URL":       s.adminURL,
		"BRAINCTL_PREFIX":          st.Ops.Prefix,
		"BRAIN_SEALING_KEY":        hex.EncodeToString(st.SealingKey),
		"BRAINCTL_NATS_URL":        st.NATS.ClientURL(),
		"BRAINCTL_NATS_CREDS":      st.ProvisionerCreds,
		"BRAINCTL_ACK_WAIT":        s.streams.AckWaitOrDefault().String(),
		"BRAINCTL_BRAIN_ACCOUNT":   st.Brain.Public,
		"BRAINCTL_STREAMS_ACCOUNT": st.StreamsAccount.Public,
		"BRAINCTL_SYSTEM_ACCOUNT":  st.IDs.System.Public,
	}}
}

// with returns a copy with more (or, with "", fewer) variables.
func (c *ctl) with(kv ...string) *ctl {
	env := maps.Clone(c.env)
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			delete(env, kv[i])
		} else {
			env[kv[i]] = kv[i+1]
		}
	}
	return &ctl{t: c.t, env: env}
}

// run runs one brainctl command and returns its exit code and output.
func (c *ctl) run(args ...string) (code int, stdout, stderr string) {
	c.t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code = admin.Main(ctx, args, admin.Env{Getenv: func(k string) string { return c.env[k] }, Stdout: &out, Stderr: &errOut})
	return code, out.String(), errOut.String()
}

// ok runs a command that must succeed and returns its output.
func (c *ctl) ok(args ...string) string {
	c.t.Helper()
	code, out, errOut := c.run(args...)
	if code != admin.ExitOK {
		c.t.Fatalf("brainctl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// json runs a command with --json and decodes its output into v; it
// returns the exit code (the output is JSON either way).
func (c *ctl) json(v any, args ...string) int {
	c.t.Helper()
	code, out, errOut := c.run(append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		c.t.Fatalf("brainctl %s --json: exit %d, output is not JSON (%v):\n%s\nstderr:\n%s", strings.Join(args, " "), code, err, out, errOut)
	}
	return code
}

// onboard does what deploy/nsc-onboard-tenant.sh does for a tenant: its
// NATS account (importing STREAMS and BRAIN, pushed to the server) and an
// edge user's .creds. The database side is brainctl's.
func (s *system) onboard(id string) *devstack.Tenant {
	s.t.Helper()
	st := s.stack
	acc, err := st.Operator.TenantAccount(id, nil, st.Brain.Public, st.StreamsAccount.Public)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := st.NATS.PutAccount(acc.Public, acc.JWT); err != nil {
		s.t.Fatal(err)
	}
	creds, err := account.UserCreds(acc, "edge", account.RoleEdge)
	if err != nil {
		s.t.Fatal(err)
	}
	path := filepath.Join(s.t.TempDir(), id+"-edge.creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		s.t.Fatal(err)
	}
	return &devstack.Tenant{ID: registry.TenantID(id), Account: acc, EdgeCreds: path, Token: "token-" + randomHex(12)}
}

// createResult is what `brainctl tenant create --json` prints.
type createResult struct {
	Tenant struct {
		ID       string `json:"id"`
		Database string `json:"database"`
		Cluster  string `json:"cluster"`
	} `json:"tenant"`
	Created  bool     `json:"created"`
	Database string   `json:"database"`
	Roles    []string `json:"roles"`
	Streams  string   `json:"streams"`
}

// quoteRules is a rules file with the harness's confident quote rule.
const quoteRules = `rules:
  - name: quotes
    match:
      subject_keywords: [quote]
    category: quote_request
    priority: high
    action: draft_reply
    params:
      subject: "Re: your quote request"
      body: "Thanks, we will send a quote shortly."
      tone: friendly
    confidence: 0.95
`

// createTenant runs `brainctl tenant create` for an onboarded tenant with
// the harness's rules, and records its database for tenantDB.
func (s *system) createTenant(c *ctl, tn *devstack.Tenant, extra ...string) createResult {
	s.t.Helper()
	rules := filepath.Join(s.t.TempDir(), string(tn.ID)+"-rules.yaml")
	if err := os.WriteFile(rules, []byte(quoteRules), 0o600); err != nil {
		s.t.Fatal(err)
	}
	var res createResult
	args := append([]string{"tenant", "create", string(tn.ID), "--account", tn.Account.Public,
		"--actions", "draft_reply,send_reply,escalate_item,close_item", "--rules", rules}, extra...)
	if code := c.json(&res, args...); code != admin.ExitOK || !res.Created {
		s.t.Fatalf("tenant create %s: exit %d, %+v", tn.ID, code, res)
	}
	tn.DB = &provision.Tenant{DBName: res.Database}
	return res
}
