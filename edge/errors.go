package edge

import (
	"encoding/json"
	"net/http"
	"strconv"

	"n8nbrain/wire"
)

// httpStatusByCode is the one table from a wire error code to an HTTP status.
var httpStatusByCode = map[wire.Code]int{
	wire.CodeInvalid:       http.StatusBadRequest,
	wire.CodeUnauthorized:  http.StatusUnauthorized,
	wire.CodeForbidden:     http.StatusForbidden,
	wire.CodeNotFound:      http.StatusNotFound,
	wire.CodeConflict:      http.StatusConflict,
	wire.CodeUnprocessable: http.StatusUnprocessableEntity,
	wire.CodeRateLimited:   http.StatusTooManyRequests,
	wire.CodeUnavailable:   http.StatusServiceUnavailable,
	wire.CodeInternal:      http.StatusInternalServerError,
}

// defaultRetryAfter is the Retry-After, in seconds, of an answer that asks
// for a retry without saying when.
const defaultRetryAfter = 2

// httpStatus maps an error to its HTTP status. An unknown code is a bug on
// the other side, so it is a 500.
func httpStatus(e *wire.Error) int {
	if e.Code == wire.CodeInvalid && e.Reason == wire.ReasonTooLarge {
		return http.StatusRequestEntityTooLarge
	}
	if s, ok := httpStatusByCode[e.Code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// writeError answers with e as a wire.ErrorReply and the status of its code.
func writeError(w http.ResponseWriter, e *wire.Error) {
	writeErrorStatus(w, httpStatus(e), e)
}

// writeErrorStatus answers with e and an explicit status, for the few HTTP
// answers that have no code of their own (415, 405).
func writeErrorStatus(w http.ResponseWriter, status int, e *wire.Error) {
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		ec := *e
		if ec.RetryAfter <= 0 {
			ec.RetryAfter = defaultRetryAfter
		}
		e = &ec
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", "Bearer")
	}
	body, err := json.Marshal(wire.ErrorReply{Error: e})
	if err != nil { // cannot happen: the type has only strings and ints
		body = []byte(`{"error":{"code":"internal","message":"internal error"}}`)
	}
	writeJSON(w, status, body)
}

// writeJSON answers with a JSON body, exactly as given.
func writeJSON(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// causeError is an error with a message safe for the tenant and a cause that
// only reaches the log (tailscale's split of client message and detail).
type causeError struct {
	public *wire.Error
	cause  error
}

func (e *causeError) Error() string   { return e.public.Error() + ": " + e.cause.Error() }
func (e *causeError) Unwrap() []error { return []error{e.public, e.cause} }

// unavailable is a 503 asking for a retry with the same turn.
func unavailable(cause error, format string, args ...any) error {
	pub := wire.Errorf(wire.CodeUnavailable, format, args...)
	pub.RetryAfter = defaultRetryAfter
	return &causeError{public: pub, cause: cause}
}

// internal is a 500 whose detail stays in the log.
func internal(cause error, message string) error {
	return &causeError{public: &wire.Error{Code: wire.CodeInternal, Message: message}, cause: cause}
}
