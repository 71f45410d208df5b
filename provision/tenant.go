package provision

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"n8nbrain/catalogue"
	"n8nbrain/migrations"
	"n8nbrain/registry"
)

// ErrTenantExists means the registry already has a tenant with that id.
var ErrTenantExists = errors.New("tenant already exists")

// TenantSpec is what ops decide about a new tenant. Zero values take the
// defaults noted.
type TenantSpec struct {
	ID               registry.TenantID     // ^[a-z0-9][a-z0-9-]{0,47}$
	NATSAccount      string                // the tenant's NATS account public key
	TurnCeiling      int                   // default 8
	ApprovalMode     registry.ApprovalMode // default review_app
	ApprovalTTL      time.Duration         // default 72h; whole seconds are kept
	CatalogueVersion catalogue.Version     // default catalogue.Current
	EnabledActions   []catalogue.Name
	Categories       []string // default DefaultCategories
	Rules            []registry.Rule
	ModelName        string
	ModelOptions     map[string]any
	DailyTokenBudget int64
	// Quota bounds the tenant on the shared brain; zero fields take the
	// registry's defaults (registry.DefaultQuota*).
	Quota    registry.Quota
	Autonomy registry.Autonomy // default registry.AutonomyAssist
}

// DefaultCategories are a tenant's triage categories unless its spec names
// others.
func DefaultCategories() []string {
	return []string{"quote_request", "complaint", "booking", "invoice", "general"}
}

// Tenant is a provisioned tenant.
type Tenant struct {
	Spec        TenantSpec // with defaults applied and rule params in canonical form
	DBName      string
	OwnerRole   string
	AppRole     string
	AppPassword string
	// AppURL is the app role's URL of the tenant database (as the brain
	// would build it from the registry row).
	AppURL string
}

type tenantNames struct {
	owner, app, db string
}

func (c *cluster) tenantNames(id registry.TenantID) (tenantNames, error) {
	base := strings.ReplaceAll(string(id), "-", "_")
	n := tenantNames{
		owner: c.prefix + "t_" + base + "_owner",
		app:   c.prefix + "t_" + base + "_app",
		db:    c.prefix + "tenant_" + base,
	}
	for _, x := range []struct{ kind, name string }{{"owner role", n.owner}, {"app role", n.app}, {"database", n.db}} {
		if err := checkIdentLen(x.kind, x.name); err != nil {
			return n, err
		}
	}
	return n, nil
}

// appConnLimit bounds the connections of one tenant's app role, whatever the
// brain's pools do.
const appConnLimit = 20

// CreateTenant creates a tenant end to end: its owner and app roles, its
// database with the tenant migrations applied and the app role's grants, and
// its registry row with the app password sealed. The spec is validated before
// anything is created (a *SpecError says what is wrong); if a later step
// fails, what this call created is dropped again. A tenant already in the
// registry is an error wrapping ErrTenantExists. The database is created on
// the registry's cluster (CreateTenantOn takes another).
func (o *Ops) CreateTenant(ctx context.Context, spec TenantSpec) (*Tenant, error) {
	return o.CreateTenantOn(ctx, spec, Cluster{})
}

// CreateTenantOn is CreateTenant with the tenant's database, roles and
// grants on cluster cl, and the registry row (naming cl's Host and Port) in
// the registry of Ops' cluster.
func (o *Ops) CreateTenantOn(ctx context.Context, spec TenantSpec, cl Cluster) (*Tenant, error) {
	rc, err := o.cluster()
	if err != nil {
		return nil, err
	}
	c, err := o.tenantCluster(cl)
	if err != nil {
		return nil, err
	}
	if c.sealer == nil {
		return nil, errors.New("provision: Ops.Sealer is required to create a tenant")
	}
	if err := o.Reserved.Known(); err != nil {
		return nil, fmt.Errorf("provision: Ops.Reserved is required to create a tenant, so that none is registered with an operator account: %w", err)
	}
	spec, err = validateSpec(spec)
	if err != nil {
		return nil, err
	}
	if err := o.Reserved.CheckTenantAccount(spec.ID, spec.NATSAccount); err != nil {
		return nil, err
	}
	n, err := c.tenantNames(spec.ID)
	if err != nil {
		return nil, fmt.Errorf("create tenant %s: %w", spec.ID, err)
	}

	admin, err := c.connect(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("create tenant %s: %w", spec.ID, err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	// Under this lock, a database or role of this tenant without a registry
	// row can only be what an interrupted run left, safe to reuse or drop.
	if err := lock(ctx, admin, "tenant:"+n.db); err != nil {
		return nil, fmt.Errorf("create tenant %s: %w", spec.ID, err)
	}
	reg, err := rc.registryAdmin(ctx)
	if err != nil {
		return nil, fmt.Errorf("create tenant %s: %w", spec.ID, err)
	}
	defer reg.Close(context.WithoutCancel(ctx))
	var exists bool
	var accountOwner *string
	err = reg.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM tenants WHERE id = $1),
		(SELECT id FROM tenants WHERE nats_account = $2)`, spec.ID, spec.NATSAccount).Scan(&exists, &accountOwner)
	if err != nil {
		return nil, fmt.Errorf("create tenant %s: look up registry: %w", spec.ID, err)
	}
	if exists {
		return nil, fmt.Errorf("create tenant %s: %w", spec.ID, ErrTenantExists)
	}
	if accountOwner != nil {
		return nil, &SpecError{Tenant: spec.ID, Problems: []string{
			fmt.Sprintf("NATS account %s is already tenant %s's", spec.NATSAccount, *accountOwner)}}
	}

	t := &Tenant{Spec: spec, DBName: n.db, OwnerRole: n.owner, AppRole: n.app, AppPassword: newPassword()}
	t.AppURL = c.url(n.app, t.AppPassword, n.db)
	if err := c.createTenant(ctx, admin, reg, t); err != nil {
		if errors.Is(err, ErrTenantExists) {
			return nil, fmt.Errorf("create tenant %s: %w", spec.ID, err) // not ours to drop
		}
		if dropErr := dropTenant(context.WithoutCancel(ctx), admin, n); dropErr != nil {
			err = errors.Join(err, fmt.Errorf("clean up after the failure: %w", dropErr))
		}
		return nil, fmt.Errorf("create tenant %s: %w", spec.ID, err)
	}
	return t, nil
}

func (c *cluster) createTenant(ctx context.Context, admin, reg *pgx.Conn, t *Tenant) error {
	n := tenantNames{owner: t.OwnerRole, app: t.AppRole, db: t.DBName}
	pwClause, err := passwordClause(t.AppPassword, generatedPasswordIterations)
	if err != nil {
		return err
	}
	if err := ensureOwnerRole(ctx, admin, n.owner); err != nil {
		return err
	}
	if err := ensureLoginRole(ctx, admin, n.app, pwClause, appConnLimit); err != nil {
		return err
	}
	if err := ensureDatabase(ctx, admin, n.db, n.owner, n.app); err != nil {
		return err
	}
	if err := migrateTenantDB(ctx, c, n); err != nil {
		return err
	}
	s := t.Spec
	row := registry.Tenant{
		ID:          s.ID,
		NATSAccount: s.NATSAccount,
		Status:      registry.TenantStatusActive,
		DB: registry.DBConfig{
			Host:           c.host,
			Port:           c.port,
			Name:           n.db,
			User:           n.app,
			PasswordSealed: c.sealer.Seal(s.ID, []byte(t.AppPassword)),
		},
		TurnCeiling:      s.TurnCeiling,
		ApprovalMode:     s.ApprovalMode,
		ApprovalTTL:      s.ApprovalTTL,
		CatalogueVersion: s.CatalogueVersion,
		EnabledActions:   s.EnabledActions,
		Categories:       s.Categories,
		ModelName:        s.ModelName,
		ModelOptions:     s.ModelOptions,
		DailyTokenBudget: s.DailyTokenBudget,
		Quota:            s.Quota,
		Rules:            s.Rules,
		Autonomy:         s.Autonomy,
	}
	err = pgx.BeginFunc(ctx, reg, func(tx pgx.Tx) error { return registry.TenantInsert(ctx, tx, row) })
	if isCode(err, "23505") && strings.Contains(err.Error(), "tenants_pkey") {
		return fmt.Errorf("%w (inserted meanwhile)", ErrTenantExists)
	}
	return err
}

// migrateTenantDB closes the public schema to PUBLIC, applies the tenant
// migrations as the owner role and (re)grants the app role its rights.
func migrateTenantDB(ctx context.Context, c *cluster, n tenantNames) error {
	db, err := c.connect(ctx, n.db)
	if err != nil {
		return err
	}
	defer db.Close(context.WithoutCancel(ctx))
	owner, app := ident(n.owner), ident(n.app)
	if _, err := hideCluster(ctx, db); err != nil {
		return fmt.Errorf("database %s: %w", n.db, err)
	}
	// A role may set its own defaults (ALTER ROLE CURRENT_USER SET …): the
	// app role has none but what provisioning gives it, which is nothing.
	err = execAll(ctx, db,
		`ALTER ROLE `+app+` RESET ALL`,
		`ALTER ROLE `+app+` IN DATABASE `+ident(n.db)+` RESET ALL`,
		`ALTER SCHEMA public OWNER TO `+owner,
		`REVOKE ALL ON SCHEMA public FROM PUBLIC`,
		`GRANT USAGE ON SCHEMA public TO `+app,
		`SET ROLE `+owner,
	)
	if err != nil {
		return fmt.Errorf("database %s: prepare schema: %w", n.db, err)
	}
	if err := migrations.Apply(ctx, db, migrations.Tenant); err != nil {
		return fmt.Errorf("database %s: %w", n.db, err)
	}
	// Rows only: no TRUNCATE, REFERENCES or TRIGGER, and nothing on the
	// migrations' own bookkeeping. Default privileges give tables that later
	// migrations create the same grants.
	err = execAll(ctx, db,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO `+app,
		`REVOKE ALL ON TABLE schema_migrations FROM `+app,
		`GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO `+app,
		`ALTER DEFAULT PRIVILEGES FOR ROLE `+owner+` IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO `+app,
		`ALTER DEFAULT PRIVILEGES FOR ROLE `+owner+` IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO `+app,
	)
	if err != nil {
		return fmt.Errorf("database %s: grant %s: %w", n.db, n.app, err)
	}
	return nil
}

// dropTenant removes a tenant's database and roles (only after a failed
// create: the registry row does not exist).
func dropTenant(ctx context.Context, admin *pgx.Conn, n tenantNames) error {
	return execAll(ctx, admin,
		`DROP DATABASE IF EXISTS `+ident(n.db)+` WITH (FORCE)`,
		`DROP ROLE IF EXISTS `+ident(n.app),
		`DROP ROLE IF EXISTS `+ident(n.owner),
	)
}

// RepairTenantRole puts a tenant's app role back as provisioning left it:
// the password sealed in the registry (a role may change its own password,
// which locks the brain out of the tenant's database), written with a
// generated password's SCRAM iterations, no role-level settings (a role may
// set its own), and its grants (as MigrateTenant). The brain's next
// connection logs in again; nothing in the registry changes. The database is
// on the registry's cluster (RepairTenantRoleOn takes another).
func (o *Ops) RepairTenantRole(ctx context.Context, id registry.TenantID) error {
	return o.RepairTenantRoleOn(ctx, id, Cluster{})
}

// RepairTenantRoleOn is RepairTenantRole for a tenant whose database is on
// cluster cl.
func (o *Ops) RepairTenantRoleOn(ctx context.Context, id registry.TenantID, cl Cluster) error {
	if o.Sealer == nil {
		return errors.New("provision: Ops.Sealer is required to repair a tenant's role")
	}
	t, err := o.Tenant(ctx, id)
	if err != nil {
		return err // it names the tenant
	}
	c, err := o.clusterOf(t, cl)
	if err != nil {
		return err
	}
	pw, err := o.Sealer.Open(t.ID, t.DB.PasswordSealed)
	if err != nil {
		return fmt.Errorf("repair tenant %s: the sealing key does not open its password: %w", id, err)
	}
	pwClause, err := passwordClause(string(pw), generatedPasswordIterations)
	if err != nil {
		return fmt.Errorf("repair tenant %s: %w", id, err)
	}
	admin, err := c.connect(ctx, "")
	if err != nil {
		return fmt.Errorf("repair tenant %s: %w", id, err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if err := ensureLoginRole(ctx, admin, t.DB.User, pwClause, appConnLimit); err != nil {
		return fmt.Errorf("repair tenant %s: %w", id, err)
	}
	// The row and cluster just read and checked: no second registry read.
	_, err = migrateTenant(ctx, t, c)
	return err
}

// MigrateTenant applies the tenant migrations an existing tenant database has
// not had yet, as its owner, and re-applies the app role's grants: the
// upgrade path after a release adds migrations. The database is on the
// registry's cluster (MigrateTenantOn takes another).
func (o *Ops) MigrateTenant(ctx context.Context, id registry.TenantID) error {
	_, err := o.MigrateTenantOn(ctx, id, Cluster{})
	return err
}
