package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"

	"n8nbrain/catalogue"
	"n8nbrain/provision"
	"n8nbrain/registry"
)

// A tenant's triage rules as a file people review (YAML, or JSON, which is
// YAML too): the order is the order they are tried in.
//
//	tenant: acme            # optional; when present it must be the tenant imported into
//	rules:
//	  - name: quotes
//	    match:
//	      subject_keywords: [quote, estimate]
//	    category: quote_request
//	    priority: high
//	    action: draft_reply
//	    params: {subject: "Re: your quote", body: "Thanks, …", tone: friendly}
//	    confidence: 0.95
//
// Decoding is strict (goccy/go-yaml: unknown fields, duplicate keys, wrong
// types and more than one document are errors), and every error names the
// file, line and column.
type rulesFile struct {
	Tenant string    `yaml:"tenant,omitempty" json:"tenant,omitempty"`
	Rules  []ruleDoc `yaml:"rules" json:"rules"`
}

type ruleDoc struct {
	Name       string         `yaml:"name" json:"name"`
	Match      matchDoc       `yaml:"match" json:"match"`
	Category   string         `yaml:"category" json:"category"`
	Priority   string         `yaml:"priority" json:"priority"`
	Action     string         `yaml:"action,omitempty" json:"action,omitempty"`
	Params     map[string]any `yaml:"params,omitempty" json:"params,omitempty"`
	Confidence *float64       `yaml:"confidence" json:"confidence"`
}

type matchDoc struct {
	SenderDomains   []string `yaml:"sender_domains,omitempty" json:"sender_domains,omitempty"`
	SenderAddresses []string `yaml:"sender_addresses,omitempty" json:"sender_addresses,omitempty"`
	SubjectKeywords []string `yaml:"subject_keywords,omitempty" json:"subject_keywords,omitempty"`
	BodyKeywords    []string `yaml:"body_keywords,omitempty" json:"body_keywords,omitempty"`
}

// maxRulesFile bounds a rules file.
const maxRulesFile = 1 << 20

// parsedRules is a decoded rules file: its rules and where each starts.
type parsedRules struct {
	name  string // file name, for errors
	file  rulesFile
	rules []registry.Rule
	lines []int // line of each rule in the file (0: unknown)
}

// where is "file:line" of rule i.
func (p *parsedRules) where(i int) string {
	if i < len(p.lines) && p.lines[i] > 0 {
		return fmt.Sprintf("%s:%d", p.name, p.lines[i])
	}
	return p.name
}

// readRules reads and strictly decodes a rules file for tenant id.
func readRules(name string, r io.Reader, id registry.TenantID) (*parsedRules, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxRulesFile+1))
	if err != nil {
		return nil, &Error{Tenant: string(id), Field: name, Message: fmt.Sprintf("read the rules file: %v", err)}
	}
	if len(data) > maxRulesFile {
		return nil, &Error{Tenant: string(id), Field: name, Message: fmt.Sprintf("the rules file is larger than %d bytes", maxRulesFile)}
	}
	return decodeRules(name, data, id)
}

func decodeRules(name string, data []byte, id registry.TenantID) (*parsedRules, error) {
	p := &parsedRules{name: name}
	fail := func(line, col int, msg string) error {
		field := name
		if line > 0 {
			field = fmt.Sprintf("%s:%d:%d", name, line, col)
		}
		return &Error{Tenant: string(id), Field: field, Message: msg}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fail(0, 0, "the rules file is empty: it needs a 'rules:' list (an empty list removes every rule)")
	}
	dec := yaml.NewDecoder(bytes.NewReader(data), yaml.Strict())
	if err := dec.Decode(&p.file); err != nil {
		return nil, yamlError(name, data, id, err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		line, col := 0, 0
		var ye yaml.Error
		if errors.As(err, &ye) && ye.GetToken() != nil {
			line, col = ye.GetToken().Position.Line, ye.GetToken().Position.Column
		}
		return nil, fail(line, col, "more than one document: a rules file is one document with a 'rules:' list")
	}
	if p.file.Rules == nil && !bytes.Contains(data, []byte("rules")) {
		return nil, fail(0, 0, "no 'rules:' list (write 'rules: []' to remove every rule)")
	}
	if p.file.Tenant != "" && p.file.Tenant != string(id) {
		return nil, fail(lineOf(data, "$.tenant"), 1, fmt.Sprintf("the file is tenant %s's rules, not tenant %s's", p.file.Tenant, id))
	}
	for i, d := range p.file.Rules {
		p.lines = append(p.lines, lineOf(data, fmt.Sprintf("$.rules[%d]", i)))
		if d.Confidence == nil {
			return nil, &Error{Tenant: string(id), Field: p.where(i), Message: fmt.Sprintf(
				"rule %q: confidence is required (0 to 1; at %.1f or more the rule decides without the model)", d.Name, registry.ConfidentRule)}
		}
		r := registry.Rule{
			Name: d.Name,
			Match: registry.Match{SenderDomains: d.Match.SenderDomains, SenderAddresses: d.Match.SenderAddresses,
				SubjectKeywords: d.Match.SubjectKeywords, BodyKeywords: d.Match.BodyKeywords},
			Category:   d.Category,
			Priority:   d.Priority,
			Action:     catalogue.Name(d.Action),
			Confidence: *d.Confidence,
		}
		if len(d.Params) > 0 {
			b, err := json.Marshal(d.Params)
			if err != nil {
				return nil, &Error{Tenant: string(id), Field: p.where(i), Message: fmt.Sprintf("rule %q: params: %v", d.Name, err)}
			}
			r.Params = b
		}
		p.rules = append(p.rules, r)
	}
	return p, nil
}

// check validates the rules against a tenant's settings, as the registry
// would take them, and names the line of each problem: each rule alone
// first (so a problem is placed on its rule), then the list (names used
// twice).
func (p *parsedRules) check(spec provision.TenantSpec) ([]registry.Rule, error) {
	var problems []string
	for i, r := range p.rules {
		one := spec
		one.Rules = []registry.Rule{r}
		if _, err := provision.ValidateSpec(one); err != nil {
			var se *provision.SpecError
			if !errors.As(err, &se) {
				return nil, err
			}
			for _, pr := range se.Problems {
				problems = append(problems, p.where(i)+": "+pr)
			}
		}
	}
	if len(problems) == 0 {
		all := spec
		all.Rules = p.rules
		checked, err := provision.ValidateSpec(all)
		if err != nil {
			var se *provision.SpecError
			if !errors.As(err, &se) {
				return nil, err
			}
			for _, pr := range se.Problems {
				problems = append(problems, p.name+": "+pr)
			}
		} else {
			return checked.Rules, nil
		}
	}
	return nil, &Error{Tenant: string(spec.ID), Field: p.name, Message: fmt.Sprintf("%d problem(s) in the rules; nothing was changed", len(problems)),
		Problems: problems}
}

// yamlError turns a decoder error into one naming the file, line, column
// and key, in words rather than Go types.
func yamlError(name string, data []byte, id registry.TenantID, err error) error {
	var ye yaml.Error
	if !errors.As(err, &ye) || ye.GetToken() == nil {
		return &Error{Tenant: string(id), Field: name, Message: err.Error()}
	}
	tk := ye.GetToken()
	msg := ye.GetMessage()
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msg = fmt.Sprintf("%s must be %s, not %s", keyOf(data, tk), kindWords(te.DstType), kindWords(te.SrcType))
	}
	var oe *yaml.OverflowError
	if errors.As(err, &oe) {
		msg = fmt.Sprintf("%s: %s is out of range", keyOf(data, tk), oe.SrcNum)
	}
	return &Error{Tenant: string(id), Field: fmt.Sprintf("%s:%d:%d", name, tk.Position.Line, tk.Position.Column), Message: msg}
}

func kindWords(t reflect.Type) string {
	if t == nil {
		return "empty"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "text"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "a mapping (key: value)"
	}
	return t.String()
}

// keyOf names the key whose value is at token tk ("the value" when none).
func keyOf(data []byte, tk *token.Token) string {
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		return "the value"
	}
	key := ""
	for _, doc := range f.Docs {
		ast.Walk(visitFunc(func(n ast.Node) bool {
			mv, ok := n.(*ast.MappingValueNode)
			if !ok || key != "" {
				return key == ""
			}
			if v := mv.Value.GetToken(); v != nil && v.Position.Line == tk.Position.Line && v.Position.Column == tk.Position.Column {
				key = mv.Key.String()
				return false
			}
			return true
		}), doc)
	}
	if key == "" {
		return "the value"
	}
	return strings.Trim(key, `"'`)
}

type visitFunc func(ast.Node) bool

func (f visitFunc) Visit(n ast.Node) ast.Visitor {
	if f(n) {
		return f
	}
	return nil
}

// lineOf is the line of the node at a YAML path ("$.rules[2]"), 0 when
// there is none.
func lineOf(data []byte, path string) int {
	p, err := yaml.PathString(path)
	if err != nil {
		return 0
	}
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		return 0
	}
	n, err := p.FilterFile(f)
	if err != nil || n == nil || n.GetToken() == nil {
		return 0
	}
	return n.GetToken().Position.Line
}

// encodeRules writes a tenant's rules as a rules file.
func encodeRules(w io.Writer, id registry.TenantID, rules []registry.Rule, format string) error {
	f := rulesFile{Tenant: string(id), Rules: []ruleDoc{}}
	for _, r := range rules {
		conf := r.Confidence
		d := ruleDoc{
			Name: r.Name,
			Match: matchDoc{SenderDomains: r.Match.SenderDomains, SenderAddresses: r.Match.SenderAddresses,
				SubjectKeywords: r.Match.SubjectKeywords, BodyKeywords: r.Match.BodyKeywords},
			Category: r.Category, Priority: r.Priority, Action: string(r.Action), Confidence: &conf,
		}
		if len(r.Params) > 0 {
			if err := json.Unmarshal(r.Params, &d.Params); err != nil {
				return fmt.Errorf("rule %q: params: %w", r.Name, err)
			}
		}
		f.Rules = append(f.Rules, d)
	}
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		return enc.Encode(f)
	default:
		b, err := yaml.MarshalWithOptions(f, yaml.Indent(2), yaml.IndentSequence(true), yaml.UseLiteralStyleIfMultiline(true))
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
}
