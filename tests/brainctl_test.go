package tests

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/edge"
	"n8nbrain/provision/admin"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// provisioner is a STREAMS provisioner connection, to look at streams.
func (s *system) provisioner() jetstream.JetStream {
	s.t.Helper()
	nc, err := nats.Connect(s.stack.NATS.ClientURL(), nats.UserCredentials(s.stack.ProvisionerCreds))
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		s.t.Fatal(err)
	}
	return js
}

// TestBrainctlTenantLifecycle runs a tenant's whole life with brainctl
// only, on a real NATS server and Postgres with a real brain and edges:
// two tenants created (database, roles, grants, registry row, streams),
// turns through each edge landing in its own database, a quota change
// reaching the streams, disable and enable, a delete refused while work is
// open, then forced, and what it removed really gone.
func TestBrainctlTenantLifecycle(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	c := s.brainctl()
	alpha, beta := s.onboard("alpha"), s.onboard("beta")
	ra := s.createTenant(c, alpha)
	s.createTenant(c, beta)
	if !strings.Contains(ra.Streams, subjects.TurnsStream(alpha.Account.Public)) {
		t.Fatalf("create reports streams %q", ra.Streams)
	}
	// Re-running the step is safe: nothing changes, the exit is 0.
	var again createResult
	if code := c.json(&again, "tenant", "create", "alpha", "--account", alpha.Account.Public); code != admin.ExitOK || again.Created {
		t.Fatalf("second create: exit %d, %+v", code, again)
	}
	// The same settings again (in another order) are the same step; other
	// settings are refused, not ignored: a create is not an update.
	if code, out, errOut := c.run("tenant", "create", "alpha", "--account", alpha.Account.Public,
		"--actions", "close_item,escalate_item,send_reply,draft_reply", "--turn-ceiling", "8"); code != admin.ExitOK || !strings.Contains(out, "exists") {
		t.Fatalf("create again with the same settings: exit %d, %s%s", code, out, errOut)
	}
	if code, _, errOut := c.run("tenant", "create", "alpha", "--account", alpha.Account.Public, "--approval-mode", "mailbox", "--turn-ceiling", "3"); code != admin.ExitError ||
		!strings.Contains(errOut, "approval_mode, turn_ceiling") || !strings.Contains(errOut, "tenant update") {
		t.Fatalf("create again with other settings: exit %d, %s", code, errOut)
	}
	// Rules the same way: the file it was created with passes, another is
	// refused naming --rules and the command that replaces rules.
	same := filepath.Join(t.TempDir(), "same.yaml")
	other := filepath.Join(t.TempDir(), "other.yaml")
	if err := os.WriteFile(same, []byte(quoteRules), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, []byte(strings.Replace(quoteRules, "confidence: 0.95", "confidence: 0.5", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	actions := "draft_reply,send_reply,escalate_item,close_item"
	if code, out, errOut := c.run("tenant", "create", "alpha", "--account", alpha.Account.Public, "--actions", actions, "--rules", same); code != admin.ExitOK ||
		!strings.Contains(out, "exists") {
		t.Fatalf("create again with the same rules: exit %d, %s%s", code, out, errOut)
	}
	if code, _, errOut := c.run("tenant", "create", "alpha", "--account", alpha.Account.Public, "--actions", actions, "--rules", other); code != admin.ExitError ||
		!strings.Contains(errOut, "--rules: the tenant exists with other rules") || !strings.Contains(errOut, "rules import") {
		t.Fatalf("create again with other rules: exit %d, %s", code, errOut)
	}
	if out := c.ok("rules", "export", "alpha", "--format", "yaml"); !strings.Contains(out, "0.95") {
		t.Fatalf("a refused create changed the rules:\n%s", out)
	}
	if out := c.ok("tenant", "show", "alpha"); !strings.Contains(out, "review_app") || !strings.Contains(out, "password sealed with the current key") {
		t.Fatalf("a refused create changed the tenant, or show does not say which key seals it:\n%s", out)
	}
	// Without the key, show says it did not check, and how to.
	if out := c.with("BRAIN_SEALING_KEY", "").ok("tenant", "show", "alpha"); !strings.Contains(out, "password sealing not checked: give --sealing-key") {
		t.Fatalf("show without the sealing key:\n%s", out)
	}

	s.startBrain("r1", nil)
	ea := s.startEdge(alpha, func(c *edge.Config) { c.PublishTimeout = time.Second })
	eb := s.startEdge(beta, nil)
	if rep := ea.submit(quoteEmail("<a1@x>")).reply(t); rep.Status != wire.WorkItemStatusAwaitingApproval {
		t.Fatalf("alpha turn: %+v", rep)
	}
	if rep := eb.submit(quoteEmail("<b1@x>")).reply(t); rep.Status != wire.WorkItemStatusAwaitingApproval {
		t.Fatalf("beta turn: %+v", rep)
	}
	dbA, dbB := s.tenantDB(alpha), s.tenantDB(beta)
	for _, c := range []struct {
		db   string
		n    int
		want int
	}{
		{"alpha has its own item", count(t, dbA, `SELECT count(*) FROM work_items WHERE id = '<a1@x>'`), 1},
		{"alpha has not beta's", count(t, dbA, `SELECT count(*) FROM work_items WHERE id = '<b1@x>'`), 0},
		{"beta has its own item", count(t, dbB, `SELECT count(*) FROM work_items WHERE id = '<b1@x>'`), 1},
		{"beta has not alpha's", count(t, dbB, `SELECT count(*) FROM work_items WHERE id = '<a1@x>'`), 0},
	} {
		if c.n != c.want {
			t.Errorf("%s: %d rows, want %d", c.db, c.n, c.want)
		}
	}

	// A quota change reaches the tenant's stream and consumer.
	js := s.provisioner()
	c.ok("tenant", "update", "beta", "--quota-turns", "500", "--max-inflight", "4")
	st, err := js.Stream(context.Background(), subjects.TurnsStream(beta.Account.Public))
	if err != nil {
		t.Fatal(err)
	}
	if st.CachedInfo().Config.MaxMsgs != 500 {
		t.Errorf("beta's stream holds %d turns after the update, want 500", st.CachedInfo().Config.MaxMsgs)
	}
	cons, err := st.Consumer(context.Background(), subjects.TurnsConsumer)
	if err != nil || cons.CachedInfo().Config.MaxAckPending != 4 {
		t.Errorf("beta's consumer after the update: %v %+v", err, cons)
	}
	// An invalid change is refused naming the tenant and the field; nothing changes.
	code, _, errOut := c.run("tenant", "update", "beta", "--approval-mode", "fax")
	if code != admin.ExitError || !strings.Contains(errOut, "tenant beta") || !strings.Contains(errOut, "approval mode") {
		t.Errorf("invalid update: exit %d, %s", code, errOut)
	}

	// Disable: the brain refuses the tenant's turns within moments; enable: served again.
	c.ok("tenant", "disable", "alpha")
	n := 0
	eventually(t, 10*time.Second, "alpha's turns refused", func() bool {
		n++
		r := ea.submit(quoteEmail(fmt.Sprintf("<a-dis-%d@x>", n)))
		return r.Status == http.StatusForbidden && strings.Contains(string(r.Body), wire.ReasonTenantDisabled)
	})
	if rep := eb.submit(quoteEmail("<b2@x>")).reply(t); rep.Status != wire.WorkItemStatusAwaitingApproval {
		t.Fatalf("beta while alpha is disabled: %+v", rep)
	}
	c.ok("tenant", "enable", "alpha")
	eventually(t, 10*time.Second, "alpha's turns served again", func() bool {
		n++
		return ea.submit(quoteEmail(fmt.Sprintf("<a-en-%d@x>", n))).Status == http.StatusOK
	})

	// Delete is refused while work is open, and leaves the tenant as it was.
	var refused struct{ Error *admin.Error }
	if code := c.json(&refused, "tenant", "delete", "alpha"); code != admin.ExitError || refused.Error == nil ||
		refused.Error.Tenant != "alpha" || refused.Error.Field != "--force" || !strings.Contains(refused.Error.Message, "open work items") {
		t.Fatalf("delete with open work: exit %d, %+v", code, refused.Error)
	}
	var shown struct {
		Tenant struct{ Status string }
	}
	c.json(&shown, "tenant", "show", "alpha")
	if shown.Tenant.Status != "active" {
		t.Fatalf("after a refused delete alpha is %q, want active", shown.Tenant.Status)
	}

	// Forced: it says what it removed, and all of it is gone.
	var del struct {
		RegistryRow    bool     `json:"registry_row"`
		Rules          int      `json:"rules"`
		Database       string   `json:"database"`
		DroppedDB      bool     `json:"database_dropped"`
		Roles          []string `json:"roles_dropped"`
		StreamsDeleted []string `json:"streams_deleted"`
		Work           struct{ Open int }
	}
	if code := c.json(&del, "tenant", "delete", "alpha", "--force"); code != admin.ExitOK {
		t.Fatalf("forced delete: exit %d", code)
	}
	if !del.RegistryRow || del.Rules != 1 || !del.DroppedDB || del.Database != alpha.DB.DBName || len(del.Roles) != 2 ||
		len(del.StreamsDeleted) != 2 || del.Work.Open == 0 {
		t.Fatalf("delete report: %+v", del)
	}
	dbA.Close(context.Background())
	pg := s.adminConn("postgres")
	if n := count(t, pg, `SELECT count(*) FROM pg_database WHERE datname = $1`, alpha.DB.DBName); n != 0 {
		t.Errorf("alpha's database is still there")
	}
	if n := count(t, pg, `SELECT count(*) FROM pg_roles WHERE rolname = ANY($1)`, del.Roles); n != 0 {
		t.Errorf("%d of alpha's roles are still there", n)
	}
	for _, name := range []string{subjects.TurnsStream(alpha.Account.Public), subjects.ResultsStream(alpha.Account.Public)} {
		if _, err := js.Stream(context.Background(), name); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("stream %s after delete: %v", name, err)
		}
	}
	var list struct {
		Tenants []struct{ ID string }
	}
	c.json(&list, "tenant", "list")
	if len(list.Tenants) != 1 || list.Tenants[0].ID != "beta" {
		t.Fatalf("tenants after delete: %+v", list.Tenants)
	}
	// Alpha's edge reaches nothing any more; beta is untouched.
	if e := ea.submit(quoteEmail("<a-gone@x>")).error(t, http.StatusServiceUnavailable); e.Reason != wire.ReasonNotProvisioned {
		t.Fatalf("alpha after delete: %+v", e)
	}
	if rep := eb.submit(quoteEmail("<b3@x>")).reply(t); rep.Status != wire.WorkItemStatusAwaitingApproval {
		t.Fatalf("beta after alpha's delete: %+v", rep)
	}
	// Deleting again finds nothing left and says so.
	if code := c.json(&del, "tenant", "delete", "alpha", "--account", alpha.Account.Public); code != admin.ExitOK || del.RegistryRow || del.DroppedDB || len(del.Roles) != 0 {
		t.Fatalf("second delete: exit %d, %+v", code, del)
	}
	// A name that was never a tenant is not reported deleted.
	if out := c.ok("tenant", "delete", "alpah"); !strings.Contains(out, "nothing of it was found") || strings.Contains(out, "deleted:") {
		t.Fatalf("delete of a mistyped name: %s", out)
	}
	// Repairing a tenant that is gone fails and says which and why.
	if code, _, errOut := c.run("tenant", "repair", "alpha"); code != admin.ExitError ||
		!strings.Contains(errOut, "alpha") || !strings.Contains(errOut, "not in the registry") {
		t.Fatalf("repair of a deleted tenant: exit %d, %s", code, errOut)
	}
}

// TestBrainctlRefusesOperatorAccountsAndMissingSettings: a tenant is never
// registered with the BRAIN, STREAMS or system account, and a create that
// cannot make the streams fails before anything exists.
func TestBrainctlRefusesOperatorAccountsAndMissingSettings(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	c := s.brainctl()
	for name, key := range map[string]string{"BRAIN": s.stack.Brain.Public, "STREAMS": s.stack.StreamsAccount.Public, "system": s.stack.IDs.System.Public} {
		code, _, errOut := c.run("tenant", "create", "sneaky", "--account", key)
		if code != admin.ExitError || !strings.Contains(errOut, "is the "+name+" account") {
			t.Errorf("create with the %s account: exit %d, %s", name, code, errOut)
		}
	}
	code, _, errOut := c.with("BRAINCTL_BRAIN_ACCOUNT", "").run("tenant", "create", "sneaky", "--account", s.onboard("sneaky").Account.Public)
	if code != admin.ExitError || !strings.Contains(errOut, "--brain-account") {
		t.Errorf("create without the BRAIN key: exit %d, %s", code, errOut)
	}
	code, _, errOut = c.with("BRAINCTL_NATS_CREDS", "").run("tenant", "create", "sneaky", "--account", s.onboard("sneaky2").Account.Public)
	if code != admin.ExitError || !strings.Contains(errOut, "--skip-streams") || !strings.Contains(errOut, "tenant sneaky") {
		t.Errorf("create without NATS credentials: exit %d, %s", code, errOut)
	}
	var list struct{ Tenants []any }
	c.json(&list, "tenant", "list")
	if len(list.Tenants) != 0 {
		t.Fatalf("refused creates left tenants: %+v", list.Tenants)
	}
	pg := s.adminConn("postgres")
	if n := count(t, pg, `SELECT count(*) FROM pg_database WHERE datname LIKE $1`, s.stack.Ops.Prefix+"tenant_sneaky%"); n != 0 {
		t.Fatalf("refused creates left %d databases", n)
	}
}
