package eval

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"n8nbrain/catalogue"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// TenantFile is a tenant's decision configuration in a file, for runs
// without a registry: what the registry holds of it that decides an
// e-mail. See testdata/client-zero.json.
type TenantFile struct {
	ID               string         `json:"id"`
	CatalogueVersion int            `json:"catalogue_version,omitempty"` // default catalogue.Current
	EnabledActions   []string       `json:"enabled_actions"`
	Categories       []string       `json:"categories"`
	Rules            []RuleFile     `json:"rules,omitempty"`
	ModelName        string         `json:"model_name,omitempty"`
	ModelOptions     map[string]any `json:"model_options,omitempty"`
}

// RuleFile is one triage rule in a TenantFile (registry.Rule).
type RuleFile struct {
	Name       string          `json:"name"`
	Match      registry.Match  `json:"match"`
	Category   string          `json:"category"`
	Priority   string          `json:"priority"`
	Action     string          `json:"action,omitempty"`
	Params     json.RawMessage `json:"params,omitempty"`
	Confidence float64         `json:"confidence"`
}

// LoadTenantFile reads and checks a TenantFile (strictly decoded).
func LoadTenantFile(path string) (*registry.Tenant, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tenant config: %w", err)
	}
	var f TenantFile
	if err := wire.Decode(raw, &f); err != nil {
		return nil, fmt.Errorf("tenant config %s: %w", path, err)
	}
	t, ps := f.tenant()
	if len(ps) > 0 {
		return nil, fmt.Errorf("tenant config %s: %s", path, strings.Join(ps, "; "))
	}
	return t, nil
}

// tenant checks the file as provisioning checks a spec, for what decides.
func (f *TenantFile) tenant() (*registry.Tenant, []string) {
	var ps []string
	bad := func(format string, args ...any) { ps = append(ps, fmt.Sprintf(format, args...)) }
	t := &registry.Tenant{ID: registry.TenantID(f.ID), Status: registry.TenantStatusActive,
		CatalogueVersion: catalogue.Version(f.CatalogueVersion), Categories: f.Categories, ModelName: f.ModelName,
		ModelOptions: f.ModelOptions, ApprovalMode: registry.ApprovalModeReviewApp, Autonomy: registry.AutonomyAssist}
	if t.CatalogueVersion == 0 {
		t.CatalogueVersion = catalogue.Current
	}
	if strings.TrimSpace(f.ID) == "" {
		bad("id is empty")
	}
	if _, err := catalogue.Get(t.CatalogueVersion); err != nil {
		return nil, []string{err.Error()}
	}
	if len(f.Categories) == 0 {
		bad("no categories")
	}
	for i, c := range f.Categories {
		switch {
		case strings.TrimSpace(c) == "":
			bad("category %d is empty", i+1)
		case c == wire.CategoryUnclassified:
			bad("category %q is reserved", c)
		case slices.Contains(f.Categories[:i], c):
			bad("category %q is listed twice", c)
		}
	}
	for _, a := range f.EnabledActions {
		if _, ok := catalogue.Lookup(t.CatalogueVersion, catalogue.Name(a)); !ok {
			bad("enabled action %s is not in catalogue version %d", a, t.CatalogueVersion)
		}
		t.EnabledActions = append(t.EnabledActions, catalogue.Name(a))
	}
	for i, r := range f.Rules {
		rule := registry.Rule{Position: i + 1, Name: r.Name, Match: r.Match, Category: r.Category, Priority: r.Priority,
			Action: catalogue.Name(r.Action), Params: r.Params, Confidence: r.Confidence}
		switch {
		case strings.TrimSpace(r.Name) == "":
			bad("rule %d has no name", i+1)
		case r.Match.Empty():
			bad("rule %q: match is empty", r.Name)
		case !slices.Contains(f.Categories, r.Category):
			bad("rule %q: category %q is not one of the categories", r.Name, r.Category)
		case !slices.Contains(catalogue.Priorities(), r.Priority):
			bad("rule %q: priority %q is not one of %s", r.Name, r.Priority, strings.Join(catalogue.Priorities(), ", "))
		case !(r.Confidence >= 0 && r.Confidence <= 1):
			bad("rule %q: confidence must be between 0 and 1", r.Name)
		}
		if r.Action != "" {
			a, ok := catalogue.Lookup(t.CatalogueVersion, rule.Action)
			switch {
			case !ok:
				bad("rule %q: action %s is not in the catalogue", r.Name, r.Action)
			case !t.ActionEnabled(rule.Action):
				bad("rule %q: action %s is not enabled", r.Name, r.Action)
			default:
				canon, err := a.ValidateRuleParams(r.Params)
				if err != nil {
					bad("rule %q: %v", r.Name, err)
				}
				rule.Params = canon
			}
		}
		t.Rules = append(t.Rules, rule)
	}
	return t, ps
}

// LoadTenant reads a tenant's configuration from the registry (the reader
// role is enough).
func LoadTenant(ctx context.Context, registryURL string, id registry.TenantID) (*registry.Tenant, error) {
	conn, err := pgx.Connect(ctx, registryURL)
	if err != nil {
		// The error can quote the URL, password included.
		var pe *pgconn.ConnectError
		if errors.As(err, &pe) {
			return nil, errors.New("connect to the registry: connection failed (check -registry)")
		}
		return nil, errors.New("connect to the registry: not a valid Postgres URL (check -registry)")
	}
	defer conn.Close(context.WithoutCancel(ctx))
	t, err := registry.TenantGet(ctx, conn, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("tenant %s is not in the registry", id)
	}
	if err != nil {
		return nil, err
	}
	return &t, nil
}
