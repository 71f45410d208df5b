package engine

import (
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// matchRule returns the first rule (in position order) whose predicates all
// hold for the email, or nil. The matcher itself is registry.FirstMatch,
// which the ops tool's dry run (brainctl rules test) uses too.
func matchRule(rules []registry.Rule, e *wire.Email) *registry.Rule {
	if e == nil {
		return nil
	}
	return registry.FirstMatch(rules, e.From, e.Subject, e.Body)
}
