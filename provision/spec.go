package provision

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/nats-io/nkeys"

	"n8nbrain/catalogue"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// SpecError lists what is wrong with a TenantSpec; nothing was created.
type SpecError struct {
	Tenant   registry.TenantID
	Problems []string
}

func (e *SpecError) Error() string { return strings.Join(e.Problems, "; ") }

var tenantIDRe = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,47}$`)

// Bounds of a tenant's categories: each is shown to the model in every
// classification prompt and schema.
const (
	MaxCategories    = 32
	MaxCategoryBytes = 64
)

// validateSpec applies the defaults and checks the spec against the pinned
// catalogue version, returning it with rule params in canonical form.
func validateSpec(s TenantSpec) (TenantSpec, error) {
	if s.TurnCeiling == 0 {
		s.TurnCeiling = 8
	}
	if s.ApprovalMode == "" {
		s.ApprovalMode = registry.ApprovalModeReviewApp
	}
	if s.ApprovalTTL == 0 {
		s.ApprovalTTL = 72 * time.Hour
	}
	if s.CatalogueVersion == 0 {
		s.CatalogueVersion = catalogue.Current
	}
	if s.Categories == nil {
		s.Categories = DefaultCategories()
	}
	s.Quota = s.Quota.WithDefaults()
	if s.Autonomy == "" {
		s.Autonomy = registry.Autonomies()[0]
	}
	s.EnabledActions = slices.Clone(s.EnabledActions)
	s.Categories = slices.Clone(s.Categories)
	s.Rules = slices.Clone(s.Rules)

	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	if !tenantIDRe.MatchString(string(s.ID)) {
		bad("tenant id %q must match %s", s.ID, tenantIDRe)
	}
	if !nkeys.IsValidPublicAccountKey(s.NATSAccount) {
		bad("NATS account %q of tenant %s is not an account public key", s.NATSAccount, s.ID)
	}
	if s.TurnCeiling < 1 || s.TurnCeiling > 1000 {
		bad("turn ceiling %d of tenant %s must be between 1 and 1000", s.TurnCeiling, s.ID)
	}
	if s.ApprovalMode != registry.ApprovalModeReviewApp && s.ApprovalMode != registry.ApprovalModeMailbox {
		bad("approval mode %q of tenant %s must be %s or %s", s.ApprovalMode, s.ID,
			registry.ApprovalModeReviewApp, registry.ApprovalModeMailbox)
	}
	if s.ApprovalTTL < time.Second || s.ApprovalTTL/time.Second > math.MaxInt32 {
		bad("approval TTL %s of tenant %s must be at least a second and at most 68 years", s.ApprovalTTL, s.ID)
	}
	if s.DailyTokenBudget < 0 {
		bad("daily token budget of tenant %s must not be negative", s.ID)
	}
	if q := s.Quota; q.Turns < 10 || q.Turns > 100_000_000 {
		bad("turn quota %d of tenant %s must be between 10 and 100000000 turns", q.Turns, s.ID)
	}
	if q := s.Quota; q.Bytes < 1<<20 || q.Bytes > 1<<40 {
		bad("turn byte quota %d of tenant %s must be between 1 MiB and 1 TiB", q.Bytes, s.ID)
	}
	if q := s.Quota; q.Window < time.Minute || q.Window > 7*24*time.Hour || q.Window%time.Second != 0 {
		bad("turn window %s of tenant %s must be whole seconds between 1m and 168h", q.Window, s.ID)
	}
	if q := s.Quota; q.MaxInflight < 1 || q.MaxInflight > 1024 {
		bad("max in-flight turns %d of tenant %s must be between 1 and 1024", q.MaxInflight, s.ID)
	}
	if s.Autonomy.Valid() && s.Autonomy != registry.AutonomyAssist {
		// Autonomy beyond assist rests on an eval report of the tenant's
		// configuration, stored for an existing tenant: SetAutonomy.
		bad("tenant %s starts at autonomy %s: raise it to %s with SetAutonomy once an eval report of its configuration is stored and passes the thresholds",
			s.ID, registry.AutonomyAssist, s.Autonomy)
	}
	if !s.Autonomy.Valid() {
		names := make([]string, len(registry.Autonomies()))
		for i, a := range registry.Autonomies() {
			names[i] = string(a)
		}
		bad("autonomy %q of tenant %s must be one of: %s", s.Autonomy, s.ID, strings.Join(names, ", "))
	}
	if _, err := json.Marshal(s.ModelOptions); err != nil {
		bad("model options of tenant %s do not encode as JSON: %v", s.ID, err)
	}

	// Categories are shown to the model in full (the answer must name one
	// exactly), so they are bounded here, where they are written.
	switch n := len(s.Categories); {
	case n == 0:
		bad("tenant %s has no categories", s.ID)
	case n > MaxCategories:
		bad("tenant %s has %d categories, at most %d are allowed", s.ID, n, MaxCategories)
	}
	for i, c := range s.Categories {
		switch {
		case strings.TrimSpace(c) == "":
			bad("category %d of tenant %s is empty", i+1, s.ID)
		case len(c) > MaxCategoryBytes:
			bad("category %d of tenant %s is longer than %d bytes", i+1, s.ID, MaxCategoryBytes)
		case strings.ContainsFunc(c, unicode.IsControl):
			bad("category %d of tenant %s contains control characters", i+1, s.ID)
		case c == wire.CategoryUnclassified:
			bad("category %q of tenant %s is reserved: it marks an item nothing assessed", c, s.ID)
		case slices.Contains(s.Categories[:i], c):
			bad("category %q of tenant %s is listed twice", c, s.ID)
		}
	}

	if _, err := catalogue.Get(s.CatalogueVersion); err != nil {
		bad("tenant %s: %v", s.ID, err)
		return s, &SpecError{Tenant: s.ID, Problems: problems}
	}
	for i, a := range s.EnabledActions {
		if _, ok := catalogue.Lookup(s.CatalogueVersion, a); !ok {
			bad("enabled action %s of tenant %s is not in catalogue version %d", a, s.ID, s.CatalogueVersion)
		} else if slices.Contains(s.EnabledActions[:i], a) {
			bad("enabled action %s of tenant %s is listed twice", a, s.ID)
		}
	}

	for i := range s.Rules {
		r := &s.Rules[i]
		name := r.Name
		if strings.TrimSpace(name) == "" {
			name = fmt.Sprintf("#%d", i+1)
			bad("rule %s of tenant %s has no name", name, s.ID)
		} else if slices.ContainsFunc(s.Rules[:i], func(o registry.Rule) bool { return o.Name == r.Name }) {
			bad("rule %q of tenant %s is listed twice", name, s.ID)
		}
		if r.Match.Empty() {
			bad("rule %q: match is empty (it would match every email)", name)
		}
		for _, list := range [][]string{r.Match.SenderDomains, r.Match.SenderAddresses, r.Match.SubjectKeywords, r.Match.BodyKeywords} {
			if slices.ContainsFunc(list, func(v string) bool { return strings.TrimSpace(v) == "" }) {
				bad("rule %q: match has an empty entry (it would match every email)", name)
				break
			}
		}
		if !slices.Contains(s.Categories, r.Category) {
			bad("rule %q: category %q is not one of tenant %s's categories (%s)", name, r.Category, s.ID,
				strings.Join(s.Categories, ", "))
		}
		if !slices.Contains(catalogue.Priorities(), r.Priority) {
			bad("rule %q: priority %q must be one of %s", name, r.Priority, strings.Join(catalogue.Priorities(), ", "))
		}
		if !(r.Confidence >= 0 && r.Confidence <= 1) {
			bad("rule %q: confidence %v must be between 0 and 1", name, r.Confidence)
		}
		if r.Action == "" {
			if p := strings.TrimSpace(string(r.Params)); p != "" && p != "{}" && p != "null" {
				bad("rule %q: has params but no action", name)
			}
			continue
		}
		action, ok := catalogue.Lookup(s.CatalogueVersion, r.Action)
		if !ok {
			bad("rule %q: action %s is not in catalogue version %d", name, r.Action, s.CatalogueVersion)
			continue
		}
		if !slices.Contains(s.EnabledActions, r.Action) {
			bad("rule %q: action %s is not enabled for tenant %s", name, r.Action, s.ID)
		}
		params, err := action.ValidateRuleParams(r.Params)
		if err != nil {
			bad("rule %q: %v", name, err)
			continue
		}
		r.Params = params
	}
	if len(problems) > 0 {
		return s, &SpecError{Tenant: s.ID, Problems: problems}
	}
	return s, nil
}
