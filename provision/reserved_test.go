package provision_test

import (
	"errors"
	"strings"
	"testing"

	"n8nbrain/provision"
	"n8nbrain/registry"
)

// A tenant registered with the BRAIN, STREAMS or system account would have
// the brain answer turns arriving on its own account as that tenant's, name
// its streams after every tenant's account, or hand a tenant the server's
// administration: provisioning refuses all three, and an Ops
// that does not know them creates no tenant at all.
func TestCreateTenantRefusesTheOperatorsAccounts(t *testing.T) {
	t.Parallel()
	ops, _ := newOps(t)
	for _, tc := range []struct {
		name, account, want string
	}{
		{"Brain", ops.Reserved.Brain, "is the BRAIN account"},
		{"Streams", ops.Reserved.Streams, "is the STREAMS account"},
		{"System", ops.Reserved.System, "is the system account"},
	} {
		spec := validSpec(t, registry.TenantID("tenant-"+strings.ToLower(tc.name)))
		spec.NATSAccount = tc.account
		_, err := ops.CreateTenant(t.Context(), spec)
		if _, ok := errors.AsType[*provision.SpecError](err); !ok || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CreateTenant with the %s account: %v, want a SpecError saying it %s", tc.name, err, tc.want)
		}
	}

	blind := *ops
	blind.Reserved.Brain = ""
	if _, err := blind.CreateTenant(t.Context(), validSpec(t, "tenant-blind")); err == nil || !strings.Contains(err.Error(), "BRAIN account's public key is required") {
		t.Errorf("CreateTenant by an Ops that does not know the BRAIN account: %v, want it refused", err)
	}

	reg, err := ops.RegistryAdmin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(t.Context())
	var rows int
	if err := reg.QueryRow(t.Context(), `SELECT count(*) FROM tenants`).Scan(&rows); err != nil || rows != 0 {
		t.Errorf("registry has %d tenants (%v) after refused specs, want none", rows, err)
	}
	// A tenant with an account of its own is still created.
	createTenant(t, ops, "tenant-own")
}
