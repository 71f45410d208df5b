package capture

import (
	"maps"
	"slices"
	"sync"

	"n8nbrain/brain/internal/model"
	"n8nbrain/registry"
)

// TenantUsage is a tenant's model use since this replica started.
type TenantUsage struct {
	Tenant registry.TenantID
	Tokens int64                   // prompt and output tokens
	Calls  map[model.Outcome]int64 // HTTP calls by ledger outcome
	// Escalations counts items the stage handed to a human because of the
	// model, by reason (model_unavailable, budget_exhausted, model_output_invalid).
	Escalations map[string]int64
}

// usage keeps the running totals behind the brain's /metrics. The ledger in
// each tenant's database is the durable record; these are per replica.
type usage struct {
	mu sync.Mutex
	by map[registry.TenantID]*TenantUsage
}

func (u *usage) add(t registry.TenantID, tokens int64, outcome model.Outcome) {
	u.mu.Lock()
	defer u.mu.Unlock()
	tu := u.tenant(t)
	tu.Tokens += tokens
	tu.Calls[outcome]++
}

func (u *usage) escalated(t registry.TenantID, reason string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.tenant(t).Escalations[reason]++
}

// tenant returns t's totals; u.mu is held.
func (u *usage) tenant(t registry.TenantID) *TenantUsage {
	if u.by == nil {
		u.by = map[registry.TenantID]*TenantUsage{}
	}
	tu := u.by[t]
	if tu == nil {
		tu = &TenantUsage{Tenant: t, Calls: map[model.Outcome]int64{}, Escalations: map[string]int64{}}
		u.by[t] = tu
	}
	return tu
}

func (u *usage) snapshot() []TenantUsage {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]TenantUsage, 0, len(u.by))
	for _, id := range slices.Sorted(maps.Keys(u.by)) {
		tu := *u.by[id]
		tu.Calls, tu.Escalations = maps.Clone(tu.Calls), maps.Clone(tu.Escalations)
		out = append(out, tu)
	}
	return out
}
