package tests

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"n8nbrain/brain"
	"n8nbrain/internal/testdb"
	"n8nbrain/migrations"
	"n8nbrain/provision/admin"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// previous is the version before a set's latest migration.
func previous(t *testing.T, set migrations.Set) (prev, latest int) {
	t.Helper()
	ms, err := migrations.List(set)
	if err != nil || len(ms) < 2 {
		t.Fatalf("migrations %s: %v (%d)", set, err, len(ms))
	}
	return ms[len(ms)-2].Version, ms[len(ms)-1].Version
}

// downgradeTenantDB rebuilds a tenant database at an earlier schema
// version, as a previous release left it: tables of the migrations up to
// prev, owned by the owner role, rows-only grants on the tables of the day
// but one, and no default privileges (so the upgrade must grant what it
// adds and what was missed). It keeps one work item written at that
// version.
func (s *system) downgradeTenantDB(db, owner, app string, prev int) {
	s.t.Helper()
	ctx := context.Background()
	conn := s.adminConn(db)
	defer conn.Close(ctx)
	for _, q := range []string{
		`DROP SCHEMA public CASCADE`,
		`CREATE SCHEMA public AUTHORIZATION ` + pgx.Identifier{owner}.Sanitize(),
		`REVOKE ALL ON SCHEMA public FROM PUBLIC`,
		`GRANT USAGE ON SCHEMA public TO ` + pgx.Identifier{app}.Sanitize(),
		`SET ROLE ` + pgx.Identifier{owner}.Sanitize(),
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			s.t.Fatalf("%s: %s: %v", db, q, err)
		}
	}
	if err := migrations.ApplyThrough(ctx, conn, migrations.Tenant, prev); err != nil {
		s.t.Fatalf("%s at version %d: %v", db, prev, err)
	}
	for _, q := range []string{
		`RESET ROLE`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO ` + pgx.Identifier{app}.Sanitize(),
		`REVOKE ALL ON TABLE schema_migrations FROM ` + pgx.Identifier{app}.Sanitize(),
		// A table the previous release's grants missed: the upgrade must grant it.
		`REVOKE ALL ON TABLE approvals FROM ` + pgx.Identifier{app}.Sanitize(),
		`INSERT INTO work_items (id, turn, status, catalogue_version, approval_mode) VALUES ('<old@x>', 0, 'open', 1, 'review_app')`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			s.t.Fatalf("%s: %s: %v", db, q, err)
		}
	}
}

// downgradeRegistry rebuilds the registry at an earlier schema version with
// the same tenants and rules (columns added since are dropped with it).
func (s *system) downgradeRegistry(prev int) {
	s.t.Helper()
	ctx := context.Background()
	prefix := s.stack.Ops.Prefix
	owner, reader := prefix+"brain_registry_owner", prefix+"brain_registry_reader"
	conn := s.adminConn(prefix + "brain_registry")
	var tenants, rules []byte
	if err := conn.QueryRow(ctx, `SELECT COALESCE(json_agg(t), '[]'), (SELECT COALESCE(json_agg(r), '[]') FROM triage_rules r) FROM tenants t`).
		Scan(&tenants, &rules); err != nil {
		s.t.Fatal(err)
	}
	for _, q := range []string{
		`DROP SCHEMA public CASCADE`,
		`CREATE SCHEMA public AUTHORIZATION ` + pgx.Identifier{owner}.Sanitize(),
		`REVOKE ALL ON SCHEMA public FROM PUBLIC`,
		`GRANT USAGE ON SCHEMA public TO ` + pgx.Identifier{reader}.Sanitize(),
		`SET ROLE ` + pgx.Identifier{owner}.Sanitize(),
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			s.t.Fatalf("registry: %s: %v", q, err)
		}
	}
	if err := migrations.ApplyThrough(ctx, conn, migrations.Registry, prev); err != nil {
		s.t.Fatalf("registry at version %d: %v", prev, err)
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO tenants SELECT * FROM json_populate_recordset(NULL::tenants, $1)`, []any{tenants}},
		{`INSERT INTO triage_rules SELECT * FROM json_populate_recordset(NULL::triage_rules, $1)`, []any{rules}},
		{`RESET ROLE`, nil},
		{`GRANT SELECT ON ALL TABLES IN SCHEMA public TO ` + pgx.Identifier{reader}.Sanitize(), nil},
	} {
		if _, err := conn.Exec(ctx, q.sql, q.args...); err != nil {
			s.t.Fatalf("registry: %s: %v", q.sql, err)
		}
	}
}

// migrateReport is what `brainctl migrate --json` prints.
type migrateReport struct {
	Databases []struct {
		Tenant     string
		Cluster    string
		SchemaFrom int `json:"schema_from"`
		SchemaTo   int `json:"schema_to"`
		Streams    string
		OK         bool
		Error      *admin.Error
	}
	Failed int
}

// TestBrainctlMigrateFromThePreviousSchema: the registry and two tenant
// databases at the previous schema version (and a previous release's
// grants) are brought to this version by `brainctl migrate`, tenant by
// tenant, keeping their data; a tenant that fails is reported and the
// others are migrated; running it again changes nothing; then turns flow.
func TestBrainctlMigrateFromThePreviousSchema(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	c := s.brainctl()
	alpha, beta := s.onboard("alpha"), s.onboard("beta")
	s.createTenant(c, alpha)
	s.createTenant(c, beta)
	prevT, latestT := previous(t, migrations.Tenant)
	prevR, latestR := previous(t, migrations.Registry)
	roles := map[string][2]string{}
	for _, tn := range []string{"alpha", "beta"} {
		p := s.stack.Ops.Prefix
		roles[tn] = [2]string{p + "t_" + tn + "_owner", p + "t_" + tn + "_app"}
		s.downgradeTenantDB(p+"tenant_"+tn, roles[tn][0], roles[tn][1], prevT)
	}
	s.downgradeRegistry(prevR)

	// One tenant fails (its database is not where the registry says); the
	// registry and the other are migrated, and the report names it.
	pg := s.adminConn("postgres")
	betaDB := s.stack.Ops.Prefix + "tenant_beta"
	if _, err := pg.Exec(context.Background(), `ALTER DATABASE `+pgx.Identifier{betaDB}.Sanitize()+` RENAME TO `+pgx.Identifier{betaDB + "_away"}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	var rep migrateReport
	if code := c.json(&rep, "migrate"); code != admin.ExitError || rep.Failed != 1 || len(rep.Databases) != 3 {
		t.Fatalf("migrate with one tenant failing: exit %d, %+v", code, rep)
	}
	reg, a, b := rep.Databases[0], rep.Databases[1], rep.Databases[2]
	if !reg.OK || reg.SchemaFrom != prevR || reg.SchemaTo != latestR {
		t.Errorf("registry: %+v, want %d → %d", reg, prevR, latestR)
	}
	if !a.OK || a.Tenant != "alpha" || a.SchemaFrom != prevT || a.SchemaTo != latestT || a.Streams == "skipped" {
		t.Errorf("alpha: %+v, want %d → %d with its streams", a, prevT, latestT)
	}
	if b.OK || b.Tenant != "beta" || b.Error == nil || b.Error.Tenant != "beta" {
		t.Errorf("beta: %+v, want a failure naming beta", b)
	}
	if _, err := pg.Exec(context.Background(), `ALTER DATABASE `+pgx.Identifier{betaDB + "_away"}.Sanitize()+` RENAME TO `+pgx.Identifier{betaDB}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if code := c.json(&rep, "migrate"); code != admin.ExitOK || rep.Failed != 0 {
		t.Fatalf("migrate: exit %d, %+v", code, rep)
	}
	if b := rep.Databases[2]; b.SchemaFrom != prevT || b.SchemaTo != latestT {
		t.Errorf("beta: %+v, want %d → %d", b, prevT, latestT)
	}
	// Again: nothing to do, nothing fails.
	if code := c.json(&rep, "migrate"); code != admin.ExitOK || rep.Failed != 0 {
		t.Fatalf("migrate again: exit %d, %+v", code, rep)
	}
	for _, d := range rep.Databases {
		if d.SchemaFrom != d.SchemaTo {
			t.Errorf("second migrate changed %+v", d)
		}
	}

	// Grants follow the schema: the app roles may use every table, the
	// registry reader may read every table, and the old data is there.
	for tn, r := range roles {
		db := s.adminConn(s.stack.Ops.Prefix + "tenant_" + tn)
		if n := count(t, db, `SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'r'
			AND relname <> 'schema_migrations' AND NOT has_table_privilege($1, oid, 'SELECT, INSERT, UPDATE, DELETE')`, r[1]); n != 0 {
			t.Errorf("%s: the app role lacks rights on %d tables after migrate", tn, n)
		}
		if n := count(t, db, `SELECT count(*) FROM work_items WHERE id = '<old@x>'`); n != 1 {
			t.Errorf("%s: the work item written at version %d is gone", tn, prevT)
		}
	}
	regDB := s.adminConn(s.stack.Ops.Prefix + "brain_registry")
	if n := count(t, regDB, `SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'r'
		AND NOT has_table_privilege($1, oid, 'SELECT')`, s.stack.Ops.Prefix+"brain_registry_reader"); n != 0 {
		t.Errorf("the registry reader cannot read %d tables after migrate", n)
	}
	if n := count(t, regDB, `SELECT count(*) FROM triage_rules`); n != 2 {
		t.Errorf("registry has %d rules after migrate, want 2", n)
	}

	s.startBrain("r1", nil)
	for _, tn := range []struct {
		e  *edgeClient
		id string
	}{{s.startEdge(alpha, nil), "<a-after@x>"}, {s.startEdge(beta, nil), "<b-after@x>"}} {
		if rep := tn.e.submit(quoteEmail(tn.id)).reply(t); rep.Status != wire.WorkItemStatusAwaitingApproval {
			t.Fatalf("turn after migrate: %+v", rep)
		}
	}
	if n := count(t, s.adminConn(s.stack.Ops.Prefix+"tenant_alpha"), `SELECT count(*) FROM work_items WHERE id = '<a-after@x>'`); n != 1 {
		t.Fatal("alpha's turn after migrate is not in alpha's database")
	}
}

// TestMigrateWhileTheBrainRuns: an upgrade stops nothing (deploy/README,
// Upgrades). A brain that prepared its statements on the previous tenant
// schema keeps answering through `brainctl migrate`: turns are decided, and
// an API call whose cached plan the migration changed is called again at
// once (pgx prepares the statement anew), so no caller sees it.
func TestMigrateWhileTheBrainRuns(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	c := s.brainctl()
	alpha := s.onboard("alpha")
	s.createTenant(c, alpha)
	prevT, latestT := previous(t, migrations.Tenant)
	p := s.stack.Ops.Prefix
	app := p + "t_alpha_app"
	s.downgradeTenantDB(p+"tenant_alpha", p+"t_alpha_owner", app, prevT)
	// The helper leaves out a grant a previous release missed; this
	// release ran with it.
	if _, err := s.adminConn(p+"tenant_alpha").Exec(context.Background(),
		`GRANT SELECT, INSERT, UPDATE, DELETE ON approvals TO `+pgx.Identifier{app}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	_, ops := s.startOpsBrain("r1", nil)
	e := s.startEdge(alpha, nil)
	if rep := e.submit(quoteEmail("<before@x>")).reply(t); rep.Status != wire.WorkItemStatusAwaitingApproval {
		t.Fatalf("turn on the previous schema: %+v", rep)
	}
	// A turn after an item's first reads the item: that statement is now
	// prepared on the brain's connection. (No rule matches this one: the
	// item is escalated, and its next turns are decided again.)
	other := closedInvoice("<esc@x>")
	if rep := e.submit(other).reply(t); rep.Status != wire.WorkItemStatusEscalated {
		t.Fatalf("turn 1 on the previous schema: %+v", rep)
	}
	if rep := e.submit(later("<esc@x>", 2, nil)).reply(t); rep.Turn != 2 || rep.Replayed {
		t.Fatalf("turn 2 on the previous schema: %+v", rep)
	}
	if r := e.do(http.MethodGet, "/v1/approvals", nil); r.Status != http.StatusOK {
		t.Fatalf("approval list on the previous schema: %d %s", r.Status, r.Body)
	}

	var rep migrateReport
	if code := c.json(&rep, "migrate"); code != admin.ExitOK || rep.Failed != 0 {
		t.Fatalf("migrate while the brain runs: exit %d, %+v", code, rep)
	}
	if a := rep.Databases[1]; a.SchemaFrom != prevT || a.SchemaTo != latestT {
		t.Fatalf("alpha: %+v, want %d → %d", a, prevT, latestT)
	}
	// The brain's cached read fails once on its connection and is called
	// again at once: the caller never sees it.
	for i := range 3 {
		if r := e.do(http.MethodGet, "/v1/approvals", nil); r.Status != http.StatusOK || !strings.Contains(string(r.Body), "before@x") {
			t.Fatalf("approval list %d after migrate: %d %s", i+1, r.Status, r.Body)
		}
	}
	// Turn 3 reads the item through the changed plan, and is decided.
	if rep := e.submit(later("<esc@x>", 3, nil)).reply(t); rep.Turn != 3 || rep.Replayed {
		t.Fatalf("turn 3 after migrate: %+v", rep)
	}
	if rep := e.submit(quoteEmail("<after@x>")).reply(t); rep.Status != wire.WorkItemStatusAwaitingApproval {
		t.Fatalf("turn after migrate, same brain: %+v", rep)
	}
	// Tried again at once, not left to a redelivery (the decided series
	// shows the names are the brain's; the brain counts a turn just after
	// its reply is out, so the last may be counted after the edge answered).
	eventually(t, 10*time.Second, "the brain to count 5 decided turns", func() bool {
		return sumMetric(t, ops, "brain_turns_total", `outcome="decided"`, `tenant="alpha"`) == 5
	})
	if n := sumMetric(t, ops, "brain_turns_total", `outcome="retried"`, `tenant="alpha"`); n != 0 {
		t.Errorf("%v turns were left to a redelivery after the migration; want 0", n)
	}
}

// traffic submits turns through edges without pause until stopped, and
// counts them; every one must be answered 200.
type traffic struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	failures   []string
	stop       chan struct{}
	done       sync.WaitGroup
}

func startTraffic(t *testing.T, edges ...*edgeClient) *traffic {
	tr := &traffic{stop: make(chan struct{})}
	for i, e := range edges {
		tr.done.Add(1)
		go func() {
			defer tr.done.Done()
			for n := 0; ; n++ {
				select {
				case <-tr.stop:
					return
				default:
				}
				r := e.submit(quoteEmail(fmt.Sprintf("<flow-%d-%d@x>", i, n)))
				if r.Status == http.StatusOK {
					tr.ok.Add(1)
				} else {
					tr.failed.Add(1)
					tr.mu.Lock()
					tr.failures = append(tr.failures, fmt.Sprintf("%d %s", r.Status, r.Body))
					tr.mu.Unlock()
				}
			}
		}()
	}
	t.Cleanup(tr.halt)
	return tr
}

func (tr *traffic) halt() {
	select {
	case <-tr.stop:
	default:
		close(tr.stop)
	}
	tr.done.Wait()
}

// flows waits until n more turns have been answered.
func (tr *traffic) flows(t *testing.T, n int64, what string) {
	t.Helper()
	want := tr.ok.Load() + n
	eventually(t, 60*time.Second, fmt.Sprintf("%d more turns answered %s", n, what), func() bool { return tr.ok.Load() >= want })
}

// TestBrainctlSealingKeyRotationWhileTurnsFlow follows the runbook's three
// steps while two tenants' turns keep flowing: brains with the new key and
// the old as previous replace those with the old key alone; `brainctl
// seal-key rotate` re-seals every password; brains with the new key alone
// replace those. No turn fails at any point, and afterwards the old key
// opens nothing.
func TestBrainctlSealingKeyRotationWhileTurnsFlow(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	c := s.brainctl()
	alpha, beta := s.onboard("alpha"), s.onboard("beta")
	s.createTenant(c, alpha)
	s.createTenant(c, beta)
	oldKey := s.stack.SealingKey
	newKey, err := registry.ParseKey(registry.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	stopOld := s.startBrain("old", nil)
	tr := startTraffic(t, s.startEdge(alpha, nil), s.startEdge(beta, nil))
	tr.flows(t, 20, "before the rotation")

	// 1. Brains that open either key take over from those with the old one.
	stopBoth := s.startBrain("both", func(cfg *brain.Config) { cfg.SealingKey, cfg.PreviousSealingKey = newKey, oldKey })
	stopOld()
	tr.flows(t, 20, "with the new key and the previous one")

	// 2. Re-seal every password with the new key, turns still flowing.
	rotating := c.with("BRAIN_SEALING_KEY", hex.EncodeToString(newKey), "BRAIN_SEALING_KEY_PREVIOUS", hex.EncodeToString(oldKey))
	var rot struct {
		Tenants []struct{ Tenant, Was, Now string }
		Failed  int
	}
	if code := rotating.json(&rot, "seal-key", "rotate"); code != admin.ExitOK || rot.Failed != 0 || len(rot.Tenants) != 2 {
		t.Fatalf("rotate: exit %d, %+v", code, rot)
	}
	for _, r := range rot.Tenants {
		if r.Was != "previous" || r.Now != "current" {
			t.Errorf("rotate %s: %+v", r.Tenant, r)
		}
	}
	tr.flows(t, 20, "after re-sealing")

	// 3. Brains with the new key alone take over; the previous key retires.
	newOnly := c.with("BRAIN_SEALING_KEY", hex.EncodeToString(newKey))
	newOnly.ok("seal-key", "check")
	s.startBrain("new", func(cfg *brain.Config) { cfg.SealingKey = newKey })
	stopBoth()
	tr.flows(t, 20, "with the new key alone")
	tr.halt()
	if tr.failed.Load() != 0 {
		t.Fatalf("%d of %d turns failed during the rotation, first: %v", tr.failed.Load(), tr.failed.Load()+tr.ok.Load(), tr.failures[0])
	}
	t.Logf("%d turns answered during the rotation, none failed", tr.ok.Load())

	// Re-running the rotation is safe; the old key now opens nothing.
	if code := rotating.json(&rot, "seal-key", "rotate"); code != admin.ExitOK || rot.Tenants[0].Was != "current" {
		t.Fatalf("second rotate: exit %d, %+v", code, rot)
	}
	code, _, _ := c.run("seal-key", "check")
	if code != admin.ExitError {
		t.Fatalf("check with the old key alone: exit %d, want %d (it opens nothing now)", code, admin.ExitError)
	}
}

// TestBrainctlTenantsOnTwoClusters: a tenant whose database is on a second
// Postgres cluster is created, served by the same brain, migrated (once
// brainctl is given that cluster's admin URL; without it the tenant is
// reported and the others go on) and deleted, while the registry and
// another tenant stay on the first.
func TestBrainctlTenantsOnTwoClusters(t *testing.T) {
	t.Parallel()
	second := testdb.PrivateCluster(t)
	s := newSystem(t)
	c := s.brainctl()
	home, away := s.onboard("home"), s.onboard("away")
	s.createTenant(c, home)
	ra := s.createTenant(c, away, "--db-admin-url", second.AdminURL())
	want := net.JoinHostPort("127.0.0.1", fmt.Sprint(second.Port))
	if ra.Tenant.Cluster != want {
		t.Fatalf("away's database is on %s, want %s", ra.Tenant.Cluster, want)
	}
	secondAdmin := func(db string) *pgx.Conn {
		cfg, err := pgx.ParseConfig(second.AdminURL())
		if err != nil {
			t.Fatal(err)
		}
		cfg.Database = db
		conn, err := pgx.ConnectConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}
	if n := count(t, s.adminConn("postgres"), `SELECT count(*) FROM pg_database WHERE datname = $1`, ra.Database); n != 0 {
		t.Fatal("away's database is on the registry's cluster")
	}

	s.startBrain("r1", nil)
	for _, x := range []struct {
		e  *edgeClient
		id string
	}{{s.startEdge(home, nil), "<home@x>"}, {s.startEdge(away, nil), "<away@x>"}} {
		if rep := x.e.submit(quoteEmail(x.id)).reply(t); rep.Status != wire.WorkItemStatusAwaitingApproval {
			t.Fatalf("turn %s: %+v", x.id, rep)
		}
	}
	if n := count(t, secondAdmin(ra.Database), `SELECT count(*) FROM work_items WHERE id = '<away@x>'`); n != 1 {
		t.Fatal("away's turn is not in its database on the second cluster")
	}

	var rep migrateReport
	if code := c.json(&rep, "migrate"); code != admin.ExitError || rep.Failed != 1 {
		t.Fatalf("migrate without the second cluster's URL: exit %d, %+v", code, rep)
	}
	for _, d := range rep.Databases[1:] {
		if d.Tenant == "away" && (d.Error == nil || d.Error.Field != "--cluster" || d.Cluster != want) {
			t.Errorf("away without its cluster: %+v", d)
		}
		if d.Tenant == "home" && !d.OK {
			t.Errorf("home: %+v", d)
		}
	}
	withSecond := c.with("BRAINCTL_CLUSTERS", want+"="+second.AdminURL())
	if code := withSecond.json(&rep, "migrate"); code != admin.ExitOK || rep.Failed != 0 {
		t.Fatalf("migrate with both clusters: exit %d, %+v", code, rep)
	}

	var del struct {
		DroppedDB bool   `json:"database_dropped"`
		Cluster   string `json:"cluster"`
	}
	if code := withSecond.json(&del, "tenant", "delete", "away", "--force"); code != admin.ExitOK || !del.DroppedDB || del.Cluster != want {
		t.Fatalf("delete away: exit %d, %+v", code, del)
	}
	if n := count(t, secondAdmin("postgres"), `SELECT count(*) FROM pg_database WHERE datname = $1`, ra.Database); n != 0 {
		t.Fatal("away's database is still on the second cluster")
	}
}
