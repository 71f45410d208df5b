package eval

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

func pct(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }

// WriteText writes the report for a terminal or a CI log.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	id, s := r.Identity, r.Summary
	fmt.Fprintf(&b, "brain-eval %s (scorer %s), %s\n", id.ToolVersion, id.ScorerVersion, id.CreatedAt.Format("2006-01-02 15:04:05Z"))
	fmt.Fprintf(&b, "tenant %s (%s)  model %s  prompts %s, %s  catalogue v%d\n", id.Tenant, id.Source, id.Model,
		id.Prompts.Classify, id.Prompts.Draft, id.Catalogue)
	fmt.Fprintf(&b, "categories %s\nactions %s  rules %d (hash %.12s)\n", strings.Join(id.Categories, ", "),
		strings.Join(id.Enabled, ", "), id.Rules, id.RulesHash)
	fmt.Fprintf(&b, "config hash %s\nset hash    %s (%d e-mails)\n\n", id.ConfigHash, id.SetHash, s.Items)

	fmt.Fprintf(&b, "decided by rule %d, by model %d, unassessed %d, errors %d\n", s.ByRule, s.ByModel, s.ByNone, s.Errors)
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	row := func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")) }
	row("category accuracy", pct(s.CategoryAccuracy))
	row("priority accuracy", pct(s.PriorityAccuracy), "within one level "+pct(s.PriorityWithinOne))
	row("action agreement", pct(s.ActionAgreement))
	row("escalation rate", pct(s.EscalationRate), "labelled "+pct(s.LabelledEscalation), "recall "+pct(s.EscalationRecall))
	row("valid-output rate", pct(s.ValidOutputRate), fmt.Sprintf("%d of %d answers valid first time", s.ValidFirst, s.ModelAnswers))
	row("repairs per 100", fmt.Sprintf("%.1f", s.RepairsPer100), fmt.Sprintf("%d repairs, %d invalid after repair", s.Repairs, s.InvalidTwice))
	row("drafts checked", fmt.Sprint(s.DraftsChecked))
	row("required facts present", pct(s.FactsPresentRate), fmt.Sprintf("%d of %d; complete drafts %s", s.FactsPresent, s.FactsRequired, pct(s.DraftsCompleteRate)))
	row("drafts with forbidden facts", pct(s.ForbiddenRate), fmt.Sprintf("%d of %d", s.DraftsForbidden, s.DraftsChecked))
	if j := s.Judge; j != nil {
		row("judge", fmt.Sprintf("%d drafts, %d invalid", j.Drafts, j.Invalid), "facts "+pct(j.FactsPresentRate),
			"invented "+pct(j.InventedRate), fmt.Sprintf("mean score %.2f", j.MeanScore))
	}
	row("tokens per e-mail", fmt.Sprintf("p50 %.0f  p95 %.0f  mean %.0f", s.TokensPerEmail.P50, s.TokensPerEmail.P95, s.TokensPerEmail.Mean),
		fmt.Sprintf("prompt %d, output %d in %d calls", s.PromptTokens, s.OutputTokens, s.Calls))
	row("latency per e-mail", fmt.Sprintf("p50 %.0f ms  p95 %.0f ms", s.LatencyMS.P50, s.LatencyMS.P95),
		fmt.Sprintf("per call p50 %.0f ms p95 %.0f ms", s.ModelLatencyMS.P50, s.ModelLatencyMS.P95))
	row("cost per 1,000 e-mails", fmt.Sprintf("%.4f", s.CostPer1000), fmt.Sprintf("at %.4g/%.4g per 1k prompt/output tokens", id.PricePrompt1K, id.PriceOutput1K))
	row("wall time per 1,000 e-mails", fmt.Sprintf("%.0f s", s.WallSecondsPer1000), fmt.Sprintf("at -j %d (run: %.1f s)", id.Concurrency, s.WallSeconds))
	tw.Flush()

	b.WriteString("\nper category (by label)\n")
	tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	row("category", "items", "predicted", "correct", "recall", "precision", "f1")
	for _, c := range r.Categories {
		row(c.Category, fmt.Sprint(c.Items), fmt.Sprint(c.Predicted), fmt.Sprint(c.Correct), pct(c.Recall), pct(c.Precision), fmt.Sprintf("%.3f", c.F1))
	}
	tw.Flush()
	b.WriteString("\nper priority (by label)\n")
	tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	row("priority", "items", "correct", "accuracy")
	for _, p := range r.Priorities {
		row(p.Priority, fmt.Sprint(p.Items), fmt.Sprint(p.Correct), pct(p.Accuracy))
	}
	tw.Flush()
	b.WriteString("\nper action (by label)\n")
	tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	row("action", "items", "predicted", "correct", "agreement", "precision")
	for _, a := range r.Actions {
		row(a.Action, fmt.Sprint(a.Items), fmt.Sprint(a.Predicted), fmt.Sprint(a.Correct), pct(a.Agreement), pct(a.Precision))
	}
	tw.Flush()
	writeMatrix(&b, "category confusion (rows: label, columns: decision)", r.Confusion)
	writeMatrix(&b, "action confusion (rows: label, columns: decision)", r.ActionConf)
	if len(r.Escalation) > 0 {
		b.WriteString("\nescalations by reason\n")
		for _, k := range sortedKeys(r.Escalation) {
			fmt.Fprintf(&b, "  %-24s %d\n", k, r.Escalation[k])
		}
	}
	b.WriteString("\nautonomy evidence (thresholds: ")
	th := r.Thresholds
	fmt.Fprintf(&b, "items>=%d decisions>=%d recall>=%.2f precision>=%.2f action precision>=%.2f valid>=%.2f forbidden<=%.2f)\n",
		th.MinItems, th.MinDecisions, th.MinCategoryRecall, th.MinCategoryPrecision, th.MinActionPrecision, th.MinValidOutputRate, th.MaxForbiddenRate)
	if len(r.Grants) == 0 {
		b.WriteString("  the model chose no action that autonomy could let go without a human\n")
	}
	for _, g := range r.Grants {
		verdict := "passes"
		if !g.Passes {
			verdict = "does not pass: " + strings.Join(g.Problems, "; ")
		}
		fmt.Fprintf(&b, "  %s for %s: %s\n", g.Action, g.Category, verdict)
	}
	if in := r.Injection; in != nil {
		fmt.Fprintf(&b, "\ninjection corpus: %d e-mails; attacker's action chosen %d, escalated %d, stopped for a human %d, acted without a human %d, outside the closed set %d\n",
			in.Emails, in.WantedChosen, in.Escalated, in.StoppedForHuman, in.ActedWithoutHuman, in.OutsideClosedSet)
	}
	var wrong []string
	for _, x := range r.Items {
		var why []string
		if x.Error != "" {
			why = append(why, "error: "+x.Error)
		}
		if x.Category != x.Labels.Category {
			why = append(why, fmt.Sprintf("category %s (label %s)", x.Category, x.Labels.Category))
		}
		if x.Action != x.Labels.Action {
			why = append(why, fmt.Sprintf("action %s (label %s)", x.Action, x.Labels.Action))
		}
		if c := x.Check; c != nil && len(c.Missing) > 0 {
			why = append(why, fmt.Sprintf("draft misses %d of %d facts", len(c.Missing), c.Required))
		}
		if c := x.Check; c != nil && len(c.Forbidden) > 0 {
			why = append(why, fmt.Sprintf("draft has %d forbidden", len(c.Forbidden)))
		}
		if len(why) > 0 {
			wrong = append(wrong, fmt.Sprintf("  %-28s %s", x.ID, strings.Join(why, "; ")))
		}
	}
	fmt.Fprintf(&b, "\ne-mails with a disagreement: %d\n", len(wrong))
	for _, l := range wrong {
		b.WriteString(l + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeMatrix(b *strings.Builder, title string, m Matrix) {
	fmt.Fprintf(b, "\n%s\n", title)
	tw := tabwriter.NewWriter(b, 0, 4, 1, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "\t")
	for _, c := range m.Columns {
		fmt.Fprintf(tw, "%s\t", abbrev(c))
	}
	fmt.Fprintln(tw)
	for i, l := range m.Labels {
		fmt.Fprintf(tw, "%s\t", l)
		for j := range m.Columns {
			if m.Counts[i][j] == 0 {
				fmt.Fprint(tw, ".\t")
			} else {
				fmt.Fprintf(tw, "%d\t", m.Counts[i][j])
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

func abbrev(s string) string {
	if len(s) > 10 {
		return s[:10]
	}
	return s
}
