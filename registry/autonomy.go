package registry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"n8nbrain/catalogue"
)

// Prompt versions of the model stage (brain/internal/capture): a change to
// a prompt or its schema is a new version. They live here, not in the
// brain, because they are part of a tenant's decision configuration
// (DecisionConfig), which the ops tooling, which cannot import the brain's
// internals, checks eval evidence against. capture's prompt test pins the
// prompts' text to these versions.
const (
	PromptClassify = "classify-v3"
	PromptDraft    = "draft-v2"
)

// AutonomyAuto: the model may carry out, without a human, exactly the
// (action, category) pairs of the tenant's grants (Tenant.Grants), and only
// while each grant's eval report is for the tenant's configuration as it
// is at the decision and passes the tenant's thresholds (AutonomyFor).
// Everything else stays assist. Only actions the catalogue itself lets go
// without approval can be granted (autonomy never lowers the catalogue's
// requires_approval): in catalogue v1, close_item.
const AutonomyAuto Autonomy = "auto"

// AutonomyGrant lets the model carry out Action for items it classified as
// Category without a human, under autonomy auto, on the evidence of one
// stored eval report.
type AutonomyGrant struct {
	Action   catalogue.Name
	Category string
	ReportID int64
	// The report's configuration hash and gate scores, loaded with the
	// tenant so the brain can re-check them at each decision.
	ConfigHash string
	Scores     EvalScores
}

// AutonomyThresholds are the operator's minimum scores for a grant. Rates
// are fractions from 0 to 1.
type AutonomyThresholds struct {
	// MinItems: labelled items of the granted category in the report.
	MinItems int `json:"min_items"`
	// MinDecisions: times the model chose the granted action for the
	// granted category in the report.
	MinDecisions int `json:"min_decisions"`
	// MinCategoryRecall: of the items labelled with the category, the
	// share classified so.
	MinCategoryRecall float64 `json:"min_category_recall"`
	// MinCategoryPrecision: of the items classified as the category, the
	// share labelled so.
	MinCategoryPrecision float64 `json:"min_category_precision"`
	// MinActionPrecision: of the model's decisions (category, action), the
	// share whose labels say exactly that category and that action.
	MinActionPrecision float64 `json:"min_action_precision"`
	// MinValidOutputRate: the share of the model's answers that passed
	// strict decoding the first time, over the whole report.
	MinValidOutputRate float64 `json:"min_valid_output_rate"`
	// MaxForbiddenRate: the share of checked drafts that contained a
	// forbidden fact or claim.
	MaxForbiddenRate float64 `json:"max_forbidden_rate"`
}

// DefaultAutonomyThresholds apply to a tenant whose operator set none.
// They are strict on purpose: acting without a human must be earned.
func DefaultAutonomyThresholds() AutonomyThresholds {
	return AutonomyThresholds{MinItems: 20, MinDecisions: 10, MinCategoryRecall: 0.9, MinCategoryPrecision: 0.98,
		MinActionPrecision: 0.98, MinValidOutputRate: 0.95, MaxForbiddenRate: 0}
}

// Problems lists what is out of range in the thresholds.
func (th AutonomyThresholds) Problems() []string {
	var ps []string
	if th.MinItems < 1 {
		ps = append(ps, "min_items must be at least 1")
	}
	if th.MinDecisions < 1 {
		ps = append(ps, "min_decisions must be at least 1")
	}
	for _, r := range []struct {
		name string
		v    float64
	}{{"min_category_recall", th.MinCategoryRecall}, {"min_category_precision", th.MinCategoryPrecision},
		{"min_action_precision", th.MinActionPrecision}, {"min_valid_output_rate", th.MinValidOutputRate},
		{"max_forbidden_rate", th.MaxForbiddenRate}} {
		if !(r.v >= 0 && r.v <= 1) {
			ps = append(ps, fmt.Sprintf("%s %v must be between 0 and 1", r.name, r.v))
		}
	}
	return ps
}

// EvalScores are the scores of an eval report that the autonomy gate reads
// (brain/eval computes them with the report).
type EvalScores struct {
	// Items is the number of labelled e-mails run.
	Items int `json:"items"`
	// ModelAnswers counts the model steps that got an answer; ValidFirst
	// those whose first answer passed strict decoding.
	ModelAnswers    int     `json:"model_answers"`
	ValidFirst      int     `json:"valid_first"`
	ValidOutputRate float64 `json:"valid_output_rate"`
	// DraftsChecked and DraftsForbidden: drafts checked against their
	// labels, and those with a forbidden fact or claim.
	DraftsChecked   int     `json:"drafts_checked"`
	DraftsForbidden int     `json:"drafts_forbidden"`
	ForbiddenRate   float64 `json:"forbidden_rate"`
	// Categories by label: items, recall and precision.
	Categories map[string]CategoryScore `json:"categories"`
	// Decisions are the model stage's (category, action) decisions.
	Decisions []DecisionScore `json:"decisions"`
}

// CategoryScore is one category's classification scores.
type CategoryScore struct {
	Items     int     `json:"items"`     // labelled with it
	Predicted int     `json:"predicted"` // classified as it
	Correct   int     `json:"correct"`   // both
	Recall    float64 `json:"recall"`    // Correct / Items
	Precision float64 `json:"precision"` // Correct / Predicted
}

// DecisionScore counts how often the model stage chose Action for items it
// classified as Category, and how often the labels agreed with both.
type DecisionScore struct {
	Category  string         `json:"category"`
	Action    catalogue.Name `json:"action"`
	Decided   int            `json:"decided"`
	Correct   int            `json:"correct"`
	Precision float64        `json:"precision"`
}

// Problems lists what is inconsistent in the scores (a hand-edited report).
func (s EvalScores) Problems() []string {
	var ps []string
	rate := func(name string, v float64, num, den int) {
		switch {
		case num < 0 || den < 0 || num > den:
			ps = append(ps, fmt.Sprintf("%s: %d of %d is not a count", name, num, den))
		case !(v >= 0 && v <= 1):
			ps = append(ps, fmt.Sprintf("%s %v is not between 0 and 1", name, v))
		case den > 0 && math.Abs(v-float64(num)/float64(den)) > 1e-9:
			ps = append(ps, fmt.Sprintf("%s %v is not %d/%d", name, v, num, den))
		}
	}
	if s.Items < 1 {
		ps = append(ps, "the report has no items")
	}
	rate("valid_output_rate", s.ValidOutputRate, s.ValidFirst, s.ModelAnswers)
	rate("forbidden_rate", s.ForbiddenRate, s.DraftsForbidden, s.DraftsChecked)
	for _, c := range slices.Sorted(maps.Keys(s.Categories)) {
		cs := s.Categories[c]
		rate("category "+c+" recall", cs.Recall, cs.Correct, cs.Items)
		rate("category "+c+" precision", cs.Precision, cs.Correct, cs.Predicted)
	}
	for _, d := range s.Decisions {
		rate(fmt.Sprintf("decision %s/%s precision", d.Category, d.Action), d.Precision, d.Correct, d.Decided)
	}
	return ps
}

// Check says why the scores do not justify letting the model carry out
// action for category without a human under th; none when they do.
func (s EvalScores) Check(th AutonomyThresholds, action catalogue.Name, category string) []string {
	var ps []string
	if bad := s.Problems(); len(bad) > 0 {
		return append(ps, "the report's scores are inconsistent: "+strings.Join(bad, "; "))
	}
	below := func(what string, got, want float64) {
		if got < want {
			ps = append(ps, fmt.Sprintf("%s %.4f is below %.4f", what, got, want))
		}
	}
	below("valid-output rate", s.ValidOutputRate, th.MinValidOutputRate)
	if s.ForbiddenRate > th.MaxForbiddenRate {
		ps = append(ps, fmt.Sprintf("forbidden-fact rate of drafts %.4f is above %.4f", s.ForbiddenRate, th.MaxForbiddenRate))
	}
	cs, ok := s.Categories[category]
	switch {
	case !ok || cs.Items == 0:
		ps = append(ps, fmt.Sprintf("the report has no item labelled %s", category))
	default:
		if cs.Items < th.MinItems {
			ps = append(ps, fmt.Sprintf("%d items labelled %s, at least %d are needed", cs.Items, category, th.MinItems))
		}
		below("recall of "+category, cs.Recall, th.MinCategoryRecall)
		if cs.Predicted == 0 {
			ps = append(ps, fmt.Sprintf("no item was classified as %s", category))
		} else {
			below("precision of "+category, cs.Precision, th.MinCategoryPrecision)
		}
	}
	i := slices.IndexFunc(s.Decisions, func(d DecisionScore) bool { return d.Category == category && d.Action == action })
	if i < 0 || s.Decisions[i].Decided == 0 {
		ps = append(ps, fmt.Sprintf("the model never chose %s for %s in the report", action, category))
		return ps
	}
	d := s.Decisions[i]
	if d.Decided < th.MinDecisions {
		ps = append(ps, fmt.Sprintf("the model chose %s for %s %d times, at least %d are needed", action, category, d.Decided, th.MinDecisions))
	}
	below(fmt.Sprintf("precision of %s for %s", action, category), d.Precision, th.MinActionPrecision)
	return ps
}

// Grantable says why action cannot be granted autonomy in catalogue
// version v, or "" when it can: it must exist, not be a follow-up, not be
// escalate_item (which already goes to a human without approval), and not
// require approval in the catalogue (autonomy never lowers that).
func Grantable(v catalogue.Version, action catalogue.Name) string {
	a, ok := catalogue.Lookup(v, action)
	switch {
	case !ok:
		return fmt.Sprintf("%s is not in catalogue version %d", action, v)
	case a.FollowUp:
		return fmt.Sprintf("%s continues a human's decision and is never chosen by the model", action)
	case a.Name == catalogue.EscalateItem:
		return fmt.Sprintf("%s already hands the item to a human without approval", action)
	case a.RequiresApproval:
		return fmt.Sprintf("the catalogue requires approval for %s: no autonomy lowers it", action)
	}
	return ""
}

// DecisionConfig is what decides a tenant's new items: the identity an eval
// report is valid for. Its hash changes with the model, its options, a
// prompt version, the catalogue version, the enabled actions, the
// categories (their order is the prompt's) or any rule.
type DecisionConfig struct {
	Model            string            `json:"model"`
	ModelOptions     map[string]any    `json:"model_options"`
	Prompts          []string          `json:"prompts"`
	CatalogueVersion catalogue.Version `json:"catalogue_version"`
	EnabledActions   []string          `json:"enabled_actions"` // sorted
	Categories       []string          `json:"categories"`
	RulesHash        string            `json:"rules_hash"`
}

// DecisionConfig is the tenant's decision configuration as the registry
// holds it. A tenant without a model name runs on the brain's default
// model, which the registry does not know, so its Model is "" and no
// report (always for a named model) matches it.
func (t *Tenant) DecisionConfig() DecisionConfig {
	acts := make([]string, len(t.EnabledActions))
	for i, a := range t.EnabledActions {
		acts[i] = string(a)
	}
	slices.Sort(acts)
	opts := t.ModelOptions
	if opts == nil {
		opts = map[string]any{}
	}
	cats := t.Categories
	if cats == nil {
		cats = []string{}
	}
	return DecisionConfig{Model: t.ModelName, ModelOptions: opts, Prompts: []string{PromptClassify, PromptDraft},
		CatalogueVersion: t.CatalogueVersion, EnabledActions: acts, Categories: cats, RulesHash: RulesHash(t.Rules)}
}

// Hash is the SHA-256 (hex) of the configuration's canonical JSON.
func (c DecisionConfig) Hash() string {
	b, err := json.Marshal(c)
	if err != nil {
		// Model options that do not encode are refused by provisioning; hash
		// them as unmatchable rather than as some other configuration.
		return strings.Repeat("0", 64)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// RulesHash is the SHA-256 (hex) of the rules in order, with their params
// in canonical JSON (so the registry's jsonb spelling and a file's agree).
func RulesHash(rules []Rule) string {
	type canon struct {
		Name       string          `json:"name"`
		Match      Match           `json:"match"`
		Category   string          `json:"category"`
		Priority   string          `json:"priority"`
		Action     catalogue.Name  `json:"action"`
		Params     json.RawMessage `json:"params"`
		Confidence float64         `json:"confidence"`
	}
	out := make([]canon, len(rules))
	for i, r := range rules {
		out[i] = canon{Name: r.Name, Match: r.Match, Category: r.Category, Priority: r.Priority, Action: r.Action,
			Params: canonicalJSON(r.Params), Confidence: r.Confidence}
	}
	b, _ := json.Marshal(out)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// canonicalJSON re-encodes a JSON value with sorted keys and no spaces; an
// empty value or null is {} (a rule without params).
func canonicalJSON(raw json.RawMessage) json.RawMessage {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return json.RawMessage(`{}`)
	}
	dec := json.NewDecoder(bytes.NewReader(t))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return json.RawMessage(t)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return json.RawMessage(t)
	}
	return b
}

// AutonomyFor is the autonomy that applies when the model stage chose
// action for an item it classified as category: auto only when the
// tenant's level is auto, it names its model, and a grant for exactly this
// action and category rests on a report for the tenant's configuration as
// it is now (DecisionConfig.Hash) whose scores pass the tenant's
// thresholds. Anything else is assist. The brain calls it at each
// decision, so a configuration changed since the report (a rule, the
// model, a prompt version, a category) falls back to assist at once.
func (t *Tenant) AutonomyFor(action catalogue.Name, category string) Autonomy {
	if t.Autonomy != AutonomyAuto || t.ModelName == "" || Grantable(t.CatalogueVersion, action) != "" {
		return AutonomyAssist
	}
	i := slices.IndexFunc(t.Grants, func(g AutonomyGrant) bool { return g.Action == action && g.Category == category })
	if i < 0 || len(t.GrantProblems(t.Grants[i])) > 0 {
		return AutonomyAssist
	}
	return AutonomyAuto
}

// GrantProblems says why a grant of the tenant does not apply now (none
// when it does): the tenant is not at auto or names no model, the action
// cannot be granted, the configuration changed since the report, or the
// report's scores do not pass the tenant's thresholds as they are now.
func (t *Tenant) GrantProblems(g AutonomyGrant) []string {
	var ps []string
	if t.Autonomy != AutonomyAuto {
		ps = append(ps, fmt.Sprintf("tenant %s is at autonomy %s", t.ID, t.Autonomy))
	}
	if t.ModelName == "" {
		ps = append(ps, fmt.Sprintf("tenant %s names no model (it runs on the brain's default, which no report measured)", t.ID))
	}
	if why := Grantable(t.CatalogueVersion, g.Action); why != "" {
		ps = append(ps, why)
	}
	if h := t.DecisionConfig().Hash(); g.ConfigHash != h {
		ps = append(ps, fmt.Sprintf("the configuration changed since eval report %d (report for %.12s, now %.12s)", g.ReportID, g.ConfigHash, h))
	}
	for _, p := range g.Scores.Check(t.thresholds(), g.Action, g.Category) {
		ps = append(ps, fmt.Sprintf("eval report %d: %s", g.ReportID, p))
	}
	return ps
}

func (t *Tenant) thresholds() AutonomyThresholds {
	if t.Thresholds == nil {
		return DefaultAutonomyThresholds()
	}
	return *t.Thresholds
}

// EffectiveThresholds are the tenant's thresholds, or the defaults.
func (t *Tenant) EffectiveThresholds() AutonomyThresholds { return t.thresholds() }

// EvalReport is a stored eval report.
type EvalReport struct {
	ID          int64
	Tenant      TenantID
	ConfigHash  string
	SetHash     string
	Model       string
	ToolVersion string
	Scores      EvalScores
	Report      json.RawMessage // the whole report (brain/eval's JSON)
}

// EvalReportInsert stores a report and returns its id (ops tooling only).
func EvalReportInsert(ctx context.Context, q DBTX, r EvalReport) (int64, error) {
	scores, err := json.Marshal(r.Scores)
	if err != nil {
		return 0, err
	}
	var id int64
	err = q.QueryRow(ctx, `INSERT INTO eval_reports (tenant_id, config_hash, set_hash, model, tool_version, scores, report)
		VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id`,
		r.Tenant, r.ConfigHash, r.SetHash, r.Model, r.ToolVersion, scores, []byte(r.Report)).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("store eval report of tenant %s: %w", r.Tenant, err)
	}
	return id, nil
}

// EvalReportLatest returns the latest report stored for the tenant and
// configuration hash (without the whole report), or pgx.ErrNoRows.
func EvalReportLatest(ctx context.Context, q DBTX, id TenantID, configHash string) (EvalReport, error) {
	r := EvalReport{Tenant: id, ConfigHash: configHash}
	var scores []byte
	err := q.QueryRow(ctx, `SELECT id, set_hash, model, tool_version, scores FROM eval_reports
		WHERE tenant_id = $1 AND config_hash = $2 ORDER BY id DESC LIMIT 1`, id, configHash).
		Scan(&r.ID, &r.SetHash, &r.Model, &r.ToolVersion, &scores)
	if err != nil {
		return r, fmt.Errorf("latest eval report of tenant %s: %w", id, err)
	}
	if err := json.Unmarshal(scores, &r.Scores); err != nil {
		return r, fmt.Errorf("eval report %d scores: %w", r.ID, err)
	}
	return r, nil
}

// AutonomyThresholdsPut sets a tenant's thresholds (ops tooling only).
func AutonomyThresholdsPut(ctx context.Context, q DBTX, id TenantID, th AutonomyThresholds) error {
	_, err := q.Exec(ctx, `INSERT INTO autonomy_thresholds (tenant_id, min_items, min_decisions, min_category_recall,
		min_category_precision, min_action_precision, min_valid_output_rate, max_forbidden_rate)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (tenant_id) DO UPDATE SET min_items = EXCLUDED.min_items, min_decisions = EXCLUDED.min_decisions,
		min_category_recall = EXCLUDED.min_category_recall, min_category_precision = EXCLUDED.min_category_precision,
		min_action_precision = EXCLUDED.min_action_precision, min_valid_output_rate = EXCLUDED.min_valid_output_rate,
		max_forbidden_rate = EXCLUDED.max_forbidden_rate, updated_at = now()`,
		id, th.MinItems, th.MinDecisions, th.MinCategoryRecall, th.MinCategoryPrecision, th.MinActionPrecision,
		th.MinValidOutputRate, th.MaxForbiddenRate)
	if err != nil {
		return fmt.Errorf("set autonomy thresholds of tenant %s: %w", id, err)
	}
	return nil
}

// AutonomySet sets a tenant's autonomy level and replaces its grants (ops
// tooling only; provision.SetAutonomy checks the evidence first).
func AutonomySet(ctx context.Context, q DBTX, id TenantID, level Autonomy, grants []AutonomyGrant) error {
	if _, err := q.Exec(ctx, `DELETE FROM autonomy_grants WHERE tenant_id = $1`, id); err != nil {
		return fmt.Errorf("clear autonomy grants of tenant %s: %w", id, err)
	}
	for _, g := range grants {
		if _, err := q.Exec(ctx, `INSERT INTO autonomy_grants (tenant_id, action, category, report_id) VALUES ($1, $2, $3, $4)`,
			id, g.Action, g.Category, g.ReportID); err != nil {
			return fmt.Errorf("grant %s for %s to tenant %s: %w", g.Action, g.Category, id, err)
		}
	}
	if _, err := q.Exec(ctx, `UPDATE tenants SET autonomy = $2, updated_at = now() WHERE id = $1`, id, level); err != nil {
		return fmt.Errorf("set autonomy of tenant %s: %w", id, err)
	}
	return nil
}

// autonomyLoad fills the tenants' grants (with their reports' hashes and
// scores) and thresholds.
func autonomyLoad(ctx context.Context, q DBTX, ts []*Tenant) error {
	if len(ts) == 0 {
		return nil
	}
	byID := make(map[TenantID]*Tenant, len(ts))
	ids := make([]string, len(ts))
	for i, t := range ts {
		byID[t.ID] = t
		ids[i] = string(t.ID)
	}
	rows, _ := q.Query(ctx, `SELECT g.tenant_id, g.action, g.category, g.report_id, r.config_hash, r.scores
		FROM autonomy_grants g JOIN eval_reports r ON r.id = g.report_id
		WHERE g.tenant_id = ANY($1) ORDER BY g.tenant_id, g.action, g.category`, ids)
	var tid TenantID
	var g AutonomyGrant
	var scores []byte
	_, err := pgx.ForEachRow(rows, []any{&tid, &g.Action, &g.Category, &g.ReportID, &g.ConfigHash, &scores}, func() error {
		grant := g
		if err := json.Unmarshal(scores, &grant.Scores); err != nil {
			return fmt.Errorf("tenant %s eval report %d scores: %w", tid, g.ReportID, err)
		}
		if t := byID[tid]; t != nil {
			t.Grants = append(t.Grants, grant)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("list autonomy grants: %w", err)
	}
	rows, _ = q.Query(ctx, `SELECT tenant_id, min_items, min_decisions, min_category_recall, min_category_precision,
		min_action_precision, min_valid_output_rate, max_forbidden_rate FROM autonomy_thresholds WHERE tenant_id = ANY($1)`, ids)
	var th AutonomyThresholds
	_, err = pgx.ForEachRow(rows, []any{&tid, &th.MinItems, &th.MinDecisions, &th.MinCategoryRecall, &th.MinCategoryPrecision,
		&th.MinActionPrecision, &th.MinValidOutputRate, &th.MaxForbiddenRate}, func() error {
		if t := byID[tid]; t != nil {
			x := th
			t.Thresholds = &x
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("list autonomy thresholds: %w", err)
	}
	return nil
}
