package edge

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"n8nbrain/internal/telemetry"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// brainClient is what the handlers need from the brain: submit a turn and
// wait for its answer, read a turn's stored answer, and call the tenant
// API. Errors carry a *wire.Error (wire.ErrorOf finds it); the NATS relay
// implements it.
type brainClient interface {
	// Submit relays the turn with the given key, canonical payload and
	// fingerprint and waits for its answer, or reports it pending.
	Submit(ctx context.Context, key string, payload []byte, fp string) (turnOutcome, error)
	// Result returns the stored answer of a turn for the payload with
	// fingerprint fp; not_found when there is none, conflict when the turn
	// was decided for another payload.
	Result(ctx context.Context, key, fp string) (turnOutcome, error)
	// Call calls a tenant API method (subjects.APIApprovalList, …) with
	// req and returns the brain's reply body, exactly.
	Call(ctx context.Context, method string, req any) ([]byte, error)
}

// turnOutcome is an answer to a turn that is not an error.
type turnOutcome struct {
	// Body is the decision envelope to serve, exactly; nil when Pending.
	Body []byte
	// Replayed is set when Body is a stored decision marked as a replay.
	Replayed bool
	// Pending: the turn is accepted but not decided within the wait.
	Pending bool
}

// deps is everything the handlers use, built by Serve.
type deps struct {
	brain     brainClient
	token     string
	connected func() bool
	// natsErr says what is wrong with the NATS connection for good (closed,
	// or the credential refused); nil while it is fine or reconnecting.
	natsErr func() error
	logger  *slog.Logger
	// auth signs reviewers in and out; nil when the review page is off.
	auth *reviewAuth
	// csrfKey signs the review page's forms (see review.go).
	csrfKey []byte
	// clock is the review page's time zone and clock.
	clock *reviewClock
	// delivering: this edge passes the brain's events to n8n (a webhook
	// is set), so an approval is carried out from here.
	delivering bool
	// metrics are observed by every route; tracer is nil when tracing is off.
	metrics *metrics
	tracer  trace.TracerProvider
}

// routes lists every HTTP route of the edge.
func routes(mux *http.ServeMux, d deps) {
	mux.Handle("POST /v1/turns", logged(d, "POST /v1/turns", requireToken(d, handleTurnSubmit(d))))
	mux.Handle("GET /v1/turns/{key}", logged(d, "GET /v1/turns/{key}", requireToken(d, handleTurnGet(d))))

	// The tenant API for n8n: approvals and the outcome report.
	mux.Handle("GET /v1/approvals", logged(d, "GET /v1/approvals", requireToken(d, handleApprovalList(d))))
	mux.Handle("GET /v1/approvals/{id}", logged(d, "GET /v1/approvals/{id}", requireToken(d, handleApprovalGet(d))))
	mux.Handle("POST /v1/approvals/{id}/approve", logged(d, "POST /v1/approvals/{id}/approve",
		requireToken(d, handleApprovalDecide(d, wire.DecisionApprove))))
	mux.Handle("POST /v1/approvals/{id}/edit", logged(d, "POST /v1/approvals/{id}/edit",
		requireToken(d, handleApprovalDecide(d, wire.DecisionEdit))))
	mux.Handle("POST /v1/approvals/{id}/reject", logged(d, "POST /v1/approvals/{id}/reject",
		requireToken(d, handleApprovalDecide(d, wire.DecisionReject))))
	mux.Handle("GET /v1/report", logged(d, "GET /v1/report", requireToken(d, handleReport(d))))

	// The review page, for humans (HTML; a session from the sign-in form).
	mux.Handle("GET /review/login", logged(d, "GET /review/login", reviewPage(d, handleLoginForm(d))))
	mux.Handle("POST /review/login", logged(d, "POST /review/login", reviewPage(d, handleLogin(d))))
	mux.Handle("POST /review/logout", logged(d, "POST /review/logout", requireReviewer(d, handleLogout(d))))
	mux.Handle("GET /review", logged(d, "GET /review", requireReviewer(d, handleReviewList(d))))
	// Typed with a trailing slash, the address still finds the page.
	mux.Handle("GET /review/{$}", logged(d, "GET /review/{$}", http.RedirectHandler("/review", http.StatusMovedPermanently)))
	mux.Handle("GET /review/approvals/{id}", logged(d, "GET /review/approvals/{id}", requireReviewer(d, handleReviewApproval(d))))
	mux.Handle("POST /review/approvals/{id}", logged(d, "POST /review/approvals/{id}", requireReviewer(d, handleReviewDecide(d))))
	mux.Handle("GET /review/assets/{name}", loggedAt(d, slog.LevelDebug, "GET /review/assets/{name}", handleReviewAsset()))
	// Any other address under the page is a page of its own saying so, not
	// the API's JSON 404.
	mux.Handle("GET /review/", logged(d, "GET /review/", reviewPage(d, handleReviewNotFound())))

	// Probes run every few seconds: their lines are Debug, not Info.
	mux.Handle("GET /healthz", loggedAt(d, slog.LevelDebug, "GET /healthz", handleHealthz(d)))
	mux.Handle("GET /readyz", loggedAt(d, slog.LevelDebug, "GET /readyz", handleReadyz(d)))
}

// newHandler is the edge's whole HTTP handler: the routes, plus JSON
// answers for the mux's own 404 and 405.
func newHandler(d deps) http.Handler {
	mux := http.NewServeMux()
	routes(mux, d)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h, pattern := mux.Handler(r); pattern == "" {
			// No route: the mux would answer 404 or 405 in plain text.
			// Run it for its status and Allow header, answer in JSON.
			probe := &headerProbe{header: http.Header{}}
			h.ServeHTTP(probe, r)
			if allow := probe.header.Get("Allow"); allow != "" {
				w.Header().Set("Allow", allow)
			}
			status := probe.status
			e := &wire.Error{Code: wire.CodeNotFound, Message: "no such route: " + r.URL.Path}
			if status == http.StatusMethodNotAllowed {
				e = &wire.Error{Code: wire.CodeInvalid, Message: "method " + r.Method + " is not allowed on " + r.URL.Path}
			} else {
				status = http.StatusNotFound
			}
			writeErrorStatus(w, status, e)
			d.logger.LogAttrs(r.Context(), slog.LevelInfo, "http request",
				logSafe([]slog.Attr{slog.String("route", ""), slog.String("method", r.Method), slog.Int("status", status)})...)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// headerProbe records what the mux's fallback handlers would answer.
type headerProbe struct {
	header http.Header
	status int
}

func (p *headerProbe) Header() http.Header         { return p.header }
func (p *headerProbe) Write(b []byte) (int, error) { return len(b), nil }
func (p *headerProbe) WriteHeader(status int)      { p.status = status }

// handleTurnSubmit relays a turn to the brain and answers with its decision,
// its error, or 202 with the URL to fetch the decision later.
func handleTurnSubmit(d deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refuseBodyType(w, r) {
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, wire.MaxTurnBytes))
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				fail(r.Context(), w, &wire.Error{Code: wire.CodeInvalid, Reason: wire.ReasonTooLarge,
					Message: "the turn is larger than " + strconv.Itoa(wire.MaxTurnBytes) + " bytes"})
				return
			}
			fail(r.Context(), w, &wire.Error{Code: wire.CodeInvalid, Message: "the body could not be read"})
			return
		}
		req, err := wire.DecodeTurnSubmitRequest(body)
		if err != nil {
			fail(r.Context(), w, err)
			return
		}
		key := subjects.TurnKey(req.WorkItemID, req.Turn)
		annotate(r.Context(), slog.String("turn_key", key), slog.Int("turn", req.Turn))
		payload, err := encodeTurn(req)
		if err != nil { // cannot happen for a decoded request
			fail(r.Context(), w, internal(err, "internal error"))
			return
		}
		if len(payload) > maxPublishedTurn {
			fail(r.Context(), w, &wire.Error{Code: wire.CodeInvalid, Reason: wire.ReasonTooLarge,
				Message: fmt.Sprintf("the turn is %d bytes once encoded for the brain, over the %d a turn may have "+
					"(the %d-byte limit less room for its headers)", len(payload), maxPublishedTurn, wire.MaxTurnBytes)})
			return
		}
		w.Header().Set("X-Turn-Key", key)

		d.metrics.observeStage(StageIntake, time.Since(requestStart(r.Context())))
		defer d.metrics.turnStarted()()
		fp := wire.Fingerprint(req)
		out, err := d.brain.Submit(r.Context(), key, payload, fp)
		if err != nil {
			fail(r.Context(), w, err)
			return
		}
		if out.Pending {
			annotate(r.Context(), slog.Bool("pending", true))
			writePending(w, key, fp)
			return
		}
		annotate(r.Context(), slog.Bool("replayed", out.Replayed))
		writeJSON(w, http.StatusOK, out.Body)
	})
}

// maxPublishedTurn is the largest turn payload the edge publishes: the
// tenant account's NATS payload limit (wire.MaxTurnBytes, headers included)
// less room for the headers.
const maxPublishedTurn = wire.MaxTurnBytes - 1<<10

// encodeTurn is the canonical payload the edge publishes: compact JSON, with
// '<', '>' and '&' as they are (e-mail ids and bodies are full of them; the
// escapes would make a turn up to six times larger), and U+2028 and U+2029
// too: the encoder escapes them for JavaScript whatever it is told, which
// doubled a turn full of them past the limit its fields were within. So
// the payload is never longer than a compact form of what n8n sent.
func encodeTurn(req *wire.TurnSubmitRequest) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(req); err != nil {
		return nil, err
	}
	return rawSeparators(bytes.TrimSuffix(buf.Bytes(), []byte("\n"))), nil
}

// rawSeparators writes the escapes \u2028 and \u2029 of encoded JSON as the
// characters themselves; every other escape is kept as it is.
func rawSeparators(b []byte) []byte {
	if !bytes.Contains(b, []byte(`\u202`)) {
		return b
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			out = append(out, b[i])
			continue
		}
		if i+5 < len(b) && b[i+1] == 'u' && string(b[i+2:i+5]) == "202" && (b[i+5] == '8' || b[i+5] == '9') {
			out = utf8.AppendRune(out, 0x2028+rune(b[i+5]-'8'))
			i += 5
			continue
		}
		// \\, \", \n, … or the start of another \uXXXX, whose digits follow.
		out = append(out, b[i], b[i+1])
		i++
	}
	return out
}

// writePending answers 202. The result URL carries the payload's
// fingerprint: the decision it fetches is served only for that payload.
func writePending(w http.ResponseWriter, key, fp string) {
	url := "/v1/turns/" + key + "?fingerprint=" + fp
	body, _ := json.Marshal(wire.TurnPendingReply{
		Status:    "pending",
		TurnKey:   key,
		ResultURL: url,
		Message: "the turn is accepted and the brain is still deciding; GET result_url for the decision, " +
			"or re-submit the same turn (it is idempotent)",
	})
	w.Header().Set("Location", url)
	w.Header().Set("Retry-After", strconv.Itoa(defaultRetryAfter))
	writeJSON(w, http.StatusAccepted, body)
}

// handleTurnGet answers with a turn's stored decision or error.
func handleTurnGet(d deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		if !subjects.ValidTurnKey(key) {
			fail(r.Context(), w, &wire.Error{Code: wire.CodeInvalid, Field: "key",
				Message: "the turn key must be the 32 lowercase hex characters of X-Turn-Key or turn_key"})
			return
		}
		annotate(r.Context(), slog.String("turn_key", key))
		q, err := strictQuery(r.URL.RawQuery, "fingerprint")
		if err != nil {
			fail(r.Context(), w, err)
			return
		}
		fp := q["fingerprint"]
		if !validFingerprint(fp) {
			what := "fingerprint is required"
			if fp != "" {
				what = "fingerprint is not one"
			}
			fail(r.Context(), w, &wire.Error{Code: wire.CodeInvalid, Field: "fingerprint",
				Message: what + ": send the 64 lowercase hex characters in the result_url of the 202, " +
					"which bind the stored decision to the payload that was submitted"})
			return
		}
		w.Header().Set("X-Turn-Key", key)
		out, err := d.brain.Result(r.Context(), key, fp)
		if err != nil {
			fail(r.Context(), w, err)
			return
		}
		annotate(r.Context(), slog.Bool("replayed", out.Replayed))
		writeJSON(w, http.StatusOK, out.Body)
	})
}

// validFingerprint reports whether s is a request fingerprint (wire.Fingerprint).
func validFingerprint(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// fail answers with err's wire error and notes it, with the full error
// when it has a cause, for the request's log line.
func fail(ctx context.Context, w http.ResponseWriter, err error) {
	failStatus(ctx, w, 0, err)
}

// failStatus is fail with an explicit HTTP status; 0 means the table's.
func failStatus(ctx context.Context, w http.ResponseWriter, status int, err error) {
	e := noteError(ctx, err)
	if status == 0 {
		status = httpStatus(e)
	}
	writeErrorStatus(w, status, e)
}

// noteError notes err for the request's log line, with the full error when
// it has a cause, and returns its wire error.
func noteError(ctx context.Context, err error) *wire.Error {
	e := wire.ErrorOf(err)
	attrs := []slog.Attr{slog.String("error_code", string(e.Code))}
	if e.Reason != "" {
		attrs = append(attrs, slog.String("error_reason", e.Reason))
	}
	if e.Field != "" {
		attrs = append(attrs, slog.String("error_field", e.Field))
	}
	var ce *causeError
	if errors.As(err, &ce) {
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	annotate(ctx, attrs...)
	return e
}

// handleHealthz is the liveness probe. A NATS connection that is down but
// reconnecting is not a reason to restart the edge; one closed for good, or
// whose credential the server refuses, is: neither mends itself.
func handleHealthz(d deps) http.Handler {
	body := []byte(`{"status":"ok"}`)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := d.natsErr(); err != nil {
			fail(r.Context(), w, natsUnhealthy(err))
			return
		}
		writeJSON(w, http.StatusOK, body)
	})
}

func handleReadyz(d deps) http.Handler {
	body := []byte(`{"status":"ready"}`)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := d.natsErr(); err != nil {
			fail(r.Context(), w, natsUnhealthy(err))
			return
		}
		if !d.connected() {
			fail(r.Context(), w, &wire.Error{Code: wire.CodeUnavailable, Message: "not connected to NATS"})
			return
		}
		writeJSON(w, http.StatusOK, body)
	})
}

// requireToken answers 401 unless the request carries the edge's bearer
// token. It runs before the body is read.
func requireToken(d deps, next http.Handler) http.Handler {
	// Comparing digests keeps the comparison constant-time whatever the
	// length of what was presented.
	want := sha256.Sum256([]byte(d.token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		headers := r.Header.Values("Authorization")
		if len(headers) != 1 {
			fail(r.Context(), w, &wire.Error{Code: wire.CodeUnauthorized,
				Message: "send one Authorization header with the edge's token: Authorization: Bearer <token>"})
			return
		}
		scheme, token, ok := strings.Cut(headers[0], " ")
		token = strings.TrimSpace(token)
		if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
			fail(r.Context(), w, &wire.Error{Code: wire.CodeUnauthorized,
				Message: "send the edge's token as Authorization: Bearer <token>"})
			return
		}
		if got := sha256.Sum256([]byte(token)); subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			fail(r.Context(), w, &wire.Error{Code: wire.CodeUnauthorized,
				Message: "the bearer token is not this edge's token (EDGE_TOKEN): check n8n's Header Auth credential"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// refuseBodyType answers 415 unless the body is JSON as sent (UTF-8, no
// Content-Encoding), and reports whether it answered.
func refuseBodyType(w http.ResponseWriter, r *http.Request) bool {
	if !isJSON(r.Header.Get("Content-Type")) {
		failStatus(r.Context(), w, http.StatusUnsupportedMediaType, &wire.Error{
			Code: wire.CodeInvalid, Field: "Content-Type",
			Message: "the body must be JSON: send Content-Type: application/json",
		})
		return true
	}
	if ce := r.Header.Values("Content-Encoding"); len(ce) > 0 && (len(ce) > 1 || !strings.EqualFold(strings.TrimSpace(ce[0]), "identity")) {
		failStatus(r.Context(), w, http.StatusUnsupportedMediaType, &wire.Error{
			Code: wire.CodeInvalid, Field: "Content-Encoding",
			Message: "the body must be sent as it is: compressed bodies (Content-Encoding) are not accepted",
		})
		return true
	}
	return false
}

// isJSON reports whether a Content-Type is JSON; a charset, if any, must be UTF-8.
func isJSON(contentType string) bool {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || mt != "application/json" {
		return false
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return false
		}
	}
	return true
}

// requestLog collects what a handler learnt for the one log line of a request.
type requestLog struct {
	attrs []slog.Attr
	start time.Time
}

// requestStart is when the request's handling began (now, outside one).
func requestStart(ctx context.Context) time.Time {
	if rl, ok := ctx.Value(requestLogKey{}).(*requestLog); ok {
		return rl.start
	}
	return time.Now()
}

type requestLogKey struct{}

// annotate adds attributes to the request's log line. Never the body, the
// token or the work item id: the turn key stands for the work item.
func annotate(ctx context.Context, attrs ...slog.Attr) {
	if rl, ok := ctx.Value(requestLogKey{}).(*requestLog); ok {
		rl.attrs = append(rl.attrs, attrs...)
	}
}

// logged writes one Info line per request with its route, status and duration.
func logged(d deps, route string, next http.Handler) http.Handler {
	return loggedAt(d, slog.LevelInfo, route, next)
}

// It also records the request's metrics and, with tracing on, makes it a
// span (a child of n8n's when the request carries a W3C traceparent), whose
// trace_id the log line carries. Probes (Debug lines) are not traced.
func loggedAt(d deps, level slog.Level, route string, next http.Handler) http.Handler {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rl := &requestLog{start: start}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), requestLogKey{}, rl)))
		took := time.Since(start)
		d.metrics.request(route, sw.status, rl.attrs, took)
		if !d.logger.Enabled(r.Context(), level) {
			return
		}
		attrs := append([]slog.Attr{
			slog.String("route", route),
			slog.Int("status", sw.status),
			slog.Int64("duration_ms", took.Milliseconds()),
		}, rl.attrs...)
		if a, ok := telemetry.LogAttr(r.Context()); ok {
			attrs = append(attrs, a)
		}
		d.logger.LogAttrs(r.Context(), level, "http request", logSafe(attrs)...)
	})
	if d.tracer == nil || level < slog.LevelInfo {
		return h
	}
	return otelhttp.NewHandler(h, route, otelhttp.WithTracerProvider(d.tracer), otelhttp.WithPropagators(telemetry.Propagator),
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()))
}

// maxLogValue bounds every string of a request's log line. What a handler
// notes is meant to be short (codes, keys, ids), but some of it derives from
// what the client sent (a field path names its keys, the method of an
// unknown route is the client's); a cap here keeps a hostile request from
// writing a 60 KB line, and Clip escapes what a terminal would act on.
const maxLogValue = 512

// logSafe clips every string attribute to maxLogValue.
func logSafe(attrs []slog.Attr) []slog.Attr {
	for i, a := range attrs {
		if a.Value.Kind() == slog.KindString {
			attrs[i].Value = slog.StringValue(wire.Clip(a.Value.String(), maxLogValue))
		}
	}
	return attrs
}

type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(status int) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = status, true
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
