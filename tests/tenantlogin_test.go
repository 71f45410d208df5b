package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"n8nbrain/brain"
	"n8nbrain/wire"
)

// A tenant's role changes its own defaults and then its own password, as
// Postgres lets any role do (ALTER ROLE CURRENT_USER …): the brain keeps
// working through the changed defaults (it pins what it relies on when it
// connects), reports the locked-out tenant by name (its reply, /readyz,
// metrics, one log line) instead of retrying in silence, and works again as
// soon as the operator repairs the role (brainctl tenant repair).
func TestTenantRoleChangingItselfIsReportedAndRepaired(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("self-alter"))
	_, opsURL := s.startOpsBrain("r1", nil)
	ea := s.startEdge(a, nil)
	ea.submit(quoteEmail("<before@x>")).reply(t)

	ctx := context.Background()
	self, err := pgx.Connect(ctx, a.DB.AppURL)
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close(ctx)
	var selfPID int
	if err := self.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&selfPID); err != nil {
		t.Fatal(err)
	}
	admin := s.tenantDB(a)
	// dropSessions ends the brain's connections and waits until they are
	// gone, so the next ones log in anew with whatever the role now has.
	dropSessions := func() {
		t.Helper()
		rows, err := admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE usename = $1 AND pid <> $2`, a.DB.AppRole, selfPID)
		if err != nil {
			t.Fatal(err)
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the brain's sessions to end", func() bool {
			_, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = ANY($1)`, pids)
			return err == nil && count(t, admin, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids) == 0
		})
	}

	// 1. Role-level defaults that would break every statement of the brain.
	for _, set := range []string{`SET default_transaction_read_only = on`, `SET search_path = pg_catalog`} {
		if _, err := self.Exec(ctx, `ALTER ROLE CURRENT_USER `+set); err != nil {
			t.Fatalf("the tenant's role could not %s on itself: %v", set, err)
		}
	}
	dropSessions()
	if rep := ea.submit(quoteEmail("<after-settings@x>")).reply(t); rep.Action == nil {
		t.Fatalf("turn after the role changed its defaults: %+v", rep)
	}

	// 2. Its own password: the sealed one no longer logs in.
	if _, err := self.Exec(ctx, `ALTER ROLE CURRENT_USER PASSWORD 'locked-out-by-itself'`); err != nil {
		t.Fatalf("the tenant's role could not change its own password: %v", err)
	}
	dropSessions()
	start := time.Now()
	e := ea.submit(quoteEmail("<locked-out@x>")).error(t, http.StatusServiceUnavailable)
	if e.Reason != wire.ReasonTenantDatabaseLogin || !strings.Contains(e.Message, "repair") {
		t.Fatalf("turn while locked out: %+v", e)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the locked-out turn took %s: it must be answered, not retried until the edge gives up", d)
	}
	var ready struct {
		Status         string `json:"status"`
		TenantProblems []struct {
			Tenant, SQLState string
		} `json:"tenant_problems"`
	}
	res, err := http.Get(opsURL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if err := json.Unmarshal(b, &ready); err != nil || res.StatusCode != http.StatusOK || len(ready.TenantProblems) != 1 ||
		ready.TenantProblems[0].Tenant != string(a.ID) || ready.TenantProblems[0].SQLState != "28P01" {
		t.Fatalf("readyz while the tenant is locked out: %d %s (%v)", res.StatusCode, b, err)
	}
	failing := fmt.Sprintf(`brain_tenant_db_login_failing{tenant="%s"}`, a.ID)
	if n := metric(t, opsURL, failing); n != 1 {
		t.Errorf("%s = %d, want 1", failing, n)
	}
	if n := metric(t, opsURL, fmt.Sprintf(`brain_tenant_db_login_failures_total{tenant="%s"}`, a.ID)); n < 1 {
		t.Errorf("login failures counted: %d", n)
	}
	if logs := s.logs.String(); strings.Count(logs, "tenant database refuses the tenant's role") != 1 ||
		!strings.Contains(logs, `"tenant_id":"`+string(a.ID)+`"`) {
		t.Errorf("want one log line naming the tenant when it was locked out:\n%s", logs)
	}

	// 3. The operator repairs the role with brainctl: the sealed password
	// again, no role defaults.
	if out := s.brainctl().ok("tenant", "repair", string(a.ID)); !strings.Contains(out, a.DB.AppRole) {
		t.Errorf("brainctl tenant repair says %q, want it to name the role %s", out, a.DB.AppRole)
	}
	if c := count(t, admin, `SELECT count(*) FROM pg_db_role_setting WHERE setrole = (SELECT oid FROM pg_roles WHERE rolname = $1)`, a.DB.AppRole); c != 0 {
		t.Errorf("the role keeps %d sets of its own defaults after the repair", c)
	}
	if rep := ea.submit(quoteEmail("<locked-out@x>")).reply(t); rep.Action == nil {
		t.Fatalf("the same turn after the repair: %+v", rep)
	}
	if n := metric(t, opsURL, failing); n != 0 {
		t.Errorf("%s = %d after the repair, want 0", failing, n)
	}
}

// A replica that requires TLS (BRAIN_DB_SSLMODE=require) of a tenant's
// server that has none: the tenant's turn is answered at once with the
// reason, not retried until the edge gives up; /readyz and the metrics name
// the tenant, one log line says why (and no credential); and the same turn,
// submitted again to a replica whose setting is mended, is decided.
func TestTenantDatabaseWithoutTheTLSRequiredIsReported(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.tenant(spec("tls-required"))
	stop, opsURL := s.startOpsBrain("r1", func(c *brain.Config) { c.DBSSLMode = "require" })
	ea := s.startEdge(a, nil)

	start := time.Now()
	e := ea.submit(quoteEmail("<needs-tls@x>")).error(t, http.StatusServiceUnavailable)
	if e.Reason != wire.ReasonTenantDatabaseTLS || !strings.Contains(e.Message, "TLS") {
		t.Fatalf("turn of a tenant whose server has no TLS, under require: %+v", e)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the turn took %s: it must be answered, not retried until the edge gives up", d)
	}
	var ready struct {
		TenantProblems []struct {
			Tenant, Problem, SQLState string
		} `json:"tenant_problems"`
	}
	res, err := http.Get(opsURL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if err := json.Unmarshal(b, &ready); err != nil || res.StatusCode != http.StatusOK || len(ready.TenantProblems) != 1 ||
		ready.TenantProblems[0].Tenant != string(a.ID) || !strings.Contains(ready.TenantProblems[0].Problem, "BRAIN_DB_SSLMODE") ||
		ready.TenantProblems[0].SQLState != "" {
		t.Fatalf("readyz while the tenant's server refuses TLS: %d %s (%v)", res.StatusCode, b, err)
	}
	if n := metric(t, opsURL, fmt.Sprintf(`brain_tenant_db_login_failing{tenant="%s"}`, a.ID)); n != 1 {
		t.Errorf("brain_tenant_db_login_failing = %d, want 1", n)
	}
	logs := s.logs.String()
	if strings.Count(logs, "cannot be reached with the TLS required") != 1 || !strings.Contains(logs, "server refused TLS connection") {
		t.Errorf("want one log line saying the tenant's server refused TLS:\n%s", logs)
	}
	if pw := a.DB.AppPassword; pw == "" || strings.Contains(logs, pw) {
		t.Errorf("the logs hold the tenant's password (or the test has none to look for: %q)", pw)
	}

	stop()
	s.startBrain("r2", nil) // the stack's setting: disable
	if rep := ea.submit(quoteEmail("<needs-tls@x>")).reply(t); rep.Status != wire.WorkItemStatusAwaitingApproval {
		t.Fatalf("the same turn on a replica whose setting is mended: %+v", rep)
	}
}
