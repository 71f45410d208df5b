package brain

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"n8nbrain/brain/internal/tenancy"
	"n8nbrain/registry"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// serveAPI answers the tenant API (brain.api.<account>.<method>, listed in
// consume.go) in a queue group shared by every replica, with at most
// cfg.Workers calls in flight on this replica.
func (b *brain) serveAPI() (*nats.Subscription, error) {
	slots := make(chan struct{}, b.cfg.Workers)
	return b.nc.QueueSubscribe(subjects.APIQueueSubject(), subjects.APIQueue, func(m *nats.Msg) {
		slots <- struct{}{}
		b.inflight.Add(1)
		go func() {
			defer func() { <-slots; b.inflight.Done() }()
			b.handleAPI(m)
		}()
	})
}

func (b *brain) handleAPI(m *nats.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	account, method, err := subjects.ParseAPI(m.Subject)
	if err != nil || !nkeys.IsValidPublicAccountKey(account) {
		b.log.Error("API request on a malformed subject; dropped", "error", err)
		return
	}
	log := b.log.With("api_method", method)
	var reply any
	t, ok := b.dir.ByAccount(account)
	switch {
	case !ok:
		err = &wire.Error{Code: wire.CodeForbidden, Reason: wire.ReasonUnknownTenant, Message: "this NATS account is not a tenant of the brain"}
	case t.Status != registry.TenantStatusActive:
		err = &wire.Error{Code: wire.CodeForbidden, Reason: wire.ReasonTenantDisabled, Message: "the tenant is disabled"}
	default:
		log = log.With("tenant_id", t.ID)
		reply, err = b.dispatchAPI(ctx, t, method, m.Data)
		err = b.dir.Check(t, err)
	}
	out := nats.NewMsg(m.Reply)
	if err != nil {
		if errors.Is(err, tenancy.ErrAtCapacity) {
			err = &wire.Error{Code: wire.CodeUnavailable, RetryAfter: 5, Message: "the brain is at its database connection limit; retry shortly"}
		}
		e := wire.ErrorOf(err)
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
	if err := m.RespondMsg(out); err != nil {
		log.Warn("respond to API call", "error", err)
	}
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
