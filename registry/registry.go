// Package registry is the registry database's data: tenants, their NATS
// account keys, database connection details (password sealed), turn ceiling,
// approval mode, enabled actions, pinned catalogue version, model settings
// and triage rules. The ops tooling writes it (package provision); the brain
// only reads it, through a role that can only SELECT.
package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"n8nbrain/catalogue"
)

// TenantID names a tenant ("client-zero").
type TenantID string

// TenantStatus says whether a tenant is served.
type TenantStatus string

const (
	TenantStatusActive   TenantStatus = "active"
	TenantStatusDisabled TenantStatus = "disabled"
)

// ApprovalMode is how a tenant approves drafts; one per tenant, pinned on
// each work item when it starts.
type ApprovalMode string

const (
	// ApprovalModeReviewApp: the draft lives in the tenant database, is edited
	// and approved on the review page, and is sent after approval. The record
	// proves the exact text sent.
	ApprovalModeReviewApp ApprovalMode = "review_app"
	// ApprovalModeMailbox: the draft is placed in the client's own mailbox and
	// a human sends it. The record proves only what was proposed.
	ApprovalModeMailbox ApprovalMode = "mailbox"
)

// Autonomy is how far the brain may act on what a model chose, per tenant.
// The allowed values are listed in one place, Autonomies; provisioning
// refuses any other.
type Autonomy string

const (
	// AutonomyAssist: every action the model stage chooses is AI-generated
	// and stops for a human (an approval record, requires_approval true),
	// whatever the catalogue says of the action; only deterministic rules
	// act without approval. The model's escalate_item is the exception that
	// proves the rule: it already hands the item to a human.
	AutonomyAssist Autonomy = "assist"
)

// Autonomies lists the allowed autonomy levels, the default first.
func Autonomies() []Autonomy { return []Autonomy{AutonomyAssist, AutonomyAuto} }

// Valid reports whether a is one of Autonomies.
func (a Autonomy) Valid() bool { return slices.Contains(Autonomies(), a) }

// Tenant is one registry row with its rules.
type Tenant struct {
	ID               TenantID
	NATSAccount      string
	Status           TenantStatus
	DB               DBConfig
	TurnCeiling      int
	ApprovalMode     ApprovalMode
	ApprovalTTL      time.Duration
	CatalogueVersion catalogue.Version
	EnabledActions   []catalogue.Name
	Categories       []string
	ModelName        string
	ModelOptions     map[string]any
	// DailyTokenBudget caps model tokens per day (UTC); 0 means unlimited.
	DailyTokenBudget int64
	// Quota bounds the tenant on the shared brain (its streams and consumer).
	Quota     Quota
	Rules     []Rule
	UpdatedAt time.Time
	Autonomy  Autonomy // see AutonomyAssist; a change applies to the next decision
	// Grants and Thresholds are the autonomy gate's (AutonomyFor); nil
	// Thresholds means DefaultAutonomyThresholds.
	Grants     []AutonomyGrant
	Thresholds *AutonomyThresholds
}

// Quota is a tenant's bounds on the shared brain, enforced by the NATS
// server on the tenant's own streams (see nats/stream).
type Quota struct {
	// Turns and Bytes bound the turns in the tenant's stream, answered or
	// not, within Window (the stream's MaxAge).
	Turns  int64
	Bytes  int64
	Window time.Duration
	// MaxInflight caps the tenant's turns in flight across brain replicas.
	MaxInflight int
}

// Default quota of a new tenant (the registry's column defaults).
const (
	DefaultQuotaTurns       = 10_000
	DefaultQuotaBytes       = 64 << 20
	DefaultQuotaWindow      = time.Hour
	DefaultQuotaMaxInflight = 16
)

// ActionEnabled reports whether the tenant has switched the action on.
func (t *Tenant) ActionEnabled(n catalogue.Name) bool {
	return slices.Contains(t.EnabledActions, n)
}

// DBConfig locates a tenant database and its login role.
type DBConfig struct {
	Host           string
	Port           int
	Name           string
	User           string
	PasswordSealed []byte
}

// Rule is a deterministic triage rule: structured predicates, no expressions.
type Rule struct {
	Position   int
	Name       string
	Match      Match
	Category   string
	Priority   string
	Action     catalogue.Name // empty: assess only, no action
	Params     json.RawMessage
	Confidence float64
}

// Match is a rule's predicates. Every non-empty list must match (AND); one
// entry of a list is enough (OR). Comparisons ignore case; keywords match as
// substrings of the subject or body.
type Match struct {
	SenderDomains   []string `json:"sender_domains,omitempty"`
	SenderAddresses []string `json:"sender_addresses,omitempty"`
	SubjectKeywords []string `json:"subject_keywords,omitempty"`
	BodyKeywords    []string `json:"body_keywords,omitempty"`
}

// Empty reports whether the match has no predicate (it would match anything).
func (m Match) Empty() bool {
	return len(m.SenderDomains)+len(m.SenderAddresses)+len(m.SubjectKeywords)+len(m.BodyKeywords) == 0
}

// DBTX is what the query functions need: a pool, a connection or a transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

const tenantColumns = `id, nats_account, status, db_host, db_port, db_name, db_user, db_password_sealed,
	turn_ceiling, approval_mode, approval_ttl_seconds, catalogue_version, enabled_actions, categories,
	model_name, model_options, daily_token_budget, turn_quota_msgs, turn_quota_bytes, turn_window_seconds,
	max_inflight, autonomy, updated_at`

func scanTenant(row pgx.CollectableRow) (Tenant, error) {
	var t Tenant
	var ttl, window int
	var enabled []string
	var opts []byte
	err := row.Scan(&t.ID, &t.NATSAccount, &t.Status, &t.DB.Host, &t.DB.Port, &t.DB.Name, &t.DB.User,
		&t.DB.PasswordSealed, &t.TurnCeiling, &t.ApprovalMode, &ttl, &t.CatalogueVersion, &enabled,
		&t.Categories, &t.ModelName, &opts, &t.DailyTokenBudget, &t.Quota.Turns, &t.Quota.Bytes, &window,
		&t.Quota.MaxInflight, &t.Autonomy, &t.UpdatedAt)
	if err != nil {
		return t, err
	}
	t.ApprovalTTL = time.Duration(ttl) * time.Second
	t.Quota.Window = time.Duration(window) * time.Second
	for _, n := range enabled {
		t.EnabledActions = append(t.EnabledActions, catalogue.Name(n))
	}
	if err := json.Unmarshal(opts, &t.ModelOptions); err != nil {
		return t, fmt.Errorf("tenant %s model_options: %w", t.ID, err)
	}
	return t, nil
}

// TenantList returns every tenant with its rules.
func TenantList(ctx context.Context, q DBTX) ([]Tenant, error) {
	rows, _ := q.Query(ctx, `SELECT `+tenantColumns+` FROM tenants ORDER BY id`)
	ts, err := pgx.CollectRows(rows, scanTenant)
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	rules, err := ruleList(ctx, q, nil)
	if err != nil {
		return nil, err
	}
	ptrs := make([]*Tenant, len(ts))
	for i := range ts {
		ts[i].Rules = rules[ts[i].ID]
		ptrs[i] = &ts[i]
	}
	if err := autonomyLoad(ctx, q, ptrs); err != nil {
		return nil, err
	}
	return ts, nil
}

// TenantGet returns one tenant with its rules, or pgx.ErrNoRows.
func TenantGet(ctx context.Context, q DBTX, id TenantID) (Tenant, error) {
	rows, _ := q.Query(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE id = $1`, id)
	t, err := pgx.CollectExactlyOneRow(rows, scanTenant)
	if err != nil {
		return t, fmt.Errorf("get tenant %s: %w", id, err)
	}
	rules, err := ruleList(ctx, q, &id)
	if err != nil {
		return t, err
	}
	t.Rules = rules[id]
	if err := autonomyLoad(ctx, q, []*Tenant{&t}); err != nil {
		return t, err
	}
	return t, nil
}

func ruleList(ctx context.Context, q DBTX, id *TenantID) (map[TenantID][]Rule, error) {
	rows, _ := q.Query(ctx, `SELECT tenant_id, position, name, match, category, priority, COALESCE(action, ''), params, confidence
		FROM triage_rules WHERE $1::text IS NULL OR tenant_id = $1 ORDER BY tenant_id, position`, id)
	out := map[TenantID][]Rule{}
	var tid TenantID
	var r Rule
	var match []byte
	_, err := pgx.ForEachRow(rows, []any{&tid, &r.Position, &r.Name, &match, &r.Category, &r.Priority, &r.Action, &r.Params, &r.Confidence}, func() error {
		rule := r
		rule.Params = slices.Clone(r.Params)
		if err := json.Unmarshal(match, &rule.Match); err != nil {
			return fmt.Errorf("tenant %s rule %q: match: %w", tid, r.Name, err)
		}
		out[tid] = append(out[tid], rule)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list triage rules: %w", err)
	}
	return out, nil
}

// TenantInsert writes a new tenant and its rules (ops tooling only).
func TenantInsert(ctx context.Context, q DBTX, t Tenant) error {
	enabled := make([]string, len(t.EnabledActions))
	for i, n := range t.EnabledActions {
		enabled[i] = string(n)
	}
	opts := t.ModelOptions
	if opts == nil {
		opts = map[string]any{}
	}
	qt := t.Quota.WithDefaults()
	autonomy := t.Autonomy
	if autonomy == "" {
		autonomy = AutonomyAssist
	}
	_, err := q.Exec(ctx, `INSERT INTO tenants (id, nats_account, status, db_host, db_port, db_name, db_user,
		db_password_sealed, turn_ceiling, approval_mode, approval_ttl_seconds, catalogue_version, enabled_actions,
		categories, model_name, model_options, daily_token_budget, turn_quota_msgs, turn_quota_bytes,
		turn_window_seconds, max_inflight, autonomy)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22)`,
		t.ID, t.NATSAccount, t.Status, t.DB.Host, t.DB.Port, t.DB.Name, t.DB.User, t.DB.PasswordSealed,
		t.TurnCeiling, t.ApprovalMode, int(t.ApprovalTTL/time.Second), t.CatalogueVersion, enabled,
		t.Categories, t.ModelName, opts, t.DailyTokenBudget, qt.Turns, qt.Bytes, int(qt.Window/time.Second), qt.MaxInflight, autonomy)
	if err != nil {
		return fmt.Errorf("insert tenant %s: %w", t.ID, err)
	}
	return RulesReplace(ctx, q, t.ID, t.Rules)
}

// WithDefaults returns the quota with zero fields set to the defaults.
func (q Quota) WithDefaults() Quota {
	if q.Turns == 0 {
		q.Turns = DefaultQuotaTurns
	}
	if q.Bytes == 0 {
		q.Bytes = DefaultQuotaBytes
	}
	if q.Window == 0 {
		q.Window = DefaultQuotaWindow
	}
	if q.MaxInflight == 0 {
		q.MaxInflight = DefaultQuotaMaxInflight
	}
	return q
}

// RulesReplace replaces a tenant's triage rules (ops tooling only).
func RulesReplace(ctx context.Context, q DBTX, id TenantID, rules []Rule) error {
	if _, err := q.Exec(ctx, `DELETE FROM triage_rules WHERE tenant_id = $1`, id); err != nil {
		return fmt.Errorf("delete rules of %s: %w", id, err)
	}
	for i, r := range rules {
		match, err := json.Marshal(r.Match)
		if err != nil {
			return err
		}
		params := r.Params
		if len(params) == 0 {
			params = json.RawMessage(`{}`)
		}
		var action *string
		if r.Action != "" {
			a := string(r.Action)
			action = &a
		}
		if _, err := q.Exec(ctx, `INSERT INTO triage_rules (tenant_id, position, name, match, category, priority, action, params, confidence)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`, id, i+1, r.Name, match, r.Category, r.Priority, action, params, r.Confidence); err != nil {
			return fmt.Errorf("insert rule %q of %s: %w", r.Name, id, err)
		}
	}
	return nil
}
