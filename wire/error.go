package wire

import (
	"errors"
	"fmt"
)

// Code is the stable class of an error a tenant can see. The brain sends it
// on the wire; the edge maps it to an HTTP status in one table.
type Code string

const (
	CodeInvalid       Code = "invalid"       // the request is malformed or breaks a rule
	CodeUnauthorized  Code = "unauthorized"  // no or wrong credentials
	CodeForbidden     Code = "forbidden"     // authenticated, but not allowed (tenant mismatch, disabled tenant)
	CodeNotFound      Code = "not_found"     // no such work item, approval, result
	CodeConflict      Code = "conflict"      // out of sequence, idempotency key reused, already resolved
	CodeUnprocessable Code = "unprocessable" // well formed, but the item cannot take it (halted, closed)
	CodeRateLimited   Code = "rate_limited"  // too many requests; retry later
	CodeUnavailable   Code = "unavailable"   // a dependency is down; retry later with the same key
	CodeInternal      Code = "internal"      // a bug or an unexpected failure; details are in the logs
)

// Reasons refine a code with a machine-readable cause.
const (
	ReasonIdempotencyKeyReused = "idempotency_key_reused"
	ReasonTurnOutOfSequence    = "turn_out_of_sequence"
	ReasonTenantMismatch       = "tenant_mismatch"
	ReasonUnknownTenant        = "unknown_tenant"
	ReasonTenantDisabled       = "tenant_disabled"
	ReasonItemHalted           = "item_halted"
	ReasonItemClosed           = "item_closed"
	ReasonTurnKeyMismatch      = "turn_key_mismatch"
	ReasonTooLarge             = "too_large"
	ReasonPending              = "decision_pending"
	ReasonAlreadyResolved      = "already_resolved"
	ReasonApprovalExpired      = "approval_expired"
	ReasonTenantQuotaExceeded  = "tenant_quota_exceeded"
	ReasonNotProvisioned       = "tenant_not_provisioned"
	ReasonCredentialRefused    = "credential_refused" // the NATS server refuses the edge's credential: not transient
	ReasonNATSClosed           = "nats_closed"        // the edge's NATS connection is closed for good
	ReasonTenantDatabaseLogin  = "tenant_database_login_failed"
	ReasonTenantDatabaseTLS    = "tenant_database_tls_failed"
)

// Error is the application error: a stable code, an optional reason and a
// message that is safe to show the tenant (no internal detail, no content).
type Error struct {
	Code    Code   `json:"code"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message"`
	// Field names the offending request field for CodeInvalid.
	Field string `json:"field,omitempty"`
	// ExpectedTurn is the turn the brain expects next, for an out-of-sequence turn.
	ExpectedTurn int `json:"expected_turn,omitempty"`
	// RetryAfter is a hint in seconds for CodeUnavailable and CodeRateLimited.
	RetryAfter int `json:"retry_after,omitempty"`
}

func (e *Error) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("%s (%s): %s", e.Code, e.Reason, e.Message)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Errorf returns an *Error with code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorReply is the body of every error answer, on NATS and over HTTP.
type ErrorReply struct {
	Error *Error `json:"error"`
}

// ErrorOf returns the *Error in err's chain, or an internal error with a
// generic message: an unexpected error's text is never shown to a tenant.
func ErrorOf(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	var de *DecodeError
	if errors.As(err, &de) {
		field := de.Field
		if field == "" {
			field = DocumentField
		}
		return &Error{Code: CodeInvalid, Field: field, Message: de.Error()}
	}
	return &Error{Code: CodeInternal, Message: "internal error"}
}
