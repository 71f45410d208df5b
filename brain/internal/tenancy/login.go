package tenancy

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"n8nbrain/registry"
	"n8nbrain/wire"
)

// LoginError is a tenant database that refuses the tenant's own role: its
// password, its LOGIN or its CONNECT privilege changed outside provisioning
// (a role may change its own password). Retrying does not mend it; an
// operator repairs the role (brainctl tenant repair). Its wire
// error, safe to show the tenant, is found by wire.ErrorOf.
type LoginError struct {
	Tenant registry.TenantID
	cause  error
}

func (e *LoginError) Error() string {
	return fmt.Sprintf("tenant %s: its database refuses its role: %v", e.Tenant, e.cause)
}

// Unwrap gives the wire error and the driver's error.
func (e *LoginError) Unwrap() []error {
	return []error{&wire.Error{Code: wire.CodeUnavailable, Reason: wire.ReasonTenantDatabaseLogin, RetryAfter: 60,
		Message: "the brain cannot log in to this tenant's database: its role's password or login was changed " +
			"outside provisioning; an operator must repair the role, and retrying before then will not help"}, e.cause}
}

// isLoginFailure reports whether err is the server refusing a new
// connection's role: invalid authorization (class 28: wrong password, no
// LOGIN, no such role, pg_hba) or no CONNECT privilege, while connecting.
func isLoginFailure(err error) bool {
	var ce *pgconn.ConnectError
	var pe *pgconn.PgError
	if !errors.As(err, &ce) || !errors.As(err, &pe) {
		return false
	}
	return pe.Code[:2] == "28" || pe.Code == "42501"
}

// LoginProblem is a tenant whose database refuses its role.
type LoginProblem struct {
	Tenant   registry.TenantID
	Since    time.Time
	SQLState string
}

type loginState struct {
	since    time.Time
	sqlState string
}

// Check returns err, or a *LoginError when err is the tenant's database
// refusing the tenant's role, and then records the problem (named in
// LoginProblems, counted in LoginFailures, logged once until it mends).
// Every path that runs SQL for a tenant passes its errors through Check.
func (d *Directory) Check(t *registry.Tenant, err error) error {
	if err == nil || !isLoginFailure(err) {
		return err
	}
	var pe *pgconn.PgError
	errors.As(err, &pe)
	d.loginMu.Lock()
	d.loginFailures[t.ID]++
	_, known := d.loginFailing[t.ID]
	if !known {
		d.loginFailing[t.ID] = loginState{since: time.Now(), sqlState: pe.Code}
	}
	d.loginMu.Unlock()
	if !known {
		d.log.Error("tenant database refuses the tenant's role: its password, LOGIN or CONNECT changed outside provisioning; "+
			"turns and API calls of this tenant fail until an operator repairs the role (brainctl tenant repair)",
			"tenant_id", t.ID, "database", t.DB.Name, "role", t.DB.User, "sqlstate", pe.Code)
	}
	return &LoginError{Tenant: t.ID, cause: err}
}

// loginWorks records that a connection of the tenant's role was made.
func (d *Directory) loginWorks(id registry.TenantID) {
	d.loginMu.Lock()
	_, was := d.loginFailing[id]
	delete(d.loginFailing, id)
	d.loginMu.Unlock()
	if was {
		d.log.Info("tenant database accepts the tenant's role again", "tenant_id", id)
	}
}

// LoginProblems lists the tenants whose database refused their role at the
// last attempt, by tenant id.
func (d *Directory) LoginProblems() []LoginProblem {
	d.loginMu.Lock()
	defer d.loginMu.Unlock()
	out := make([]LoginProblem, 0, len(d.loginFailing))
	for id, s := range d.loginFailing {
		out = append(out, LoginProblem{Tenant: id, Since: s.since, SQLState: s.sqlState})
	}
	slices.SortFunc(out, func(a, b LoginProblem) int { return compare(a.Tenant, b.Tenant) })
	return out
}

// LoginFailures counts, by tenant, the refused logins since the replica
// started (a counter: it never goes down).
func (d *Directory) LoginFailures() map[registry.TenantID]int64 {
	d.loginMu.Lock()
	defer d.loginMu.Unlock()
	out := make(map[registry.TenantID]int64, len(d.loginFailures))
	for id, n := range d.loginFailures {
		out[id] = n
	}
	return out
}
