package eval

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
)

// The HTML report is one self-contained page: inline CSS and inline SVG
// charts, no script, no external asset, so it can be archived with a CI
// run and opened anywhere. Everything from the set or the model is
// escaped by html/template.

// Bar is one bar of a horizontal bar chart.
type bar struct {
	Label string
	Value float64 // 0..1
	Text  string
	Y     int
	W     float64
	Class string
}

type barChart struct {
	ID, Title string
	Bars      []bar
	Height    int
}

const barWidth = 420.0

func newBarChart(id, title string, bars []bar) barChart {
	for i := range bars {
		bars[i].Y = 8 + i*24
		bars[i].W = math.Max(0, math.Min(1, bars[i].Value)) * barWidth
	}
	return barChart{ID: id, Title: title, Bars: bars, Height: 16 + len(bars)*24}
}

type cell struct {
	X, Y, Count int
	Fill        string
	Diagonal    bool
}

type heatmap struct {
	ID, Title     string
	Rows, Cols    []axisLabel
	Cells         []cell
	Width, Height int
}

type axisLabel struct {
	Text string
	X, Y int
}

const (
	hmLeft = 130
	hmTop  = 110
	hmCell = 34
)

func newHeatmap(id, title string, m Matrix) heatmap {
	h := heatmap{ID: id, Title: title, Width: hmLeft + len(m.Columns)*hmCell + 80, Height: hmTop + len(m.Labels)*hmCell + 10}
	peak := 1
	for _, r := range m.Counts {
		for _, n := range r {
			peak = max(peak, n)
		}
	}
	for j, c := range m.Columns {
		h.Cols = append(h.Cols, axisLabel{Text: c, X: hmLeft + j*hmCell + hmCell/2, Y: hmTop - 6})
	}
	for i, l := range m.Labels {
		h.Rows = append(h.Rows, axisLabel{Text: l, X: hmLeft - 6, Y: hmTop + i*hmCell + hmCell/2 + 4})
		for j, c := range m.Columns {
			n := m.Counts[i][j]
			light := 97 - int(60*float64(n)/float64(peak))
			hue := 210
			if c != l && n > 0 {
				hue = 10
			}
			h.Cells = append(h.Cells, cell{X: hmLeft + j*hmCell, Y: hmTop + i*hmCell, Count: n,
				Fill: fmt.Sprintf("hsl(%d,70%%,%d%%)", hue, light), Diagonal: c == l})
		}
	}
	return h
}

type histogram struct {
	ID, Title, Unit string
	Bins            []hbin
	Min, Max        float64
	Width, Height   int
}

type hbin struct {
	X, Y, W, H int
	Label      string
	Count      int
}

func newHistogram(id, title, unit string, xs []float64) histogram {
	const bins, w, hgt = 12, 480, 140
	h := histogram{ID: id, Title: title, Unit: unit, Width: w + 20, Height: hgt + 40}
	if len(xs) == 0 {
		return h
	}
	lo, hi := xs[0], xs[0]
	for _, x := range xs {
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	step := (hi - lo) / bins
	if step == 0 {
		step = 1
	}
	counts := make([]int, bins)
	for _, x := range xs {
		counts[min(bins-1, int((x-lo)/step))]++
	}
	peak := 1
	for _, c := range counts {
		peak = max(peak, c)
	}
	bw := w / bins
	for i, c := range counts {
		bh := int(float64(hgt) * float64(c) / float64(peak))
		h.Bins = append(h.Bins, hbin{X: 10 + i*bw, Y: 10 + hgt - bh, W: bw - 2, H: bh, Count: c,
			Label: fmt.Sprintf("%.0f–%.0f %s: %d", lo+float64(i)*step, lo+float64(i+1)*step, unit, c)})
	}
	h.Min, h.Max = lo, hi
	return h
}

type htmlPage struct {
	R          *Report
	Scores     barChart
	Categories barChart
	Confusion  heatmap
	Actions    heatmap
	Latency    histogram
	Tokens     histogram
	Wrong      []Result
}

// WriteHTML writes the self-contained HTML page.
func (r *Report) WriteHTML(w io.Writer) error {
	s := r.Summary
	scores := []bar{
		{Label: "category accuracy", Value: s.CategoryAccuracy},
		{Label: "priority accuracy", Value: s.PriorityAccuracy},
		{Label: "action agreement", Value: s.ActionAgreement},
		{Label: "valid-output rate", Value: s.ValidOutputRate},
		{Label: "required facts present", Value: s.FactsPresentRate},
		{Label: "complete drafts", Value: s.DraftsCompleteRate},
		{Label: "drafts with forbidden facts", Value: s.ForbiddenRate, Class: "bad"},
		{Label: "escalation rate", Value: s.EscalationRate, Class: "neutral"},
	}
	for i := range scores {
		scores[i].Text = pct(scores[i].Value)
	}
	var cats []bar
	for _, c := range r.Categories {
		cats = append(cats, bar{Label: c.Category + " recall", Value: c.Recall, Text: fmt.Sprintf("%s (%d/%d)", pct(c.Recall), c.Correct, c.Items)},
			bar{Label: c.Category + " precision", Value: c.Precision, Text: fmt.Sprintf("%s (%d/%d)", pct(c.Precision), c.Correct, c.Predicted), Class: "alt"})
	}
	var lat, tok []float64
	var wrong []Result
	for _, x := range r.Items {
		lat = append(lat, x.LatencyMS)
		tok = append(tok, float64(x.Tokens()))
		if x.Error != "" || x.Category != x.Labels.Category || x.Action != x.Labels.Action ||
			(x.Check != nil && (len(x.Check.Missing) > 0 || len(x.Check.Forbidden) > 0)) {
			wrong = append(wrong, x)
		}
	}
	p := htmlPage{R: r,
		Scores:     newBarChart("chart-scores", "Headline scores", scores),
		Categories: newBarChart("chart-categories", "Accuracy (recall) and precision per category", cats),
		Confusion:  newHeatmap("chart-confusion", "Category confusion (rows: label, columns: decision)", r.Confusion),
		Actions:    newHeatmap("chart-actions", "Action confusion (rows: label, columns: decision)", r.ActionConf),
		Latency:    newHistogram("chart-latency", "Latency per e-mail", "ms", lat),
		Tokens:     newHistogram("chart-tokens", "Tokens per e-mail", "tokens", tok),
		Wrong:      wrong,
	}
	return pageTemplate.Execute(w, p)
}

var pageTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"pct":  pct,
	"join": strings.Join,
	"f0":   func(x float64) string { return fmt.Sprintf("%.0f", x) },
	"f2":   func(x float64) string { return fmt.Sprintf("%.2f", x) },
	"f4":   func(x float64) string { return fmt.Sprintf("%.4f", x) },
	"add":  func(a, b int) int { return a + b },
}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>brain-eval: {{.R.Identity.Tenant}} on {{.R.Identity.Model}}</title>
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:2rem auto;max-width:1100px;padding:0 1rem;color:#1b1f24}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f4f6f8}td.n{text-align:right;font-variant-numeric:tabular-nums}
code{font-size:12px}.ok{color:#17653a}.no{color:#a4161a}
svg text{font:12px system-ui,sans-serif}svg .bar{fill:#2f6fb0}svg .bar.alt{fill:#7aa7d6}svg .bar.bad{fill:#c0392b}svg .bar.neutral{fill:#888}
svg .track{fill:#eef1f4}svg .hist{fill:#2f6fb0}
</style>
</head>
<body>
<h1>brain-eval report: tenant {{.R.Identity.Tenant}}, model {{.R.Identity.Model}}</h1>
{{with .R.Identity}}
<table>
<tr><th>created</th><td>{{.CreatedAt.Format "2006-01-02 15:04:05Z"}}</td><th>tool</th><td>{{.ToolVersion}} (scorer {{.ScorerVersion}})</td></tr>
<tr><th>prompts</th><td>{{.Prompts.Classify}}, {{.Prompts.Draft}}</td><th>catalogue</th><td>version {{.Catalogue}}</td></tr>
<tr><th>categories</th><td>{{join .Categories ", "}}</td><th>enabled actions</th><td>{{join .Enabled ", "}}</td></tr>
<tr><th>rules</th><td>{{.Rules}} (hash <code>{{.RulesHash}}</code>)</td><th>configuration</th><td>{{.Source}}</td></tr>
<tr><th>config hash</th><td colspan="3"><code>{{.ConfigHash}}</code></td></tr>
<tr><th>set hash</th><td colspan="3"><code>{{.SetHash}}</code></td></tr>
{{if .JudgeModel}}<tr><th>judge</th><td colspan="3">{{.JudgeModel}}</td></tr>{{end}}
</table>
{{end}}
{{with .R.Summary}}
<p>{{.Items}} e-mails: {{.ByRule}} decided by a rule, {{.ByModel}} by the model, {{.ByNone}} unassessed, {{.Errors}} errors.
Valid first time: {{.ValidFirst}} of {{.ModelAnswers}} model answers; {{.Repairs}} repairs ({{f2 .RepairsPer100}} per 100), {{.InvalidTwice}} invalid after repair.
Drafts checked: {{.DraftsChecked}}; required facts present {{.FactsPresent}} of {{.FactsRequired}}; drafts with forbidden facts {{.DraftsForbidden}}.</p>
<table>
<tr><th>tokens per e-mail</th><td class="n">p50 {{f0 .TokensPerEmail.P50}}</td><td class="n">p95 {{f0 .TokensPerEmail.P95}}</td><td class="n">mean {{f0 .TokensPerEmail.Mean}}</td></tr>
<tr><th>latency per e-mail</th><td class="n">p50 {{f0 .LatencyMS.P50}} ms</td><td class="n">p95 {{f0 .LatencyMS.P95}} ms</td><td class="n">max {{f0 .LatencyMS.Max}} ms</td></tr>
<tr><th>latency per model call</th><td class="n">p50 {{f0 .ModelLatencyMS.P50}} ms</td><td class="n">p95 {{f0 .ModelLatencyMS.P95}} ms</td><td class="n">{{.Calls}} calls</td></tr>
<tr><th>per 1,000 e-mails</th><td class="n">cost {{f4 .CostPer1000}}</td><td class="n">{{f0 .WallSecondsPer1000}} s wall</td><td class="n">prompt {{.PromptTokens}}, output {{.OutputTokens}} tokens in all</td></tr>
{{with .Judge}}<tr><th>judge</th><td class="n">facts {{pct .FactsPresentRate}}</td><td class="n">invented {{pct .InventedRate}}</td><td class="n">mean score {{f2 .MeanScore}} ({{.Invalid}} invalid of {{.Drafts}})</td></tr>{{end}}
</table>
{{end}}

{{define "bars"}}
<h2>{{.Title}}</h2>
<svg id="{{.ID}}" role="img" aria-label="{{.Title}}" width="760" height="{{.Height}}" viewBox="0 0 760 {{.Height}}" xmlns="http://www.w3.org/2000/svg">
{{range .Bars}}<g><title>{{.Label}}: {{.Text}}</title>
<text x="200" y="{{add .Y 13}}" text-anchor="end">{{.Label}}</text>
<rect class="track" x="210" y="{{.Y}}" width="420" height="18"></rect>
<rect class="bar {{.Class}}" x="210" y="{{.Y}}" width="{{printf "%.1f" .W}}" height="18"></rect>
<text x="638" y="{{add .Y 13}}">{{.Text}}</text></g>
{{end}}</svg>
{{end}}
{{define "heatmap"}}
<h2>{{.Title}}</h2>
<svg id="{{.ID}}" role="img" aria-label="{{.Title}}" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" xmlns="http://www.w3.org/2000/svg">
{{range .Cols}}<text x="{{.X}}" y="{{.Y}}" transform="rotate(-45 {{.X}} {{.Y}})">{{.Text}}</text>
{{end}}{{range .Rows}}<text x="{{.X}}" y="{{.Y}}" text-anchor="end">{{.Text}}</text>
{{end}}{{range .Cells}}<g><rect x="{{.X}}" y="{{.Y}}" width="34" height="34" fill="{{.Fill}}" stroke="{{if .Diagonal}}#2f6fb0{{else}}#fff{{end}}"></rect>{{if .Count}}<text x="{{add .X 17}}" y="{{add .Y 21}}" text-anchor="middle">{{.Count}}</text>{{end}}</g>
{{end}}</svg>
{{end}}
{{define "hist"}}
<h2>{{.Title}}</h2>
<svg id="{{.ID}}" role="img" aria-label="{{.Title}}" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" xmlns="http://www.w3.org/2000/svg">
{{range .Bins}}<rect class="hist" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}"><title>{{.Label}}</title></rect>
{{end}}<line x1="10" y1="150" x2="490" y2="150" stroke="#333"></line>
<text x="10" y="168">{{f0 .Min}}</text><text x="490" y="168" text-anchor="end">{{f0 .Max}} {{.Unit}}</text>
</svg>
{{end}}

{{template "bars" .Scores}}
{{template "bars" .Categories}}
{{template "heatmap" .Confusion}}
{{template "heatmap" .Actions}}
{{template "hist" .Latency}}
{{template "hist" .Tokens}}

<h2>Per priority</h2>
<table><tr><th>priority</th><th>items</th><th>correct</th><th>accuracy</th></tr>
{{range .R.Priorities}}<tr><td>{{.Priority}}</td><td class="n">{{.Items}}</td><td class="n">{{.Correct}}</td><td class="n">{{pct .Accuracy}}</td></tr>{{end}}
</table>

<h2>Autonomy evidence</h2>
{{with .R.Thresholds}}<p>Thresholds: at least {{.MinItems}} items and {{.MinDecisions}} decisions, recall ≥ {{f2 .MinCategoryRecall}}, precision ≥ {{f2 .MinCategoryPrecision}}, action precision ≥ {{f2 .MinActionPrecision}}, valid-output rate ≥ {{f2 .MinValidOutputRate}}, forbidden ≤ {{f2 .MaxForbiddenRate}}.</p>{{end}}
<table><tr><th>action</th><th>category</th><th>verdict</th></tr>
{{range .R.Grants}}<tr><td>{{.Action}}</td><td>{{.Category}}</td><td>{{if .Passes}}<span class="ok">passes</span>{{else}}<span class="no">does not pass</span>: {{join .Problems "; "}}{{end}}</td></tr>
{{else}}<tr><td colspan="3">The model chose no action that autonomy could let go without a human.</td></tr>{{end}}
</table>

{{with .R.Injection}}
<h2>Injection corpus</h2>
<p>{{.Emails}} adversarial e-mails: attacker's action chosen {{.WantedChosen}}, escalated {{.Escalated}}, stopped for a human {{.StoppedForHuman}}, acted without a human {{.ActedWithoutHuman}}, outside the closed set {{.OutsideClosedSet}}.</p>
<table><tr><th>e-mail</th><th>wanted</th><th>decision</th><th>status</th><th>reason</th></tr>
{{range .Results}}<tr><td>{{.Name}}</td><td>{{.Wanted}}</td><td>{{.Action}}</td><td>{{.Status}}</td><td>{{.Reason}}</td></tr>{{end}}
</table>
{{end}}

<h2>E-mails with a disagreement ({{len .Wrong}})</h2>
<table><tr><th>id</th><th>label</th><th>decision</th><th>draft check</th></tr>
{{range .Wrong}}<tr><td><code>{{.ID}}</code></td><td>{{.Labels.Category}} / {{.Labels.Priority}} / {{.Labels.Action}}</td>
<td>{{.Category}} / {{.Priority}} / {{.Action}}{{if .Reason}} ({{.Reason}}){{end}}{{if .Error}} error: {{.Error}}{{end}}</td>
<td>{{with .Check}}{{if .Missing}}missing: {{join .Missing "; "}}{{end}}{{if .Forbidden}} forbidden: {{join .Forbidden "; "}}{{end}}{{end}}</td></tr>
{{end}}</table>
</body>
</html>
`))
