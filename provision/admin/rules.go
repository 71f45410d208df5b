package admin

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"n8nbrain/catalogue"
	"n8nbrain/provision"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

type rulesCmd struct {
	Import rulesImportCmd `cmd:"" help:"Replace a tenant's triage rules with a reviewed file (YAML or JSON; '-' reads standard input)."`
	Export rulesExportCmd `cmd:"" help:"Write a tenant's triage rules as a file to review and import again."`
	Test   rulesTestCmd   `cmd:"" help:"Dry run: which rule an e-mail would hit, and what the brain would then do."`
}

// open reads a named file, or standard input for "-".
func (a *app) open(name string) (io.ReadCloser, error) {
	if name == "-" {
		return io.NopCloser(a.env.Stdin), nil
	}
	return os.Open(name)
}

type rulesImportCmd struct {
	ID     string `arg:"" name:"tenant" help:"Tenant id."`
	File   string `arg:"" name:"file" help:"Rules file (YAML or JSON), or - for standard input."`
	DryRun bool   `name:"dry-run" help:"Check the file against the tenant's settings and change nothing."`
}

type importResult struct {
	Tenant   string   `json:"tenant"`
	Rules    []string `json:"rules"`
	Replaced int      `json:"replaced"`
	DryRun   bool     `json:"dry_run"`
}

func (c *rulesImportCmd) Run(a *app) error {
	id := registry.TenantID(c.ID)
	f, err := a.open(c.File)
	if err != nil {
		return &Error{Tenant: c.ID, Field: c.File, Message: err.Error()}
	}
	defer f.Close()
	parsed, err := readRules(c.File, f, id)
	if err != nil {
		return err
	}
	ops, err := a.opsFor(false)
	if err != nil {
		return err
	}
	out := importResult{Tenant: c.ID, Rules: []string{}, DryRun: c.DryRun}
	for _, r := range parsed.rules {
		out.Rules = append(out.Rules, r.Name)
	}
	if c.DryRun {
		t, err := ops.Tenant(a.ctx, id)
		if err != nil {
			return tenantError(c.ID, err)
		}
		spec, err := provision.ValidateSpec(provision.SpecOf(t))
		if err != nil {
			return err
		}
		if _, err := parsed.check(spec); err != nil {
			return err
		}
		out.Replaced = len(t.Rules)
	} else {
		var checkErr error
		before, _, err := ops.UpdateTenant(a.ctx, id, func(s *provision.TenantSpec) error {
			spec, err := provision.ValidateSpec(*s)
			if err != nil {
				return err
			}
			rules, err := parsed.check(spec)
			if err != nil {
				checkErr = err
				return err
			}
			s.Rules = rules
			return nil
		})
		if checkErr != nil {
			return checkErr
		}
		if err != nil {
			return tenantError(c.ID, err)
		}
		out.Replaced = len(before.Rules)
	}
	return a.out.emit(out, func(w io.Writer) {
		verb := "imported"
		if c.DryRun {
			verb = "checked (--dry-run: nothing changed)"
		}
		fmt.Fprintf(w, "tenant %s: %d rules %s from %s, replacing %d; brains use them within moments\n",
			c.ID, len(out.Rules), verb, c.File, out.Replaced)
		for i, n := range out.Rules {
			fmt.Fprintf(w, "  %d. %s\n", i+1, n)
		}
	})
}

type rulesExportCmd struct {
	ID     string `arg:"" name:"tenant" help:"Tenant id."`
	Format string `name:"format" enum:"yaml,json" default:"yaml" help:"yaml or json."`
	Output string `name:"output" short:"o" placeholder:"FILE" help:"Write to FILE instead of standard output."`
}

func (c *rulesExportCmd) Run(a *app) error {
	ops, err := a.opsFor(false)
	if err != nil {
		return err
	}
	t, err := ops.Tenant(a.ctx, registry.TenantID(c.ID))
	if err != nil {
		return tenantError(c.ID, err)
	}
	var buf bytes.Buffer
	if err := encodeRules(&buf, t.ID, t.Rules, c.Format); err != nil {
		return tenantError(c.ID, err)
	}
	if c.Output == "" {
		_, err := a.env.Stdout.Write(buf.Bytes())
		return err
	}
	if err := os.WriteFile(c.Output, buf.Bytes(), 0o644); err != nil {
		return &Error{Tenant: c.ID, Field: "--output", Message: err.Error()}
	}
	return a.out.emit(struct {
		Tenant string `json:"tenant"`
		File   string `json:"file"`
		Rules  int    `json:"rules"`
	}{c.ID, c.Output, len(t.Rules)}, func(w io.Writer) {
		fmt.Fprintf(w, "tenant %s: %d rules written to %s\n", c.ID, len(t.Rules), c.Output)
	})
}

type rulesTestCmd struct {
	ID    string `arg:"" name:"tenant" help:"Tenant id."`
	Email string `name:"email" placeholder:"FILE" help:"The e-mail as JSON, as n8n sends it in a turn: {\"from\",\"subject\",\"body\"}; - reads standard input."`
	Rules string `name:"rules" placeholder:"FILE" help:"Test these rules (a file not yet imported) instead of the tenant's."`
}

// testResult is a dry run's answer.
type testResult struct {
	Tenant  string `json:"tenant"`
	Matched bool   `json:"matched"`
	// Rule is the rule hit: its name, place (1-based) and, with --rules, line.
	Rule     string `json:"rule,omitempty"`
	Position int    `json:"position,omitempty"`
	Line     int    `json:"line,omitempty"`
	// Assessment and action as the rule sets them.
	Category   string         `json:"category,omitempty"`
	Priority   string         `json:"priority,omitempty"`
	Confidence float64        `json:"confidence,omitempty"`
	Action     string         `json:"action,omitempty"`
	Params     map[string]any `json:"params,omitempty"`
	// Decides: the rule decides alone (confidence ≥ registry.ConfidentRule);
	// otherwise the model decides when the brain has one.
	Decides bool `json:"decides"`
	// Outcome says in words what the brain would do with this e-mail.
	Outcome string `json:"outcome"`
}

func (c *rulesTestCmd) Run(a *app) error {
	id := registry.TenantID(c.ID)
	if c.Email == "" {
		return usageError{&Error{Tenant: c.ID, Field: "--email", Message: "the e-mail to test is required: a JSON file {\"from\",\"subject\",\"body\"}"}}
	}
	f, err := a.open(c.Email)
	if err != nil {
		return &Error{Tenant: c.ID, Field: "--email", Message: err.Error()}
	}
	data, err := io.ReadAll(io.LimitReader(f, wire.MaxTurnBytes+1))
	f.Close()
	if err != nil {
		return &Error{Tenant: c.ID, Field: "--email", Message: err.Error()}
	}
	var email wire.Email
	if err := wire.Decode(data, &email); err != nil {
		field := "--email"
		var de *wire.DecodeError
		if errors.As(err, &de) && de.Field != "" {
			field = c.Email + ": " + de.Field
		}
		return &Error{Tenant: c.ID, Field: field, Message: err.Error()}
	}
	ops, err := a.opsFor(false)
	if err != nil {
		return err
	}
	t, err := ops.Tenant(a.ctx, id)
	if err != nil {
		return tenantError(c.ID, err)
	}
	rules := t.Rules
	var parsed *parsedRules
	if c.Rules != "" {
		rf, err := a.open(c.Rules)
		if err != nil {
			return &Error{Tenant: c.ID, Field: "--rules", Message: err.Error()}
		}
		defer rf.Close()
		if parsed, err = readRules(c.Rules, rf, id); err != nil {
			return err
		}
		spec, err := provision.ValidateSpec(provision.SpecOf(t))
		if err != nil {
			return err
		}
		if rules, err = parsed.check(spec); err != nil {
			return err
		}
	}
	out := testResult{Tenant: c.ID}
	r := registry.FirstMatch(rules, email.From, email.Subject, email.Body)
	if r == nil {
		out.Outcome = "no rule matches: the model classifies it (a brain without a model escalates it to a human)"
	} else {
		out.Matched, out.Rule, out.Category, out.Priority, out.Confidence = true, r.Name, r.Category, r.Priority, r.Confidence
		out.Action = string(r.Action)
		for i := range rules {
			if &rules[i] == r {
				out.Position = i + 1
			}
		}
		if parsed != nil && out.Position > 0 && out.Position <= len(parsed.lines) {
			out.Line = parsed.lines[out.Position-1]
		}
		if len(r.Params) > 0 {
			_ = jsonUnmarshal(r.Params, &out.Params)
		}
		out.Decides = r.Confidence >= registry.ConfidentRule
		what := "assessed only (no action): the item stays open"
		if r.Action != "" {
			what = "action " + string(r.Action)
			if act, ok := catalogue.Lookup(t.CatalogueVersion, r.Action); ok && act.RequiresApproval {
				what += ", which waits for a human's approval"
			}
		}
		if out.Decides {
			out.Outcome = fmt.Sprintf("rule %q decides (confidence %s ≥ %s): %s/%s, %s", r.Name, fmtConf(r.Confidence),
				fmtConf(registry.ConfidentRule), r.Category, r.Priority, what)
		} else {
			out.Outcome = fmt.Sprintf("rule %q matches below confidence %s (%s): the model decides; a brain without a model takes the rule: %s/%s, %s",
				r.Name, fmtConf(registry.ConfidentRule), fmtConf(r.Confidence), r.Category, r.Priority, what)
		}
	}
	return a.out.emit(out, func(w io.Writer) {
		if out.Matched {
			where := "rule " + strconv.Itoa(out.Position)
			if out.Line > 0 {
				where += fmt.Sprintf(" (%s line %d)", c.Rules, out.Line)
			}
			fmt.Fprintf(w, "tenant %s: %s, %q, matches\n", c.ID, where, out.Rule)
		} else {
			fmt.Fprintf(w, "tenant %s: no rule matches\n", c.ID)
		}
		fmt.Fprintln(w, out.Outcome)
	})
}

func fmtConf(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
