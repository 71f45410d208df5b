package devstack_test

import (
	"testing"

	"n8nbrain/deploy/devstack"
)

// Compose's init restricts the maintenance databases of the cluster it owns
// unless told not to (options built in code, as the tests on the shared
// cluster build them, have it off: the zero value). provision's TestRestrictMaintenanceDatabases
// proves what the step does.
func TestInitRestrictsMaintenanceDatabasesFromTheEnvironment(t *testing.T) {
	for v, want := range map[string]bool{"": true, "1": true, "0": false, "false": false, "FALSE": false} {
		env := map[string]string{"INIT_ADMIN_URL": "postgres://a@b/c", "INIT_RESTRICT_MAINTENANCE_DBS": v}
		o, err := devstack.InitOptionsFromEnv(func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		if o.RestrictMaintenanceDatabases != want {
			t.Errorf("INIT_RESTRICT_MAINTENANCE_DBS=%q: restrict %v, want %v", v, o.RestrictMaintenanceDatabases, want)
		}
	}
}
