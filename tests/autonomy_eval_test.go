package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	evalharness "n8nbrain/brain/eval"
	"n8nbrain/brain/eval/evaltest"
	"n8nbrain/catalogue"
	"n8nbrain/internal/ollamafake"
	"n8nbrain/provision"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// remittances is a small labelled set: 24 remittance advices (invoice,
// close_item) and 4 notices (general, close_item). No subject matches
// the test tenant's rules, so the model decides every one.
func remittances() []evalharness.Item {
	var items []evalharness.Item
	for i := range 24 {
		items = append(items, evalharness.Item{ID: fmt.Sprintf("remit-%02d", i), Language: "en",
			Email: wire.Email{From: "Accounts Payable <ap@agency.example>", Subject: fmt.Sprintf("Remittance advice %d", 2000+i),
				Body: fmt.Sprintf("Payment reference %d. Paid by EFT today.", 7000+i)},
			Labels: evalharness.Labels{Category: "invoice", Priority: "low", Action: string(catalogue.CloseItem)}})
	}
	for i := range 4 {
		items = append(items, evalharness.Item{ID: fmt.Sprintf("notice-%02d", i), Language: "en",
			Email: wire.Email{From: "Council <noreply@council.example>", Subject: fmt.Sprintf("Road closure notice %d", i),
				Body: "The street will be closed for resurfacing."},
			Labels: evalharness.Labels{Category: "general", Priority: "low", Action: string(catalogue.CloseItem)}})
	}
	return items
}

// The autonomy gate end to end: brain-eval's harness scores the tenant's
// configuration as the registry holds it, the report is stored, and
// provisioning raises the tenant to auto for close_item on invoices. The
// real brain then closes a remittance the model classifies as an invoice
// without a human ("autonomy":"auto", no approval record), still stops
// close_item for another category, and once a rule changes (a new rules
// hash) falls back to assist for the very same e-mail.
func TestAutonomyGateOnStoredEvalReport(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	sp := modelSpec("gate-a")
	sp.ModelName = testModel
	tn := s.tenant(sp)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	items := remittances()
	double, err := evaltest.NewDouble(items)
	if err != nil {
		t.Fatal(err)
	}
	fake := ollamafake.New(t, double.Chat)

	// The evidence: the harness against the tenant's registry configuration.
	cfg, err := evalharness.LoadTenant(ctx, s.stack.RegistryURL, tn.ID)
	if err != nil {
		t.Fatal(err)
	}
	set, err := evalharness.NewSet(items, nil)
	if err != nil {
		t.Fatal(err)
	}
	runCfg := evalharness.Config{OllamaURL: fake.URL(), Tenant: cfg, Concurrency: 4}
	runner, err := evalharness.NewRunner(runCfg)
	if err != nil {
		t.Fatal(err)
	}
	results, wall, err := runner.Run(ctx, set.Items)
	if err != nil {
		t.Fatal(err)
	}
	rep := evalharness.Score(results, evalharness.RunInfo{Tenant: runner.Tenant(), Source: "registry", Set: set, Config: runCfg, Wall: wall, CreatedAt: time.Now()})
	if len(rep.Grants) != 2 || rep.Identity.ConfigHash != cfg.DecisionConfig().Hash() {
		t.Fatalf("report grants %+v, config hash %s", rep.Grants, rep.Identity.ConfigHash)
	}
	rec, err := rep.Record()
	if err != nil {
		t.Fatal(err)
	}
	scopes := []provision.AutonomyScope{{Action: catalogue.CloseItem, Category: "invoice"}}
	if _, err := s.stack.Ops.SetAutonomy(ctx, tn.ID, registry.AutonomyAuto, scopes); err == nil {
		t.Fatal("autonomy raised before any report was stored")
	}
	if _, err := s.stack.Ops.StoreEvalReport(ctx, rec); err != nil {
		t.Fatal(err)
	}
	// general has 4 items in the report, fewer than the 20 the thresholds want.
	if _, err := s.stack.Ops.SetAutonomy(ctx, tn.ID, registry.AutonomyAuto,
		append(scopes, provision.AutonomyScope{Action: catalogue.CloseItem, Category: "general"})); err == nil {
		t.Fatal("autonomy raised for a category the report has too few e-mails of")
	}
	if _, err := s.stack.Ops.SetAutonomy(ctx, tn.ID, registry.AutonomyAuto, scopes); err != nil {
		t.Fatal(err)
	}

	s.startModelBrain("r1", fake, nil)
	ea := s.startEdge(tn, nil)
	db := s.tenantDB(tn)
	n := 0
	submit := func(t *testing.T, it evalharness.Item) (wire.TurnSubmitReply, string) {
		n++
		e := it.Email
		res := ea.forTest(t).submit(&wire.TurnSubmitRequest{WorkItemID: fmt.Sprintf("<gate-%d-%s@agency.example>", n, it.ID), Turn: 1, Email: &e})
		return res.reply(t), envelopeAutonomy(t, res.Body)
	}
	approvals := func() int { return count(t, db, `SELECT count(*) FROM approvals`) }

	rep1, auto := submit(t, items[0])
	if auto != "auto" || rep1.Status != wire.WorkItemStatusClosed || rep1.Action == nil || rep1.Action.Name != "close_item" ||
		rep1.Action.RequiresApproval || rep1.Action.ApprovalID != "" || rep1.Assessment.Category != "invoice" || approvals() != 0 {
		t.Fatalf("granted close_item of an invoice: autonomy %s, %+v", auto, rep1)
	}
	rep2, auto := submit(t, items[len(items)-1]) // a notice: close_item for general is not granted
	if auto != "assist" || rep2.Status != wire.WorkItemStatusAwaitingApproval || rep2.Action == nil || !rep2.Action.RequiresApproval || approvals() != 1 {
		t.Fatalf("close_item of a general item: autonomy %s, %+v", auto, rep2)
	}

	// A new rule: another configuration, which the report did not measure.
	admin, err := s.stack.Ops.RegistryAdmin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	rules := append(sp.Rules, registry.Rule{Name: "statements", Match: registry.Match{SubjectKeywords: []string{"statement"}},
		Category: "invoice", Priority: "low", Confidence: 0.9})
	if err := registry.RulesReplace(ctx, admin, tn.ID, rules); err != nil {
		t.Fatal(err)
	}
	var last wire.TurnSubmitReply
	eventually(t, 30*time.Second, "the brain to fall back to assist after the rule change", func() bool {
		var auto string
		last, auto = submit(t, items[1])
		return auto == "assist"
	})
	if last.Status != wire.WorkItemStatusAwaitingApproval || last.Action == nil || last.Action.Name != "close_item" || !last.Action.RequiresApproval ||
		last.Assessment.Category != "invoice" {
		t.Fatalf("after the rule change: %+v", last)
	}
	if u := double.Unknown(); len(u) > 0 {
		t.Fatalf("the model double did not know %q", u)
	}
}
