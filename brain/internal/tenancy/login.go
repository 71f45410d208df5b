package tenancy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"n8nbrain/brain/internal/guard"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// Logged reports whether err was logged where it arose, so that a caller
// does not log it again: a refused login (Directory.Check logs it once) or
// a recovered panic (guard.Run logs it with its stack).
func Logged(err error) bool {
	var le *LoginError
	return errors.As(err, &le) || errors.Is(err, guard.ErrPanicked)
}

// LoginError is a tenant database that refuses the brain's connection in a
// way retrying does not mend. Either it refuses the tenant's own role: its
// password, its LOGIN or its CONNECT privilege changed outside provisioning
// (a role may change its own password), and an operator repairs the role
// (brainctl tenant repair). Or (TLS) it cannot be reached with the TLS the
// replica requires (BRAIN_DB_SSLMODE): the server refuses TLS, or its
// certificate does not verify, and an operator mends the server or the
// setting. Its wire error, safe to show the tenant, is found by
// wire.ErrorOf.
type LoginError struct {
	Tenant registry.TenantID
	TLS    bool
	cause  error
}

func (e *LoginError) Error() string {
	if e.TLS {
		return fmt.Sprintf("tenant %s: its database cannot be reached with the TLS required: %v", e.Tenant, e.cause)
	}
	return fmt.Sprintf("tenant %s: its database refuses its role: %v", e.Tenant, e.cause)
}

// Unwrap gives the wire error and the driver's error.
func (e *LoginError) Unwrap() []error {
	if e.TLS {
		return []error{&wire.Error{Code: wire.CodeUnavailable, Reason: wire.ReasonTenantDatabaseTLS, RetryAfter: 60,
			Message: "the brain cannot connect to this tenant's database with the TLS its operator requires (the server " +
				"refuses TLS, or its certificate does not verify); an operator must mend the server or the brain's setting, " +
				"and retrying before then will not help"}, e.cause}
	}
	return []error{&wire.Error{Code: wire.CodeUnavailable, Reason: wire.ReasonTenantDatabaseLogin, RetryAfter: 60,
		Message: "the brain cannot log in to this tenant's database: its role's password or login was changed " +
			"outside provisioning; an operator must repair the role, and retrying before then will not help"}, e.cause}
}

// refusal reports whether err is a new connection that the tenant's server
// refused for good: its role (invalid authorization, class 28: wrong
// password, no LOGIN, no such role, pg_hba; or no CONNECT privilege, with
// its SQLSTATE), or the TLS required (tls: the server refuses TLS, or its
// certificate does not verify), under an sslmode that requires TLS: under
// prefer or allow a refused TLS attempt is followed by a plain one, and the
// error of the connection is that one's. A TLS handshake that timed out or
// was cut is not one: it is retried.
func refusal(err error, sslMode string) (sqlState string, isTLS, ok bool) {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return "", false, false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code, false, pe.Code[:2] == "28" || pe.Code == "42501"
	}
	switch sslMode {
	case "require", "verify-ca", "verify-full":
	default:
		return "", false, false
	}
	var (
		verify   *tls.CertificateVerificationError // verify-full: Go's own check
		unknown  x509.UnknownAuthorityError        // verify-ca: pgx's check
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	if errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid) ||
		strings.Contains(err.Error(), "server refused TLS connection") { // pgconn's text; it has no type
		return "", true, true
	}
	return "", false, false
}

// LoginProblem is a tenant whose database refuses the brain's connection
// for good (LoginError): its role, with the SQLSTATE, or the TLS required.
type LoginProblem struct {
	Tenant   registry.TenantID
	Since    time.Time
	SQLState string
	TLS      bool
}

type loginState struct {
	since    time.Time
	sqlState string
	tls      bool
}

// Check returns err, or a *LoginError when err is the tenant's database
// refusing the brain's connection for good (refusal), and then records the
// problem (named in LoginProblems, counted in LoginFailures, logged once
// until it mends). Every path that runs SQL for a tenant passes its errors
// through Check.
func (d *Directory) Check(t *registry.Tenant, err error) error {
	if err == nil {
		return nil
	}
	sqlState, isTLS, ok := refusal(err, d.cfg.SSLMode)
	if !ok {
		return err
	}
	d.loginMu.Lock()
	d.loginFailures[t.ID]++
	_, known := d.loginFailing[t.ID]
	if !known {
		d.loginFailing[t.ID] = loginState{since: time.Now(), sqlState: sqlState, tls: isTLS}
	}
	d.loginMu.Unlock()
	switch {
	case known:
	case isTLS:
		// The driver's error says which (refused, or which certificate
		// check failed) and names the server, never a credential.
		d.log.Error("tenant database cannot be reached with the TLS required (BRAIN_DB_SSLMODE): the server refuses TLS "+
			"or its certificate does not verify; turns and API calls of this tenant fail until the server or the setting is mended",
			"tenant_id", t.ID, "database", t.DB.Name, "sslmode", d.cfg.SSLMode, "error", err.Error())
	default:
		d.log.Error("tenant database refuses the tenant's role: its password, LOGIN or CONNECT changed outside provisioning; "+
			"turns and API calls of this tenant fail until an operator repairs the role (brainctl tenant repair)",
			"tenant_id", t.ID, "database", t.DB.Name, "role", t.DB.User, "sqlstate", sqlState)
	}
	return &LoginError{Tenant: t.ID, TLS: isTLS, cause: err}
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
		out = append(out, LoginProblem{Tenant: id, Since: s.since, SQLState: s.sqlState, TLS: s.tls})
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
