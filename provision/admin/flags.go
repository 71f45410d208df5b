package admin

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"n8nbrain/catalogue"
	"n8nbrain/provision"
	"n8nbrain/registry"
)

// list is a comma-separated flag value that knows whether it was given
// (an empty value, "", is a given empty list).
type list struct {
	set   bool
	items []string
}

func (l *list) UnmarshalText(b []byte) error {
	l.set = true
	l.items = nil
	for _, s := range strings.Split(string(b), ",") {
		if s = strings.TrimSpace(s); s != "" {
			l.items = append(l.items, s)
		}
	}
	return nil
}

// byteSize is a size in bytes, written as a number or with a unit
// (KiB, MiB, GiB, TiB).
type byteSize int64

func (b *byteSize) UnmarshalText(t []byte) error {
	s := strings.TrimSpace(string(t))
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"B", 1}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return fmt.Errorf("%q is not a size: write bytes, or a whole number with KiB, MiB, GiB or TiB", string(t))
	}
	*b = byteSize(n * mult)
	return nil
}

// settings are a tenant's settings as flags of create and update. A flag
// not given leaves the setting as it is (update) or at its default (create).
type settings struct {
	ApprovalMode     *string        `name:"approval-mode" placeholder:"MODE" help:"review_app (approved on the review page, sent by us) or mailbox (a draft in the client's mailbox). Default review_app; a change applies to new work items."`
	ApprovalTTL      *time.Duration `name:"approval-ttl" placeholder:"DURATION" help:"How long an approval waits before it expires and the item goes back to a human. Default 72h."`
	TurnCeiling      *int           `name:"turn-ceiling" placeholder:"N" help:"Turns per work item before it halts for a human (1 to 1000). Default 8."`
	CatalogueVersion *int           `name:"catalogue-version" placeholder:"N" help:"Catalogue version new work items are pinned to. Default the current one."`
	Actions          list           `name:"actions" placeholder:"A,B" help:"Enabled catalogue actions, comma-separated (e.g. draft_reply,send_reply,escalate_item); replaces the list."`
	Categories       list           `name:"categories" placeholder:"C,D" help:"Triage categories, comma-separated; replaces the list. Default quote_request,complaint,booking,invoice,general."`
	Model            *string        `name:"model" placeholder:"NAME" help:"Ollama model for this tenant; empty: the brain's BRAIN_MODEL."`
	ModelOptions     *string        `name:"model-options" placeholder:"JSON" help:"Ollama options as a JSON object, e.g. '{\"temperature\":0.2}'."`
	TokenBudget      *int64         `name:"token-budget" placeholder:"N" help:"Model tokens per day (UTC); 0 means unlimited."`
	QuotaTurns       *int64         `name:"quota-turns" placeholder:"N" help:"Turns the tenant's stream holds within the turn window (10 to 100000000). Default 10000."`
	QuotaBytes       *byteSize      `name:"quota-bytes" placeholder:"SIZE" help:"Bytes the tenant's stream holds within the turn window (1MiB to 1TiB). Default 64MiB."`
	TurnWindow       *time.Duration `name:"turn-window" placeholder:"DURATION" help:"How long turns and replies are kept in the tenant's streams (1m to 168h). Default 1h."`
	MaxInflight      *int           `name:"max-inflight" placeholder:"N" help:"The tenant's turns in flight across brain replicas (1 to 1024). Default 16."`
}

// quota reports whether a quota flag was given (the streams follow).
func (s *settings) quota() bool {
	return s.QuotaTurns != nil || s.QuotaBytes != nil || s.TurnWindow != nil || s.MaxInflight != nil
}

// apply writes the given flags into a spec.
func (s *settings) apply(spec *provision.TenantSpec) error {
	id := string(spec.ID)
	if s.ApprovalMode != nil {
		spec.ApprovalMode = registry.ApprovalMode(*s.ApprovalMode)
	}
	if s.ApprovalTTL != nil {
		if *s.ApprovalTTL <= 0 {
			return &Error{Tenant: id, Field: "--approval-ttl", Message: "must be positive, such as 72h"}
		}
		spec.ApprovalTTL = *s.ApprovalTTL
	}
	if s.TurnCeiling != nil {
		if *s.TurnCeiling <= 0 {
			return &Error{Tenant: id, Field: "--turn-ceiling", Message: "must be between 1 and 1000"}
		}
		spec.TurnCeiling = *s.TurnCeiling
	}
	if s.CatalogueVersion != nil {
		if *s.CatalogueVersion <= 0 {
			return &Error{Tenant: id, Field: "--catalogue-version", Message: "must be a published version (1 or more)"}
		}
		spec.CatalogueVersion = catalogue.Version(*s.CatalogueVersion)
	}
	if s.Actions.set {
		spec.EnabledActions = nil
		for _, a := range s.Actions.items {
			spec.EnabledActions = append(spec.EnabledActions, catalogue.Name(a))
		}
		if spec.EnabledActions == nil {
			spec.EnabledActions = []catalogue.Name{}
		}
	}
	if s.Categories.set {
		if len(s.Categories.items) == 0 {
			return &Error{Tenant: id, Field: "--categories", Message: "a tenant needs at least one category"}
		}
		spec.Categories = s.Categories.items
	}
	if s.Model != nil {
		spec.ModelName = strings.TrimSpace(*s.Model)
	}
	if s.ModelOptions != nil {
		var opts map[string]any
		if strings.TrimSpace(*s.ModelOptions) != "" {
			d := json.NewDecoder(strings.NewReader(*s.ModelOptions))
			d.UseNumber()
			if err := d.Decode(&opts); err != nil || d.More() {
				return &Error{Tenant: id, Field: "--model-options", Message: "must be one JSON object, such as {\"temperature\":0.2}"}
			}
		}
		spec.ModelOptions = opts
	}
	if s.TokenBudget != nil {
		if *s.TokenBudget < 0 {
			return &Error{Tenant: id, Field: "--token-budget", Message: "must be 0 (unlimited) or more"}
		}
		spec.DailyTokenBudget = *s.TokenBudget
	}
	if s.QuotaTurns != nil {
		if *s.QuotaTurns <= 0 {
			return &Error{Tenant: id, Field: "--quota-turns", Message: "must be between 10 and 100000000"}
		}
		spec.Quota.Turns = *s.QuotaTurns
	}
	if s.QuotaBytes != nil {
		if *s.QuotaBytes <= 0 {
			return &Error{Tenant: id, Field: "--quota-bytes", Message: "must be between 1MiB and 1TiB"}
		}
		spec.Quota.Bytes = int64(*s.QuotaBytes)
	}
	if s.TurnWindow != nil {
		if *s.TurnWindow <= 0 {
			return &Error{Tenant: id, Field: "--turn-window", Message: "must be between 1m and 168h"}
		}
		spec.Quota.Window = *s.TurnWindow
	}
	if s.MaxInflight != nil {
		if *s.MaxInflight <= 0 {
			return &Error{Tenant: id, Field: "--max-inflight", Message: "must be between 1 and 1024"}
		}
		spec.Quota.MaxInflight = *s.MaxInflight
	}
	return nil
}
