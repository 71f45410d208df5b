package brain

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"go.opentelemetry.io/otel/trace"

	"n8nbrain/brain/internal/fair"
	"n8nbrain/brain/internal/guard"
	"n8nbrain/brain/internal/store"
	"n8nbrain/brain/internal/tenancy"
	"n8nbrain/internal/telemetry"
	"n8nbrain/registry"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// apiServer answers the tenant API (brain.api.<account>.<method>, listed in
// consume.go). Each tenant's calls arrive on a subscription of their own
// (queue group "brain", shared by every replica; opened and closed with the
// tenant's turn consumer, see consumers.go), so a flood from one tenant
// queues in its own subscription, not in front of another's calls. Calls
// are then queued per tenant and answered by cfg.Workers workers round
// robin between tenants, at most cfg.TenantWorkers of one tenant at once; a
// tenant with apiMaxQueued calls already waiting is answered rate_limited,
// and a tenant that keeps being refused is paused (see tenantAPI).
type apiServer struct {
	b     *brain
	sched *fair.Scheduler[*nats.Msg]
	wg    sync.WaitGroup
}

func (b *brain) newAPIServer() *apiServer {
	a := &apiServer{b: b, sched: fair.New[*nats.Msg](b.cfg.TenantWorkers)}
	for range b.cfg.Workers {
		a.wg.Go(func() {
			for {
				acc, m, ok := a.sched.Next()
				if !ok {
					return
				}
				b.handleAPI(m)
				a.sched.Done(acc)
			}
		})
	}
	return a
}

// subscribe opens the API subscription of one tenant account, with its
// flood breaker.
func (a *apiServer) subscribe(account string, id registry.TenantID) (*tenantAPI, error) {
	t := &tenantAPI{a: a, account: account, id: id}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.open(); err != nil {
		return nil, err
	}
	return t, nil
}

// The flood breaker. Every call reaches the replica over its NATS
// connection before it can be refused, so refusing a flood (rate_limited,
// too large) does not stop its bytes: a tenant sending near-maximum
// payloads from many connections can outrun what the replica reads, and
// the server then cuts the replica's connection as a slow consumer. A
// tenant refused floodRefusals times within floodWindow (a call too large
// counts oversizedWeight times) has its subscription closed instead, so
// the server drops the flood at the source (its callers see no responders,
// the edge answers 503), and opened again after a pause that doubles while
// the flood goes on.
const (
	floodWindow   = time.Second
	floodRefusals = 64
	floodPause    = 2 * time.Second
	floodMaxPause = time.Minute
)

// tenantAPI is one tenant account's API subscription on this replica.
type tenantAPI struct {
	a       *apiServer
	account string
	id      registry.TenantID

	mu       sync.Mutex
	sub      *nats.Subscription // nil while paused
	closed   bool
	resume   *time.Timer
	window   time.Time // start of the current refusal window
	refused  int       // refusals in it, weighted
	pause    time.Duration
	pausedAt time.Time
}

// open subscribes; t.mu is held.
func (t *tenantAPI) open() error {
	sub, err := t.a.b.apiNC.QueueSubscribe(subjects.APISubject(t.account), subjects.APIQueue, t.receive)
	if err != nil {
		return err
	}
	t.sub = sub
	return nil
}

// receive queues a call for the workers, or refuses it at once.
func (t *tenantAPI) receive(m *nats.Msg) {
	e, weight := wire.CheckAPISize(m.Data), oversizedWeight
	switch {
	case e != nil:
	case !t.a.sched.TryPush(t.account, m, apiMaxQueued):
		e, weight = &wire.Error{Code: wire.CodeRateLimited, RetryAfter: 1,
			Message: "this tenant has too many API calls waiting at the brain; retry in a moment"}, 1
	default:
		return
	}
	t.a.b.respondAPIError(m, e)
	t.refuse(weight)
}

// oversizedWeight is what a call beyond wire.MaxAPIBytes counts towards
// floodRefusals: the edge never sends one (it refuses a larger body over
// HTTP), and each costs up to four times the bytes of a valid call, so four
// of them in a window pause the tenant.
const oversizedWeight = floodRefusals / 4

// refuse counts a refusal and pauses the subscription at the threshold.
func (t *tenantAPI) refuse(weight int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if now.Sub(t.window) > floodWindow {
		t.window, t.refused = now, 0
	}
	t.refused += weight
	if t.refused < floodRefusals || t.sub == nil || t.closed {
		return
	}
	_ = t.sub.Unsubscribe()
	t.sub = nil
	if now.Sub(t.pausedAt) > 2*t.pause+floodWindow {
		t.pause = 0 // calm since the last pause: start over
	}
	t.pause = min(max(2*t.pause, floodPause), floodMaxPause)
	t.pausedAt = now
	t.a.b.inst.apiPauses.WithLabelValues(string(t.id)).Inc()
	t.a.b.log.Warn("tenant flooding the API: its API calls are not taken on this replica for a while",
		"tenant_id", t.id, "refusals_weighted", t.refused, "window", floodWindow, "pause", t.pause)
	t.resume = time.AfterFunc(t.pause, t.reopen)
}

// reopen ends a pause.
func (t *tenantAPI) reopen() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.sub != nil {
		return
	}
	t.window, t.refused = time.Time{}, 0
	if err := t.open(); err != nil {
		t.a.b.log.Warn("subscribe to a tenant's API after a pause; retrying", "tenant_id", t.id, "error", err)
		t.resume = time.AfterFunc(floodPause, t.reopen)
	}
}

// close closes the subscription for good; drain still hands the calls
// already received to the workers.
func (t *tenantAPI) close(drain bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	if t.resume != nil {
		t.resume.Stop()
	}
	switch {
	case t.sub == nil:
		return nil
	case drain:
		return t.sub.Drain()
	default:
		return t.sub.Unsubscribe()
	}
}

// stop ends the workers once the subscriptions are closed. Calls still
// queued get no answer: their requesters time out and ask again, and
// another replica answers.
func (a *apiServer) stop() {
	a.sched.Close()
	a.wg.Wait()
}

// apiMaxQueued bounds one tenant's API calls waiting on a replica.
const apiMaxQueued = 256

// respondAPIError answers an API request with an error.
func (b *brain) respondAPIError(m *nats.Msg, e *wire.Error) {
	out := nats.NewMsg(m.Reply)
	out.Header.Set(wire.HeaderStatus, wire.StatusError)
	out.Data, _ = json.Marshal(wire.ErrorReply{Error: e})
	if err := m.RespondMsg(out); err != nil {
		b.log.Warn("respond to API call", "error", err)
	}
}

func (b *brain) handleAPI(m *nats.Msg) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	account, method, err := subjects.ParseAPI(m.Subject)
	if err != nil || !nkeys.IsValidPublicAccountKey(account) {
		b.log.Error("API request on a malformed subject; dropped", "error", err)
		return
	}
	ctx, span := b.tracer.Start(telemetry.Extract(ctx, m.Header), "brain api "+apiMethodLabel(method), trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	log := telemetry.With(ctx, b.log.With("api_method", method))
	var reply any
	t, ok := b.dir.ByAccount(account)
	tenant := account
	if ok {
		tenant = string(t.ID)
	}
	result := "ok"
	defer func() {
		b.inst.apiCalls.WithLabelValues(tenant, apiMethodLabel(method), result).Observe(time.Since(start).Seconds())
	}()
	switch {
	case !ok:
		err = &wire.Error{Code: wire.CodeForbidden, Reason: wire.ReasonUnknownTenant, Message: "this NATS account is not a tenant of the brain"}
	case t.Status != registry.TenantStatusActive:
		err = &wire.Error{Code: wire.CodeForbidden, Reason: wire.ReasonTenantDisabled, Message: "the tenant is disabled"}
	default:
		log = log.With("tenant_id", t.ID)
		reply, err = b.safeDispatchAPI(ctx, t, method, m.Data)
		if store.PlanChanged(err) {
			// A migration changed a column this call reads; its statement
			// is prepared again on the next try, and nothing was written.
			reply, err = b.safeDispatchAPI(ctx, t, method, m.Data)
		}
		err = b.dir.Check(t, err)
		switch method {
		case subjects.APIApprovalList, subjects.APIApprovalGet, subjects.APIApprovalDecide, subjects.APIEventAck:
			// Someone is looking at or deciding approvals, or an event was
			// delivered: count what is pending again.
			b.pending.kick(t)
		}
	}
	out := nats.NewMsg(m.Reply)
	if err != nil {
		var we *wire.Error
		switch {
		case errors.Is(err, tenancy.ErrAtCapacity):
			err = &wire.Error{Code: wire.CodeUnavailable, RetryAfter: 5, Message: "the brain is at its database connection limit; retry shortly"}
		case !errors.As(err, &we) && store.Transient(err):
			// A wire error already says what is wrong: a tenancy.LoginError
			// (TLS refused) also wraps the connect error that Transient
			// would otherwise take for a passing outage.
			log.Warn("API call: the tenant's database did not serve it", "error", err)
			err = &wire.Error{Code: wire.CodeUnavailable, RetryAfter: 2, Message: "the tenant's database did not answer this call " +
				"(restarting, out of connections or briefly locked); retry shortly"}
		}
		e := wire.ErrorOf(err)
		result = string(e.Code)
		telemetry.End(span, err)
		if e.Code == wire.CodeInternal {
			log.Error("API call failed", "error", err)
		}
		out.Header.Set(wire.HeaderStatus, wire.StatusError)
		out.Data, _ = json.Marshal(wire.ErrorReply{Error: e})
	} else {
		out.Header.Set(wire.HeaderStatus, wire.StatusOK)
		if out.Data, err = json.Marshal(reply); err != nil {
			log.Error("encode API reply", "error", err)
			return
		}
	}
	respondAPI(m, out, log)
}

// respondAPI sends out as m's answer. One larger than the server's
// max_payload is answered with an error saying so: the caller would
// otherwise wait out its timeout and retry a call that cannot succeed.
func respondAPI(m, out *nats.Msg, log *slog.Logger) {
	err := m.RespondMsg(out)
	if errors.Is(err, nats.ErrMaxPayload) {
		log.Error("API reply larger than the NATS server's max_payload", "bytes", len(out.Data))
		out.Header.Set(wire.HeaderStatus, wire.StatusError)
		out.Data, _ = json.Marshal(wire.ErrorReply{Error: &wire.Error{Code: wire.CodeInternal,
			Message: "the reply (" + strconv.Itoa(len(out.Data)) + " bytes) is larger than the NATS server's max_payload; ask for less (a smaller limit, or brief)"}})
		err = m.RespondMsg(out)
	}
	if err != nil {
		log.Warn("respond to API call", "error", err)
	}
}

// apiMethodLabel is method when it is one of the API's, else "unknown": a
// label never takes a value a client chose.
func apiMethodLabel(method string) string {
	switch method {
	case subjects.APIApprovalList, subjects.APIApprovalGet, subjects.APIApprovalDecide, subjects.APIEventAck,
		subjects.APIReport, subjects.APITenantLimits:
		return method
	}
	return "unknown"
}

// safeDispatchAPI is dispatchAPI with a panic in the brain's code (a bug)
// recovered, logged with its stack and answered internal, instead of taking
// the replica down.
func (b *brain) safeDispatchAPI(ctx context.Context, t *registry.Tenant, method string, data []byte) (reply any, err error) {
	defer func() {
		if r := recover(); r != nil {
			guard.Log(b.log, r, "an API call panicked, a bug in the brain; it is answered internal", "tenant_id", string(t.ID),
				"api_method", apiMethodLabel(method))
			reply, err = nil, panicked()
		}
	}()
	if h := b.cfg.Hooks.BeforeAPIFunc; h != nil {
		h(t.ID, method)
	}
	return b.dispatchAPI(ctx, t, method, data)
}

// dispatchAPI decodes a request strictly and calls the method's handler.
func (b *brain) dispatchAPI(ctx context.Context, t *registry.Tenant, method string, data []byte) (any, error) {
	a := b.approvals
	switch method {
	case subjects.APIApprovalList:
		return call(ctx, t, data, a.List)
	case subjects.APIApprovalGet:
		return call(ctx, t, data, a.Get)
	case subjects.APIApprovalDecide:
		return call(ctx, t, data, a.Decide)
	case subjects.APIEventAck:
		return call(ctx, t, data, a.AckEvent)
	case subjects.APIReport:
		return call(ctx, t, data, a.Report)
	case subjects.APITenantLimits:
		return call(ctx, t, data, tenantLimits)
	}
	return nil, &wire.Error{Code: wire.CodeNotFound, Message: "unknown API method " + method}
}

func call[Req, Rep any](ctx context.Context, t *registry.Tenant, data []byte, fn func(context.Context, *registry.Tenant, *Req) (*Rep, error)) (any, error) {
	var req Req
	if err := wire.DecodeAPI(data, &req); err != nil {
		return nil, err
	}
	return fn(ctx, t, &req)
}

// tenantLimits serves api.tenant.limits: the tenant's quota, from its
// registry row (what provisioning created its streams with).
func tenantLimits(_ context.Context, t *registry.Tenant, _ *wire.TenantLimitsRequest) (*wire.TenantLimitsReply, error) {
	q := t.Quota.WithDefaults()
	return &wire.TenantLimitsReply{MaxTurns: q.Turns, MaxBytes: q.Bytes, WindowSeconds: int64(q.Window / time.Second),
		MaxInflight: q.MaxInflight, MaxTurnBytes: wire.MaxTurnBytes}, nil
}
