package registry

import (
	"context"
	"fmt"
	"time"
)

// The ops tooling's writes besides TenantInsert and RulesReplace. The brain
// never calls them: its registry role can only SELECT.

// TenantUpdate writes a tenant's settings: everything ops decide after
// creation (status, ceiling, approval, catalogue, actions, categories,
// model, budget, quota), not its id, NATS account or database. It reports
// whether the tenant exists; rules are written by RulesReplace.
func TenantUpdate(ctx context.Context, q DBTX, t Tenant) (bool, error) {
	enabled := make([]string, len(t.EnabledActions))
	for i, n := range t.EnabledActions {
		enabled[i] = string(n)
	}
	opts := t.ModelOptions
	if opts == nil {
		opts = map[string]any{}
	}
	qt := t.Quota.WithDefaults()
	tag, err := q.Exec(ctx, `UPDATE tenants SET status = $2, turn_ceiling = $3, approval_mode = $4,
		approval_ttl_seconds = $5, catalogue_version = $6, enabled_actions = $7, categories = $8, model_name = $9,
		model_options = $10, daily_token_budget = $11, turn_quota_msgs = $12, turn_quota_bytes = $13,
		turn_window_seconds = $14, max_inflight = $15, updated_at = now()
		WHERE id = $1`,
		t.ID, t.Status, t.TurnCeiling, t.ApprovalMode, int(t.ApprovalTTL/time.Second), t.CatalogueVersion, enabled,
		t.Categories, t.ModelName, opts, t.DailyTokenBudget, qt.Turns, qt.Bytes, int(qt.Window/time.Second), qt.MaxInflight)
	if err != nil {
		return false, fmt.Errorf("update tenant %s: %w", t.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// TenantLock locks a tenant's row until the transaction q ends, and reports
// whether it exists.
func TenantLock(ctx context.Context, q DBTX, id TenantID) (bool, error) {
	tag, err := q.Exec(ctx, `SELECT 1 FROM tenants WHERE id = $1 FOR UPDATE`, id)
	if err != nil {
		return false, fmt.Errorf("lock tenant %s: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// TenantSetStatus sets a tenant's status and reports whether it changed.
func TenantSetStatus(ctx context.Context, q DBTX, id TenantID, s TenantStatus) (bool, error) {
	tag, err := q.Exec(ctx, `UPDATE tenants SET status = $2, updated_at = now() WHERE id = $1 AND status <> $2`, id, s)
	if err != nil {
		return false, fmt.Errorf("set status of tenant %s: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// TenantSetPasswordSealed replaces a tenant's sealed password if it is
// still old (a compare-and-set), and reports whether it did.
func TenantSetPasswordSealed(ctx context.Context, q DBTX, id TenantID, old, sealed []byte) (bool, error) {
	tag, err := q.Exec(ctx, `UPDATE tenants SET db_password_sealed = $3, updated_at = now()
		WHERE id = $1 AND db_password_sealed = $2`, id, old, sealed)
	if err != nil {
		return false, fmt.Errorf("re-seal password of tenant %s: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// TenantDelete deletes a tenant's row and its rules, and reports how many
// rules went with it and whether the row existed.
func TenantDelete(ctx context.Context, q DBTX, id TenantID) (rules int, existed bool, err error) {
	if err := q.QueryRow(ctx, `SELECT count(*) FROM triage_rules WHERE tenant_id = $1`, id).Scan(&rules); err != nil {
		return 0, false, fmt.Errorf("count rules of tenant %s: %w", id, err)
	}
	tag, err := q.Exec(ctx, `DELETE FROM tenants WHERE id = $1`, id)
	if err != nil {
		return 0, false, fmt.Errorf("delete tenant %s: %w", id, err)
	}
	return rules, tag.RowsAffected() == 1, nil
}
