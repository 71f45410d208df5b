package provision

import (
	"errors"
	"fmt"

	"github.com/nats-io/nkeys"

	"n8nbrain/registry"
)

// ReservedAccounts are the operator's own accounts: never a tenant's. A
// tenant registered with the BRAIN account's key would have the brain take
// turns arriving on its own account as that tenant's; with the STREAMS
// account's, its streams would be named after the account holding every
// tenant's; with the system account's, its edge would hold the server's
// administration.
type ReservedAccounts struct {
	Brain, Streams, System string
}

// Known reports an error unless every key is an account public key, so
// that a check against them means something.
func (r ReservedAccounts) Known() error {
	var errs []error
	for _, k := range []struct{ name, key string }{{"BRAIN", r.Brain}, {"STREAMS", r.Streams}, {"system", r.System}} {
		if !nkeys.IsValidPublicAccountKey(k.key) {
			errs = append(errs, fmt.Errorf("the %s account's public key is required to tell it from a tenant's (got %q)", k.name, k.key))
		}
	}
	return errors.Join(errs...)
}

// CheckTenantAccount refuses an operator account as a tenant's NATS
// account, with a *SpecError.
func (r ReservedAccounts) CheckTenantAccount(id registry.TenantID, account string) error {
	for _, k := range []struct{ name, key string }{{"BRAIN", r.Brain}, {"STREAMS", r.Streams}, {"system", r.System}} {
		if k.key != "" && account == k.key {
			return &SpecError{Tenant: id, Problems: []string{fmt.Sprintf(
				"NATS account %s of tenant %s is the %s account: a tenant needs an account of its own", account, id, k.name)}}
		}
	}
	return nil
}
