package deploy_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"
)

// The observability files (deploy/prometheus, deploy/grafana,
// compose.observability.yaml) are checked here as Prometheus and Grafana
// would read them: the rules with Prometheus's own rule parser (what
// promtool check rules runs), every PromQL expression of the rules and the
// dashboard with its PromQL parser, and every metric they name against the
// metrics the brain and the edge export.

var promql = parser.NewParser(parser.Options{})

func TestAlertRulesParse(t *testing.T) {
	groups, errs := rulefmt.ParseFile("prometheus/rules.yml", false, model.UTF8Validation, promql, nil)
	if len(errs) > 0 {
		t.Fatalf("rules.yml: %v", errs)
	}
	var alerts []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				alerts = append(alerts, r.Alert)
			}
		}
	}
	// The alerts: turns failing, p99 over budget, outbox lag,
	// approvals about to expire unseen, breaker open, a tenant at its quota.
	for _, want := range []string{"TurnsFailing", "TurnP99OverBudget", "OutboxLag", "ApprovalsAboutToExpireUnseen", "ModelBreakerOpen", "TenantAtQuota"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no alert %s in rules.yml (alerts: %v)", want, alerts)
		}
	}
}

// dashboard is the part of Grafana's dashboard model we ship; decoding is
// strict, so a typo in a field name fails.
type dashboard struct {
	UID           string          `json:"uid"`
	Title         string          `json:"title"`
	Tags          []string        `json:"tags"`
	Timezone      string          `json:"timezone"`
	SchemaVersion int             `json:"schemaVersion"`
	Version       int             `json:"version"`
	Editable      bool            `json:"editable"`
	Refresh       string          `json:"refresh"`
	Time          json.RawMessage `json:"time"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Label      string          `json:"label"`
			Datasource datasourceRef   `json:"datasource"`
			Query      json.RawMessage `json:"query"`
			Definition string          `json:"definition"`
			IncludeAll bool            `json:"includeAll"`
			Multi      bool            `json:"multi"`
			AllValue   string          `json:"allValue"`
			Refresh    int             `json:"refresh"`
			Current    json.RawMessage `json:"current"`
		} `json:"list"`
	} `json:"templating"`
	Annotations json.RawMessage `json:"annotations"`
	Panels      []panel         `json:"panels"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID          int                      `json:"id"`
	Type        string                   `json:"type"`
	Title       string                   `json:"title"`
	Description string                   `json:"description"`
	Collapsed   bool                     `json:"collapsed"`
	Panels      []panel                  `json:"panels"`
	Datasource  *datasourceRef           `json:"datasource"`
	GridPos     struct{ H, W, X, Y int } `json:"gridPos"`
	FieldConfig json.RawMessage          `json:"fieldConfig"`
	Options     json.RawMessage          `json:"options"`
	Targets     []struct {
		RefID        string        `json:"refId"`
		Expr         string        `json:"expr"`
		LegendFormat string        `json:"legendFormat"`
		Datasource   datasourceRef `json:"datasource"`
	} `json:"targets"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile("grafana/dashboards/n8nbrain.json")
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var d dashboard
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("n8nbrain.json: %v", err)
	}
	if dec.More() {
		t.Fatal("n8nbrain.json: trailing data")
	}
	return d
}

// dashboardVars stand in for Grafana's variables when the expressions are parsed.
var dashboardVars = strings.NewReplacer("$__rate_interval", "5m", "$tenant", ".*", "$instance", ".*")

func TestDashboardLoads(t *testing.T) {
	d := readDashboard(t)
	if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
		t.Fatal("the dashboard has no uid, title or panels")
	}
	var ds struct {
		APIVersion  int `yaml:"apiVersion"`
		Datasources []struct {
			Name, UID, Type, Access, URL string
			IsDefault                    bool `yaml:"isDefault"`
		} `yaml:"datasources"`
	}
	strictYAML(t, "grafana/provisioning/datasources/datasources.yml", &ds)
	uids := map[string]bool{}
	for _, s := range ds.Datasources {
		uids[s.UID] = true
	}
	ids := map[int]bool{}
	type cell struct{ x, y int }
	used := map[cell]string{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.X+p.GridPos.W > 24 || p.GridPos.W <= 0 || p.GridPos.H <= 0 {
			t.Errorf("panel %q: gridPos %+v out of Grafana's 24 columns", p.Title, p.GridPos)
		}
		for x := p.GridPos.X; x < p.GridPos.X+p.GridPos.W; x++ {
			for y := p.GridPos.Y; y < p.GridPos.Y+p.GridPos.H; y++ {
				if other, ok := used[cell{x, y}]; ok {
					t.Errorf("panels %q and %q overlap", other, p.Title)
				}
				used[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || !uids[p.Datasource.UID] || len(p.Targets) == 0 {
			t.Errorf("panel %q: no provisioned datasource or no query", p.Title)
		}
		for _, tg := range p.Targets {
			if _, err := promql.ParseExpr(dashboardVars.Replace(tg.Expr)); err != nil {
				t.Errorf("panel %q, query %s: %v", p.Title, tg.RefID, err)
			}
		}
	}
}

// TestObservabilityMetricsExist checks every metric the rules and the
// dashboard read is one the code exports (a histogram's _bucket, _sum and
// _count included), or a recording rule.
func TestObservabilityMetricsExist(t *testing.T) {
	exported := exportedMetrics(t)
	groups, errs := rulefmt.ParseFile("prometheus/rules.yml", false, model.UTF8Validation, promql, nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	recorded := map[string]bool{}
	var exprs []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = true
			}
			exprs = append(exprs, r.Expr)
		}
	}
	for _, p := range readDashboard(t).Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, dashboardVars.Replace(tg.Expr))
		}
	}
	for _, q := range []string{"label_values(edge_turns_total, tenant)", "label_values(brain_turns_total, instance)"} {
		exprs = append(exprs, strings.TrimSuffix(strings.SplitN(strings.TrimPrefix(q, "label_values("), ",", 2)[0], ")"))
	}
	read := 0
	for _, e := range exprs {
		expr, err := promql.ParseExpr(e)
		if err != nil {
			t.Errorf("%s: %v", e, err)
			continue
		}
		for _, sel := range parser.ExtractSelectors(expr) {
			for _, m := range sel {
				if m.Name != model.MetricNameLabel {
					continue
				}
				names := []string{m.Value}
				if m.Type == labels.MatchRegexp {
					names = strings.Split(m.Value, "|")
				}
				for _, n := range names {
					read++
					if !recorded[n] && !exported[n] && !exported[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")] {
						t.Errorf("%s reads %s, which neither the code exports nor a rule records", e, n)
					}
				}
			}
		}
	}
	if read < 20 {
		t.Fatalf("only %d metric names found in the rules and the dashboard", read)
	}
}

// exportedMetrics are the metric names the brain's and the edge's code
// registers: every "brain_…"/"edge_…" string literal, and the NATS
// collectors' names built from their prefix.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	lit := regexp.MustCompile(`"((?:brain|edge)_[a-z0-9_]+)"`)
	suffix := regexp.MustCompile(`prefix \+ "(_[a-z0-9_]+)"`)
	prefixCall := regexp.MustCompile(`NATSCollectors\("([a-z]+)"`)
	out := map[string]bool{}
	var suffixes, prefixes []string
	for _, dir := range []string{"../brain", "../edge", "../internal/telemetry"} {
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range lit.FindAllSubmatch(b, -1) {
				out[string(m[1])] = true
			}
			for _, m := range suffix.FindAllSubmatch(b, -1) {
				suffixes = append(suffixes, string(m[1]))
			}
			for _, m := range prefixCall.FindAllSubmatch(b, -1) {
				prefixes = append(prefixes, string(m[1]))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range prefixes {
		for _, s := range suffixes {
			out[p+s] = true
		}
	}
	for _, must := range []string{"brain_turn_stage_seconds", "edge_turn_stage_seconds", "brain_nats_connected", "edge_nats_connected"} {
		if !out[must] {
			t.Fatalf("the scan of the code missed %s: it is broken", must)
		}
	}
	return out
}

func strictYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// The Prometheus configuration scrapes the brain's ops port and the edge's
// metrics listener, and loads the rules file where the override mounts it;
// the override mounts only files that exist.
func TestObservabilityComposeOverride(t *testing.T) {
	var prom struct {
		Global struct {
			ScrapeInterval     string `yaml:"scrape_interval"`
			EvaluationInterval string `yaml:"evaluation_interval"`
		} `yaml:"global"`
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName      string `yaml:"job_name"`
			DNSSDConfigs []struct {
				Names           []string `yaml:"names"`
				Type            string   `yaml:"type"`
				Port            int      `yaml:"port"`
				RefreshInterval string   `yaml:"refresh_interval"`
			} `yaml:"dns_sd_configs"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	strictYAML(t, "prometheus/prometheus.yml", &prom)
	var compose struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Profiles    []string          `yaml:"profiles"`
			Command     []string          `yaml:"command"`
			DependsOn   []string          `yaml:"depends_on"`
			Environment map[string]string `yaml:"environment"`
			Volumes     []string          `yaml:"volumes"`
			Ports       []string          `yaml:"ports"`
			Restart     string            `yaml:"restart"`
		} `yaml:"services"`
		Volumes map[string]any `yaml:"volumes"`
	}
	strictYAML(t, "compose.observability.yaml", &compose)

	targets := map[string]bool{}
	for _, sc := range prom.ScrapeConfigs {
		for _, d := range sc.DNSSDConfigs {
			for _, n := range d.Names {
				targets[n+":"+itoa(d.Port)] = true
			}
		}
		for _, s := range sc.StaticConfigs {
			for _, tg := range s.Targets {
				targets[tg] = true
			}
		}
	}
	if !targets["brain:8490"] || !targets["edge:9480"] {
		t.Errorf("scrape targets %v: want brain:8490 (BRAIN_OPS_ADDR) and edge:9480", targets)
	}
	if got := compose.Services["edge"].Environment["EDGE_METRICS_ADDR"]; !strings.HasSuffix(got, ":9480") {
		t.Errorf("the override sets EDGE_METRICS_ADDR %q, want the port Prometheus scrapes, 9480", got)
	}
	mounted := map[string]bool{}
	for name, s := range compose.Services {
		if s.Image != "" && !slices.Contains(s.Profiles, "observability") {
			t.Errorf("service %s runs without the observability profile", name)
		}
		for _, v := range s.Volumes {
			src, dst, _ := strings.Cut(v, ":")
			dst, _, _ = strings.Cut(dst, ":")
			if !strings.HasPrefix(src, "./") {
				continue // a named volume
			}
			if _, err := os.Stat(filepath.Join("..", src)); err != nil {
				t.Errorf("service %s mounts %s: %v", name, src, err)
			}
			mounted[dst] = true
		}
	}
	for _, f := range prom.RuleFiles {
		if !mounted[f] {
			t.Errorf("prometheus.yml loads %s, which the override does not mount", f)
		}
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
