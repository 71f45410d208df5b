package admin

import (
	"errors"
	"strings"
	"testing"

	"n8nbrain/catalogue"
	"n8nbrain/provision"
)

func tenantSpec(t *testing.T) provision.TenantSpec {
	t.Helper()
	s, err := provision.ValidateSpec(provision.TenantSpec{ID: "acme", NATSAccount: "ABJ2J4QH2RZ32ZH56AIKDPHGF5WWYR3LNWWDC2AK2Y7KDR3IP7BA3AMZ",
		EnabledActions: []catalogue.Name{catalogue.DraftReply, catalogue.EscalateItem}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRulesFileStrictDecoding: every way a rules file can be wrong is an
// error naming the tenant and the file:line:column, in words.
func TestRulesFileStrictDecoding(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, src   string
		field, want string
	}{
		{"UnknownField", "rules:\n  - name: q\n    catgory: x\n", "r.yaml:3:5", `unknown field "catgory"`},
		{"UnknownNestedField", "rules:\n  - name: q\n    match:\n      subject_keyword: [x]\n", "r.yaml:4:7", `unknown field "subject_keyword"`},
		{"DuplicateKey", "rules:\n  - name: q\n    name: r\n", "r.yaml:3:5", `"name" already defined`},
		{"WrongType", "rules:\n  - name: q\n    confidence: high\n", "r.yaml:3:17", "confidence must be a number, not text"},
		{"ListForText", "rules:\n  - name: [a, b]\n", "r.yaml:2:11", "name must be text, not a list"},
		{"JSONWrongType", "{\"rules\": [\n {\"name\": \"q\",\n  \"confidence\": \"x\"}]}", "r.yaml:3:17", "confidence must be a number, not text"},
		{"JSONDuplicateKey", "{\"rules\": [],\n \"rules\": []}", "r.yaml:2:2", `"rules" already defined`},
		{"TwoDocuments", "rules: []\n---\nrules: []\n", "r.yaml", "more than one document"},
		{"Empty", "  \n", "r.yaml", "empty"},
		{"NoRules", "tenant: acme\n", "r.yaml", "no 'rules:' list"},
		{"OtherTenant", "tenant: other\nrules: []\n", "r.yaml:1:1", "tenant other's rules"},
		{"NoConfidence", "rules:\n  - name: q\n    match: {subject_keywords: [x]}\n", "r.yaml:2", "confidence is required"},
		{"Syntax", "rules:\n  - name: q\n   x: [\n", "r.yaml:3:4", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := decodeRules("r.yaml", []byte(tc.src), "acme")
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("decode: %v, want an *Error", err)
			}
			if e.Tenant != "acme" || e.Field != tc.field || !strings.Contains(e.Message, tc.want) {
				t.Fatalf("got tenant %q field %q message %q; want field %q and %q", e.Tenant, e.Field, e.Message, tc.field, tc.want)
			}
		})
	}
}

// TestRulesFileCheckPlacesProblemsOnTheirLines: a file that decodes but
// breaks the tenant's settings says which rule, on which line, and why.
func TestRulesFileCheckPlacesProblemsOnTheirLines(t *testing.T) {
	t.Parallel()
	src := `rules:
  - name: quotes
    match: {subject_keywords: [quote]}
    category: quote_requests
    priority: high
    confidence: 0.9
  - name: ok
    match: {sender_domains: [acme.example]}
    category: general
    priority: normal
    confidence: 1
  - name: replies
    match: {subject_keywords: [re]}
    category: general
    priority: normal
    action: send_reply
    confidence: 0.9
  - name: ok
    match: {body_keywords: [x]}
    category: general
    priority: low
    confidence: 1
`
	p, err := decodeRules("r.yaml", []byte(src), "acme")
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.check(tenantSpec(t))
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("check: %v", err)
	}
	got := strings.Join(e.Problems, "\n")
	for _, want := range []string{
		`r.yaml:2: rule "quotes": category "quote_requests" is not one of tenant acme's categories`,
		`r.yaml:12: rule "replies": action send_reply is not enabled for tenant acme`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("problems lack %q:\n%s", want, got)
		}
	}
	// Names used twice are a problem of the list, reported once the rules
	// are each right.
	p, err = decodeRules("r.yaml", []byte(strings.Replace(strings.Replace(src, "quote_requests", "quote_request", 1), "    action: send_reply\n", "", 1)), "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err = p.check(tenantSpec(t)); !errors.As(err, &e) || !strings.Contains(strings.Join(e.Problems, "\n"), `rule "ok" of tenant acme is listed twice`) {
		t.Fatalf("duplicate names: %v", err)
	}
}

// TestRulesFileRoundTrip: what export writes, import reads back unchanged,
// as YAML and as JSON.
func TestRulesFileRoundTrip(t *testing.T) {
	t.Parallel()
	src := "rules:\n  - name: quotes\n    match: {subject_keywords: [quote, estimate], sender_domains: [acme.example]}\n" +
		"    category: quote_request\n    priority: high\n    action: draft_reply\n" +
		"    params: {subject: \"Re: quote\", body: \"Thanks:\\n we will quote.\", tone: friendly}\n    confidence: 0.95\n" +
		"  - name: noted\n    match: {body_keywords: [fyi]}\n    category: general\n    priority: low\n    confidence: 0.5\n"
	p, err := decodeRules("r.yaml", []byte(src), "acme")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := p.check(tenantSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"yaml", "json"} {
		var b strings.Builder
		if err := encodeRules(&b, "acme", rules, format); err != nil {
			t.Fatal(err)
		}
		back, err := decodeRules("out."+format, []byte(b.String()), "acme")
		if err != nil {
			t.Fatalf("%s: re-read what export wrote: %v\n%s", format, err, b.String())
		}
		again, err := back.check(tenantSpec(t))
		if err != nil {
			t.Fatal(err)
		}
		if !sameRulesAs(rules, again) {
			t.Fatalf("%s round trip changed the rules:\n%+v\n%+v", format, rules, again)
		}
		if back.lines[1] == 0 {
			t.Errorf("%s: no line for the second rule", format)
		}
	}
}

func sameRulesAs(a, b []registryRule) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].Category != b[i].Category || a[i].Priority != b[i].Priority || a[i].Action != b[i].Action ||
			a[i].Confidence != b[i].Confidence || string(a[i].Params) != string(b[i].Params) ||
			strings.Join(a[i].Match.SubjectKeywords, ",") != strings.Join(b[i].Match.SubjectKeywords, ",") ||
			strings.Join(a[i].Match.SenderDomains, ",") != strings.Join(b[i].Match.SenderDomains, ",") ||
			strings.Join(a[i].Match.BodyKeywords, ",") != strings.Join(b[i].Match.BodyKeywords, ",") {
			return false
		}
	}
	return true
}
