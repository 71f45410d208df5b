package admin

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"n8nbrain/provision"
)

// Error is what brainctl reports when a command fails: the tenant and the
// field (a flag, or a place in a rules file) it is about, when it is about
// one, and what was wrong.
type Error struct {
	Tenant   string   `json:"tenant,omitempty"`
	Field    string   `json:"field,omitempty"`
	Message  string   `json:"message"`
	Problems []string `json:"problems,omitempty"`
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Tenant != "" {
		b.WriteString("tenant " + e.Tenant + ": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Message)
	for _, p := range e.Problems {
		b.WriteString("\n  - " + p)
	}
	return b.String()
}

// usageError is a command line brainctl cannot act on (exit 2).
type usageError struct{ e *Error }

func (u usageError) Error() string { return u.e.Error() }
func (u usageError) Unwrap() error { return u.e }

// partialError: the command ran for every tenant and printed its report,
// and some tenants failed (exit 1).
type partialError struct{ failed, total int }

func (e partialError) Error() string {
	return fmt.Sprintf("%d of %d tenants failed (see the report above)", e.failed, e.total)
}

// asError turns any error into an *Error, keeping the tenant and field
// of the typed errors provisioning returns.
func asError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	var se *provision.SpecError
	if errors.As(err, &se) {
		return &Error{Tenant: string(se.Tenant), Message: "the tenant's settings are not valid; nothing was changed", Problems: se.Problems}
	}
	var ce *provision.ClusterError
	if errors.As(err, &ce) {
		return &Error{Tenant: string(ce.Tenant), Field: "--cluster", Message: ce.Error()}
	}
	return &Error{Message: err.Error()}
}

// tenantError names the tenant of a failure that does not say it.
func tenantError(id string, err error) error {
	if err == nil {
		return nil
	}
	e := asError(err)
	if e.Tenant == "" {
		e.Tenant = id
		e.Message = strings.TrimPrefix(e.Message, "tenant "+id+": ")
	}
	return e
}

func splitAddr(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 || host == "" {
		return "", 0, fmt.Errorf("bad host:port %q", addr)
	}
	return host, port, nil
}

// redactEntry hides a password in a HOST:PORT=URL entry quoted in an error.
func redactEntry(e string) string {
	addr, u, ok := strings.Cut(e, "=")
	if !ok {
		return e
	}
	if pu, err := url.Parse(u); err == nil {
		return addr + "=" + pu.Redacted()
	}
	return addr + "=…"
}
