package eval_test

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"golang.org/x/net/html"

	"n8nbrain/brain/eval"
	"n8nbrain/brain/eval/evaltest"
	"n8nbrain/catalogue"
	"n8nbrain/internal/ollamafake"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// scoredTenant: client-zero's categories and actions, and one rule
// (invoices are closed), so one e-mail is decided without the model.
func scoredTenant(t *testing.T) *registry.Tenant {
	tn := clientZero(t)
	tn.ModelName = "test-model:1b"
	tn.Rules = slices.DeleteFunc(slices.Clone(tn.Rules), func(r registry.Rule) bool { return r.Name != "invoices" })
	return tn
}

func item(id, subject, category, priority, action string, req, forb []string) eval.Item {
	return eval.Item{ID: id, Language: "en", Email: wire.Email{From: "Jo <jo@customer.example>", Subject: subject, Body: "Body of " + id},
		Labels: eval.Labels{Category: category, Priority: priority, Action: action, RequiredFacts: req, Forbidden: forb}}
}

const price = `re:[$€£]\s?\d`

// scoredItems are eight e-mails with one known fault each (or none).
func scoredItems() []eval.Item {
	return []eval.Item{
		item("s1-good-draft", "Deck lights", "quote_request", "high", "draft_reply", []string{"12 Finch St", "photos | photo"}, []string{price}),
		item("s2-wrong-category", "Tap", "booking", "normal", "create_job", nil, nil),
		item("s3-repair", "Angry", "complaint", "high", "escalate", nil, nil),
		item("s4-invalid-twice", "Junk", "general", "low", "close_item", nil, nil),
		item("s5-invented", "Hot water", "quote_request", "high", "draft_reply", []string{"7 Owl Rd", "hot water"}, []string{price, `re:(?i)\btomorrow\b`}),
		item("s6-rule", "Invoice 5521", "invoice", "normal", "close_item", nil, nil),
		item("s7-draft-repair", "Saturday?", "general", "normal", "draft_reply", []string{"Saturday"}, nil),
		item("s8-wrong-action", "Unhappy", "complaint", "high", "escalate", nil, nil),
	}
}

// scoredScript answers each e-mail as its name says.
func scoredScript(req *api.ChatRequest) ollamafake.Reply {
	e, _ := evaltest.EmailOf(req)
	repair := evaltest.IsRepair(req)
	reply := func(s string) ollamafake.Reply { return ollamafake.Reply{Content: s} }
	if evaltest.IsClassify(req) {
		switch e.Subject {
		case "Deck lights", "Hot water":
			return reply(`{"category":"quote_request","priority":"high","confidence":0.9,"action":"draft_reply","params":{}}`)
		case "Tap":
			return reply(`{"category":"general","priority":"normal","confidence":0.6,"action":"create_job","params":{"title":"Tap","description":"Fix the tap"}}`)
		case "Angry":
			if !repair {
				return reply(`Sure! Here is the JSON: {"category": "complaint"`)
			}
			return reply(`{"category":"complaint","priority":"high","confidence":0.8,"action":"escalate_item","params":{"reason":"angry customer"}}`)
		case "Junk":
			return reply(`{"category":"spam","priority":"low","confidence":0.9,"action":"close_item","params":{"resolution":"spam"}}`)
		case "Saturday?":
			return reply(`{"category":"general","priority":"normal","confidence":0.7,"action":"draft_reply","params":{}}`)
		case "Unhappy":
			return reply(`{"category":"complaint","priority":"urgent","confidence":0.7,"action":"draft_reply","params":{}}`)
		}
		return ollamafake.Reply{Status: 400}
	}
	switch e.Subject {
	case "Deck lights":
		return reply(`{"subject":"Re: deck lights","body":"Thanks. Could you send photos of 12 Finch St's deck?","tone":"friendly"}`)
	case "Hot water":
		return reply(`{"subject":"Re: hot water","body":"We can replace the hot water unit tomorrow for $1,200.","tone":"neutral"}`)
	case "Saturday?":
		if !repair {
			return reply(`{"subject":"Re: Saturday"}`)
		}
		return reply(`{"subject":"Re: Saturday","body":"We will let you know about Saturday."}`)
	case "Unhappy":
		return reply(`{"subject":"Re: sorry","body":"We are sorry to hear that.","tone":"apologetic"}`)
	}
	return ollamafake.Reply{Status: 400}
}

func run(t *testing.T, tn *registry.Tenant, items []eval.Item, fake *ollamafake.Server, mutate func(*eval.Config)) *eval.Report {
	t.Helper()
	set, err := eval.NewSet(items, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := set.CheckTenant(tn); err != nil {
		t.Fatal(err)
	}
	cfg := eval.Config{OllamaURL: fake.URL(), Tenant: tn, Concurrency: 4, CallTimeout: 10 * time.Second}
	if mutate != nil {
		mutate(&cfg)
	}
	r, err := eval.NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	results, wall, err := r.Run(ctx, set.Items)
	if err != nil {
		t.Fatal(err)
	}
	return eval.Score(results, eval.RunInfo{Tenant: r.Tenant(), Source: "test", Set: set, Config: cfg, Wall: wall, CreatedAt: time.Now()})
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// Scripted answers, right and wrong, give exactly the scores worked out by
// hand: a wrong category, a first answer that is not JSON (repaired), an
// answer invalid twice (escalated, unclassified), a draft that invents a
// price and a date and misses a fact, a rule's decision, a draft repaired,
// a wrong action.
func TestScoresOfScriptedAnswers(t *testing.T) {
	t.Parallel()
	fake := ollamafake.New(t, scoredScript)
	tn := scoredTenant(t)
	rep := run(t, tn, scoredItems(), fake, func(c *eval.Config) { c.PricePrompt1K, c.PriceOutput1K = 0.5, 1.5 })
	s := rep.Summary
	checks := []struct {
		name      string
		got, want float64
	}{
		{"items", float64(s.Items), 8},
		{"by rule", float64(s.ByRule), 1},
		{"by model", float64(s.ByModel), 6},
		{"unassessed", float64(s.ByNone), 1},
		{"category accuracy", s.CategoryAccuracy, 6.0 / 8},
		{"priority accuracy", s.PriorityAccuracy, 6.0 / 8},
		{"priority within one", s.PriorityWithinOne, 1},
		{"action agreement", s.ActionAgreement, 6.0 / 8},
		{"escalation rate", s.EscalationRate, 2.0 / 8},
		{"labelled escalation", s.LabelledEscalation, 2.0 / 8},
		{"escalation recall", s.EscalationRecall, 1.0 / 2},
		{"model answers", float64(s.ModelAnswers), 11},
		{"valid first", float64(s.ValidFirst), 8},
		{"valid-output rate", s.ValidOutputRate, 8.0 / 11},
		{"repairs", float64(s.Repairs), 3},
		{"repairs per 100", s.RepairsPer100, 37.5},
		{"invalid after repair", float64(s.InvalidTwice), 1},
		{"calls", float64(s.Calls), 14},
		{"drafts checked", float64(s.DraftsChecked), 3},
		{"facts required", float64(s.FactsRequired), 5},
		{"facts present", float64(s.FactsPresent), 4},
		{"facts present rate", s.FactsPresentRate, 0.8},
		{"complete drafts", s.DraftsCompleteRate, 2.0 / 3},
		{"drafts forbidden", float64(s.DraftsForbidden), 1},
		{"forbidden rate", s.ForbiddenRate, 1.0 / 3},
		{"errors", float64(s.Errors), 0},
	}
	for _, c := range checks {
		if !near(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if fake.Calls() != s.Calls {
		t.Errorf("the server saw %d calls, the report counts %d", fake.Calls(), s.Calls)
	}
	wantCost := (float64(s.PromptTokens)/1000*0.5 + float64(s.OutputTokens)/1000*1.5) / 8 * 1000
	if s.PromptTokens == 0 || s.OutputTokens == 0 || !near(s.CostPer1000, wantCost) {
		t.Errorf("tokens %d+%d, cost per 1,000 %v, want %v", s.PromptTokens, s.OutputTokens, s.CostPer1000, wantCost)
	}
	if s.LatencyMS.N != 8 || s.LatencyMS.P50 <= 0 || s.LatencyMS.P95 < s.LatencyMS.P50 || s.TokensPerEmail.P95 < s.TokensPerEmail.P50 {
		t.Errorf("latency %+v tokens %+v", s.LatencyMS, s.TokensPerEmail)
	}
	if !reflect.DeepEqual(rep.Escalation, map[string]int{"model_chose_escalate": 1, "model_output_invalid": 1}) {
		t.Errorf("escalations by reason %v", rep.Escalation)
	}
	cell := func(m eval.Matrix, label, col string) int {
		return m.Counts[slices.Index(m.Labels, label)][slices.Index(m.Columns, col)]
	}
	if cell(rep.Confusion, "booking", "general") != 1 || cell(rep.Confusion, "general", wire.CategoryUnclassified) != 1 ||
		cell(rep.Confusion, "quote_request", "quote_request") != 2 || cell(rep.Confusion, "complaint", "complaint") != 2 {
		t.Errorf("category confusion %+v", rep.Confusion)
	}
	if cell(rep.ActionConf, "escalate", "draft_reply") != 1 || cell(rep.ActionConf, "close_item", "escalate") != 1 {
		t.Errorf("action confusion %+v", rep.ActionConf)
	}
	byID := map[string]eval.Result{}
	for _, x := range rep.Items {
		byID[x.ID] = x
	}
	if c := byID["s5-invented"].Check; c == nil || len(c.Forbidden) != 2 || !slices.Equal(c.Missing, []string{"7 Owl Rd"}) {
		t.Errorf("the invented draft's check: %+v", c)
	}
	if x := byID["s4-invalid-twice"]; x.Reason != "model_output_invalid" || x.Category != wire.CategoryUnclassified || x.Repairs != 1 {
		t.Errorf("invalid twice: %+v", x)
	}
	if x := byID["s6-rule"]; x.Source != "rule" || x.Rule != "invoices" || len(x.Calls) != 0 {
		t.Errorf("rule: %+v", x)
	}
	wantDecisions := []registry.DecisionScore{
		{Category: "complaint", Action: catalogue.DraftReply, Decided: 1, Correct: 0, Precision: 0},
		{Category: "general", Action: catalogue.CreateJob, Decided: 1, Correct: 0, Precision: 0},
		{Category: "general", Action: catalogue.DraftReply, Decided: 1, Correct: 1, Precision: 1},
		{Category: "quote_request", Action: catalogue.DraftReply, Decided: 2, Correct: 2, Precision: 1},
	}
	if !reflect.DeepEqual(rep.Gate.Decisions, wantDecisions) {
		t.Errorf("gate decisions %+v", rep.Gate.Decisions)
	}
	if g := rep.Gate.Categories["booking"]; g.Items != 1 || g.Correct != 0 || g.Predicted != 0 {
		t.Errorf("gate booking %+v", g)
	}
	if len(rep.Grants) != 0 {
		t.Errorf("grants %+v: the model chose no close_item", rep.Grants)
	}
	id := rep.Identity
	if id.Model != "test-model:1b" || id.Prompts.Classify != registry.PromptClassify || id.Prompts.Draft != registry.PromptDraft ||
		id.ConfigHash != tn.DecisionConfig().Hash() || id.RulesHash != registry.RulesHash(tn.Rules) || id.SetHash != eval.SetHash(scoredItems()) ||
		id.ScorerVersion != eval.ScorerVersion || id.ToolVersion == "" || id.Catalogue != 1 {
		t.Errorf("identity %+v", id)
	}

	// The written report reads back, verifies, and says the same.
	path := filepath.Join(t.TempDir(), "r.json")
	b, _ := json.Marshal(rep)
	writeFile(t, path, string(b))
	back, err := eval.LoadReport(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := back.Verify(); err != nil {
		t.Fatalf("verify: %v", err)
	}
	back.Gate.Decisions[0].Correct, back.Gate.Decisions[0].Precision = 1, 1
	if err := back.Verify(); err == nil || !strings.Contains(err.Error(), "do not follow from its items") {
		t.Fatalf("verify of an edited report: %v", err)
	}
	var txt bytes.Buffer
	if err := rep.WriteText(&txt); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`category accuracy\s+75\.0%`, `valid-output rate\s+72\.7%\s+8 of 11 answers valid first time`,
		`repairs per 100\s+37\.5`, `drafts with forbidden facts\s+33\.3%`, `s5-invented\s+draft misses 1 of 2 facts; draft has 2 forbidden`} {
		if !regexp.MustCompile(want).MatchString(txt.String()) {
			t.Errorf("text report lacks %q:\n%s", want, txt.String())
		}
	}
}

// The HTML page parses as HTML, carries its six charts as inline SVG, and
// nothing external or executable; text from the set is escaped.
func TestHTMLReportIsSelfContained(t *testing.T) {
	t.Parallel()
	fake := ollamafake.New(t, scoredScript)
	items := scoredItems()
	items[0].Labels.RequiredFacts = append(items[0].Labels.RequiredFacts, "<script>alert(1)</script>")
	rep := run(t, scoredTenant(t), items, fake, nil)
	var page bytes.Buffer
	if err := rep.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	doc, err := html.Parse(bytes.NewReader(page.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	svgs := map[string]int{}
	var bad []string
	var walk func(n *html.Node, inSVG string)
	walk = func(n *html.Node, inSVG string) {
		if n.Type == html.ElementNode {
			switch n.Data {
			case "script", "iframe", "img", "link", "object", "embed":
				bad = append(bad, n.Data)
			case "svg":
				inSVG = attr(n, "id")
			case "rect", "text":
				if inSVG != "" {
					svgs[inSVG]++
				}
			}
			for _, a := range n.Attr {
				if a.Key == "src" || (a.Key == "href" && !strings.HasPrefix(a.Val, "#")) || strings.HasPrefix(a.Key, "on") {
					bad = append(bad, n.Data+"@"+a.Key)
				}
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c, inSVG)
		}
	}
	walk(doc, "")
	if len(bad) > 0 {
		t.Errorf("the page has external or executable parts: %v", bad)
	}
	for _, id := range []string{"chart-scores", "chart-categories", "chart-confusion", "chart-actions", "chart-latency", "chart-tokens"} {
		if svgs[id] < 3 {
			t.Errorf("chart %s has %d shapes", id, svgs[id])
		}
	}
	if !bytes.Contains(page.Bytes(), []byte("&lt;script&gt;alert(1)&lt;/script&gt;")) {
		t.Error("a fact from the set is not escaped in the page")
	}
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

// The whole labelled set through the real decision path, against a
// double that answers every e-mail with its labels: every e-mail reaches
// the model (no rules), every score is perfect, nothing is unknown to the
// double. Then with client-zero's rules, which decide some e-mails first:
// the model's own decisions stay perfect and the rules' are measured.
func TestWholeSetThroughTheDecisionPath(t *testing.T) {
	t.Parallel()
	set, err := eval.LoadSet(setDir)
	if err != nil {
		t.Fatal(err)
	}
	d, err := evaltest.NewDouble(set.Items)
	if err != nil {
		t.Fatal(err)
	}
	fake := ollamafake.New(t, d.Chat)
	noRules := clientZero(t)
	noRules.Rules = nil
	rep := run(t, noRules, set.Items, fake, func(c *eval.Config) { c.Concurrency = 8 })
	if u := d.Unknown(); len(u) > 0 {
		t.Fatalf("the double did not know %d e-mails: %q", len(u), u)
	}
	s := rep.Summary
	if s.Items != len(set.Items) || s.ByModel != s.Items || s.Errors != 0 {
		t.Fatalf("summary %+v", s)
	}
	for name, v := range map[string]float64{"category accuracy": s.CategoryAccuracy, "priority accuracy": s.PriorityAccuracy,
		"action agreement": s.ActionAgreement, "valid-output rate": s.ValidOutputRate, "facts present": s.FactsPresentRate,
		"complete drafts": s.DraftsCompleteRate, "escalation recall": s.EscalationRecall} {
		if v != 1 {
			t.Errorf("%s = %v, want 1 with a double that answers the labels", name, v)
		}
	}
	if s.Repairs != 0 || s.DraftsForbidden != 0 || s.DraftsChecked < 60 {
		var forb []string
		for _, x := range rep.Items {
			if x.Check != nil && len(x.Check.Forbidden) > 0 {
				forb = append(forb, x.ID+": "+strings.Join(x.Check.Forbidden, ","))
			}
		}
		t.Errorf("repairs %d, drafts checked %d, with forbidden facts %d %v (a label's required fact is forbidden by its own labels?)",
			s.Repairs, s.DraftsChecked, s.DraftsForbidden, forb)
	}
	if fake.Calls() != s.Calls || s.Calls != s.Items+s.DraftsChecked {
		t.Errorf("%d calls at the server, %d in the report, want one per e-mail plus one per draft (%d)", fake.Calls(), s.Calls, s.Items+s.DraftsChecked)
	}

	// client-zero as configured: its rules decide first.
	withRules := clientZero(t)
	rep = run(t, withRules, set.Items, fake, func(c *eval.Config) { c.Concurrency = 8 })
	ruled, agree := 0, 0
	for _, x := range rep.Items {
		switch x.Source {
		case "rule":
			ruled++
			if x.Category == x.Labels.Category && x.Action == x.Labels.Action {
				agree++
			}
		case "model":
			if x.Category != x.Labels.Category || x.Priority != x.Labels.Priority || x.Action != x.Labels.Action {
				t.Errorf("%s: the model's decision %s/%s/%s differs from the labels it was given", x.ID, x.Category, x.Priority, x.Action)
			}
		default:
			t.Errorf("%s: source %q", x.ID, x.Source)
		}
	}
	if ruled == 0 || ruled != rep.Summary.ByRule {
		t.Fatalf("%d e-mails decided by rules (summary %d)", ruled, rep.Summary.ByRule)
	}
	t.Logf("client-zero's rules decide %d of %d e-mails; %d of them agree with the labels on category and action; overall category accuracy %.3f, action agreement %.3f with a perfect model",
		ruled, rep.Summary.Items, agree, rep.Summary.CategoryAccuracy, rep.Summary.ActionAgreement)
}

// A stricter run: the injection corpus against a double that obeys every
// attacker, with the tenant the suite's injection test uses. What the
// brain does with each e-mail is what the corpus expects of it; nothing
// leaves the closed set and nothing the model chose goes without a human.
func TestInjectionCorpusWithAnObedientModel(t *testing.T) {
	t.Parallel()
	as, err := eval.LoadAttacks("../../tests/testdata/injection/corpus.json")
	if err != nil {
		t.Fatal(err)
	}
	bySubject := map[string]*eval.Attack{}
	for i := range as {
		bySubject[as[i].Email.Subject] = &as[i]
	}
	raw := func(m json.RawMessage) string {
		var s string
		if len(m) > 0 && m[0] == '"' && json.Unmarshal(m, &s) == nil {
			return s
		}
		return string(m)
	}
	fake := ollamafake.New(t, func(req *api.ChatRequest) ollamafake.Reply {
		e, _ := evaltest.EmailOf(req)
		a := bySubject[e.Subject]
		if a == nil {
			return ollamafake.Reply{Status: 400}
		}
		if evaltest.IsClassify(req) {
			return ollamafake.Reply{Content: raw(a.Classify)}
		}
		if a.Draft == nil {
			return ollamafake.Reply{Content: `{"subject":"Re: your email","body":"Thank you for your message.","tone":"neutral"}`}
		}
		return ollamafake.Reply{Content: raw(a.Draft)}
	})
	tn := &registry.Tenant{ID: "inj", CatalogueVersion: 1, ModelName: "test-model:1b", Categories: []string{"quote_request", "complaint", "booking", "invoice", "general"},
		EnabledActions: []catalogue.Name{catalogue.DraftReply, catalogue.SendReply, catalogue.EscalateItem, catalogue.CloseItem}}
	r, err := eval.NewRunner(eval.Config{OllamaURL: fake.URL(), Tenant: tn, Concurrency: 8})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.RunAttacks(t.Context(), as)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Emails != len(as) || rep.OutsideClosedSet != 0 || rep.ActedWithoutHuman != 0 {
		t.Fatalf("injection report %+v", rep)
	}
	wanted := 0
	for i, res := range rep.Results {
		exp := as[i].Expect
		action := exp.Action
		if action == string(catalogue.EscalateItem) {
			action = eval.ActionEscalate
		}
		if res.Action != action || string(res.Status) != exp.Status || res.Reason != exp.Reason {
			t.Errorf("%s: decided %s/%s/%s, the corpus expects %s/%s/%s", res.Name, res.Action, res.Status, res.Reason, exp.Action, exp.Status, exp.Reason)
		}
		if w := as[i].WantedAction(); w != "" && w != string(catalogue.EscalateItem) && w == res.Action {
			wanted++
		}
	}
	if wanted == 0 || rep.WantedChosen != wanted {
		t.Fatalf("attacker's action chosen %d, counted %d", rep.WantedChosen, wanted)
	}
}

// The judge model checks drafts with its own strict schema; an answer that
// does not follow it is counted invalid, never guessed at.
func TestJudgeModel(t *testing.T) {
	t.Parallel()
	fake := ollamafake.New(t, scoredScript)
	judge := ollamafake.New(t, func(req *api.ChatRequest) ollamafake.Reply {
		var c struct {
			Draft struct {
				Body string `json:"body"`
			} `json:"draft"`
			Required []string `json:"required"`
		}
		u := req.Messages[1].Content
		_ = json.Unmarshal([]byte(strings.TrimSuffix(strings.TrimPrefix(u, "<case>\n"), "\n</case>")), &c)
		switch {
		case strings.Contains(c.Draft.Body, "$1,200"):
			return ollamafake.Reply{Content: `{"required_present":[false,true],"invented":true,"score":1}`}
		case strings.Contains(c.Draft.Body, "Saturday"):
			return ollamafake.Reply{Content: `{"required_present":[true,true],"invented":false,"score":4}`} // one entry too many
		}
		pres := make([]bool, len(c.Required))
		for i := range pres {
			pres[i] = true
		}
		b, _ := json.Marshal(map[string]any{"required_present": pres, "invented": false, "score": 5})
		return ollamafake.Reply{Content: string(b)}
	})
	rep := run(t, scoredTenant(t), scoredItems(), fake, func(c *eval.Config) {
		c.Judge = &eval.JudgeConfig{OllamaURL: judge.URL(), Model: "judge:3b"}
	})
	j := rep.Summary.Judge
	if j == nil || j.Drafts != 3 || j.Invalid != 1 || !near(j.FactsPresentRate, 3.0/4) || !near(j.InventedRate, 0.5) || !near(j.MeanScore, 3) || j.Tokens == 0 {
		t.Fatalf("judge summary %+v", j)
	}
	if rep.Identity.JudgeModel != "judge:3b" || judge.Calls() != 3 {
		t.Fatalf("judge model %q, %d calls", rep.Identity.JudgeModel, judge.Calls())
	}
	for _, r := range judge.Requests() {
		if !bytes.Contains(r.Format, []byte(`"required_present"`)) || r.Model != "judge:3b" {
			t.Fatalf("judge request without its schema: %s", r.Format)
		}
	}
}
