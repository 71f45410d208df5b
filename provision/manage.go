package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5"

	"n8nbrain/catalogue"
	"n8nbrain/migrations"
	"n8nbrain/registry"
)

// The tenant lifecycle after creation (brainctl's verbs): reading,
// updating, enabling and disabling, migrating, deleting, and re-sealing
// passwords under a new sealing key. Tenants' streams are not here (they
// need NATS): see Streams.

// ErrTenantNotFound means the registry has no tenant with that id.
var ErrTenantNotFound = errors.New("not in the registry")

// Tenant returns a tenant's registry row with its rules.
func (o *Ops) Tenant(ctx context.Context, id registry.TenantID) (registry.Tenant, error) {
	reg, err := o.RegistryAdmin(ctx)
	if err != nil {
		return registry.Tenant{}, err
	}
	defer reg.Close(context.WithoutCancel(ctx))
	return tenantGet(ctx, reg, id)
}

func tenantGet(ctx context.Context, q registry.DBTX, id registry.TenantID) (registry.Tenant, error) {
	t, err := registry.TenantGet(ctx, q, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, fmt.Errorf("tenant %s: %w", id, ErrTenantNotFound)
	}
	return t, err
}

// Tenants returns every tenant's registry row with its rules, by id.
func (o *Ops) Tenants(ctx context.Context) ([]registry.Tenant, error) {
	reg, err := o.RegistryAdmin(ctx)
	if err != nil {
		return nil, err
	}
	defer reg.Close(context.WithoutCancel(ctx))
	return registry.TenantList(ctx, reg)
}

// SpecOf is the spec a registry row was made from: what UpdateTenant edits.
func SpecOf(t registry.Tenant) TenantSpec {
	return TenantSpec{
		ID:               t.ID,
		NATSAccount:      t.NATSAccount,
		TurnCeiling:      t.TurnCeiling,
		ApprovalMode:     t.ApprovalMode,
		ApprovalTTL:      t.ApprovalTTL,
		CatalogueVersion: t.CatalogueVersion,
		EnabledActions:   slices.Clone(t.EnabledActions),
		Categories:       slices.Clone(t.Categories),
		Rules:            slices.Clone(t.Rules),
		ModelName:        t.ModelName,
		ModelOptions:     maps.Clone(t.ModelOptions),
		DailyTokenBudget: t.DailyTokenBudget,
		Quota:            t.Quota,
	}
}

// ValidateSpec applies a spec's defaults and checks it, as CreateTenant
// and UpdateTenant do; a *SpecError says what is wrong.
func ValidateSpec(s TenantSpec) (TenantSpec, error) { return validateSpec(s) }

// WithSettings is t with the settings of a validated spec: not its id,
// account, database or rules.
func WithSettings(t registry.Tenant, spec TenantSpec) registry.Tenant {
	t.TurnCeiling, t.ApprovalMode, t.ApprovalTTL = spec.TurnCeiling, spec.ApprovalMode, spec.ApprovalTTL
	t.CatalogueVersion, t.EnabledActions, t.Categories = spec.CatalogueVersion, spec.EnabledActions, spec.Categories
	t.ModelName, t.ModelOptions, t.DailyTokenBudget = spec.ModelName, spec.ModelOptions, spec.DailyTokenBudget
	t.Quota = spec.Quota
	return t
}

// UpdateTenant changes a tenant's settings and rules: edit gets the spec of
// the registry row and changes it; the result is validated as a new tenant's
// would be (a *SpecError says what is wrong, and nothing changes) and
// written in one transaction; what is as it was is not written again. The
// id, NATS account and database cannot change. It returns the row before
// and after.
func (o *Ops) UpdateTenant(ctx context.Context, id registry.TenantID, edit func(*TenantSpec) error) (before, after registry.Tenant, err error) {
	reg, err := o.RegistryAdmin(ctx)
	if err != nil {
		return before, after, err
	}
	defer reg.Close(context.WithoutCancel(ctx))
	err = pgx.BeginFunc(ctx, reg, func(tx pgx.Tx) error {
		ok, err := registry.TenantLock(ctx, tx, id)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("tenant %s: %w", id, ErrTenantNotFound)
		}
		if before, err = tenantGet(ctx, tx, id); err != nil {
			return err
		}
		spec := SpecOf(before)
		if err := edit(&spec); err != nil {
			return err
		}
		if spec.ID != before.ID {
			return &SpecError{Tenant: id, Problems: []string{fmt.Sprintf("tenant %s: the id cannot change", id)}}
		}
		if spec.NATSAccount != before.NATSAccount {
			return &SpecError{Tenant: id, Problems: []string{fmt.Sprintf("tenant %s: the NATS account cannot change "+
				"(its streams, imports and users are the account's: onboard a new tenant instead)", id)}}
		}
		if spec, err = validateSpec(spec); err != nil {
			return err
		}
		row := WithSettings(before, spec)
		// Settings as they were are not written again: re-running an
		// update changes nothing, updated_at included.
		if !sameSettings(before, row) {
			if _, err := registry.TenantUpdate(ctx, tx, row); err != nil {
				return err
			}
		}
		if !SameRules(before.Rules, spec.Rules) {
			if err := registry.RulesReplace(ctx, tx, id, spec.Rules); err != nil {
				return err
			}
		}
		after, err = tenantGet(ctx, tx, id)
		return err
	})
	return before, after, err
}

// sameSettings compares the settings UpdateTenant writes, as the registry
// stores them (a nil and an empty list or map are the same).
func sameSettings(a, b registry.Tenant) bool {
	norm := func(t registry.Tenant) string {
		opts := t.ModelOptions
		if opts == nil {
			opts = map[string]any{}
		}
		v, _ := json.Marshal([]any{t.Status, t.TurnCeiling, t.ApprovalMode, t.ApprovalTTL, t.CatalogueVersion,
			slices.Concat([]catalogue.Name{}, t.EnabledActions), slices.Concat([]string{}, t.Categories),
			t.ModelName, opts, t.DailyTokenBudget, t.Quota.WithDefaults()})
		return string(v)
	}
	return norm(a) == norm(b)
}

// SameRules reports whether two rule lists are the same as written
// (position aside, params compared as JSON).
func SameRules(a, b []registry.Rule) bool {
	norm := func(rs []registry.Rule) string {
		type r struct {
			Name       string
			Match      registry.Match
			Category   string
			Priority   string
			Action     catalogue.Name
			Params     any
			Confidence float64
		}
		out := make([]r, len(rs))
		for i, x := range rs {
			var p any
			if len(x.Params) > 0 {
				_ = json.Unmarshal(x.Params, &p)
			}
			if m, ok := p.(map[string]any); ok && len(m) == 0 {
				p = nil
			}
			out[i] = r{x.Name, x.Match, x.Category, x.Priority, x.Action, p, x.Confidence}
		}
		b, _ := json.Marshal(out)
		return string(b)
	}
	return norm(a) == norm(b)
}

// SetTenantStatus enables or disables a tenant and reports whether its
// status changed. Brains refuse a disabled tenant's turns within moments
// (the registry notifies them); its data, streams and users stay.
func (o *Ops) SetTenantStatus(ctx context.Context, id registry.TenantID, s registry.TenantStatus) (bool, error) {
	if s != registry.TenantStatusActive && s != registry.TenantStatusDisabled {
		return false, fmt.Errorf("tenant %s: status %q must be %s or %s", id, s, registry.TenantStatusActive, registry.TenantStatusDisabled)
	}
	reg, err := o.RegistryAdmin(ctx)
	if err != nil {
		return false, err
	}
	defer reg.Close(context.WithoutCancel(ctx))
	var changed bool
	err = pgx.BeginFunc(ctx, reg, func(tx pgx.Tx) error {
		ok, err := registry.TenantLock(ctx, tx, id)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("tenant %s: %w", id, ErrTenantNotFound)
		}
		changed, err = registry.TenantSetStatus(ctx, tx, id, s)
		return err
	})
	return changed, err
}

// Work is what a tenant's database holds that deleting it would lose.
type Work struct {
	// ItemsByStatus counts work items by status.
	ItemsByStatus map[string]int `json:"items_by_status"`
	// Open counts the work items not closed (closed, closed_manual).
	Open              int `json:"open"`
	PendingApprovals  int `json:"pending_approvals"`
	UndeliveredEvents int `json:"undelivered_events"`
	Decisions         int `json:"decisions"`
}

// TenantWork counts a tenant's work items, pending approvals, events not
// yet delivered and decisions, reading its database on cluster cl as the
// admin.
func (o *Ops) TenantWork(ctx context.Context, t registry.Tenant, cl Cluster) (Work, error) {
	w := Work{ItemsByStatus: map[string]int{}}
	c, err := o.clusterOf(t, cl)
	if err != nil {
		return w, err
	}
	db, err := c.connect(ctx, t.DB.Name)
	if err != nil {
		return w, fmt.Errorf("tenant %s: %w", t.ID, err)
	}
	defer db.Close(context.WithoutCancel(ctx))
	rows, _ := db.Query(ctx, `SELECT status, count(*) FROM work_items GROUP BY status`)
	var status string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&status, &n}, func() error {
		w.ItemsByStatus[status] = n
		if status != "closed" && status != "closed_manual" {
			w.Open += n
		}
		return nil
	}); err != nil {
		return w, fmt.Errorf("tenant %s: count work items: %w", t.ID, err)
	}
	err = db.QueryRow(ctx, `SELECT (SELECT count(*) FROM approvals WHERE status = 'pending'),
		(SELECT count(*) FROM outbox WHERE delivered_at IS NULL), (SELECT count(*) FROM decisions)`).
		Scan(&w.PendingApprovals, &w.UndeliveredEvents, &w.Decisions)
	if err != nil {
		return w, fmt.Errorf("tenant %s: count approvals, events and decisions: %w", t.ID, err)
	}
	return w, nil
}

// clusterOf is the cluster of a tenant's database: cl, which must be where
// the registry row says the database is (so nothing acts on a same-named
// database elsewhere).
func (o *Ops) clusterOf(t registry.Tenant, cl Cluster) (*cluster, error) {
	c, err := o.tenantCluster(cl)
	if err != nil {
		return nil, err
	}
	if t.DB.Host != c.host || t.DB.Port != c.port {
		return nil, &ClusterError{Tenant: t.ID, Want: Cluster{Host: t.DB.Host, Port: t.DB.Port}.Addr(),
			Got: Cluster{Host: c.host, Port: c.port}.Addr()}
	}
	return c, nil
}

// ClusterError means a tenant's database is on another cluster than the
// admin URL given reaches.
type ClusterError struct {
	Tenant    registry.TenantID
	Want, Got string // host:port as the brain reaches them
}

func (e *ClusterError) Error() string {
	return fmt.Sprintf("tenant %s: its database is on cluster %s (registry db_host, db_port), not %s: "+
		"give that cluster's admin URL", e.Tenant, e.Want, e.Got)
}

// DeleteReport says what DeleteTenant removed.
type DeleteReport struct {
	Tenant      registry.TenantID `json:"tenant"`
	RegistryRow bool              `json:"registry_row"`
	Rules       int               `json:"rules"`
	Cluster     string            `json:"cluster"`
	Database    string            `json:"database"`
	DroppedDB   bool              `json:"database_dropped"`
	Roles       []string          `json:"roles_dropped"`
}

// DeleteTenant drops a tenant's database (closing whatever connections it
// has) and its roles on cluster cl, then removes its registry row and rules
// (brains drop the tenant when the row goes). It does not look at what the
// database holds (TenantWork) nor at its streams (Streams.DeleteTenant):
// callers do both first, and disable the tenant. The row goes last, so
// running it again finishes an interrupted delete on the cluster the row
// names; with the row gone, the database and roles named after the id on cl
// are dropped if they are there.
func (o *Ops) DeleteTenant(ctx context.Context, id registry.TenantID, cl Cluster) (DeleteReport, error) {
	rep := DeleteReport{Tenant: id}
	reg, err := o.RegistryAdmin(ctx)
	if err != nil {
		return rep, err
	}
	defer reg.Close(context.WithoutCancel(ctx))
	row, err := tenantGet(ctx, reg, id)
	gone := errors.Is(err, ErrTenantNotFound)
	if err != nil && !gone {
		return rep, err
	}
	var c *cluster
	if gone {
		c, err = o.tenantCluster(cl)
	} else {
		c, err = o.clusterOf(row, cl)
	}
	if err != nil {
		return rep, err
	}
	n, err := c.tenantNames(id)
	if err != nil {
		return rep, fmt.Errorf("delete tenant %s: %w", id, err)
	}
	if !gone {
		// The row is the record of what was created.
		n.db, n.app = row.DB.Name, row.DB.User
	}
	rep.Cluster, rep.Database = Cluster{Host: c.host, Port: c.port}.Addr(), n.db

	admin, err := c.connect(ctx, "")
	if err != nil {
		return rep, fmt.Errorf("delete tenant %s: %w", id, err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if err := lock(ctx, admin, "tenant:"+n.db); err != nil {
		return rep, fmt.Errorf("delete tenant %s: %w", id, err)
	}
	var owner *string
	if err := admin.QueryRow(ctx, `SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = $1`, n.db).Scan(&owner); err != nil &&
		!errors.Is(err, pgx.ErrNoRows) {
		return rep, fmt.Errorf("delete tenant %s: look up database %s: %w", id, n.db, err)
	}
	if owner != nil && *owner != n.owner {
		// Owned by an unexpected role: drop the database, keep that role.
		n.owner = ""
	}
	if owner != nil {
		if _, err := admin.Exec(ctx, `DROP DATABASE IF EXISTS `+ident(n.db)+` WITH (FORCE)`); err != nil {
			return rep, fmt.Errorf("delete tenant %s: drop database %s: %w", id, n.db, err)
		}
		rep.DroppedDB = true
	}
	for _, role := range []string{n.app, n.owner} {
		if role == "" {
			continue
		}
		tag, err := admin.Exec(ctx, `SELECT 1 FROM pg_roles WHERE rolname = $1`, role)
		if err != nil {
			return rep, fmt.Errorf("delete tenant %s: look up role %s: %w", id, role, err)
		}
		if tag.RowsAffected() == 0 {
			continue
		}
		if _, err := admin.Exec(ctx, `DROP ROLE `+ident(role)); err != nil {
			return rep, fmt.Errorf("delete tenant %s: drop role %s: %w", id, role, err)
		}
		rep.Roles = append(rep.Roles, role)
	}
	if !gone {
		err := pgx.BeginFunc(ctx, reg, func(tx pgx.Tx) error {
			var err error
			rep.Rules, rep.RegistryRow, err = registry.TenantDelete(ctx, tx, id)
			return err
		})
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// MigrateResult is a database's schema version before and after.
type MigrateResult struct {
	From int `json:"from"`
	To   int `json:"to"`
}

// MigrateRegistry brings an existing registry to the current schema and
// re-applies its grants, leaving the reader's password as it is. A registry
// that does not exist yet is an error: BootstrapRegistry creates it.
func (o *Ops) MigrateRegistry(ctx context.Context) (MigrateResult, error) {
	var res MigrateResult
	reg, err := o.RegistryAdmin(ctx)
	if err != nil {
		return res, err
	}
	res.From, err = migrations.Applied(ctx, reg)
	reg.Close(context.WithoutCancel(ctx))
	if err != nil {
		return res, fmt.Errorf("registry: %w", err)
	}
	if _, err := o.bootstrapRegistry(ctx, nil); err != nil {
		return res, err
	}
	reg, err = o.RegistryAdmin(ctx)
	if err != nil {
		return res, err
	}
	defer reg.Close(context.WithoutCancel(ctx))
	res.To, err = migrations.Applied(ctx, reg)
	return res, err
}

// MigrateTenantOn brings a tenant's database on cluster cl to the current
// schema as its owner, and re-applies its database's and app role's grants.
func (o *Ops) MigrateTenantOn(ctx context.Context, id registry.TenantID, cl Cluster) (MigrateResult, error) {
	t, err := o.Tenant(ctx, id)
	if err != nil {
		return MigrateResult{}, err // it names the tenant
	}
	c, err := o.clusterOf(t, cl)
	if err != nil {
		return MigrateResult{}, err
	}
	return migrateTenant(ctx, t, c)
}

// migrateTenant is MigrateTenantOn for a registry row already read and its
// cluster already checked.
func migrateTenant(ctx context.Context, t registry.Tenant, c *cluster) (MigrateResult, error) {
	var res MigrateResult
	id := t.ID
	admin, err := c.connect(ctx, "")
	if err != nil {
		return res, fmt.Errorf("migrate tenant %s: %w", id, err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if err := lock(ctx, admin, "tenant:"+t.DB.Name); err != nil {
		return res, fmt.Errorf("migrate tenant %s: %w", id, err)
	}
	// The registry row names the database and app role; the owner is
	// whoever owns the database.
	var owner string
	err = admin.QueryRow(ctx, `SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = $1`, t.DB.Name).Scan(&owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return res, fmt.Errorf("migrate tenant %s: database %s does not exist on cluster %s", id, t.DB.Name, Cluster{Host: c.host, Port: c.port}.Addr())
	}
	if err != nil {
		return res, fmt.Errorf("migrate tenant %s: look up database %s: %w", id, t.DB.Name, err)
	}
	db, err := c.connect(ctx, t.DB.Name)
	if err != nil {
		return res, fmt.Errorf("migrate tenant %s: %w", id, err)
	}
	res.From, err = migrations.Applied(ctx, db)
	db.Close(context.WithoutCancel(ctx))
	if err != nil {
		return res, fmt.Errorf("migrate tenant %s: %w", id, err)
	}
	n := tenantNames{owner: owner, app: t.DB.User, db: t.DB.Name}
	if err := ensureDatabase(ctx, admin, n.db, n.owner, n.app); err != nil {
		return res, fmt.Errorf("migrate tenant %s: %w", id, err)
	}
	if err := migrateTenantDB(ctx, c, n); err != nil {
		return res, fmt.Errorf("migrate tenant %s: %w", id, err)
	}
	res.To, err = migrations.Latest(migrations.Tenant)
	return res, err
}

// Reseal is one tenant's password in a sealing-key rotation.
type Reseal struct {
	Tenant registry.TenantID `json:"tenant"`
	// Was is the key that opened it: current, previous or unknown.
	Was      registry.Sealing `json:"was"`
	Resealed bool             `json:"resealed"`
	Err      error            `json:"-"`
}

// ResealPasswords re-seals every tenant's database password with the
// sealer's current key, tenant by tenant, each in its own transaction (a
// compare-and-set on the sealed value), and reports each. A password no key
// opens is reported (Err) and the others go on. Brains that hold both keys
// open either version, so nothing stops while it runs; a re-sealed row makes
// brains reopen that tenant's pool with the same password.
func (o *Ops) ResealPasswords(ctx context.Context) ([]Reseal, error) {
	return o.reseal(ctx, true)
}

// Sealings reports which of the sealer's keys opens each tenant's password,
// changing nothing: before the previous key is retired, every one must say
// current.
func (o *Ops) Sealings(ctx context.Context) ([]Reseal, error) {
	return o.reseal(ctx, false)
}

func (o *Ops) reseal(ctx context.Context, write bool) ([]Reseal, error) {
	if o.Sealer == nil {
		return nil, errors.New("provision: Ops.Sealer is required")
	}
	reg, err := o.RegistryAdmin(ctx)
	if err != nil {
		return nil, err
	}
	defer reg.Close(context.WithoutCancel(ctx))
	rows, _ := reg.Query(ctx, `SELECT id FROM tenants ORDER BY id`)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[registry.TenantID])
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	out := make([]Reseal, 0, len(ids))
	for _, id := range ids {
		r := Reseal{Tenant: id}
		r.Err = pgx.BeginFunc(ctx, reg, func(tx pgx.Tx) error {
			var sealed []byte
			err := tx.QueryRow(ctx, `SELECT db_password_sealed FROM tenants WHERE id = $1 FOR UPDATE`, id).Scan(&sealed)
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("tenant %s: %w (deleted meanwhile)", id, ErrTenantNotFound)
			}
			if err != nil {
				return fmt.Errorf("tenant %s: %w", id, err)
			}
			r.Was = o.Sealer.Which(id, sealed)
			if r.Was == registry.SealedUnknown {
				return fmt.Errorf("tenant %s: db_password_sealed opens with neither sealing key", id)
			}
			if !write || r.Was == registry.SealedCurrent {
				return nil
			}
			resealed, changed, err := o.Sealer.Reseal(id, sealed)
			if err != nil || !changed {
				return err
			}
			r.Resealed, err = registry.TenantSetPasswordSealed(ctx, tx, id, sealed, resealed)
			return err
		})
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		out = append(out, r)
	}
	return out, nil
}
