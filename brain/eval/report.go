package eval

import (
	"encoding/json"
	"maps"
	"math"
	"runtime/debug"
	"slices"
	"sort"
	"time"

	"n8nbrain/catalogue"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// ScorerVersion names the definitions of the scores below; a change to
// how any score is computed is a new version, so that compare can say two
// reports are not measured alike.
const ScorerVersion = "eval-1"

// Report is one scored run. Its JSON is what compare reads and what is
// stored in the registry as autonomy evidence.
type Report struct {
	Identity   Identity            `json:"identity"`
	Summary    Summary             `json:"summary"`
	Categories []CategoryRow       `json:"categories"`
	Priorities []PriorityRow       `json:"priorities"`
	Actions    []ActionRow         `json:"actions"`
	Confusion  Matrix              `json:"category_confusion"`
	ActionConf Matrix              `json:"action_confusion"`
	Escalation map[string]int      `json:"escalation_reasons"`
	Gate       registry.EvalScores `json:"gate"`
	// Grants says, for each (category, action) the model chose that the
	// catalogue lets go without approval, whether this report would
	// justify autonomy under the thresholds (the tenant's, or the defaults).
	Grants     []GrantCheck                `json:"grants"`
	Thresholds registry.AutonomyThresholds `json:"thresholds"`
	Injection  *InjectionReport            `json:"injection,omitempty"`
	Items      []Result                    `json:"items"`
}

// Identity makes runs comparable: what decided, on which set, measured how.
type Identity struct {
	Tool          string            `json:"tool"`
	ToolVersion   string            `json:"tool_version"`
	ScorerVersion string            `json:"scorer_version"`
	CreatedAt     time.Time         `json:"created_at"`
	Tenant        registry.TenantID `json:"tenant"`
	Source        string            `json:"config_source"` // registry or a file
	Model         string            `json:"model"`
	ModelOptions  map[string]any    `json:"model_options"`
	Prompts       Prompts           `json:"prompts"`
	Catalogue     catalogue.Version `json:"catalogue_version"`
	Categories    []string          `json:"categories"`
	Enabled       []string          `json:"enabled_actions"`
	RulesHash     string            `json:"rules_hash"`
	Rules         int               `json:"rules"`
	// ConfigHash is registry.DecisionConfig's hash of the configuration
	// run: what an autonomy grant must match.
	ConfigHash    string   `json:"config_hash"`
	SetHash       string   `json:"set_hash"`
	SetFiles      []string `json:"set_files"`
	Concurrency   int      `json:"concurrency"`
	JudgeModel    string   `json:"judge_model,omitempty"`
	PricePrompt1K float64  `json:"price_prompt_1k"`
	PriceOutput1K float64  `json:"price_output_1k"`
}

// Prompts are the model stage's prompt versions.
type Prompts struct {
	Classify string `json:"classify"`
	Draft    string `json:"draft"`
}

// Summary holds the headline scores. Rates are fractions from 0 to 1.
type Summary struct {
	Items  int `json:"items"`
	Errors int `json:"errors"` // decisions that could not be made
	// Where the assessment came from.
	ByRule  int `json:"by_rule"`
	ByModel int `json:"by_model"`
	ByNone  int `json:"by_none"` // unassessed: escalated without a usable model answer

	CategoryAccuracy  float64 `json:"category_accuracy"`
	PriorityAccuracy  float64 `json:"priority_accuracy"`
	PriorityWithinOne float64 `json:"priority_within_one"`
	ActionAgreement   float64 `json:"action_agreement"`
	// EscalationRate is the share of items escalated; LabelledEscalation
	// the share the labels say should be.
	EscalationRate     float64 `json:"escalation_rate"`
	LabelledEscalation float64 `json:"labelled_escalation_rate"`
	// EscalationRecall: of the items labelled escalate, the share escalated.
	EscalationRecall float64 `json:"escalation_recall"`

	ModelAnswers    int     `json:"model_answers"`
	ValidFirst      int     `json:"valid_first"`
	ValidOutputRate float64 `json:"valid_output_rate"`
	Repairs         int     `json:"repairs"`
	RepairsPer100   float64 `json:"repairs_per_100"`
	InvalidTwice    int     `json:"invalid_after_repair"`

	DraftsChecked      int           `json:"drafts_checked"`
	FactsRequired      int           `json:"facts_required"`
	FactsPresent       int           `json:"facts_present"`
	FactsPresentRate   float64       `json:"facts_present_rate"`
	DraftsComplete     int           `json:"drafts_complete"`
	DraftsCompleteRate float64       `json:"drafts_complete_rate"`
	DraftsForbidden    int           `json:"drafts_forbidden"`
	ForbiddenRate      float64       `json:"forbidden_rate"`
	Judge              *JudgeSummary `json:"judge,omitempty"`

	PromptTokens   int64        `json:"prompt_tokens"`
	OutputTokens   int64        `json:"output_tokens"`
	TokensPerEmail Distribution `json:"tokens_per_email"`
	LatencyMS      Distribution `json:"latency_ms"`       // whole decision, per e-mail
	ModelLatencyMS Distribution `json:"model_latency_ms"` // per model call
	Calls          int          `json:"calls"`
	WallSeconds    float64      `json:"wall_seconds"`
	// CostPer1000 is the model's cost of 1,000 e-mails at the configured
	// prices; WallSecondsPer1000 the time 1,000 take at this concurrency.
	CostPer1000        float64 `json:"cost_per_1000"`
	WallSecondsPer1000 float64 `json:"wall_seconds_per_1000"`
}

// JudgeSummary is the judge model's view of the drafts.
type JudgeSummary struct {
	Drafts           int     `json:"drafts"`
	Invalid          int     `json:"invalid"`
	FactsPresentRate float64 `json:"facts_present_rate"`
	InventedRate     float64 `json:"invented_rate"`
	MeanScore        float64 `json:"mean_score"`
	Tokens           int64   `json:"tokens"`
}

// Distribution is a sample's size, mean and percentiles.
type Distribution struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P95  float64 `json:"p95"`
	Max  float64 `json:"max"`
}

// CategoryRow scores one category (by label, and as predicted).
type CategoryRow struct {
	Category  string  `json:"category"`
	Items     int     `json:"items"`
	Predicted int     `json:"predicted"`
	Correct   int     `json:"correct"`
	Recall    float64 `json:"recall"` // the category's accuracy
	Precision float64 `json:"precision"`
	F1        float64 `json:"f1"`
}

// PriorityRow scores one priority.
type PriorityRow struct {
	Priority string  `json:"priority"`
	Items    int     `json:"items"`
	Correct  int     `json:"correct"`
	Accuracy float64 `json:"accuracy"`
}

// ActionRow scores one labelled action.
type ActionRow struct {
	Action    string  `json:"action"`
	Items     int     `json:"items"`
	Predicted int     `json:"predicted"`
	Correct   int     `json:"correct"`
	Agreement float64 `json:"agreement"`
	Precision float64 `json:"precision"`
}

// Matrix is a confusion matrix: Counts[i][j] items labelled Labels[i]
// and predicted Columns[j].
type Matrix struct {
	Labels  []string `json:"labels"`
	Columns []string `json:"columns"`
	Counts  [][]int  `json:"counts"`
}

// GrantCheck says whether the report would justify an autonomy grant.
type GrantCheck struct {
	Category string         `json:"category"`
	Action   catalogue.Name `json:"action"`
	Passes   bool           `json:"passes"`
	Problems []string       `json:"problems,omitempty"`
}

// RunInfo is what Score needs besides the results.
type RunInfo struct {
	Tenant     *registry.Tenant // as run (model name set)
	Source     string
	Set        *Set
	Config     Config
	Wall       time.Duration
	CreatedAt  time.Time
	Thresholds *registry.AutonomyThresholds // nil: the tenant's, or the defaults
}

// ToolVersion is this binary's module version and VCS revision.
func ToolVersion() string {
	v := "devel"
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += "+" + s.Value[:12]
			}
			if s.Key == "vcs.modified" && s.Value == "true" {
				v += "-dirty"
			}
		}
	}
	return v
}

// Score builds the report of a run.
func Score(results []Result, info RunInfo) *Report {
	t := info.Tenant
	cfg := t.DecisionConfig()
	r := &Report{Items: results, Escalation: map[string]int{}}
	r.Identity = Identity{Tool: "brain-eval", ToolVersion: ToolVersion(), ScorerVersion: ScorerVersion,
		CreatedAt: info.CreatedAt.UTC(), Tenant: t.ID, Source: info.Source, Model: t.ModelName, ModelOptions: cfg.ModelOptions,
		Prompts: Prompts{Classify: registry.PromptClassify, Draft: registry.PromptDraft}, Catalogue: cfg.CatalogueVersion,
		Categories: cfg.Categories, Enabled: cfg.EnabledActions, RulesHash: cfg.RulesHash, Rules: len(t.Rules),
		ConfigHash: cfg.Hash(), SetHash: info.Set.Hash, SetFiles: info.Set.Files, Concurrency: info.Config.withDefaults().Concurrency,
		PricePrompt1K: info.Config.PricePrompt1K, PriceOutput1K: info.Config.PriceOutput1K}
	if info.Config.Judge != nil {
		r.Identity.JudgeModel = info.Config.Judge.Model
	}
	s := &r.Summary
	n := len(results)
	s.Items = n
	prio := catalogue.Priorities()
	var catCorrect, prioCorrect, prioNear, actCorrect, escalated, labelledEsc, escCaught int
	var tokens, latency, modelLatency []float64
	var judge JudgeSummary
	var judgeFacts, judgeFactsPresent, judgeInvented, judgeScore int
	for i := range results {
		x := &results[i]
		if x.Error != "" {
			s.Errors++
		}
		switch x.Source {
		case "rule":
			s.ByRule++
		case "model":
			s.ByModel++
		default:
			s.ByNone++
		}
		if x.Category == x.Labels.Category {
			catCorrect++
		}
		if x.Priority == x.Labels.Priority {
			prioCorrect++
		}
		if d := slices.Index(prio, x.Priority) - slices.Index(prio, x.Labels.Priority); slices.Contains(prio, x.Priority) && d >= -1 && d <= 1 {
			prioNear++
		}
		if x.Action == x.Labels.Action {
			actCorrect++
		}
		if x.Action == ActionEscalate {
			escalated++
			reason := x.Reason
			if reason == "" {
				reason = "model_chose_escalate"
			}
			r.Escalation[reason]++
		}
		if x.Labels.Action == ActionEscalate {
			labelledEsc++
			if x.Action == ActionEscalate {
				escCaught++
			}
		}
		if x.Reason == "model_output_invalid" {
			s.InvalidTwice++
		}
		s.Repairs += x.Repairs
		// Valid-output rate: per model step that got an answer, was the
		// first answer accepted by the strict check?
		seen := map[string]bool{}
		for _, c := range x.Calls {
			s.Calls++
			s.PromptTokens += c.PromptTokens
			s.OutputTokens += c.OutputTokens
			modelLatency = append(modelLatency, c.LatencyMS)
			if answeredOutcome(c.Outcome) && !seen[c.Step] {
				seen[c.Step] = true
				s.ModelAnswers++
				if c.Outcome == "ok" {
					s.ValidFirst++
				}
			}
		}
		tokens = append(tokens, float64(x.Tokens()))
		latency = append(latency, x.LatencyMS)
		if c := x.Check; c != nil {
			s.DraftsChecked++
			s.FactsRequired += c.Required
			s.FactsPresent += c.Present
			if c.Present == c.Required {
				s.DraftsComplete++
			}
			if len(c.Forbidden) > 0 {
				s.DraftsForbidden++
			}
			if v := c.Judge; v != nil {
				judge.Drafts++
				judge.Tokens += v.Tokens
				if v.Invalid != "" {
					judge.Invalid++
					continue
				}
				judgeFacts += len(v.RequiredPresent)
				for _, p := range v.RequiredPresent {
					if p {
						judgeFactsPresent++
					}
				}
				if v.Invented {
					judgeInvented++
				}
				judgeScore += v.Score
			}
		}
	}
	s.CategoryAccuracy = rate(catCorrect, n)
	s.PriorityAccuracy = rate(prioCorrect, n)
	s.PriorityWithinOne = rate(prioNear, n)
	s.ActionAgreement = rate(actCorrect, n)
	s.EscalationRate = rate(escalated, n)
	s.LabelledEscalation = rate(labelledEsc, n)
	s.EscalationRecall = rate(escCaught, labelledEsc)
	s.ValidOutputRate = rate(s.ValidFirst, s.ModelAnswers)
	s.RepairsPer100 = 100 * rate(s.Repairs, n)
	s.FactsPresentRate = rate(s.FactsPresent, s.FactsRequired)
	s.DraftsCompleteRate = rate(s.DraftsComplete, s.DraftsChecked)
	s.ForbiddenRate = rate(s.DraftsForbidden, s.DraftsChecked)
	if info.Config.Judge != nil {
		valid := judge.Drafts - judge.Invalid
		judge.FactsPresentRate = rate(judgeFactsPresent, judgeFacts)
		judge.InventedRate = rate(judgeInvented, valid)
		if valid > 0 {
			judge.MeanScore = float64(judgeScore) / float64(valid)
		}
		s.Judge = &judge
	}
	s.TokensPerEmail = distribution(tokens)
	s.LatencyMS = distribution(latency)
	s.ModelLatencyMS = distribution(modelLatency)
	s.WallSeconds = info.Wall.Seconds()
	if n > 0 {
		cost := float64(s.PromptTokens)/1000*info.Config.PricePrompt1K + float64(s.OutputTokens)/1000*info.Config.PriceOutput1K
		s.CostPer1000 = cost / float64(n) * 1000
		s.WallSecondsPer1000 = s.WallSeconds / float64(n) * 1000
	}

	r.Categories, r.Confusion = categoryScores(results, t.Categories)
	r.Priorities = priorityScores(results)
	r.Actions, r.ActionConf = actionScores(results)
	r.Gate = gateScores(results, s, r.Categories)
	th := t.EffectiveThresholds()
	if info.Thresholds != nil {
		th = *info.Thresholds
	}
	r.Thresholds = th
	for _, d := range r.Gate.Decisions {
		if registry.Grantable(t.CatalogueVersion, d.Action) != "" {
			continue
		}
		ps := r.Gate.Check(th, d.Action, d.Category)
		r.Grants = append(r.Grants, GrantCheck{Category: d.Category, Action: d.Action, Passes: len(ps) == 0, Problems: ps})
	}
	return r
}

func rate(num, den int) float64 {
	if den == 0 {
		return 0
	}
	return float64(num) / float64(den)
}

// distribution: nearest-rank percentiles.
func distribution(xs []float64) Distribution {
	d := Distribution{N: len(xs)}
	if len(xs) == 0 {
		return d
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	pct := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	d.Mean = sum / float64(len(s))
	d.P50, d.P95, d.Max = pct(0.50), pct(0.95), s[len(s)-1]
	return d
}

func categoryScores(results []Result, tenantCats []string) ([]CategoryRow, Matrix) {
	labels := slices.Clone(tenantCats)
	cols := slices.Clone(tenantCats)
	for _, x := range results {
		if !slices.Contains(labels, x.Labels.Category) {
			labels = append(labels, x.Labels.Category)
		}
		if !slices.Contains(cols, x.Category) {
			cols = append(cols, x.Category)
		}
	}
	if !slices.Contains(cols, wire.CategoryUnclassified) {
		cols = append(cols, wire.CategoryUnclassified)
	}
	m := newMatrix(labels, cols)
	rows := make([]CategoryRow, len(labels))
	for i, c := range labels {
		rows[i].Category = c
	}
	for _, x := range results {
		m.add(x.Labels.Category, x.Category)
		for i := range rows {
			if rows[i].Category == x.Labels.Category {
				rows[i].Items++
				if x.Category == x.Labels.Category {
					rows[i].Correct++
				}
			}
			if rows[i].Category == x.Category {
				rows[i].Predicted++
			}
		}
	}
	for i := range rows {
		c := &rows[i]
		c.Recall, c.Precision = rate(c.Correct, c.Items), rate(c.Correct, c.Predicted)
		if c.Recall+c.Precision > 0 {
			c.F1 = 2 * c.Recall * c.Precision / (c.Recall + c.Precision)
		}
	}
	return rows, m
}

func priorityScores(results []Result) []PriorityRow {
	var rows []PriorityRow
	for _, p := range catalogue.Priorities() {
		row := PriorityRow{Priority: p}
		for _, x := range results {
			if x.Labels.Priority == p {
				row.Items++
				if x.Priority == p {
					row.Correct++
				}
			}
		}
		row.Accuracy = rate(row.Correct, row.Items)
		rows = append(rows, row)
	}
	return rows
}

func actionScores(results []Result) ([]ActionRow, Matrix) {
	labels := append(triageActions(), ActionEscalate)
	cols := slices.Clone(labels)
	for _, x := range results {
		if !slices.Contains(cols, x.Action) {
			cols = append(cols, x.Action)
		}
	}
	m := newMatrix(labels, cols)
	var rows []ActionRow
	for _, a := range labels {
		row := ActionRow{Action: a}
		for _, x := range results {
			if x.Labels.Action == a {
				row.Items++
				if x.Action == a {
					row.Correct++
				}
			}
			if x.Action == a {
				row.Predicted++
			}
		}
		row.Agreement, row.Precision = rate(row.Correct, row.Items), rate(row.Correct, row.Predicted)
		rows = append(rows, row)
	}
	for _, x := range results {
		m.add(x.Labels.Action, x.Action)
	}
	return rows, m
}

func newMatrix(labels, cols []string) Matrix {
	m := Matrix{Labels: labels, Columns: cols, Counts: make([][]int, len(labels))}
	for i := range m.Counts {
		m.Counts[i] = make([]int, len(cols))
	}
	return m
}

func (m *Matrix) add(label, predicted string) {
	i, j := slices.Index(m.Labels, label), slices.Index(m.Columns, predicted)
	if i >= 0 && j >= 0 {
		m.Counts[i][j]++
	}
}

// gateScores are the scores the autonomy gate reads. Decisions count the
// model stage's own choices only: rules act as the catalogue says whatever
// the autonomy, so only what the model chose can be granted.
func gateScores(results []Result, s *Summary, cats []CategoryRow) registry.EvalScores {
	g := registry.EvalScores{Items: s.Items, ModelAnswers: s.ModelAnswers, ValidFirst: s.ValidFirst,
		ValidOutputRate: s.ValidOutputRate, DraftsChecked: s.DraftsChecked, DraftsForbidden: s.DraftsForbidden,
		ForbiddenRate: s.ForbiddenRate, Categories: map[string]registry.CategoryScore{}}
	for _, c := range cats {
		g.Categories[c.Category] = registry.CategoryScore{Items: c.Items, Predicted: c.Predicted, Correct: c.Correct,
			Recall: c.Recall, Precision: c.Precision}
	}
	type key struct {
		cat string
		act catalogue.Name
	}
	by := map[key]*registry.DecisionScore{}
	for _, x := range results {
		if x.Source != "model" || x.Action == ActionEscalate || x.Action == ActionNone {
			continue
		}
		k := key{x.Category, catalogue.Name(x.Action)}
		d := by[k]
		if d == nil {
			d = &registry.DecisionScore{Category: k.cat, Action: k.act}
			by[k] = d
		}
		d.Decided++
		if x.Labels.Category == x.Category && x.Labels.Action == x.Action {
			d.Correct++
		}
	}
	keys := slices.Collect(maps.Keys(by))
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].cat != keys[j].cat {
			return keys[i].cat < keys[j].cat
		}
		return keys[i].act < keys[j].act
	})
	for _, k := range keys {
		d := by[k]
		d.Precision = rate(d.Correct, d.Decided)
		g.Decisions = append(g.Decisions, *d)
	}
	return g
}

// Record is the report as registry evidence for its tenant.
func (r *Report) Record() (registry.EvalReport, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return registry.EvalReport{}, err
	}
	return registry.EvalReport{Tenant: r.Identity.Tenant, ConfigHash: r.Identity.ConfigHash, SetHash: r.Identity.SetHash,
		Model: r.Identity.Model, ToolVersion: r.Identity.ToolVersion, Scores: r.Gate, Report: b}, nil
}
