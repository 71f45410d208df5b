package eval

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"n8nbrain/wire"
)

// CompareLimits say how much worse B may be than A before compare fails.
type CompareLimits struct {
	// MaxDrop is the largest drop allowed in a score where higher is
	// better (a fraction: 0.02 is two percentage points): category,
	// priority and per-category accuracy, action agreement, valid-output
	// rate, required facts present.
	MaxDrop float64
	// MaxForbiddenRise is the largest rise allowed in the share of drafts
	// with a forbidden fact (default 0: any rise fails).
	MaxForbiddenRise float64
	// MaxRepairsRise is the largest rise allowed in repairs per 100 e-mails
	// (0: not checked).
	MaxRepairsRise float64
	// MaxLatencyRatio fails when B's p95 latency per e-mail exceeds A's by
	// this factor (1.5: half as slow again; 0: not checked).
	MaxLatencyRatio float64
	// AllowSetChange compares reports of different labelled sets (their
	// scores are not measured on the same e-mails).
	AllowSetChange bool
}

// Delta is one score of both reports.
type Delta struct {
	Name       string  `json:"name"`
	A          float64 `json:"a"`
	B          float64 `json:"b"`
	HigherGood bool    `json:"higher_is_better"`
	Rate       bool    `json:"rate"`
	Regression string  `json:"regression,omitempty"`
}

// Comparison is compare's result.
type Comparison struct {
	// Changed lists identity fields that differ ("model: a → b").
	Changed     []string `json:"changed"`
	Deltas      []Delta  `json:"deltas"`
	Regressions []string `json:"regressions"`
	// NotComparable says why the scores cannot be compared (another set,
	// another scorer), unless allowed.
	NotComparable string `json:"not_comparable,omitempty"`
}

// LoadReport reads a report written by brain-eval (strictly decoded).
func LoadReport(path string) (*Report, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	var r Report
	if err := wire.Decode(raw, &r); err != nil {
		return nil, fmt.Errorf("report %s: %w", path, err)
	}
	return &r, nil
}

// Compare compares report b (the change) with a (the baseline).
func Compare(a, b *Report, lim CompareLimits) *Comparison {
	c := &Comparison{}
	ia, ib := a.Identity, b.Identity
	diff := func(name, x, y string) {
		if x != y {
			c.Changed = append(c.Changed, fmt.Sprintf("%s: %s → %s", name, x, y))
		}
	}
	diff("model", ia.Model, ib.Model)
	diff("model options", fmt.Sprint(ia.ModelOptions), fmt.Sprint(ib.ModelOptions))
	diff("classify prompt", ia.Prompts.Classify, ib.Prompts.Classify)
	diff("draft prompt", ia.Prompts.Draft, ib.Prompts.Draft)
	diff("catalogue version", fmt.Sprint(ia.Catalogue), fmt.Sprint(ib.Catalogue))
	diff("categories", strings.Join(ia.Categories, ","), strings.Join(ib.Categories, ","))
	diff("enabled actions", strings.Join(ia.Enabled, ","), strings.Join(ib.Enabled, ","))
	diff("rules hash", ia.RulesHash, ib.RulesHash)
	diff("config hash", ia.ConfigHash, ib.ConfigHash)
	diff("set hash", ia.SetHash, ib.SetHash)
	diff("scorer", ia.ScorerVersion, ib.ScorerVersion)
	diff("tool", ia.ToolVersion, ib.ToolVersion)
	diff("tenant", string(ia.Tenant), string(ib.Tenant))
	diff("judge", ia.JudgeModel, ib.JudgeModel)
	switch {
	case ia.ScorerVersion != ib.ScorerVersion:
		c.NotComparable = fmt.Sprintf("the reports were scored differently (%s, %s)", ia.ScorerVersion, ib.ScorerVersion)
	case ia.SetHash != ib.SetHash && !lim.AllowSetChange:
		c.NotComparable = "the reports measured different labelled sets (set hash); pass -allow-set-change to compare anyway"
	}

	sa, sb := a.Summary, b.Summary
	higher := func(name string, x, y float64) {
		d := Delta{Name: name, A: x, B: y, HigherGood: true, Rate: true}
		if x-y > lim.MaxDrop+1e-12 {
			d.Regression = fmt.Sprintf("%s dropped from %s to %s (more than %s)", name, pct(x), pct(y), pct(lim.MaxDrop))
		}
		c.add(d)
	}
	higher("category accuracy", sa.CategoryAccuracy, sb.CategoryAccuracy)
	higher("priority accuracy", sa.PriorityAccuracy, sb.PriorityAccuracy)
	higher("action agreement", sa.ActionAgreement, sb.ActionAgreement)
	higher("valid-output rate", sa.ValidOutputRate, sb.ValidOutputRate)
	higher("required facts present", sa.FactsPresentRate, sb.FactsPresentRate)
	higher("complete drafts", sa.DraftsCompleteRate, sb.DraftsCompleteRate)
	recall := func(r *Report) map[string]float64 {
		m := map[string]float64{}
		for _, x := range r.Categories {
			if x.Items > 0 {
				m[x.Category] = x.Recall
			}
		}
		return m
	}
	ra, rb := recall(a), recall(b)
	for _, k := range sortedKeys(ra) {
		if y, ok := rb[k]; ok {
			higher("accuracy of "+k, ra[k], y)
		}
	}
	d := Delta{Name: "drafts with forbidden facts", A: sa.ForbiddenRate, B: sb.ForbiddenRate, Rate: true}
	if sb.ForbiddenRate-sa.ForbiddenRate > lim.MaxForbiddenRise+1e-12 {
		d.Regression = fmt.Sprintf("drafts with forbidden facts rose from %s to %s", pct(sa.ForbiddenRate), pct(sb.ForbiddenRate))
	}
	c.add(d)
	d = Delta{Name: "repairs per 100", A: sa.RepairsPer100, B: sb.RepairsPer100}
	if lim.MaxRepairsRise > 0 && sb.RepairsPer100-sa.RepairsPer100 > lim.MaxRepairsRise {
		d.Regression = fmt.Sprintf("repairs per 100 rose from %.1f to %.1f", sa.RepairsPer100, sb.RepairsPer100)
	}
	c.add(d)
	c.add(Delta{Name: "escalation rate", A: sa.EscalationRate, B: sb.EscalationRate, Rate: true})
	d = Delta{Name: "latency p95 ms", A: sa.LatencyMS.P95, B: sb.LatencyMS.P95}
	if lim.MaxLatencyRatio > 0 && sa.LatencyMS.P95 > 0 && sb.LatencyMS.P95 > lim.MaxLatencyRatio*sa.LatencyMS.P95 {
		d.Regression = fmt.Sprintf("p95 latency per e-mail rose from %.0f ms to %.0f ms", sa.LatencyMS.P95, sb.LatencyMS.P95)
	}
	c.add(d)
	c.add(Delta{Name: "latency p50 ms", A: sa.LatencyMS.P50, B: sb.LatencyMS.P50})
	c.add(Delta{Name: "tokens per e-mail p50", A: sa.TokensPerEmail.P50, B: sb.TokensPerEmail.P50})
	c.add(Delta{Name: "tokens per e-mail p95", A: sa.TokensPerEmail.P95, B: sb.TokensPerEmail.P95})
	c.add(Delta{Name: "cost per 1,000 e-mails", A: sa.CostPer1000, B: sb.CostPer1000})
	return c
}

func (c *Comparison) add(d Delta) {
	c.Deltas = append(c.Deltas, d)
	if d.Regression != "" {
		c.Regressions = append(c.Regressions, d.Regression)
	}
}

// Failed reports whether CI should fail the change.
func (c *Comparison) Failed() bool { return len(c.Regressions) > 0 || c.NotComparable != "" }

// WriteText writes the comparison.
func (c *Comparison) WriteText(w io.Writer) error {
	var b strings.Builder
	if len(c.Changed) == 0 {
		b.WriteString("same configuration, set and tool\n")
	} else {
		b.WriteString("changed:\n")
		for _, s := range c.Changed {
			b.WriteString("  " + s + "\n")
		}
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "score\tA\tB\tchange\t")
	for _, d := range c.Deltas {
		fa, fb, fd := fmt.Sprintf("%.1f", d.A), fmt.Sprintf("%.1f", d.B), fmt.Sprintf("%+.1f", d.B-d.A)
		if d.Rate {
			fa, fb, fd = pct(d.A), pct(d.B), fmt.Sprintf("%+.1f pt", 100*(d.B-d.A))
		}
		mark := ""
		if d.Regression != "" {
			mark = "REGRESSION"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", d.Name, fa, fb, fd, mark)
	}
	tw.Flush()
	if c.NotComparable != "" {
		b.WriteString("\nnot comparable: " + c.NotComparable + "\n")
	}
	if len(c.Regressions) > 0 {
		fmt.Fprintf(&b, "\n%d regression(s):\n", len(c.Regressions))
		for _, r := range c.Regressions {
			b.WriteString("  " + r + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
