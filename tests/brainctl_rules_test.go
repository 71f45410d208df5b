package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/goccy/go-yaml"

	"n8nbrain/catalogue"
	"n8nbrain/provision/admin"
	"n8nbrain/wire"
)

// rulesYAML is a reviewed rules file as an operator writes it: three rules,
// one of them assessing only (no action).
const rulesYAML = `tenant: rulesy
rules:
  - name: quotes
    match:
      subject_keywords: [quote, estimate]
    category: quote_request
    priority: high
    action: draft_reply
    params:
      subject: "Re: your quote request"
      body: "Thanks for asking: we will send you a quote within two working days."
      tone: friendly
    confidence: 0.95
  - name: invoices
    match:
      subject_keywords: [invoice]
      sender_domains: [supplier.example]
    category: invoice
    priority: normal
    action: escalate_item
    params:
      reason: "invoices go to accounts"
    confidence: 0.9
  - name: complaints
    match:
      body_keywords: [disappointed]
    category: complaint
    priority: urgent
    confidence: 0.7
`

// rulesJSON replaces them: the same file in JSON, with other rules.
const rulesJSON = `{
  "tenant": "rulesy",
  "rules": [
    {
      "name": "bookings",
      "match": {"subject_keywords": ["booking", "appointment"]},
      "category": "booking",
      "priority": "normal",
      "action": "close_item",
      "params": {"resolution": "bookings are handled by the calendar"},
      "confidence": 0.85
    },
    {
      "name": "quotes-by-body",
      "match": {"body_keywords": ["quote"]},
      "category": "quote_request",
      "priority": "low",
      "confidence": 0.5
    }
  ]
}
`

// rulesDoc is a rules file decoded for comparison.
type rulesDoc struct {
	Tenant string           `yaml:"tenant" json:"tenant"`
	Rules  []map[string]any `yaml:"rules" json:"rules"`
}

func decodeRulesDoc(t *testing.T, format, src string) rulesDoc {
	t.Helper()
	var d rulesDoc
	var err error
	if format == "json" {
		err = json.Unmarshal([]byte(src), &d)
	} else {
		err = yaml.Unmarshal([]byte(src), &d)
	}
	if err != nil {
		t.Fatalf("decode %s rules:\n%s\n%v", format, src, err)
	}
	// Numbers compare as numbers whichever decoder read them.
	b, _ := json.Marshal(d)
	var norm rulesDoc
	if err := json.Unmarshal(b, &norm); err != nil {
		t.Fatal(err)
	}
	return norm
}

func writeRulesFile(t *testing.T, dir, name, src string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBrainctlRulesImportExportAndTest runs `brainctl rules` against a real
// registry: a YAML file and then a JSON file imported into a tenant and
// exported back unchanged; files that are malformed (unknown field,
// duplicate key, wrong type) or do not fit the tenant (an action it has not
// enabled, one the catalogue lacks) refused with the tenant and the
// file:line named and the rules left as they were; and the dry run naming
// the rule an e-mail hits, which is the rule the brain then applies to that
// e-mail.
func TestBrainctlRulesImportExportAndTest(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	c := s.brainctl()
	tn := s.onboard("rulesy")
	s.createTenant(c, tn) // actions draft_reply, send_reply, escalate_item, close_item; the harness's one rule
	dir := t.TempDir()

	export := func(format string) string {
		t.Helper()
		return c.ok("rules", "export", "rulesy", "--format", format)
	}

	// YAML in: the table says what was imported and what it replaced.
	yamlFile := writeRulesFile(t, dir, "rulesy.yaml", rulesYAML)
	out := c.ok("rules", "import", "rulesy", yamlFile)
	if want := fmt.Sprintf("tenant rulesy: 3 rules imported from %s, replacing 1;", yamlFile); !strings.Contains(out, want) ||
		!strings.Contains(out, "1. quotes\n") || !strings.Contains(out, "2. invoices\n") || !strings.Contains(out, "3. complaints\n") {
		t.Fatalf("import of the YAML file printed:\n%s\nwant %q and the rules in order", out, want)
	}
	// Out again: the same rules, in the same order, as YAML and as JSON.
	gotYAML := export("yaml")
	if got, want := decodeRulesDoc(t, "yaml", gotYAML), decodeRulesDoc(t, "yaml", rulesYAML); !reflect.DeepEqual(got, want) {
		t.Fatalf("YAML export differs from the file imported:\n got %+v\nwant %+v\nexport:\n%s", got, want, gotYAML)
	}
	if got, want := decodeRulesDoc(t, "json", export("json")), decodeRulesDoc(t, "yaml", rulesYAML); !reflect.DeepEqual(got, want) {
		t.Fatalf("JSON export differs from the YAML file imported:\n got %+v\nwant %+v", got, want)
	}
	// An export is a file to import again: doing so changes nothing.
	again := writeRulesFile(t, dir, "exported.yaml", gotYAML)
	c.ok("rules", "import", "rulesy", again)
	if e := export("yaml"); e != gotYAML {
		t.Fatalf("re-importing the export changed it:\nbefore:\n%s\nafter:\n%s", gotYAML, e)
	}

	// The dry run names the rule an e-mail hits, its place in the list and
	// in the file, and what the brain would do.
	emailFile := func(name string, e wire.Email) string {
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		return writeRulesFile(t, dir, name, string(b))
	}
	invoice := wire.Email{From: "Accounts <ap@supplier.example>", Subject: "Invoice 4411 for March", Body: "Please find our invoice attached."}
	out = c.ok("rules", "test", "rulesy", "--email", emailFile("invoice.json", invoice))
	if want := "tenant rulesy: rule 2, \"invoices\", matches\n" +
		"rule \"invoices\" decides (confidence 0.9 ≥ 0.8): invoice/normal, action escalate_item\n"; out != want {
		t.Errorf("rules test of an invoice printed:\n%s\nwant:\n%s", out, want)
	}
	quote := wire.Email{From: "Jo <jo@customer.example>", Subject: "Estimate for a fence", Body: "How much?"}
	out = c.ok("rules", "test", "rulesy", "--email", emailFile("quote.json", quote))
	if want := "tenant rulesy: rule 1, \"quotes\", matches\n" +
		"rule \"quotes\" decides (confidence 0.95 ≥ 0.8): quote_request/high, action draft_reply, which waits for a human's approval\n"; out != want {
		t.Errorf("rules test of a quote printed:\n%s\nwant:\n%s", out, want)
	}
	// The same invoice from another domain: the second rule's predicates do not all hold.
	other := invoice
	other.From = "Someone <x@elsewhere.example>"
	out = c.ok("rules", "test", "rulesy", "--email", emailFile("other.json", other))
	if !strings.HasPrefix(out, "tenant rulesy: no rule matches\n") || !strings.Contains(out, "the model classifies it") {
		t.Errorf("rules test of an unmatched e-mail printed:\n%s", out)
	}
	var dry struct {
		Matched  bool
		Rule     string
		Position int
		Line     int
		Decides  bool
		Action   string
		Params   map[string]any
	}
	// With --rules, a file not yet imported, and the line of the rule in it.
	if code := c.json(&dry, "rules", "test", "rulesy", "--email", emailFile("complaint.json",
		wire.Email{From: "a@b.example", Subject: "Our order", Body: "We are disappointed."}), "--rules", yamlFile); code != admin.ExitOK {
		t.Fatalf("rules test --rules: exit %d", code)
	}
	line := strings.Count(rulesYAML[:strings.Index(rulesYAML, "  - name: complaints")], "\n") + 1
	if !dry.Matched || dry.Rule != "complaints" || dry.Position != 3 || dry.Line != line || dry.Decides || dry.Action != "" {
		t.Errorf("rules test --json of a complaint: %+v; want rule complaints, 3rd, line %d, not deciding, no action", dry, line)
	}

	// The brain applies the rule the dry run named.
	s.startBrain("r1", nil)
	e := s.startEdge(tn, nil)
	rep := e.submit(emailTurn("<inv-1@supplier.example>", invoice.From, invoice.Subject, invoice.Body)).reply(t)
	if rep.Assessment.Source != "rule" || rep.Assessment.Rule != "invoices" || rep.Action == nil || rep.Action.Name != string(catalogue.EscalateItem) {
		t.Fatalf("the brain's decision on the invoice: %+v %+v; the dry run said rule invoices, escalate_item", rep.Assessment, rep.Action)
	}

	// JSON in, replacing the YAML rules; exported as JSON, it is the file.
	jsonFile := writeRulesFile(t, dir, "rulesy.json", rulesJSON)
	out = c.ok("rules", "import", "rulesy", jsonFile)
	if want := fmt.Sprintf("tenant rulesy: 2 rules imported from %s, replacing 3;", jsonFile); !strings.Contains(out, want) {
		t.Fatalf("import of the JSON file printed:\n%s\nwant %q", out, want)
	}
	if got, want := decodeRulesDoc(t, "json", export("json")), decodeRulesDoc(t, "json", rulesJSON); !reflect.DeepEqual(got, want) {
		t.Fatalf("JSON export differs from the JSON file imported:\n got %+v\nwant %+v", got, want)
	}
	booking := wire.Email{From: "Kim <kim@customer.example>", Subject: "Booking for Tuesday", Body: "See you then."}
	out = c.ok("rules", "test", "rulesy", "--email", emailFile("booking.json", booking))
	if !strings.HasPrefix(out, "tenant rulesy: rule 1, \"bookings\", matches\n") || !strings.Contains(out, "booking/normal, action close_item") {
		t.Errorf("rules test of a booking after the JSON import printed:\n%s", out)
	}
	// Brains pick the new rules up within moments, with nothing restarted.
	n := 0
	eventually(t, 15*time.Second, "the brain applying the imported JSON rules", func() bool {
		n++
		r := e.submit(emailTurn(fmt.Sprintf("<book-%d@customer.example>", n), booking.From, booking.Subject, booking.Body)).reply(t)
		return r.Assessment.Rule == "bookings"
	})
	current := export("json")

	// Refused files change nothing and say where and why.
	for _, tc := range []struct {
		name, file, src string
		field           string   // the error's field: file:line[:column]
		want            []string // in the message or its problems
	}{
		{"UnknownField", "unknown.yaml", "rules:\n  - name: q\n    match: {subject_keywords: [x]}\n    catgory: general\n",
			"unknown.yaml:4:5", []string{`unknown field "catgory"`}},
		{"DuplicateKey", "duplicate.yaml", "rules:\n  - name: q\n    priority: high\n    priority: low\n",
			"duplicate.yaml:4:5", []string{`"priority" already defined`}},
		{"WrongType", "wrongtype.json", "{\"rules\": [\n  {\"name\": \"q\",\n   \"confidence\": \"very\"}\n]}\n",
			"wrongtype.json:3:18", []string{"confidence must be a number, not text"}},
		{"ActionNotEnabled", "jobs.yaml", "rules:\n  - name: ok\n    match: {subject_keywords: [x]}\n    category: general\n    priority: low\n    confidence: 0.5\n" +
			"  - name: jobs\n    match: {subject_keywords: [leak]}\n    category: booking\n    priority: urgent\n    action: create_job\n" +
			"    params: {title: Leak, description: Fix it}\n    confidence: 0.9\n",
			"jobs.yaml", []string{"jobs.yaml:7: rule \"jobs\": action create_job is not enabled for tenant rulesy"}},
		{"ActionNotInCatalogue", "fax.yaml", "rules:\n  - name: fax\n    match: {subject_keywords: [fax]}\n    category: general\n    priority: low\n    action: send_fax\n    confidence: 0.9\n",
			"fax.yaml", []string{"fax.yaml:2: rule \"fax\": action send_fax is not in catalogue version 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeRulesFile(t, dir, tc.file, tc.src)
			field := strings.Replace(tc.field, tc.file, path, 1)
			code, stdout, stderr := c.run("rules", "import", "rulesy", path)
			if code != admin.ExitError || stdout != "" || !strings.HasPrefix(stderr, "brainctl: tenant rulesy: "+field+": ") {
				t.Errorf("import: exit %d, stdout %q, stderr:\n%s\nwant exit 1 and an error naming tenant rulesy and %s", code, stdout, stderr, field)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, strings.Replace(w, tc.file, path, 1)) {
					t.Errorf("import: stderr lacks %q:\n%s", w, stderr)
				}
			}
			// For scripts, the same as JSON.
			var res struct{ Error *admin.Error }
			if code := c.json(&res, "rules", "import", "rulesy", path); code != admin.ExitError || res.Error == nil ||
				res.Error.Tenant != "rulesy" || res.Error.Field != field {
				t.Errorf("import --json: exit %d, %+v; want tenant rulesy, field %s", code, res.Error, field)
			}
			// The dry run of the file is refused the same way.
			if code, _, errOut := c.run("rules", "test", "rulesy", "--email", emailFile("b.json", booking), "--rules", path); code != admin.ExitError ||
				!strings.Contains(errOut, "tenant rulesy: "+field) {
				t.Errorf("rules test --rules: exit %d, %s", code, errOut)
			}
			if e := export("json"); e != current {
				t.Errorf("a refused import changed the rules:\n%s", e)
			}
		})
	}
}
