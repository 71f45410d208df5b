package provision_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nkeys"

	"n8nbrain/catalogue"
	"n8nbrain/internal/testdb"
	"n8nbrain/provision"
	"n8nbrain/registry"
)

// newOps returns an Ops with its own random prefix and a bootstrapped
// registry, and drops everything it creates when the test ends.
func newOps(t testing.TB) (*provision.Ops, string) {
	t.Helper()
	adminURL := testdb.AdminURL(t)
	sealer, err := registry.NewSealer(must(registry.ParseKey(registry.NewKey())))
	if err != nil {
		t.Fatal(err)
	}
	ops := &provision.Ops{AdminURL: adminURL, Sealer: sealer, Prefix: randomPrefix(),
		Reserved: newReserved(t)}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := ops.DropPrefixed(ctx); err != nil {
			t.Errorf("clean up prefix %s: %v", ops.Prefix, err)
		}
	})
	readerURL, err := ops.BootstrapRegistry(t.Context(), "reader-"+randomPrefix())
	if err != nil {
		t.Fatalf("bootstrap registry: %v", err)
	}
	return ops, readerURL
}

func randomPrefix() string {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return "t" + hex.EncodeToString(b) + "_"
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func newAccount(t testing.TB) string {
	t.Helper()
	kp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// newReserved is a fresh set of operator accounts.
func newReserved(t testing.TB) provision.ReservedAccounts {
	return provision.ReservedAccounts{Brain: newAccount(t), Streams: newAccount(t), System: newAccount(t)}
}

// validSpec is a spec that passes validation: one rule with an action.
func validSpec(t testing.TB, id registry.TenantID) provision.TenantSpec {
	return provision.TenantSpec{
		ID:             id,
		NATSAccount:    newAccount(t),
		EnabledActions: []catalogue.Name{catalogue.DraftReply, catalogue.EscalateItem},
		Rules: []registry.Rule{
			{
				Name:       "quotes",
				Match:      registry.Match{SubjectKeywords: []string{"quote"}},
				Category:   "quote_request",
				Priority:   "normal",
				Action:     catalogue.EscalateItem,
				Params:     json.RawMessage(`{"reason": "quote requests go to sales"}`),
				Confidence: 0.9,
			},
			{
				Name:       "invoices",
				Match:      registry.Match{SenderDomains: []string{"billing.example"}},
				Category:   "invoice",
				Priority:   "low",
				Confidence: 1,
			},
		},
		ModelName:    "qwen3:8b",
		ModelOptions: map[string]any{"temperature": 0.1},
	}
}

func createTenant(t *testing.T, ops *provision.Ops, id registry.TenantID) *provision.Tenant {
	t.Helper()
	tn, err := ops.CreateTenant(t.Context(), validSpec(t, id))
	if err != nil {
		t.Fatalf("create tenant %s: %v", id, err)
	}
	return tn
}

func connect(t *testing.T, rawURL string, db string) (*pgx.Conn, error) {
	t.Helper()
	cc, err := pgx.ParseConfig(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	if db != "" {
		cc.Database = db
	}
	conn, err := pgx.ConnectConfig(t.Context(), cc)
	if err == nil {
		t.Cleanup(func() { conn.Close(context.Background()) })
	}
	return conn, err
}

func mustConnect(t *testing.T, rawURL string, db string) *pgx.Conn {
	t.Helper()
	conn, err := connect(t, rawURL, db)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	return conn
}

func sqlState(err error) string {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pgErr.Code
	}
	return ""
}

const insufficientPrivilege = "42501"

func wantDenied(t *testing.T, err error, what string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: succeeded, want SQLSTATE %s", what, insufficientPrivilege)
	}
	if got := sqlState(err); got != insufficientPrivilege {
		t.Fatalf("%s: got %v (SQLSTATE %q), want SQLSTATE %s", what, err, got, insufficientPrivilege)
	}
}

func TestTenantCannotConnectToAnotherTenantsDatabase(t *testing.T) {
	t.Parallel()
	ops, _ := newOps(t)
	a := createTenant(t, ops, "tenant-a")
	b := createTenant(t, ops, "tenant-b")
	registryDB := ops.Prefix + provision.DefaultRegistryDB

	tests := []struct {
		name string
		from *provision.Tenant
		db   string
	}{
		{"AToB", a, b.DBName},
		{"BToA", b, a.DBName},
		{"AToRegistry", a, registryDB},
		{"BToRegistry", b, registryDB},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := connect(t, tt.from.AppURL, tt.db)
			wantDenied(t, err, "connect "+tt.from.AppRole+" to "+tt.db)
		})
	}
	for _, tn := range []*provision.Tenant{a, b} {
		t.Run("Own"+tn.AppRole, func(t *testing.T) {
			t.Parallel()
			conn := mustConnect(t, tn.AppURL, "")
			var n int
			if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM work_items`).Scan(&n); err != nil {
				t.Fatalf("own database: %v", err)
			}
		})
	}
}

func TestRegistryReaderOnlyReads(t *testing.T) {
	t.Parallel()
	ops, readerURL := newOps(t)
	createTenant(t, ops, "client-zero")
	reader := mustConnect(t, readerURL, "")

	tenants, err := registry.TenantList(t.Context(), reader)
	if err != nil {
		t.Fatalf("reader lists tenants: %v", err)
	}
	if len(tenants) != 1 || len(tenants[0].Rules) != 2 {
		t.Fatalf("reader sees %d tenants (%+v), want 1 with 2 rules", len(tenants), tenants)
	}

	denied := []struct{ name, sql string }{
		{"InsertTenants", `INSERT INTO tenants (id) VALUES ('other')`},
		{"UpdateTenants", `UPDATE tenants SET turn_ceiling = 9`},
		{"DeleteTenants", `DELETE FROM tenants`},
		{"TruncateTenants", `TRUNCATE tenants CASCADE`},
		{"InsertTriageRules", `INSERT INTO triage_rules (tenant_id) VALUES ('client-zero')`},
		{"UpdateTriageRules", `UPDATE triage_rules SET confidence = 0`},
		{"DeleteTriageRules", `DELETE FROM triage_rules`},
		{"TruncateTriageRules", `TRUNCATE triage_rules`},
		{"CreateTable", `CREATE TABLE x (id int)`},
		{"CreateTempTable", `CREATE TEMP TABLE x (id int)`},
		{"UpdateSchemaMigrations", `UPDATE schema_migrations SET name = 'x'`},
	}
	for _, tt := range denied {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			conn := mustConnect(t, readerURL, "")
			_, err := conn.Exec(t.Context(), tt.sql)
			wantDenied(t, err, tt.sql)
		})
	}
}

func TestRuntimeRolesHaveNoPowersAndOwnNothing(t *testing.T) {
	t.Parallel()
	ops, readerURL := newOps(t)
	a := createTenant(t, ops, "tenant-a")
	b := createTenant(t, ops, "tenant-b")
	registryDB := ops.Prefix + provision.DefaultRegistryDB
	reader := must(pgx.ParseConfig(readerURL)).User

	tests := []struct {
		name, role, db string
	}{
		{"RegistryReader", reader, registryDB},
		{"AppA", a.AppRole, a.DBName},
		{"AppB", b.AppRole, b.DBName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			admin := mustConnect(t, ops.AdminURL, tt.db)
			var super, createDB, createRole, bypassRLS, replication, inherit bool
			err := admin.QueryRow(t.Context(), `SELECT rolsuper, rolcreatedb, rolcreaterole, rolbypassrls, rolreplication, rolinherit
				FROM pg_roles WHERE rolname = $1`, tt.role).Scan(&super, &createDB, &createRole, &bypassRLS, &replication, &inherit)
			if err != nil {
				t.Fatalf("look up role %s: %v", tt.role, err)
			}
			if super || createDB || createRole || bypassRLS || replication || inherit {
				t.Errorf("role %s: superuser=%v createdb=%v createrole=%v bypassrls=%v replication=%v inherit=%v, want all false",
					tt.role, super, createDB, createRole, bypassRLS, replication, inherit)
			}
			var owned []string
			rows, _ := admin.Query(t.Context(), `
				SELECT 'relation ' || c.relname FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE r.rolname = $1
				UNION ALL SELECT 'function ' || p.proname FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner WHERE r.rolname = $1
				UNION ALL SELECT 'schema ' || n.nspname FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner WHERE r.rolname = $1
				UNION ALL SELECT 'database ' || d.datname FROM pg_database d JOIN pg_roles r ON r.oid = d.datdba WHERE r.rolname = $1
				UNION ALL SELECT 'type ' || ty.typname FROM pg_type ty JOIN pg_roles r ON r.oid = ty.typowner WHERE r.rolname = $1`, tt.role)
			owned, err = pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			if len(owned) > 0 {
				t.Errorf("role %s owns %s in %s, want nothing", tt.role, strings.Join(owned, ", "), tt.db)
			}
		})
	}
}

func TestAppRoleCannotRunDDL(t *testing.T) {
	t.Parallel()
	ops, _ := newOps(t)
	tn := createTenant(t, ops, "client-zero")

	tests := []struct{ name, sql string }{
		{"CreateTable", `CREATE TABLE x (id int)`},
		{"CreateTempTable", `CREATE TEMP TABLE x (id int)`},
		{"AlterTableAddColumn", `ALTER TABLE work_items ADD COLUMN x int`},
		{"DropTable", `DROP TABLE decisions`},
		{"CreateFunction", `CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'`},
		{"CreateSchema", `CREATE SCHEMA x`},
		{"CreateIndex", `CREATE INDEX x ON work_items (status)`},
		{"DisableAppendOnlyTrigger", `ALTER TABLE decisions DISABLE TRIGGER decisions_append_only`},
		{"Truncate", `TRUNCATE step_checkpoints`},
		{"ReadSchemaMigrations", `SELECT * FROM schema_migrations`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			conn := mustConnect(t, tn.AppURL, "")
			_, err := conn.Exec(t.Context(), tt.sql)
			wantDenied(t, err, tt.sql)
		})
	}
}

func TestAppRoleReadsAndWritesRowsButDecisionsAreAppendOnly(t *testing.T) {
	t.Parallel()
	ops, _ := newOps(t)
	tn := createTenant(t, ops, "client-zero")
	conn := mustConnect(t, tn.AppURL, "")
	ctx := t.Context()

	if _, err := conn.Exec(ctx, `INSERT INTO work_items (id, turn, status, catalogue_version, approval_mode)
		VALUES ('wi-1', 1, 'open', 1, 'review_app')`); err != nil {
		t.Fatalf("insert work item: %v", err)
	}
	var status string
	if err := conn.QueryRow(ctx, `SELECT status FROM work_items WHERE id = 'wi-1'`).Scan(&status); err != nil || status != "open" {
		t.Fatalf("select work item: %q, %v", status, err)
	}
	if _, err := conn.Exec(ctx, `UPDATE work_items SET status = 'closed' WHERE id = 'wi-1'`); err != nil {
		t.Fatalf("update work item: %v", err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO decisions (work_item_id, turn, fingerprint, turn_seq, status, reply)
		VALUES ('wi-1', 1, 'fp', 1, 'closed', '\x00')`); err != nil {
		t.Fatalf("insert decision: %v", err)
	}
	_, err := conn.Exec(ctx, `UPDATE decisions SET status = 'open'`)
	wantDenied(t, err, "update decision")
	_, err = conn.Exec(ctx, `DELETE FROM decisions`)
	wantDenied(t, err, "delete decision")
}

func TestRegistryHoldsThePasswordSealed(t *testing.T) {
	t.Parallel()
	ops, readerURL := newOps(t)
	a := createTenant(t, ops, "tenant-a")
	reader := mustConnect(t, readerURL, "")

	row, err := registry.TenantGet(t.Context(), reader, "tenant-a")
	if err != nil {
		t.Fatal(err)
	}
	sealed := row.DB.PasswordSealed
	if bytes.Contains(sealed, []byte(a.AppPassword)) {
		t.Fatalf("db_password_sealed contains the plain password")
	}
	pw, err := ops.Sealer.Open("tenant-a", sealed)
	if err != nil || string(pw) != a.AppPassword {
		t.Fatalf("open sealed password: %v (matches: %v)", err, string(pw) == a.AppPassword)
	}
	if _, err := ops.Sealer.Open("tenant-b", sealed); !errors.Is(err, registry.ErrUnseal) {
		t.Fatalf("open with another tenant id: %v, want ErrUnseal", err)
	}
	// Autonomy defaults to assist.
	if row.Autonomy != registry.AutonomyAssist {
		t.Fatalf("autonomy %q, want assist", row.Autonomy)
	}
	// The row is enough to connect, as the brain will.
	if row.DB.Name != a.DBName || row.DB.User != a.AppRole {
		t.Fatalf("registry row names %s/%s, want %s/%s", row.DB.Name, row.DB.User, a.DBName, a.AppRole)
	}
	cc := must(pgx.ParseConfig(a.AppURL))
	cc.Host, cc.Port, cc.Database, cc.User, cc.Password = row.DB.Host, uint16(row.DB.Port), row.DB.Name, row.DB.User, string(pw)
	conn, err := pgx.ConnectConfig(t.Context(), cc)
	if err != nil {
		t.Fatalf("connect with the registry row: %v", err)
	}
	conn.Close(t.Context())
}

func TestCreateTenantRejectsInvalidSpecAndCreatesNothing(t *testing.T) {
	t.Parallel()
	ops, _ := newOps(t)
	const id = "client-zero"

	tests := []struct {
		name   string
		change func(*provision.TenantSpec)
		want   string
	}{
		{"EnabledActionNotInCatalogue", func(s *provision.TenantSpec) {
			s.EnabledActions = append(s.EnabledActions, "launch_rocket")
		}, "enabled action launch_rocket of tenant client-zero is not in catalogue version 1"},
		{"RuleActionNotEnabled", func(s *provision.TenantSpec) {
			s.Rules[0].Action = catalogue.CreateJob
		}, `rule "quotes": action create_job is not enabled for tenant client-zero`},
		{"RuleActionNotInCatalogue", func(s *provision.TenantSpec) {
			s.Rules[0].Action = "launch_rocket"
		}, `rule "quotes": action launch_rocket is not in catalogue version 1`},
		{"EmptyMatch", func(s *provision.TenantSpec) {
			s.Rules[0].Match = registry.Match{}
		}, `rule "quotes": match is empty`},
		{"EmptyKeyword", func(s *provision.TenantSpec) {
			s.Rules[0].Match.SubjectKeywords = []string{" "}
		}, `rule "quotes": match has an empty entry`},
		{"BadCategory", func(s *provision.TenantSpec) {
			s.Rules[0].Category = "spam"
		}, `rule "quotes": category "spam" is not one of tenant client-zero's categories`},
		{"BadPriority", func(s *provision.TenantSpec) {
			s.Rules[0].Priority = "asap"
		}, `rule "quotes": priority "asap" must be one of`},
		{"MissingParam", func(s *provision.TenantSpec) {
			s.Rules[0].Params = json.RawMessage(`{}`)
		}, `rule "quotes": action escalate_item: parameter "reason" is required`},
		{"UnknownParam", func(s *provision.TenantSpec) {
			s.Rules[0].Params = json.RawMessage(`{"reason": "x", "colour": "red"}`)
		}, `parameter "colour" is not a parameter of this action`},
		{"ParamsWithoutAction", func(s *provision.TenantSpec) {
			s.Rules[1].Params = json.RawMessage(`{"reason": "x"}`)
		}, `rule "invoices": has params but no action`},
		{"ConfidenceAboveOne", func(s *provision.TenantSpec) {
			s.Rules[0].Confidence = 1.5
		}, `rule "quotes": confidence 1.5 must be between 0 and 1`},
		{"DuplicateRuleName", func(s *provision.TenantSpec) {
			s.Rules[1].Name = "quotes"
		}, `rule "quotes" of tenant client-zero is listed twice`},
		{"BadNATSAccount", func(s *provision.TenantSpec) {
			s.NATSAccount = "UABC"
		}, `NATS account "UABC" of tenant client-zero is not an account public key`},
		{"UnpublishedCatalogue", func(s *provision.TenantSpec) {
			s.CatalogueVersion = 99
		}, "catalogue version 99 is not published"},
		{"BadApprovalMode", func(s *provision.TenantSpec) {
			s.ApprovalMode = "fax"
		}, `approval mode "fax"`},
		{"BadID", func(s *provision.TenantSpec) {
			s.ID = "Client_Zero"
		}, `tenant id "Client_Zero" must match`},
		{"BadAutonomy", func(s *provision.TenantSpec) {
			s.Autonomy = "autopilot"
		}, `autonomy "autopilot" of tenant client-zero must be one of: assist, auto`},
		{"AutoAtCreation", func(s *provision.TenantSpec) {
			s.Autonomy = registry.AutonomyAuto
		}, `tenant client-zero starts at autonomy assist: raise it to auto with SetAutonomy`},
		{"ReservedCategory", func(s *provision.TenantSpec) {
			s.Categories = []string{"quote_request", "invoice", "unclassified"}
		}, `category "unclassified" of tenant client-zero is reserved`},
		{"CategoryTooLong", func(s *provision.TenantSpec) {
			s.Categories = []string{"quote_request", "invoice", strings.Repeat("c", 65)}
		}, `is longer than 64 bytes`},
		{"TooManyCategories", func(s *provision.TenantSpec) {
			s.Categories = provision.DefaultCategories()
			for i := range 40 {
				s.Categories = append(s.Categories, fmt.Sprintf("category_%d", i))
			}
		}, `has 45 categories, at most 32 are allowed`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spec := validSpec(t, id)
			tt.change(&spec)
			_, err := ops.CreateTenant(t.Context(), spec)
			if err == nil {
				t.Fatalf("CreateTenant succeeded, want an error containing %q", tt.want)
			}
			if _, ok := errors.AsType[*provision.SpecError](err); !ok {
				t.Errorf("error %v is not a *SpecError", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
	// After all subtests: nothing of the tenant exists anywhere.
	t.Cleanup(func() {
		ctx := context.Background() // t.Context() is done by now
		admin, err := pgx.Connect(ctx, ops.AdminURL)
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(ctx)
		var roles, dbs int
		err = admin.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM pg_roles WHERE starts_with(rolname, $1 || 't_')),
			(SELECT count(*) FROM pg_database WHERE starts_with(datname, $1 || 'tenant_'))`, ops.Prefix).Scan(&roles, &dbs)
		if err != nil {
			t.Fatal(err)
		}
		if roles != 0 || dbs != 0 {
			t.Errorf("invalid specs left %d tenant roles and %d tenant databases", roles, dbs)
		}
		reg, err := ops.RegistryAdmin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Close(ctx)
		var rows int
		if err := reg.QueryRow(ctx, `SELECT count(*) FROM tenants`).Scan(&rows); err != nil || rows != 0 {
			t.Errorf("registry has %d tenants (%v), want none", rows, err)
		}
	})
}

func TestCreateTenantTwice(t *testing.T) {
	t.Parallel()
	ops, _ := newOps(t)
	first := createTenant(t, ops, "client-zero")

	_, err := ops.CreateTenant(t.Context(), validSpec(t, "client-zero"))
	if !errors.Is(err, provision.ErrTenantExists) {
		t.Fatalf("second CreateTenant: %v, want ErrTenantExists", err)
	}
	// The failed attempt touched nothing: the first password still works.
	mustConnect(t, first.AppURL, "")
}

func TestCreateTenantRejectsAReusedNATSAccount(t *testing.T) {
	t.Parallel()
	ops, _ := newOps(t)
	a := createTenant(t, ops, "tenant-a")
	spec := validSpec(t, "tenant-b")
	spec.NATSAccount = a.Spec.NATSAccount
	_, err := ops.CreateTenant(t.Context(), spec)
	if _, ok := errors.AsType[*provision.SpecError](err); !ok || !strings.Contains(err.Error(), "already tenant tenant-a's") {
		t.Fatalf("CreateTenant with tenant-a's account: %v, want a SpecError naming tenant-a", err)
	}
}

func TestBootstrapRegistryIsIdempotent(t *testing.T) {
	t.Parallel()
	ops, firstURL := newOps(t)
	createTenant(t, ops, "client-zero")

	secondURL, err := ops.BootstrapRegistry(t.Context(), "another-password")
	if err != nil {
		t.Fatalf("second BootstrapRegistry: %v", err)
	}
	if _, err := connect(t, firstURL, ""); sqlState(err) != "28P01" {
		t.Errorf("old reader password: %v, want SQLSTATE 28P01 (it was reset)", err)
	}
	reader := mustConnect(t, secondURL, "")
	tenants, err := registry.TenantList(t.Context(), reader)
	if err != nil || len(tenants) != 1 {
		t.Fatalf("tenants after a second bootstrap: %d, %v; want the one created before", len(tenants), err)
	}
	var versions, distinct int
	if err := reader.QueryRow(t.Context(), `SELECT count(*), count(DISTINCT version) FROM schema_migrations`).Scan(&versions, &distinct); err != nil {
		t.Fatal(err)
	}
	if versions != distinct {
		t.Errorf("schema_migrations has %d rows for %d versions", versions, distinct)
	}
}

func TestMigrateTenantKeepsGrantsAndLaterTablesGetThem(t *testing.T) {
	t.Parallel()
	ops, _ := newOps(t)
	tn := createTenant(t, ops, "client-zero")
	ctx := t.Context()

	if err := ops.MigrateTenant(ctx, "client-zero"); err != nil {
		t.Fatalf("MigrateTenant: %v", err)
	}
	// A table a later migration creates (as the owner) is the app's to use.
	owner := mustConnect(t, ops.AdminURL, tn.DBName)
	if _, err := owner.Exec(ctx, `SET ROLE `+pgx.Identifier{tn.OwnerRole}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(ctx, `CREATE TABLE later (id bigserial PRIMARY KEY, note text)`); err != nil {
		t.Fatal(err)
	}
	app := mustConnect(t, tn.AppURL, "")
	if _, err := app.Exec(ctx, `INSERT INTO later (note) VALUES ('x')`); err != nil {
		t.Fatalf("app inserts into a later table: %v", err)
	}
	_, err := app.Exec(ctx, `TRUNCATE later`)
	wantDenied(t, err, "truncate a later table")

	if err := ops.MigrateTenant(ctx, "nobody"); err == nil || !strings.Contains(err.Error(), "not in the registry") {
		t.Errorf("MigrateTenant of an unknown tenant: %v", err)
	}
}

func TestNonSuperuserAdmin(t *testing.T) {
	t.Parallel()
	ops, _ := newOps(t)
	// An admin with CREATEDB and CREATEROLE only, as a managed cluster gives.
	admin := mustConnect(t, ops.AdminURL, "")
	role := ops.Prefix + "ops"
	if _, err := admin.Exec(t.Context(), `CREATE ROLE `+pgx.Identifier{role}.Sanitize()+
		` LOGIN CREATEDB CREATEROLE PASSWORD 'ops-password'`); err != nil {
		t.Fatal(err)
	}
	cc := must(pgx.ParseConfig(ops.AdminURL))
	limited := *ops
	limited.AdminURL = fmt.Sprintf("postgres://%s:ops-password@%s:%d/postgres?sslmode=disable", role, cc.Host, cc.Port)
	limited.RegistryDB = "limited_registry"

	readerURL, err := limited.BootstrapRegistry(t.Context(), "reader-password")
	if err != nil {
		t.Fatalf("BootstrapRegistry as a non-superuser: %v", err)
	}
	if _, err := limited.BootstrapRegistry(t.Context(), "reader-password"); err != nil {
		t.Fatalf("second BootstrapRegistry as a non-superuser: %v", err)
	}
	tn, err := limited.CreateTenant(t.Context(), validSpec(t, "limited"))
	if err != nil {
		t.Fatalf("CreateTenant as a non-superuser: %v", err)
	}
	if err := limited.MigrateTenant(t.Context(), "limited"); err != nil {
		t.Fatalf("MigrateTenant as a non-superuser: %v", err)
	}
	app := mustConnect(t, tn.AppURL, "")
	_, err = app.Exec(t.Context(), `CREATE TABLE x (id int)`)
	wantDenied(t, err, "app DDL")
	reader := mustConnect(t, readerURL, "")
	if _, err := registry.TenantGet(t.Context(), reader, "limited"); err != nil {
		t.Fatalf("reader reads the tenant: %v", err)
	}
}

func TestOpsRejectsNamesPostgresWouldTruncate(t *testing.T) {
	t.Parallel()
	ops := &provision.Ops{AdminURL: "postgres://x@127.0.0.1:1/postgres", Prefix: "sixteen_chars_pp",
		Reserved: newReserved(t)}
	sealer := must(registry.NewSealer(make([]byte, registry.KeySize)))
	ops.Sealer = sealer
	spec := validSpec(t, registry.TenantID(strings.Repeat("a", 48)))
	_, err := ops.CreateTenant(t.Context(), spec)
	if err == nil || !strings.Contains(err.Error(), "longer than 63 bytes") {
		t.Fatalf("CreateTenant with a role name over 63 bytes: %v", err)
	}
}
