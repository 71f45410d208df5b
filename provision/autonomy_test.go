package provision_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"n8nbrain/catalogue"
	"n8nbrain/provision"
	"n8nbrain/registry"
)

// gateScores is a report's gate section: for close_item on invoices the
// given category precision, everything else comfortably passing.
func gateScores(precision float64) registry.EvalScores {
	correct := int(precision * 20)
	return registry.EvalScores{Items: 60, ModelAnswers: 50, ValidFirst: 50, ValidOutputRate: 1,
		Categories: map[string]registry.CategoryScore{
			"invoice": {Items: 22, Predicted: 20, Correct: correct, Recall: float64(correct) / 22, Precision: float64(correct) / 20},
			"general": {Items: 38, Predicted: 40, Correct: 38, Recall: 1, Precision: 38.0 / 40},
		},
		Decisions: []registry.DecisionScore{{Category: "invoice", Action: catalogue.CloseItem, Decided: 20, Correct: correct, Precision: float64(correct) / 20}},
	}
}

func evalReport(id registry.TenantID, hash string, s registry.EvalScores) registry.EvalReport {
	return registry.EvalReport{Tenant: id, ConfigHash: hash, SetHash: strings.Repeat("a", 64), Model: "qwen3:8b",
		ToolVersion: "test", Scores: s, Report: json.RawMessage(`{"identity":{}}`)}
}

func wantAutonomyError(t *testing.T, err error, wants ...string) {
	t.Helper()
	var ae *provision.AutonomyError
	if !errors.As(err, &ae) {
		t.Fatalf("error %v is not an *AutonomyError", err)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
}

// Autonomy beyond assist is refused without a stored passing report for
// the tenant's current configuration, granted with one, re-checked
// against the configuration and thresholds as they are whenever the
// tenant is read (as the brain does at each decision), and dropped by a
// change of rule; the evidence a grant rests on cannot be deleted.
func TestSetAutonomyNeedsAPassingReportForTheCurrentConfiguration(t *testing.T) {
	t.Parallel()
	ops, readerURL := newOps(t)
	ctx := t.Context()
	const id = "auto-a"
	spec := validSpec(t, id)
	spec.EnabledActions = append(spec.EnabledActions, catalogue.CloseItem, catalogue.CreateJob)
	if _, err := ops.CreateTenant(ctx, spec); err != nil {
		t.Fatal(err)
	}
	reader := mustConnect(t, readerURL, "")
	get := func() registry.Tenant {
		t.Helper()
		tn, err := registry.TenantGet(ctx, reader, id)
		if err != nil {
			t.Fatal(err)
		}
		return tn
	}
	tn := get()
	hash := tn.DecisionConfig().Hash()
	invoices := []provision.AutonomyScope{{Action: catalogue.CloseItem, Category: "invoice"}}

	// No report at all, then a passing one for another configuration only.
	_, err := ops.SetAutonomy(ctx, id, registry.AutonomyAuto, invoices)
	wantAutonomyError(t, err, "no eval report is stored for tenant auto-a's current configuration", hash)
	if _, err := ops.StoreEvalReport(ctx, evalReport(id, strings.Repeat("b", 64), gateScores(1))); err != nil {
		t.Fatal(err)
	}
	_, err = ops.SetAutonomy(ctx, id, registry.AutonomyAuto, invoices)
	wantAutonomyError(t, err, "no eval report is stored")

	// A report of this configuration below the thresholds is refused, with why.
	below, err := ops.StoreEvalReport(ctx, evalReport(id, hash, gateScores(0.9)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = ops.SetAutonomy(ctx, id, registry.AutonomyAuto, invoices)
	wantAutonomyError(t, err, "close_item for invoice", "precision of invoice 0.9000 is below 0.9800",
		"precision of close_item for invoice 0.9000 is below 0.9800")
	if tn := get(); tn.Autonomy != registry.AutonomyAssist || len(tn.Grants) != 0 {
		t.Fatalf("a refused SetAutonomy changed the tenant: %s %+v", tn.Autonomy, tn.Grants)
	}

	// What can never be granted, whatever the evidence.
	for _, tc := range []struct {
		scopes []provision.AutonomyScope
		want   string
	}{
		{[]provision.AutonomyScope{{Action: catalogue.DraftReply, Category: "quote_request"}}, "the catalogue requires approval for draft_reply"},
		{[]provision.AutonomyScope{{Action: catalogue.CreateJob, Category: "booking"}}, "the catalogue requires approval for create_job"},
		{[]provision.AutonomyScope{{Action: catalogue.EscalateItem, Category: "general"}}, "already hands the item to a human"},
		{[]provision.AutonomyScope{{Action: catalogue.SendReply, Category: "general"}}, "continues a human's decision"},
		{[]provision.AutonomyScope{{Action: catalogue.CloseItem, Category: "spam"}}, `category "spam" is not one of tenant auto-a's categories`},
		{append(invoices, invoices...), "asked for twice"},
		{nil, "auto needs at least one"},
	} {
		_, err := ops.SetAutonomy(ctx, id, registry.AutonomyAuto, tc.scopes)
		wantAutonomyError(t, err, tc.want)
	}
	_, err = ops.SetAutonomy(ctx, id, "autopilot", invoices)
	wantAutonomyError(t, err, `autonomy "autopilot" must be one of: assist, auto`)

	// A passing report of this configuration: granted, on that report.
	pass, err := ops.StoreEvalReport(ctx, evalReport(id, hash, gateScores(1)))
	if err != nil {
		t.Fatal(err)
	}
	got, err := ops.SetAutonomy(ctx, id, registry.AutonomyAuto, invoices)
	if err != nil || got != pass {
		t.Fatalf("SetAutonomy: report %d, %v; want report %d", got, err, pass)
	}
	tn = get()
	if tn.Autonomy != registry.AutonomyAuto || len(tn.Grants) != 1 || tn.Grants[0].ReportID != pass || tn.Grants[0].ConfigHash != hash {
		t.Fatalf("tenant after SetAutonomy: %s %+v", tn.Autonomy, tn.Grants)
	}
	for _, tc := range []struct {
		action   catalogue.Name
		category string
		want     registry.Autonomy
	}{
		{catalogue.CloseItem, "invoice", registry.AutonomyAuto},
		{catalogue.CloseItem, "general", registry.AutonomyAssist},
		{catalogue.DraftReply, "invoice", registry.AutonomyAssist},
	} {
		if a := tn.AutonomyFor(tc.action, tc.category); a != tc.want {
			t.Errorf("AutonomyFor(%s, %s) = %s, want %s", tc.action, tc.category, a, tc.want)
		}
	}
	// The evidence a grant rests on stays.
	admin, err := ops.RegistryAdmin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `DELETE FROM eval_reports WHERE id = $1`, pass); sqlState(err) != "23503" {
		t.Fatalf("deleting the report a grant rests on: %v, want a foreign key violation", err)
	}
	if _, err := admin.Exec(ctx, `DELETE FROM eval_reports WHERE id = $1`, below); err != nil {
		t.Fatalf("deleting an unused report: %v", err)
	}

	// Thresholds raised above the report: the grant no longer applies.
	th := registry.DefaultAutonomyThresholds()
	th.MinItems = 30
	if err := ops.SetAutonomyThresholds(ctx, id, th); err != nil {
		t.Fatal(err)
	}
	tn = get()
	if tn.AutonomyFor(catalogue.CloseItem, "invoice") != registry.AutonomyAssist ||
		!strings.Contains(strings.Join(tn.GrantProblems(tn.Grants[0]), "; "), "22 items labelled invoice, at least 30 are needed") {
		t.Fatalf("after raising min_items: %s, %v", tn.AutonomyFor(catalogue.CloseItem, "invoice"), tn.GrantProblems(tn.Grants[0]))
	}
	bad := th
	bad.MinCategoryRecall = 1.5
	wantAutonomyError(t, ops.SetAutonomyThresholds(ctx, id, bad), "min_category_recall 1.5 must be between 0 and 1")
	if err := ops.SetAutonomyThresholds(ctx, id, registry.DefaultAutonomyThresholds()); err != nil {
		t.Fatal(err)
	}
	if tn = get(); tn.AutonomyFor(catalogue.CloseItem, "invoice") != registry.AutonomyAuto {
		t.Fatalf("thresholds back to the defaults: %v", tn.GrantProblems(tn.Grants[0]))
	}

	// A changed rule is a new configuration: assist until a new report.
	rules := append(spec.Rules, registry.Rule{Name: "statements", Match: registry.Match{SubjectKeywords: []string{"statement"}},
		Category: "invoice", Priority: "low", Confidence: 0.9})
	if err := registry.RulesReplace(ctx, admin, id, rules); err != nil {
		t.Fatal(err)
	}
	tn = get()
	if tn.AutonomyFor(catalogue.CloseItem, "invoice") != registry.AutonomyAssist ||
		!strings.Contains(strings.Join(tn.GrantProblems(tn.Grants[0]), "; "), "the configuration changed since eval report") {
		t.Fatalf("after a rule change: %v", tn.GrantProblems(tn.Grants[0]))
	}
	_, err = ops.SetAutonomy(ctx, id, registry.AutonomyAuto, invoices)
	wantAutonomyError(t, err, "no eval report is stored for tenant auto-a's current configuration")

	// Back to assist: always allowed, and the grants go.
	if _, err := ops.SetAutonomy(ctx, id, registry.AutonomyAssist, nil); err != nil {
		t.Fatal(err)
	}
	if tn = get(); tn.Autonomy != registry.AutonomyAssist || len(tn.Grants) != 0 {
		t.Fatalf("after assist: %s %+v", tn.Autonomy, tn.Grants)
	}
	// The brain's reader can read the evidence and write none of it.
	if _, err := reader.Exec(ctx, `INSERT INTO autonomy_grants (tenant_id, action, category, report_id) VALUES ($1, 'close_item', 'invoice', $2)`, id, pass); sqlState(err) != insufficientPrivilege {
		t.Fatalf("reader writing a grant: %v", err)
	}
	var n int
	if err := reader.QueryRow(ctx, `SELECT count(*) FROM eval_reports WHERE tenant_id = $1`, id).Scan(&n); err != nil || n != 2 {
		t.Fatalf("reader sees %d reports (%v), want 2", n, err)
	}
}

// A tenant that names no model runs on the brain's default, which no
// report measured: it cannot leave assist.
func TestSetAutonomyNeedsANamedModel(t *testing.T) {
	t.Parallel()
	ops, readerURL := newOps(t)
	ctx := t.Context()
	spec := validSpec(t, "auto-b")
	spec.ModelName = ""
	spec.EnabledActions = append(spec.EnabledActions, catalogue.CloseItem)
	if _, err := ops.CreateTenant(ctx, spec); err != nil {
		t.Fatal(err)
	}
	tn, err := registry.TenantGet(ctx, mustConnect(t, readerURL, ""), "auto-b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ops.StoreEvalReport(ctx, evalReport("auto-b", tn.DecisionConfig().Hash(), gateScores(1))); err != nil {
		t.Fatal(err)
	}
	_, err = ops.SetAutonomy(ctx, "auto-b", registry.AutonomyAuto, []provision.AutonomyScope{{Action: catalogue.CloseItem, Category: "invoice"}})
	wantAutonomyError(t, err, "tenant auto-b names no model")
}

// A report is stored only when it is consistent and its tenant exists.
func TestStoreEvalReportRefusesBadReports(t *testing.T) {
	t.Parallel()
	ops, _ := newOps(t)
	ctx := t.Context()
	createTenant(t, ops, "auto-c")
	good := evalReport("auto-c", strings.Repeat("c", 64), gateScores(1))
	inconsistent := gateScores(1)
	inconsistent.ValidOutputRate = 0.5 // 50 of 50 is not 0.5
	for _, tc := range []struct {
		name string
		r    registry.EvalReport
		want string
	}{
		{"BadHash", func() registry.EvalReport { r := good; r.ConfigHash = "xyz"; return r }(), "config hash must be 64 lowercase hex digits"},
		{"NoModel", func() registry.EvalReport { r := good; r.Model = ""; return r }(), "names no model"},
		{"Inconsistent", func() registry.EvalReport { r := good; r.Scores = inconsistent; return r }(), "valid_output_rate 0.5 is not 50/50"},
		{"NotJSON", func() registry.EvalReport { r := good; r.Report = json.RawMessage(`[1]`); return r }(), "not a JSON object"},
		{"NoTenant", func() registry.EvalReport { r := good; r.Tenant = "nobody"; return r }(), "tenant nobody: not in the registry"},
	} {
		if _, err := ops.StoreEvalReport(ctx, tc.r); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := ops.StoreEvalReport(ctx, good); err != nil {
		t.Fatal(err)
	}
}
