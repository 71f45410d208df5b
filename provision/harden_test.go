package provision_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"n8nbrain/internal/testdb"
	"n8nbrain/provision"
	"n8nbrain/registry"
)

// A tenant's role and the registry reader cannot list the cluster's roles,
// databases or sessions from the database they may connect to: tenant ids
// are in those names.
func TestRuntimeRolesCannotListTheCluster(t *testing.T) {
	t.Parallel()
	ops, readerURL := newOps(t)
	tn := createTenant(t, ops, "lister")
	for _, who := range []struct {
		name string
		url  string
	}{{"app role", tn.AppURL}, {"registry reader", readerURL}} {
		conn := mustConnect(t, who.url, "")
		for _, q := range []string{
			`SELECT datname FROM pg_database`, `SELECT rolname FROM pg_roles`, `SELECT usename FROM pg_user`,
			`SELECT datname, usename FROM pg_stat_activity`, `SELECT datname FROM pg_stat_database`,
			`SELECT roleid FROM pg_auth_members`, `SELECT setrole FROM pg_db_role_setting`,
		} {
			_, err := conn.Exec(t.Context(), q)
			wantDenied(t, err, who.name+": "+q)
		}
	}
	// What Postgres still answers for a guessed name (documented in harden.go).
	app := mustConnect(t, tn.AppURL, "")
	var exists bool
	if err := app.QueryRow(t.Context(), `SELECT has_database_privilege(current_user, current_database(), 'CONNECT')`).Scan(&exists); err != nil || !exists {
		t.Errorf("the app role lost what it may know about its own database: %v %v", exists, err)
	}
}

// RestrictMaintenanceDatabases, on a cluster of the test's own (it changes
// the cluster's defaults for every role): before it, a tenant's role may
// connect to postgres and template1 and create temporary tables in postgres;
// after it, neither, while the admin still connects.
func TestRestrictMaintenanceDatabases(t *testing.T) {
	t.Parallel()
	inst := testdb.PrivateCluster(t)
	sealer := must(registry.NewSealer(must(registry.ParseKey(registry.NewKey()))))
	ops := &provision.Ops{AdminURL: inst.AdminURL(), Sealer: sealer, Reserved: newReserved(t)}
	readerURL, err := ops.BootstrapRegistry(t.Context(), "reader-password-0123")
	if err != nil {
		t.Fatal(err)
	}
	tn := createTenant(t, ops, "restricted")

	app := mustConnect(t, tn.AppURL, "postgres")
	if _, err := app.Exec(t.Context(), `CREATE TEMPORARY TABLE probe (x int)`); err != nil {
		t.Fatalf("before: the app role could not create a temporary table in postgres (%v): the test proves nothing", err)
	}
	mustConnect(t, tn.AppURL, "template1")

	// A non-superuser admin that does not own them is told it cannot.
	admin := mustConnect(t, inst.AdminURL(), "")
	if _, err := admin.Exec(t.Context(), `CREATE ROLE limited_ops LOGIN CREATEDB CREATEROLE PASSWORD 'limited-ops-pw'`); err != nil {
		t.Fatal(err)
	}
	limited := *ops
	limited.AdminURL = strings.Replace(inst.AdminURL(), inst.AdminUser+":"+inst.AdminPassword, "limited_ops:limited-ops-pw", 1)
	if err := limited.RestrictMaintenanceDatabases(t.Context()); err == nil || !strings.Contains(err.Error(), "neither a superuser nor the owner") {
		t.Fatalf("a non-superuser admin restricting: %v", err)
	}

	for range 2 { // idempotent
		if err := ops.RestrictMaintenanceDatabases(t.Context()); err != nil {
			t.Fatalf("restrict: %v", err)
		}
	}
	for _, db := range provision.MaintenanceDatabases {
		for _, who := range []struct{ name, url string }{{"app role", tn.AppURL}, {"registry reader", readerURL}} {
			_, err := connect(t, who.url, db)
			wantDenied(t, err, who.name+" connects to "+db)
		}
	}
	mustConnect(t, inst.AdminURL(), "postgres")
	mustConnect(t, tn.AppURL, "") // its own database still
	var conn *pgx.Conn = mustConnect(t, readerURL, "")
	if _, err := registry.TenantGet(t.Context(), conn, "restricted"); err != nil {
		t.Fatalf("the reader still reads the registry: %v", err)
	}
}

// Re-running provisioning (the registry bootstrap, a tenant's role repair)
// leaves no password verifier in the server's log: a failing statement is
// logged whole, so an existing login role is altered, never first tried
// with a CREATE ROLE … PASSWORD that fails.
func TestReRunsLeaveNoPasswordVerifierInTheServerLog(t *testing.T) {
	t.Parallel()
	inst := testdb.PrivateCluster(t)
	sealer := must(registry.NewSealer(must(registry.ParseKey(registry.NewKey()))))
	ops := &provision.Ops{AdminURL: inst.AdminURL(), Sealer: sealer, Reserved: newReserved(t)}
	for range 2 {
		if _, err := ops.BootstrapRegistry(t.Context(), "reader-password-0123"); err != nil {
			t.Fatal(err)
		}
	}
	tn := createTenant(t, ops, "logged")
	if err := ops.RepairTenantRole(t.Context(), tn.Spec.ID); err != nil {
		t.Fatal(err)
	}
	mustConnect(t, tn.AppURL, "")

	serverLog, err := os.ReadFile(filepath.Join(inst.Dir, "postgres.log"))
	if err != nil {
		t.Fatalf("the cluster's server log: %v", err)
	}
	if !bytes.Contains(serverLog, []byte("database system is ready to accept connections")) {
		t.Fatalf("%s is not this cluster's server log: the test proves nothing", filepath.Join(inst.Dir, "postgres.log"))
	}
	if i := bytes.Index(serverLog, []byte("SCRAM-SHA-256$")); i >= 0 {
		// The line up to the verifier, not the verifier.
		t.Errorf("the server log holds a password verifier: %s…", serverLog[bytes.LastIndexByte(serverLog[:i], '\n')+1:i])
	}
}
