package brain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"n8nbrain/brain/internal/guard"
	"n8nbrain/brain/internal/store"
	"n8nbrain/brain/internal/tenancy"
	"n8nbrain/brain/internal/turn"
	"n8nbrain/internal/telemetry"
	"n8nbrain/registry"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// Every subject the brain answers, in one place:
//
//	brain.turn.<account>.<key>    TURNS_<account> in the STREAMS account, its durable pull
//	                              consumer "brain" (one per tenant, shared by every
//	                              replica), pulled through the turn-next import    → fair scheduler → handleTurn
//	brain.api.<account>.<method>  core request-reply, queue group "brain", a subscription
//	                              per tenant (api.go)                                  → handleAPI
//	                              approval.list, approval.get, approval.decide, event.ack,
//	                              report.outcomes, tenant.limits
//	brain.due.<account>.<kind>.<id>  SCHEDULES in STREAMS, consumer "brain": a timer fired
//	                              (expiry.next, outbox.next; one of each per tenant)   → handleDue
//
// and every subject it publishes:
//
//	brain.reply.<account>.<key>   through the reply-store import into RESULTS_<account>; the
//	                              stream republishes it to brain.live.<account>.<key>,
//	                              exported to the tenant's reply.<key>
//	brain.event.<account>.<id>    outbox events, exported to the tenant's event.<id> (internal/outbox)
//	brain.sched.<account>.<kind>.<id>  a timer (message schedule) into SCHEDULES, through the
//	                              schedules import (internal/timer)
//	$JS.ACK.<stream>.brain.…      acknowledgements and progress, through the turn-ack import
//
// <account> is written by the NATS server (account token position 3): it is
// the only source of the tenant's identity.

// queued is a turn waiting in the fair scheduler, or being decided.
type queued struct {
	m       jetstream.Msg
	account string
	ackWait time.Duration
	at      time.Time // when this replica received it (zero: unknown)
	holds   int       // how often this delivery was held (held.go)
}

// turnWorkers decides turns from every tenant's consumer with cfg.Workers
// workers, round robin between tenants, at most cfg.TenantWorkers of them on
// one tenant. It returns once the workers run; stop ends them.
func (b *brain) turnWorkers(ctx context.Context) (stop func()) {
	var wg sync.WaitGroup
	for range b.cfg.Workers {
		wg.Go(func() {
			for {
				acc, q, ok := b.sched.Next()
				if !ok {
					return
				}
				// A turn finishes even when shutdown starts (bounded by the grace).
				b.handleTurn(context.WithoutCancel(ctx), q)
				b.sched.Done(acc)
			}
		})
	}
	return wg.Wait
}

// heartbeatQueued tells JetStream, beatsPerAckWait times per shortest ack
// wait, that turns waiting in this replica's queue or held (held.go) are
// alive, so a short ack wait (fast redelivery after a dead replica) never
// redelivers a turn that is merely queued behind others, or waiting for its
// database.
func (b *brain) heartbeatQueued(ctx context.Context) {
	t := time.NewTicker(b.consumers.minAckWait() / beatsPerAckWait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b.sched.Each(func(_ string, q queued) { _ = q.m.InProgress() })
		b.held.each(func(q queued) { _ = q.m.InProgress() })
		t.Reset(b.consumers.minAckWait() / beatsPerAckWait)
	}
}

func (b *brain) handleTurn(ctx context.Context, q queued) {
	m := q.m
	start := time.Now()
	md, err := m.Metadata()
	if err != nil {
		b.log.Error("turn without JetStream metadata; terminated", "error", err)
		_ = m.Term()
		return
	}
	account, key, err := subjects.ParseTurn(m.Subject())
	if err == nil && account != q.account {
		err = fmt.Errorf("subject names account %s, but the turn came from the stream of %s", account, q.account)
	}
	if err == nil && !nkeys.IsValidPublicAccountKey(account) {
		err = fmt.Errorf("token 3 is not an account public key")
	}
	if err != nil {
		// The tenant's edge never publishes such a subject, but anything
		// holding the edge's credentials can (turn.> is its to publish on):
		// the tenant's own doing, with no valid reply subject to answer on.
		b.log.Warn("turn on a malformed subject, not one its edge publishes; terminated",
			"account", q.account, "error", err, "stream_seq", md.Sequence.Stream)
		_ = m.TermWithReason("malformed subject")
		return
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.TurnTimeout)
	defer cancel()
	t, ok := b.dir.ByAccount(account)
	tenant := account
	if ok {
		tenant = string(t.ID)
	}
	ctx, span := b.startTurnSpan(ctx, q, md, tenant, start)
	defer span.End()
	// The turn's log attributes, formatted only for a line that is written
	// (slog's With would format them on every turn, logged or not).
	tl := turnLog{log: b.log, ctx: ctx, attrs: []slog.Attr{slog.String("turn_key", key),
		slog.Uint64("stream_seq", md.Sequence.Stream), slog.Uint64("delivered", md.NumDelivered)}}
	if a, traced := telemetry.LogAttr(ctx); traced {
		tl.attrs = append(tl.attrs, a)
	}

	var ans turn.Answer
	switch {
	case !ok:
		tl.at(slog.LevelWarn, "turn from an account the registry does not know; rejected", slog.String("account", account))
		ans = b.proc.Refuse(m.Data(), &wire.Error{Code: wire.CodeForbidden, Reason: wire.ReasonUnknownTenant,
			Message: "this NATS account is not a tenant of the brain"})
	case t.Status != registry.TenantStatusActive:
		tl.at(slog.LevelWarn, "turn from a disabled tenant; rejected", slog.String("tenant_id", string(t.ID)))
		ans = b.proc.Refuse(m.Data(), &wire.Error{Code: wire.CodeForbidden, Reason: wire.ReasonTenantDisabled,
			Message: "the tenant is disabled"})
	default:
		tl.attrs = append(tl.attrs, slog.String("tenant_id", string(t.ID)))
		// The tenant's database is not answering: the turn waits with the
		// others (held.go) rather than fail against it, unless this is its
		// last delivery, answered unavailable if it fails.
		last := int(md.NumDelivered) >= b.cfg.MaxDeliveries
		if !last && b.held.join(t, q) {
			return
		}
		ans, err = b.process(ctx, t, q, turn.Message{Key: key, Seq: md.Sequence.Stream, StoredAt: md.Timestamp, Data: m.Data()})
		if errors.Is(err, turn.ErrCrash) {
			tl.at(slog.LevelWarn, "turn abandoned by a test hook", slog.Any("error", err))
			return
		}
		if err != nil && unreachable(err) && !last && b.held.hold(t, q) {
			telemetry.End(span, err)
			tl.at(slog.LevelDebug, "turn held: the tenant database does not answer", slog.Any("error", err))
			return
		}
		if err != nil {
			telemetry.End(span, err)
			if !last {
				delay := redeliveryDelay(md.NumDelivered)
				tl.at(slog.LevelWarn, "turn failed; will be retried", slog.Any("error", err), slog.String("retry_in", delay.String()))
				b.inst.turnDone(tenant, OutcomeRetried, "transient")
				_ = m.NakWithDelay(delay)
				return
			}
			tl.at(slog.LevelError, "turn keeps failing; answered unavailable", slog.Any("error", err))
			ans = b.proc.Refuse(m.Data(), &wire.Error{Code: wire.CodeUnavailable, RetryAfter: 30,
				Message: "the brain could not decide this turn now; submit the same turn again later"})
		}
	}
	replyStart := time.Now()
	if err := b.publishReply(ctx, account, key, md.Sequence.Stream, ans); err != nil {
		tl.at(slog.LevelWarn, "publish reply failed; turn will be redelivered", slog.Any("error", err))
		b.inst.turnDone(tenant, OutcomeDropped, "reply_not_stored")
		telemetry.End(span, err)
		_ = m.NakWithDelay(time.Second)
		return
	}
	b.inst.observeStage(tenant, StageReply, time.Since(replyStart))
	if err := m.Ack(); err != nil {
		// The reply is stored; a redelivery replays it from the database.
		tl.at(slog.LevelWarn, "ack turn", slog.Any("error", err))
	}
	b.inst.answered(tenant, ans)
	b.inst.observeStage(tenant, StageProcess, time.Since(start))
	if ok && ans.OK {
		// A decision may have written or superseded approvals and events.
		b.pending.kick(t)
	}
	annotateTurnSpan(span, ans)
	tl.at(slog.LevelInfo, "turn answered", slog.Int("turn", ans.Turn), slog.Bool("ok", ans.OK), slog.Bool("replayed", ans.Replayed),
		slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000))
}

// process decides a turn, telling JetStream meanwhile that it is alive. A
// panic in the brain's code (a bug) is recovered here, logged with its
// stack, and the turn answered internal at once: left to run, it would take
// the replica down, and every replica the turn is redelivered to after it.
func (b *brain) process(ctx context.Context, t *registry.Tenant, q queued, msg turn.Message) (ans turn.Answer, err error) {
	stop := keepAlive(q.m, q.ackWait)
	defer stop()
	defer func() {
		if r := recover(); r != nil {
			guard.Log(b.log, r, "deciding a turn panicked, a bug in the brain; the turn is answered internal", "tenant_id", string(t.ID),
				"turn_key", msg.Key)
			ans, err = b.refusePanicked(msg.Data), nil
		}
	}()
	return b.proc.Process(ctx, t, msg)
}

// refusePanicked answers a turn the brain's code panicked on: with its
// fingerprint when its payload decodes (the edge takes only a reply that
// carries one), or without it if decoding it is what panics.
func (b *brain) refusePanicked(data []byte) (ans turn.Answer) {
	defer func() {
		if recover() != nil {
			ans = b.proc.Refuse(nil, panicked())
		}
	}()
	return b.proc.Refuse(data, panicked())
}

// panicked answers a request the brain's code panicked on.
func panicked() *wire.Error {
	return &wire.Error{Code: wire.CodeInternal,
		Message: "the brain failed on this request (a bug, logged with its stack); sending it again tries it again"}
}

// unreachable reports whether a turn failed because its tenant's database
// does not answer (its turns are then held, held.go). A replica at its
// connection cap is not that: the database answers, and the turn is
// retried as before.
func unreachable(err error) bool {
	return store.Unreachable(err) && !errors.Is(err, tenancy.ErrAtCapacity)
}

// turnLog writes a turn's log lines: its attributes, then the line's own.
type turnLog struct {
	log   *slog.Logger
	ctx   context.Context
	attrs []slog.Attr
}

func (l *turnLog) at(level slog.Level, msg string, extra ...slog.Attr) {
	if !l.log.Enabled(l.ctx, level) {
		return
	}
	l.log.LogAttrs(l.ctx, level, msg, append(l.attrs[:len(l.attrs):len(l.attrs)], extra...)...)
}

// startTurnSpan starts the turn's span on this replica, a child of the
// edge's publish (its trace context travels in the turn's headers, which
// the stream stores, so a redelivered turn joins the same trace), with the
// time it waited in JetStream and in the fair scheduler as child spans and
// histograms. Without tracing the span is a no-op.
func (b *brain) startTurnSpan(ctx context.Context, q queued, md *jetstream.MsgMetadata, tenant string, start time.Time) (context.Context, trace.Span) {
	stored, received := md.Timestamp, q.at
	if received.IsZero() || received.After(start) {
		received = start
	}
	if stored.After(received) { // the NATS server's clock runs ahead of ours
		stored = received
	}
	b.inst.observeStage(tenant, StageQueue, received.Sub(stored))
	b.inst.observeStage(tenant, StageSchedule, start.Sub(received))
	b.inst.backlog.WithLabelValues(tenant).Set(float64(md.NumPending))

	ctx = telemetry.Extract(ctx, q.m.Headers())
	ctx, span := b.tracer.Start(ctx, "brain turn", trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(stored))
	if !span.IsRecording() {
		return ctx, span
	}
	span.SetAttributes(
		attribute.String("messaging.system", "nats"),
		attribute.String("messaging.destination.name", subjects.TurnsStream(q.account)),
		attribute.Int64("messaging.nats.stream_sequence", int64(md.Sequence.Stream)),
		attribute.Int64("messaging.nats.delivered", int64(md.NumDelivered)),
		attribute.String("tenant.id", tenant),
		attribute.String("brain.replica", b.cfg.Replica),
	)
	_, wait := b.tracer.Start(ctx, "jetstream wait", trace.WithTimestamp(stored))
	wait.End(trace.WithTimestamp(received))
	_, sched := b.tracer.Start(ctx, "scheduler wait", trace.WithTimestamp(received))
	sched.End(trace.WithTimestamp(start))
	return ctx, span
}

// annotateTurnSpan notes the answer on the turn's span.
func annotateTurnSpan(span trace.Span, ans turn.Answer) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.Bool("turn.ok", ans.OK), attribute.Bool("turn.replayed", ans.Replayed),
		attribute.Int("turn.number", ans.Turn))
	if ans.OK {
		span.SetAttributes(attribute.String("turn.status", string(ans.Status)))
	} else if ans.Error != nil {
		span.SetAttributes(attribute.String("error.type", errorReason(ans.Error)))
	}
}

// publishReply stores the answer in RESULTS (one per subject) and, through
// the stream export, pushes it live to the tenant's reply.<key>.
func (b *brain) publishReply(ctx context.Context, account, key string, seq uint64, ans turn.Answer) error {
	msg := nats.NewMsg(subjects.Reply(account, key))
	msg.Data = ans.Body
	status := wire.StatusOK
	if !ans.OK {
		status = wire.StatusError
	}
	msg.Header.Set(wire.HeaderStatus, status)
	msg.Header.Set(wire.HeaderFingerprint, ans.Fingerprint)
	msg.Header.Set(wire.HeaderTurnSeq, strconv.FormatUint(seq, 10))
	// No message id: a replay after a crash must be stored (and so
	// republished live) again, not swallowed by the dedupe window. RESULTS
	// keeps one message per subject, so nothing accumulates.
	ctx, span := telemetry.Start(ctx, "publish reply", trace.WithSpanKind(trace.SpanKindProducer))
	// The reply carries the turn's trace context back to the edge.
	telemetry.Inject(ctx, msg.Header)
	_, err := b.js.PublishMsg(ctx, msg)
	telemetry.End(span, err)
	return err
}

// beatsPerAckWait is how many signs of life a turn sends per ack wait. Four
// leave three quarters of the ack wait as slack for a timer that fires
// late on a loaded machine, or a beat delayed on its way to the server.
const beatsPerAckWait = 4

// keepAlive tells JetStream the turn is still being worked on, so a long
// model call is not mistaken for a dead replica. It returns a stop function.
// A timer, not a goroutine: most turns end long before the first beat.
func keepAlive(m jetstream.Msg, ackWait time.Duration) func() {
	every := ackWait / beatsPerAckWait
	var mu sync.Mutex
	stopped := false
	mu.Lock()
	defer mu.Unlock()
	var t *time.Timer
	t = time.AfterFunc(every, func() {
		_ = m.InProgress()
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(every)
		}
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// redeliveryDelay backs off transient failures: 1s, 2s, 4s … capped at 30s.
func redeliveryDelay(delivered uint64) time.Duration {
	d := time.Second << min(delivered-1, 5)
	return min(d, 30*time.Second)
}

// consumeDue takes the brain's timers as they fire (SCHEDULES, consumer
// "brain", shared by every replica) until ctx is done: an approval's expiry
// sweeps its tenant, an outbox timer forwards its tenant's due events. It
// binds to the consumer once provisioning has created it.
func (b *brain) consumeDue(ctx context.Context) {
	var cons jetstream.Consumer
	warned := false
	for cons == nil {
		bctx, cancel := context.WithTimeout(ctx, bindTimeout)
		c, err := b.js.Consumer(bctx, subjects.SchedulesStream, subjects.TurnsConsumer)
		cancel()
		if err == nil {
			cons = c
			break
		}
		if !warned && ctx.Err() == nil {
			b.log.Warn("no timer stream yet: approval expiries and event re-deliveries wait for it (provisioning creates it); "+
				"the reconciliation pass still runs", "stream", subjects.SchedulesStream, "error", err)
			warned = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(missingRetry):
		}
	}
	slots := make(chan struct{}, dueWorkers)
	var workers gate
	cc, err := cons.Consume(func(m jetstream.Msg) {
		slots <- struct{}{}
		ok := workers.Go(func() {
			defer func() { <-slots }()
			b.handleDue(ctx, m)
		})
		if !ok { // stopping: back to JetStream, for another replica
			<-slots
			_ = m.Nak()
		}
	}, jetstream.PullMaxMessages(dueWorkers), jetstream.PullExpiry(pullExpiry), jetstream.PullHeartbeat(pullHeartbeat))
	if err != nil {
		b.log.Error("consume the timer stream", "error", err)
		return
	}
	<-ctx.Done()
	workers.Close()
	cc.Stop()
	workers.Wait()
}

// gate runs functions on goroutines until it is closed. A consumer's Stop
// does not wait for a delivery already under way, so its callback can still
// run while the workers are waited for; a WaitGroup must not be added to
// then, and the gate refuses instead.
type gate struct {
	mu     sync.Mutex
	wg     sync.WaitGroup
	closed bool
}

// Go runs f on a goroutine, or reports false once the gate is closed.
func (g *gate) Go(f func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Go(f)
	return true
}

// Close refuses every later Go.
func (g *gate) Close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// Wait returns once every function Go started has returned.
func (g *gate) Wait() { g.wg.Wait() }

// dueWorkers bounds the timers handled at once on a replica.
const dueWorkers = 4

func (b *brain) handleDue(ctx context.Context, m jetstream.Msg) {
	account, kind, _, err := subjects.ParseDue(m.Subject())
	if err != nil {
		b.log.Error("timer on a malformed subject; dropped", "error", err)
		_ = m.Term()
		return
	}
	t, ok := b.dir.ByAccount(account)
	if !ok {
		// The tenant was deleted: its timers are moot.
		_ = m.Ack()
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.TurnTimeout)
	defer cancel()
	log := b.log.With("tenant_id", t.ID, "timer", kind)
	defer b.pending.kick(t)
	switch kind {
	case subjects.DueExpiry:
		err = b.guarded(t, "an expiry timer", func() error {
			n, err := b.approvals.Expire(ctx, t)
			if n > 0 {
				log.Info("approvals expired and re-queued for a human", "count", n)
			}
			return err
		})
	case subjects.DueOutbox:
		err = b.guarded(t, "an outbox timer", func() error { return b.outbox.Forward(ctx, t) })
	default:
		log.Error("timer of an unknown kind; dropped")
		_ = m.Term()
		return
	}
	if err != nil {
		b.inst.timers.WithLabelValues(kind, "failed").Inc()
		if errors.Is(err, guard.ErrPanicked) {
			// Logged with its stack; a bug does not mend in 5 s.
			_ = m.NakWithDelay(time.Minute)
			return
		}
		log.Warn("timer failed; it fires again shortly", "error", err)
		_ = m.NakWithDelay(5 * time.Second)
		return
	}
	b.inst.timers.WithLabelValues(kind, "ok").Inc()
	_ = m.Ack()
}
