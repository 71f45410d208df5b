// Package testdb gives tests the Postgres cluster they run against. There is
// no fallback: a test that needs Postgres fails when it is absent (unless
// -short is given, which skips it and says so).
package testdb

import (
	"os"
	"testing"
)

// EnvAdminURL names the variable holding the bootstrap (admin) URL of the
// test cluster. `make test` starts a local cluster and sets it.
const EnvAdminURL = "BRAIN_TEST_DATABASE_URL"

// AdminURL returns the admin URL of the test cluster or fails the test.
func AdminURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(EnvAdminURL)
	if u != "" {
		return u
	}
	if testing.Short() {
		t.Skipf("-short: skipping a test that needs Postgres (%s is not set)", EnvAdminURL)
	}
	t.Fatalf("%s is not set: this test needs a real Postgres. Run `make test`, which starts a local cluster "+
		"and sets it, or point it at a cluster where the URL's role may create databases and roles", EnvAdminURL)
	return ""
}
