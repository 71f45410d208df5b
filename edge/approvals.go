package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// The tenant API over HTTP, for n8n: the approvals and the outcome report.
// The edge checks what it can (shapes, sizes, strict JSON) so that a bad
// request never reaches the brain, and serves the brain's reply as it is.

const (
	// defaultListLimit and maxListLimit bound GET /v1/approvals.
	defaultListLimit = 50
	maxListLimit     = 200
	// maxByBytes bounds who decided, as n8n names them; "n8n:" is added.
	maxByBytes = 100
	// maxReasonBytes is the brain's limit on a rejection reason.
	maxReasonBytes = 1000
	// maxCursorBytes bounds a listing cursor (the brain's are far shorter).
	maxCursorBytes = 1024
)

// approvalStatuses are the statuses GET /v1/approvals filters on.
var approvalStatuses = []wire.ApprovalStatus{
	wire.ApprovalStatusPending, wire.ApprovalStatusApproved, wire.ApprovalStatusRejected,
	wire.ApprovalStatusExpired, wire.ApprovalStatusSuperseded,
}

// handleApprovalList answers GET /v1/approvals?status=pending&limit=50
// &q=<sender or subject>&cursor=<next_cursor>&brief=true.
func handleApprovalList(d deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q, err := strictQuery(r.URL.RawQuery, "status", "limit", "q", "cursor", "brief")
		if err != nil {
			fail(r.Context(), w, err)
			return
		}
		// An empty parameter is one left out: what a form or n8n sends for
		// a field with no value (the first page has no cursor).
		for k, v := range q {
			if v == "" {
				delete(q, k)
			}
		}
		req := wire.ApprovalListRequest{Status: wire.ApprovalStatusPending, Limit: defaultListLimit}
		if v, ok := q["status"]; ok {
			req.Status = wire.ApprovalStatus(v)
			if !validStatus(req.Status) {
				fail(r.Context(), w, &wire.Error{Code: wire.CodeInvalid, Field: "status",
					Message: "status must be one of pending, approved, rejected, expired, superseded"})
				return
			}
		}
		if v, ok := q["limit"]; ok {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxListLimit {
				fail(r.Context(), w, &wire.Error{Code: wire.CodeInvalid, Field: "limit",
					Message: "limit must be a whole number from 1 to " + strconv.Itoa(maxListLimit)})
				return
			}
			req.Limit = n
		}
		if v, ok := q["q"]; ok {
			if len(v) > wire.MaxApprovalQueryBytes || hasControl(v) || !utf8.ValidString(v) {
				fail(r.Context(), w, &wire.Error{Code: wire.CodeInvalid, Field: "q",
					Message: "q must be UTF-8 text without control characters, of at most " + strconv.Itoa(wire.MaxApprovalQueryBytes) + " bytes"})
				return
			}
			req.Query = v
		}
		if v, ok := q["cursor"]; ok {
			if len(v) > maxCursorBytes {
				fail(r.Context(), w, &wire.Error{Code: wire.CodeInvalid, Field: "cursor",
					Message: "cursor must be the next_cursor of the previous page"})
				return
			}
			req.Cursor = v
		}
		if v, ok := q["brief"]; ok {
			b, err := strconv.ParseBool(v)
			if err != nil {
				fail(r.Context(), w, &wire.Error{Code: wire.CodeInvalid, Field: "brief", Message: "brief must be true or false"})
				return
			}
			req.Brief = b
		}
		annotate(r.Context(), slog.String("status_filter", string(req.Status)))
		serveCall(w, r, d, subjects.APIApprovalList, req)
	})
}

// handleApprovalGet answers GET /v1/approvals/{id}.
func handleApprovalGet(d deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := approvalID(w, r)
		if !ok {
			return
		}
		serveCall(w, r, d, subjects.APIApprovalGet, wire.ApprovalGetRequest{ApprovalID: id})
	})
}

// The bodies of POST /v1/approvals/{id}/approve, …/edit and …/reject.
type (
	approveBody struct {
		By string `json:"by"`
	}
	editBody struct {
		By     string          `json:"by"`
		Params json.RawMessage `json:"params"`
	}
	rejectBody struct {
		By     string `json:"by"`
		Reason string `json:"reason"`
	}
)

// handleApprovalDecide answers POST /v1/approvals/{id}/<decision>: n8n
// records a human's decision made elsewhere (a chat button, a form), as
// "n8n:<by>".
func handleApprovalDecide(d deps, decision wire.ApprovalDecision) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := approvalID(w, r)
		if !ok {
			return
		}
		body, ok := readJSONBody(w, r)
		if !ok {
			return
		}
		req, err := decodeDecideBody(id, body, decision)
		if err != nil {
			fail(r.Context(), w, err)
			return
		}
		annotate(r.Context(), slog.String("decision", string(decision)))
		serveCall(w, r, d, subjects.APIApprovalDecide, req)
	})
}

// decodeDecideBody decodes the body of a decision strictly and checks it,
// naming the offending field as n8n sent it.
func decodeDecideBody(id string, body []byte, decision wire.ApprovalDecision) (wire.ApprovalDecideRequest, error) {
	req := wire.ApprovalDecideRequest{ApprovalID: id, Decision: decision}
	var (
		by     string
		params json.RawMessage
	)
	var err error
	switch decision {
	case wire.DecisionApprove:
		var b approveBody
		err = wire.DecodeAPI(body, &b)
		by = b.By
	case wire.DecisionEdit:
		var b editBody
		err = wire.DecodeAPI(body, &b)
		by, params = b.By, b.Params
	case wire.DecisionReject:
		var b rejectBody
		err = wire.DecodeAPI(body, &b)
		by, req.Reason = b.By, b.Reason
	}
	if err != nil {
		return req, err
	}
	if err := checkBy(by); err != nil {
		return req, err
	}
	req.By = "n8n:" + by
	switch decision {
	case wire.DecisionEdit:
		if p := bytes.TrimSpace(params); len(p) == 0 || p[0] != '{' {
			return req, &wire.Error{Code: wire.CodeInvalid, Field: "params",
				Message: "params is required for an edit: an object with the full edited parameters"}
		}
		req.Edited = params
	case wire.DecisionReject:
		if err := checkReason(req.Reason); err != nil {
			return req, err
		}
	}
	// The brain's own rules, checked early.
	if err := req.Validate(); err != nil {
		return req, err
	}
	return req, nil
}

func checkBy(by string) error {
	if by == "" || len(by) > maxByBytes || hasControl(by) {
		return &wire.Error{Code: wire.CodeInvalid, Field: "by",
			Message: "by is required: who decided, at most " + strconv.Itoa(maxByBytes) + " bytes without control characters"}
	}
	return nil
}

func checkReason(reason string) error {
	if strings.TrimSpace(reason) == "" || len(reason) > maxReasonBytes {
		return &wire.Error{Code: wire.CodeInvalid, Field: "reason",
			Message: "reason is required for a rejection, at most " + strconv.Itoa(maxReasonBytes) + " bytes"}
	}
	return nil
}

// handleReport answers GET /v1/report?since=<RFC 3339>.
func handleReport(d deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q, err := strictQuery(r.URL.RawQuery, "since")
		if err != nil {
			fail(r.Context(), w, err)
			return
		}
		var req wire.ReportRequest
		if v, ok := q["since"]; ok {
			since, err := time.Parse(time.RFC3339, v)
			if err != nil {
				fail(r.Context(), w, &wire.Error{Code: wire.CodeInvalid, Field: "since",
					Message: "since must be an RFC 3339 time such as 2026-01-31T00:00:00Z"})
				return
			}
			req.Since = &since
		}
		serveCall(w, r, d, subjects.APIReport, req)
	})
}

// serveCall calls a tenant API method and answers with the brain's reply
// body or its error.
func serveCall(w http.ResponseWriter, r *http.Request, d deps, method string, req any) {
	body, err := d.brain.Call(r.Context(), method, req)
	if err != nil {
		fail(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

// approvalID reads the {id} of a route and answers 400 unless it is a UUID.
func approvalID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if !validUUID(id) {
		fail(r.Context(), w, &wire.Error{Code: wire.CodeInvalid, Field: "id",
			Message: "the approval id must be a lowercase UUID, as the turn's action.approval_id"})
		return "", false
	}
	annotate(r.Context(), slog.String("approval_id", id))
	return id, true
}

// readJSONBody reads a JSON request body within wire.MaxAPIBytes; it
// answers the error itself when it returns false.
func readJSONBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if refuseBodyType(w, r) {
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, wire.MaxAPIBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			fail(r.Context(), w, &wire.Error{Code: wire.CodeInvalid, Reason: wire.ReasonTooLarge,
				Message: "the body is larger than " + strconv.Itoa(wire.MaxAPIBytes) + " bytes"})
			return nil, false
		}
		fail(r.Context(), w, &wire.Error{Code: wire.CodeInvalid, Message: "the body could not be read"})
		return nil, false
	}
	return body, true
}

// maxQueryNameBytes bounds a query parameter's name in an error and a log.
const maxQueryNameBytes = 64

// strictQuery parses a query string as strictly as a body: only the
// allowed parameters, each at most once.
func strictQuery(raw string, allowed ...string) (map[string]string, error) {
	vals, err := url.ParseQuery(raw)
	if err != nil {
		return nil, &wire.Error{Code: wire.CodeInvalid, Message: "the query string is malformed"}
	}
	out := make(map[string]string, len(vals))
	for k, vs := range vals {
		known := false
		for _, a := range allowed {
			known = known || a == k
		}
		// The name is the client's: escaped and cut before it is returned
		// and logged.
		name := wire.Clip(k, maxQueryNameBytes)
		switch {
		case !known:
			return nil, &wire.Error{Code: wire.CodeInvalid, Field: name, Message: `unknown query parameter "` + name + `"`}
		case len(vs) > 1:
			return nil, &wire.Error{Code: wire.CodeInvalid, Field: name, Message: `query parameter "` + name + `" is repeated`}
		}
		out[k] = vs[0]
	}
	return out, nil
}

func validStatus(s wire.ApprovalStatus) bool {
	for _, v := range approvalStatuses {
		if s == v {
			return true
		}
	}
	return false
}

// validUUID reports whether s is a UUID in its canonical lowercase form,
// as the brain writes approval ids.
func validUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

func hasControl(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			return true
		}
	}
	return false
}

// callJSON calls a tenant API method and decodes its reply into rep. The
// reply comes from the brain, which the edge trusts to speak the wire
// types, so unknown fields (a newer brain) are ignored here.
func callJSON(ctx context.Context, b brainClient, method string, req, rep any) error {
	body, err := b.Call(ctx, method, req)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, rep); err != nil {
		return internal(err, "the brain's reply is unreadable")
	}
	return nil
}
