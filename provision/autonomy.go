package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"n8nbrain/catalogue"
	"n8nbrain/registry"
)

// The autonomy gate's writes: eval reports as evidence, the operator's
// thresholds, and a tenant's autonomy level with its grants. Raising
// autonomy beyond assist is refused unless the latest report stored for
// the tenant's current decision configuration passes the thresholds for
// every (action, category) asked for; the brain re-checks the same at each
// decision (registry.Tenant.AutonomyFor).

// AutonomyError says why a tenant's autonomy was not changed; nothing was.
type AutonomyError struct {
	Tenant   registry.TenantID
	Problems []string
}

func (e *AutonomyError) Error() string {
	return fmt.Sprintf("autonomy of tenant %s not changed: %s", e.Tenant, strings.Join(e.Problems, "; "))
}

// AutonomyScope is one (action, category) the model may carry out without
// a human under autonomy auto.
type AutonomyScope struct {
	Action   catalogue.Name
	Category string
}

var hexHashRe = regexp.MustCompile(`^[0-9a-f]{64}$`)

// StoreEvalReport stores an eval report (brain-eval's) as evidence for its
// tenant and returns its id. The scores must be consistent with
// themselves, and the tenant must exist. Storing a report changes no
// autonomy: SetAutonomy does, on evidence.
func (o *Ops) StoreEvalReport(ctx context.Context, r registry.EvalReport) (int64, error) {
	var ps []string
	if !hexHashRe.MatchString(r.ConfigHash) {
		ps = append(ps, "config hash must be 64 lowercase hex digits")
	}
	if !hexHashRe.MatchString(r.SetHash) {
		ps = append(ps, "set hash must be 64 lowercase hex digits")
	}
	if strings.TrimSpace(r.Model) == "" {
		ps = append(ps, "the report names no model")
	}
	if strings.TrimSpace(r.ToolVersion) == "" {
		ps = append(ps, "the report names no tool version")
	}
	ps = append(ps, r.Scores.Problems()...)
	var obj map[string]json.RawMessage
	if json.Unmarshal(r.Report, &obj) != nil {
		ps = append(ps, "the report is not a JSON object")
	}
	if len(ps) > 0 {
		return 0, fmt.Errorf("store eval report for tenant %s: %s", r.Tenant, strings.Join(ps, "; "))
	}
	c, err := o.cluster()
	if err != nil {
		return 0, err
	}
	reg, err := c.registryAdmin(ctx)
	if err != nil {
		return 0, fmt.Errorf("store eval report for tenant %s: %w", r.Tenant, err)
	}
	defer reg.Close(context.WithoutCancel(ctx))
	var id int64
	err = pgx.BeginFunc(ctx, reg, func(tx pgx.Tx) error {
		if err := tenantMustExist(ctx, tx, r.Tenant); err != nil {
			return err
		}
		id, err = registry.EvalReportInsert(ctx, tx, r)
		return err
	})
	return id, err
}

// SetAutonomyThresholds sets the minimum scores a tenant's eval report
// must reach for SetAutonomy (and the brain) to let the model act alone.
// Existing grants are re-checked by the brain at each decision: raising a
// threshold above a grant's report puts that grant back to assist.
func (o *Ops) SetAutonomyThresholds(ctx context.Context, id registry.TenantID, th registry.AutonomyThresholds) error {
	if ps := th.Problems(); len(ps) > 0 {
		return &AutonomyError{Tenant: id, Problems: ps}
	}
	c, err := o.cluster()
	if err != nil {
		return err
	}
	reg, err := c.registryAdmin(ctx)
	if err != nil {
		return fmt.Errorf("set autonomy thresholds of tenant %s: %w", id, err)
	}
	defer reg.Close(context.WithoutCancel(ctx))
	return pgx.BeginFunc(ctx, reg, func(tx pgx.Tx) error {
		if err := tenantMustExist(ctx, tx, id); err != nil {
			return err
		}
		return registry.AutonomyThresholdsPut(ctx, tx, id, th)
	})
}

// SetAutonomy sets a tenant's autonomy. Assist (no scopes) is always
// allowed and removes every grant. Auto needs at least one scope, each an
// action the catalogue lets go without approval (registry.Grantable), enabled
// for the tenant, and one of its categories; the tenant must name its model;
// and the latest eval report stored for the tenant's current decision
// configuration (registry.DecisionConfig) must pass the tenant's thresholds
// for every scope. Otherwise it returns an *AutonomyError listing every
// problem, and nothing changes. On success it returns the id of the report
// the grants rest on.
func (o *Ops) SetAutonomy(ctx context.Context, id registry.TenantID, level registry.Autonomy, scopes []AutonomyScope) (int64, error) {
	if !level.Valid() {
		names := make([]string, len(registry.Autonomies()))
		for i, a := range registry.Autonomies() {
			names[i] = string(a)
		}
		return 0, &AutonomyError{Tenant: id, Problems: []string{fmt.Sprintf("autonomy %q must be one of: %s", level, strings.Join(names, ", "))}}
	}
	c, err := o.cluster()
	if err != nil {
		return 0, err
	}
	reg, err := c.registryAdmin(ctx)
	if err != nil {
		return 0, fmt.Errorf("set autonomy of tenant %s: %w", id, err)
	}
	defer reg.Close(context.WithoutCancel(ctx))
	var reportID int64
	err = pgx.BeginFunc(ctx, reg, func(tx pgx.Tx) error {
		// The row lock keeps a concurrent SetAutonomy out; a configuration
		// changed after this commit is caught by the brain's re-check.
		if err := tenantMustExist(ctx, tx, id); err != nil {
			return err
		}
		t, err := registry.TenantGet(ctx, tx, id)
		if err != nil {
			return err
		}
		if level == registry.AutonomyAssist {
			if len(scopes) > 0 {
				return &AutonomyError{Tenant: id, Problems: []string{"assist takes no scopes: every action the model chooses stops for a human"}}
			}
			return registry.AutonomySet(ctx, tx, id, level, nil)
		}
		grants, ps := checkScopes(&t, scopes)
		if t.ModelName == "" {
			ps = append(ps, fmt.Sprintf("tenant %s names no model: it runs on the brain's default, and evidence is for one model; set its model name to the model the eval report measured", id))
		}
		if len(ps) > 0 {
			return &AutonomyError{Tenant: id, Problems: ps}
		}
		cfg := t.DecisionConfig()
		hash := cfg.Hash()
		rep, err := registry.EvalReportLatest(ctx, tx, id, hash)
		if errors.Is(err, pgx.ErrNoRows) {
			return &AutonomyError{Tenant: id, Problems: []string{fmt.Sprintf(
				"no eval report is stored for tenant %s's current configuration (hash %s: model %s, prompts %s, catalogue version %d, rules hash %.12s): run brain-eval against this configuration and store the report",
				id, hash, cfg.Model, strings.Join(cfg.Prompts, ","), cfg.CatalogueVersion, cfg.RulesHash)}}
		}
		if err != nil {
			return err
		}
		th := t.EffectiveThresholds()
		for _, s := range scopes {
			for _, p := range rep.Scores.Check(th, s.Action, s.Category) {
				ps = append(ps, fmt.Sprintf("%s for %s: eval report %d: %s", s.Action, s.Category, rep.ID, p))
			}
		}
		if len(ps) > 0 {
			return &AutonomyError{Tenant: id, Problems: ps}
		}
		for i := range grants {
			grants[i].ReportID = rep.ID
		}
		reportID = rep.ID
		return registry.AutonomySet(ctx, tx, id, level, grants)
	})
	if err != nil {
		return 0, err
	}
	return reportID, nil
}

// checkScopes checks what is asked for against the catalogue and the
// tenant's configuration.
func checkScopes(t *registry.Tenant, scopes []AutonomyScope) ([]registry.AutonomyGrant, []string) {
	var ps []string
	if len(scopes) == 0 {
		ps = append(ps, "auto needs at least one (action, category) to let go without a human")
	}
	var grants []registry.AutonomyGrant
	for i, s := range scopes {
		switch why := registry.Grantable(t.CatalogueVersion, s.Action); {
		case why != "":
			ps = append(ps, why)
		case !t.ActionEnabled(s.Action):
			ps = append(ps, fmt.Sprintf("%s is not enabled for tenant %s", s.Action, t.ID))
		case !slices.Contains(t.Categories, s.Category):
			ps = append(ps, fmt.Sprintf("category %q is not one of tenant %s's categories (%s)", s.Category, t.ID, strings.Join(t.Categories, ", ")))
		case slices.Contains(scopes[:i], s):
			ps = append(ps, fmt.Sprintf("%s for %s is asked for twice", s.Action, s.Category))
		default:
			grants = append(grants, registry.AutonomyGrant{Action: s.Action, Category: s.Category})
		}
	}
	return grants, ps
}

// tenantMustExist locks the tenant's registry row for the transaction.
func tenantMustExist(ctx context.Context, tx pgx.Tx, id registry.TenantID) error {
	tag, err := tx.Exec(ctx, `SELECT 1 FROM tenants WHERE id = $1 FOR UPDATE`, id)
	if err != nil {
		return fmt.Errorf("lock tenant %s: %w", id, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("tenant %s: not in the registry", id)
	}
	return nil
}
