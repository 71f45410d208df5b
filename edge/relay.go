package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"go.opentelemetry.io/otel/trace"

	"n8nbrain/internal/telemetry"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

const (
	// resultTimeout bounds one direct get of a stored reply.
	resultTimeout = 2 * time.Second
	// attemptTimeout bounds one publish attempt; PublishTimeout bounds them all.
	attemptTimeout = 2 * time.Second
	// relookFirst and relookMax pace the looks at the stored reply of a
	// request waiting on a message it did not publish (see await).
	relookFirst = 20 * time.Millisecond
	relookMax   = 500 * time.Millisecond
	// waiterBuffer is how many replies a waiter holds. A key gets one reply
	// per turn message, so more than a few means a re-drive storm; a reply
	// dropped here is still found by the final fetch of the result.
	waiterBuffer = 8
)

// relay is the NATS side of the edge: it publishes turns through the
// tenant's turn import, receives live replies on one shared subscription and
// fetches stored replies through the result import. It implements brainClient.
type relay struct {
	nc             *nats.Conn
	js             jetstream.JetStream
	logger         *slog.Logger
	turnWait       time.Duration
	publishTimeout time.Duration
	metrics        *metrics

	mu      sync.Mutex
	waiters map[string]map[chan *nats.Msg]struct{}
	// pending remembers turns answered 202 (key → fingerprint) until their
	// decision is first delivered; pendingOrder evicts the oldest.
	pending      map[string]string
	pendingOrder []string
	// limitsCache is the tenant's quota as the brain last reported it.
	limitsCache wire.TenantLimitsReply
	limitsAt    time.Time
}

// newRelay subscribes to every live reply of the tenant once, for the life
// of the process, and waits until the server has the subscription: a reply
// published after newRelay returns reaches a registered waiter.
func newRelay(nc *nats.Conn, cfg Config, m *metrics, logger *slog.Logger) (*relay, error) {
	// The edge user has no $JS.API rights; the JetStream client is only used
	// to publish through the turn import and read the PubAck.
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream client: %w", err)
	}
	r := &relay{
		nc:             nc,
		js:             js,
		logger:         logger,
		turnWait:       cfg.TurnWait,
		publishTimeout: cfg.PublishTimeout,
		metrics:        m,
		waiters:        map[string]map[chan *nats.Msg]struct{}{},
		pending:        map[string]string{},
	}
	if _, err := nc.Subscribe(subjects.LocalReply+">", r.dispatch); err != nil {
		return nil, fmt.Errorf("subscribe to %s>: %w", subjects.LocalReply, err)
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		return nil, fmt.Errorf("flush reply subscription: %w", err)
	}
	// The server answers a refused subscription before the flush's PONG,
	// so a credential of another kind of user (the brain's, another
	// account's) is found here, at start, not as turns that never get a
	// reply while /readyz says ready.
	if err := nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+subjects.LocalReply+`>"`) {
		return nil, fmt.Errorf("the NATS server refuses this credential the tenant's replies (%s>): "+
			"EDGE_NATS_CREDS must be the tenant's edge user's .creds: %w", subjects.LocalReply, err)
	}
	return r, nil
}

// dispatch hands a live reply to every waiter on its key.
func (r *relay) dispatch(m *nats.Msg) {
	key, err := subjects.ParseReplyLocal(m.Subject)
	if err != nil {
		r.logger.Warn("live reply on a malformed subject", "error", err)
		return
	}
	if !storedUnder(m, key) {
		r.logger.Warn("a message on a live reply subject is not that turn's reply; dropped "+
			"(a request whose reply subject was set to it: only this edge's own credentials can send one)", "turn_key", key)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for ch := range r.waiters[key] {
		select {
		case ch <- m:
		default:
			r.logger.Warn("live reply dropped: waiter is full", "turn_key", key)
		}
	}
}

func (r *relay) register(key string) chan *nats.Msg {
	ch := make(chan *nats.Msg, waiterBuffer)
	r.mu.Lock()
	defer r.mu.Unlock()
	set := r.waiters[key]
	if set == nil {
		set = map[chan *nats.Msg]struct{}{}
		r.waiters[key] = set
	}
	set[ch] = struct{}{}
	return ch
}

func (r *relay) unregister(key string, ch chan *nats.Msg) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.waiters[key], ch)
	if len(r.waiters[key]) == 0 {
		delete(r.waiters, key)
	}
}

// submission is the state of one HTTP request's turn.
type submission struct {
	key     string
	payload []byte
	fp      string
	// ownSeq is the TURNS sequence this request's publish created, 0 if the
	// turn was already there. A stored decision of ownSeq answers this very
	// request and is not a replay.
	ownSeq uint64
	// published are all the sequences this request's publishes created
	// (its first and any re-drive): a decision of one of them answers it.
	published []uint64
	// minSeq: an error reply for a turn message before it is stale, because
	// a newer message for the key (ours or a concurrent re-drive) is in flight.
	minSeq   uint64
	redriven bool
}

// Submit relays a turn and waits for its answer (DESIGN §4). It returns the
// decision to serve, a pending outcome when no answer came within TurnWait,
// or an error carrying a *wire.Error: the brain's own error for this payload,
// conflict (idempotency_key_reused), or unavailable when the turn could not
// be published.
func (r *relay) Submit(ctx context.Context, key string, payload []byte, fp string) (turnOutcome, error) {
	// Register before publishing, so the live reply cannot slip past.
	ch := r.register(key)
	defer r.unregister(key, ch)

	s := &submission{key: key, payload: payload, fp: fp}
	start := time.Now()
	pctx, span := telemetry.Start(ctx, "publish turn", trace.WithSpanKind(trace.SpanKindProducer))
	res, err := r.publish(pctx, key, payload, msgID(key, fp, 0), 0)
	telemetry.End(span, err)
	published := time.Now()
	r.metrics.observeStage(StagePublish, published.Sub(start))
	if err != nil {
		return turnOutcome{}, err
	}
	// The wait for the answer, live or stored; the brain's reply carries its
	// turn's trace context, linked to this span.
	ctx, span = telemetry.Start(ctx, "await reply")
	defer func() {
		r.metrics.observeStage(StageAwait, time.Since(published))
		span.End()
	}()
	if res.kind == publishAccepted {
		s.ownSeq, s.minSeq = res.seq, res.seq
		s.published = append(s.published, res.seq)
		return r.await(ctx, s, ch)
	}
	// Already accepted: by an earlier try, a concurrent one, or another
	// payload under the same key. What is stored says which.
	if res.kind == publishDuplicate {
		s.minSeq = res.seq
	}
	if out, done, err := r.look(ctx, s); done {
		return out, err
	}
	return r.await(ctx, s, ch)
}

// linkReply links the span in ctx to the brain's span that answered, when
// the reply carries its trace context.
func linkReply(ctx context.Context, h nats.Header) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	if sc := telemetry.RemoteSpanContext(h); sc.IsValid() {
		span.AddLink(trace.Link{SpanContext: sc})
	}
}

// look fetches the stored reply of s's key and applies it. done is false
// while s has no answer yet: nothing stored, a stale error, or an error that
// was just re-driven.
func (r *relay) look(ctx context.Context, s *submission) (out turnOutcome, done bool, err error) {
	stored, found, err := r.fetch(ctx, s.key)
	switch {
	case errors.Is(err, errMalformedReply):
		return turnOutcome{}, true, internal(err, "the brain's stored reply is malformed")
	case err != nil:
		// The turn is in the stream; the live reply or a later look may
		// still find the answer.
		r.logger.Warn("fetch stored reply", "turn_key", s.key, "error", err)
		return turnOutcome{}, false, nil
	case !found:
		r.logger.Debug("no stored reply yet", "turn_key", s.key)
		return turnOutcome{}, false, nil
	case stored.status == wire.StatusOK:
		out, err = r.decided(s, stored)
		return out, true, err
	case stored.turnSeq < s.minSeq:
		// A stale error: a newer message for the key is in flight.
		return turnOutcome{}, false, nil
	case s.ownSeq != 0 && stored.turnSeq == s.ownSeq:
		// The answer to the message this request published.
		return turnOutcome{}, true, stored.brainError()
	case !s.redriven:
		// Only a decision consumes a key: an error is re-driven, once.
		if err := r.redrive(ctx, s, stored.turnSeq); err != nil {
			return turnOutcome{}, true, err
		}
		return turnOutcome{}, false, nil
	case stored.fingerprint == s.fp:
		return turnOutcome{}, true, stored.brainError()
	}
	return turnOutcome{}, false, nil
}

// await waits up to TurnWait for the live reply, then looks at the stored
// reply once more before answering pending.
//
// A request that did not publish the message in flight itself also looks
// at the stored reply now and then: the stream export delivers a reply live
// before RESULTS has stored it, so a retry arriving in that instant finds
// nothing stored and would otherwise wait for a live reply already gone.
func (r *relay) await(ctx context.Context, s *submission, ch chan *nats.Msg) (turnOutcome, error) {
	deadline := time.NewTimer(r.turnWait)
	defer deadline.Stop()
	relookEvery := relookFirst
	relook := time.NewTimer(relookEvery)
	defer relook.Stop()
	for {
		relookC := relook.C
		if s.ownSeq != 0 {
			// Our own message: its reply comes live, to a waiter registered
			// before it was published.
			relookC = nil
		}
		select {
		case m := <-ch:
			linkReply(ctx, m.Header)
			rep, err := parseReply(m)
			switch {
			case err != nil:
				r.logger.Error("malformed live reply", "turn_key", s.key, "error", err)
			case rep.status == wire.StatusOK:
				return r.decided(s, rep)
			case rep.turnSeq < s.minSeq:
				// Stale: it answers a message older than the one in flight.
			case rep.fingerprint == s.fp:
				return turnOutcome{}, rep.brainError()
			case !s.redriven:
				// Another payload's error: the key is still open, drive ours.
				if err := r.redrive(ctx, s, rep.turnSeq); err != nil {
					return turnOutcome{}, err
				}
			}
		case <-relookC:
			if out, done, err := r.look(ctx, s); done {
				return out, err
			}
			relookEvery = min(2*relookEvery, relookMax)
			relook.Reset(relookEvery)
		case <-deadline.C:
			// A last look: an edge that missed the live reply (a reconnect,
			// a full waiter) still answers. An error left on the key is
			// re-driven first, so that "pending" is true.
			if out, done, err := r.look(ctx, s); done {
				return out, err
			}
			r.notePending(s.key, s.fp)
			return turnOutcome{Pending: true}, nil
		case <-ctx.Done():
			return turnOutcome{}, unavailable(ctx.Err(), "the request ended before the brain answered; retry with the same turn")
		}
	}
}

// errKeyReused is the answer to a payload whose key was decided for another.
func errKeyReused() error {
	return &wire.Error{
		Code:   wire.CodeConflict,
		Reason: wire.ReasonIdempotencyKeyReused,
		Message: "this work item and turn were already decided for a different payload; " +
			"send the same payload to get the stored decision, or the next turn",
	}
}

// decided turns a decision into the outcome of s: the decision when it
// answers s's payload, idempotency_key_reused when it answers another. A
// decision is a replay, live or stored, unless it answers a message s
// published, or its requester got a 202 and this is its first delivery.
func (r *relay) decided(s *submission, rep brainReply) (turnOutcome, error) {
	if rep.fingerprint != s.fp {
		return turnOutcome{}, errKeyReused()
	}
	first := r.firstDelivery(s.key, s.fp)
	if slices.Contains(s.published, rep.turnSeq) {
		return turnOutcome{Body: rep.body}, nil
	}
	// Another request's message was decided (this one was a retry that
	// found it in flight or stored): a replay, live or read back, unless
	// its requester got a 202 and this is the decision's first delivery.
	body, err := wire.SetReplayed(rep.body, !first)
	if err != nil {
		return turnOutcome{}, internal(err, "the stored decision is unreadable")
	}
	return turnOutcome{Body: body, Replayed: !first}, nil
}

// maxPending bounds the turns remembered as answered 202 and not yet delivered.
const maxPending = 100_000

// notePending remembers that key's decision for payload fp was not yet
// delivered: its requester got a 202.
func (r *relay) notePending(key, fp string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.pending[key]; !ok {
		if len(r.pendingOrder) >= maxPending {
			delete(r.pending, r.pendingOrder[0])
			r.pendingOrder = r.pendingOrder[1:]
		}
		r.pendingOrder = append(r.pendingOrder, key)
	}
	r.pending[key] = fp
}

// firstDelivery reports whether this is the first delivery of key's
// decision for fp after a 202, and forgets the 202: every later delivery is
// a repeat. An edge restarted since the 202 no longer knows, and says repeat.
func (r *relay) firstDelivery(key, fp string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	pfp, ok := r.pending[key]
	if !ok || pfp != fp {
		return false
	}
	delete(r.pending, key)
	// pendingOrder keeps the key until it is evicted; a key not in pending is skipped then.
	return true
}

// redrive publishes s again after an error reply for turn message seq. The
// expectation makes concurrent re-drives of the same error collapse into
// one; the message id is bound to the payload and the error's sequence.
func (r *relay) redrive(ctx context.Context, s *submission, seq uint64) error {
	s.redriven = true
	res, err := r.publish(ctx, s.key, s.payload, msgID(s.key, s.fp, seq), seq)
	if err != nil {
		return err
	}
	switch res.kind {
	case publishAccepted:
		s.ownSeq, s.minSeq = res.seq, res.seq
		s.published = append(s.published, res.seq)
	case publishDuplicate:
		s.minSeq = max(s.minSeq, res.seq)
	case publishWrongLast:
		// Somebody re-drove already; its message comes after seq.
		s.minSeq = max(s.minSeq, seq+1)
	}
	r.logger.Info("turn re-driven after an error reply", "turn_key", s.key, "error_turn_seq", seq)
	return nil
}

// Result returns the stored answer of a turn for the payload with
// fingerprint fp: the decision, the brain's error for that payload,
// idempotency_key_reused when the key was decided for another payload, or
// not_found. The decision is marked as a replay unless this is its first
// delivery after a 202.
func (r *relay) Result(ctx context.Context, key, fp string) (turnOutcome, error) {
	rep, found, err := r.fetch(ctx, key)
	switch {
	case errors.Is(err, errMalformedReply):
		return turnOutcome{}, internal(err, "the brain's stored reply is malformed")
	case err != nil:
		return turnOutcome{}, unavailable(err, "the stored answer cannot be read right now; retry")
	case !found:
		return turnOutcome{}, &wire.Error{
			Code: wire.CodeNotFound,
			Message: "no answer is stored for this turn: it is still being decided, was never submitted, or expired; " +
				"re-submitting the same turn is always safe (it is idempotent)",
		}
	case rep.status == wire.StatusError && rep.fingerprint == fp:
		return turnOutcome{}, rep.brainError()
	case rep.status == wire.StatusError:
		// An error answers another payload and consumes nothing: this one
		// has no answer until it is submitted.
		return turnOutcome{}, &wire.Error{Code: wire.CodeNotFound,
			Message: "no answer is stored for this payload: submit the same turn again (it is idempotent)"}
	case rep.fingerprint != fp:
		return turnOutcome{}, errKeyReused()
	}
	first := r.firstDelivery(key, fp)
	body, err := wire.SetReplayed(rep.body, !first)
	if err != nil {
		return turnOutcome{}, internal(err, "the stored decision is unreadable")
	}
	return turnOutcome{Body: body, Replayed: !first}, nil
}

// msgID is the Nats-Msg-Id of a turn. The dedupe table it is checked
// against is the tenant's own turn stream's (TURNS_<account>, one per
// tenant), so no other tenant's ids share it and the id needs no tenant in
// it. It is bound to the content (key and fingerprint) so that, within the
// tenant, a duplicate PubAck means this very payload was accepted before,
// while another payload under the same key is a new message, which the
// subject expectation refuses and the stored reply's fingerprint answers. A
// re-drive adds the sequence of the error it replaces: each re-drive is one
// new message, and concurrent re-drives of one error collapse into it.
func msgID(key, fp string, redriveOf uint64) string {
	id := key + "." + fp[:32]
	if redriveOf > 0 {
		id += "." + strconv.FormatUint(redriveOf, 10)
	}
	return id
}

type publishKind int

const (
	publishAccepted  publishKind = iota + 1 // a new message; seq is its sequence
	publishDuplicate                        // same message id seen; seq is the original's
	publishWrongLast                        // the subject's last sequence is not the expected one
)

type publishResult struct {
	kind publishKind
	seq  uint64
}

// publish sends a turn expecting expect as the last sequence of its
// subject, retrying transient failures with exponential backoff within
// PublishTimeout, always with the same message id.
func (r *relay) publish(ctx context.Context, key string, payload []byte, id string, expect uint64) (publishResult, error) {
	bctx, cancel := context.WithTimeout(ctx, r.publishTimeout)
	defer cancel()
	var last error
	attempt := func() (publishResult, error) {
		actx, cancel := context.WithTimeout(bctx, attemptTimeout)
		defer cancel()
		// A fresh message each attempt: PublishMsg writes its headers into it.
		msg := &nats.Msg{Subject: subjects.TurnLocal(key), Data: payload}
		if trace.SpanContextFromContext(ctx).IsValid() {
			// W3C trace context rides in the turn's headers, stored with it.
			msg.Header = nats.Header{}
			telemetry.Inject(ctx, msg.Header)
		}
		ack, err := r.js.PublishMsg(actx, msg,
			jetstream.WithMsgID(id),
			jetstream.WithExpectLastSequencePerSubject(expect),
			jetstream.WithRetryAttempts(0), // the backoff below retries
		)
		if err == nil {
			if ack.Duplicate {
				return publishResult{kind: publishDuplicate, seq: ack.Sequence}, nil
			}
			return publishResult{kind: publishAccepted, seq: ack.Sequence}, nil
		}
		last = err
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) {
			switch {
			case apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence,
				apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant:
				return publishResult{kind: publishWrongLast}, nil
			case overQuota(apiErr):
				// The tenant's own stream is full: retrying now cannot help.
				return publishResult{}, backoff.Permanent(err)
			case apiErr.Code == 503:
				return publishResult{}, err
			}
			return publishResult{}, backoff.Permanent(err)
		}
		if errors.Is(err, nats.ErrMaxPayload) {
			return publishResult{}, backoff.Permanent(err)
		}
		if transient(err) {
			return publishResult{}, err
		}
		return publishResult{}, backoff.Permanent(err)
	}
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(50*time.Millisecond),
		backoff.WithMaxInterval(time.Second),
		backoff.WithMaxElapsedTime(r.publishTimeout),
	)
	res, err := backoff.RetryNotifyWithData(attempt, backoff.WithContext(b, bctx), func(err error, next time.Duration) {
		r.logger.Debug("turn publish retry", "turn_key", key, "error", err, "next_ms", next.Milliseconds())
	})
	if err == nil {
		return res, nil
	}
	if last == nil {
		last = err
	}
	var apiErr *jetstream.APIError
	switch {
	case ctx.Err() != nil:
		return publishResult{}, unavailable(ctx.Err(), "the request ended before the turn was accepted; retry with the same turn")
	case errors.As(last, &apiErr) && overQuota(apiErr):
		return publishResult{}, r.quotaError(ctx, apiErr)
	case errors.As(last, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum,
		errors.Is(last, nats.ErrMaxPayload):
		return publishResult{}, tooLargeForNATS(last)
	case errors.Is(last, nats.ErrNoResponders), errors.Is(last, jetstream.ErrNoStreamResponse):
		return publishResult{}, &causeError{public: &wire.Error{Code: wire.CodeUnavailable, Reason: wire.ReasonNotProvisioned,
			RetryAfter: defaultRetryAfter,
			Message: "no turn stream took the turn: this tenant's streams are not provisioned on the brain yet, " +
				"or NATS is restarting; retry later with the same turn"}, cause: last}
	case errors.As(last, &apiErr) && apiErr.Code != 503:
		return publishResult{}, unavailable(last, "the brain's turn stream refused the turn (%s); retry later with the same turn", apiErr.Description)
	case transient(last) && !r.nc.IsConnected():
		return publishResult{}, unavailable(last, "the edge has lost its NATS connection (it reconnects by itself): "+
			"the turn was not sent within %s; retry with the same turn", r.publishTimeout)
	case transient(last):
		return publishResult{}, unavailable(last, "the brain did not accept the turn within %s; retry with the same turn", r.publishTimeout)
	}
	return publishResult{}, unavailable(last, "the turn could not be sent to the brain; retry with the same turn")
}

// overQuota reports whether a publish was refused because the tenant's own
// turn stream is at its quota (DiscardNew: 10077 "maximum messages/bytes
// exceeded").
func overQuota(e *jetstream.APIError) bool {
	return e.ErrorCode == 10077 && (strings.Contains(e.Description, "maximum messages") || strings.Contains(e.Description, "maximum bytes"))
}

// quotaError is the 429 of a turn refused over quota, naming the quota the
// brain reports for this tenant (cached).
func (r *relay) quotaError(ctx context.Context, apiErr *jetstream.APIError) error {
	msg := "this tenant's turn quota is used up (" + apiErr.Description + ")"
	if l, err := r.limits(ctx); err == nil {
		msg = fmt.Sprintf("this tenant's turn quota is used up (%s): at most %d turns or %s of turns within any %s; "+
			"older turns leave the quota as they pass that age",
			apiErr.Description, l.MaxTurns, byteSize(l.MaxBytes), time.Duration(l.WindowSeconds)*time.Second)
	}
	return &causeError{public: &wire.Error{Code: wire.CodeRateLimited, Reason: wire.ReasonTenantQuotaExceeded,
		RetryAfter: quotaRetryAfter, Message: msg + "; retry later with the same turn"}, cause: apiErr}
}

// quotaRetryAfter is the Retry-After, in seconds, of a turn over quota.
const quotaRetryAfter = 30

// limits returns the tenant's bounds, asked of the brain at most once a minute.
func (r *relay) limits(ctx context.Context) (wire.TenantLimitsReply, error) {
	r.mu.Lock()
	l, at := r.limitsCache, r.limitsAt
	r.mu.Unlock()
	if !at.IsZero() && time.Since(at) < time.Minute {
		return l, nil
	}
	body, err := r.Call(ctx, subjects.APITenantLimits, wire.TenantLimitsRequest{})
	if err != nil {
		return l, err
	}
	if err := json.Unmarshal(body, &l); err != nil {
		return l, err
	}
	r.mu.Lock()
	r.limitsCache, r.limitsAt = l, time.Now()
	r.mu.Unlock()
	return l, nil
}

func byteSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// tooLargeForNATS is the 413 of a turn the server would not take.
func tooLargeForNATS(cause error) error {
	return &causeError{public: &wire.Error{Code: wire.CodeInvalid, Reason: wire.ReasonTooLarge,
		Message: fmt.Sprintf("the turn with its headers is larger than the %d bytes this tenant may send to the brain", wire.MaxTurnBytes)},
		cause: cause}
}

// transient reports whether a publish failure may pass on retry.
func transient(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code == 503
	}
	return errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, nats.ErrStaleConnection)
}

// brainReply is a reply of the brain, live or stored.
type brainReply struct {
	status      string // wire.StatusOK or wire.StatusError
	fingerprint string
	turnSeq     uint64
	body        []byte
}

// errMalformedReply is a reply without the headers the brain always sets.
var errMalformedReply = errors.New("malformed brain reply")

func parseReply(m *nats.Msg) (brainReply, error) {
	rep := brainReply{
		status:      m.Header.Get(wire.HeaderStatus),
		fingerprint: m.Header.Get(wire.HeaderFingerprint),
		body:        m.Data,
	}
	if rep.status != wire.StatusOK && rep.status != wire.StatusError {
		return brainReply{}, fmt.Errorf("%w on %s: header %s is %q", errMalformedReply, m.Subject, wire.HeaderStatus, rep.status)
	}
	if rep.fingerprint == "" {
		return brainReply{}, fmt.Errorf("%w on %s: header %s is missing", errMalformedReply, m.Subject, wire.HeaderFingerprint)
	}
	seq, err := strconv.ParseUint(m.Header.Get(wire.HeaderTurnSeq), 10, 64)
	if err != nil {
		return brainReply{}, fmt.Errorf("%w on %s: header %s: %v", errMalformedReply, m.Subject, wire.HeaderTurnSeq, err)
	}
	rep.turnSeq = seq
	return rep, nil
}

// brainError decodes an error reply; an unreadable one is an internal error.
func (rep brainReply) brainError() error {
	var er wire.ErrorReply
	if err := json.Unmarshal(rep.body, &er); err != nil {
		return internal(err, "the brain's error reply is unreadable")
	}
	if er.Error == nil || er.Error.Code == "" {
		return internal(errors.New("error reply without a code"), "the brain's error reply is unreadable")
	}
	return er.Error
}

// fetch reads the stored reply of key through the result import (a direct
// get of the last message on its RESULTS subject). found is false when no
// reply is stored yet.
func (r *relay) fetch(ctx context.Context, key string) (rep brainReply, found bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, resultTimeout)
	defer cancel()
	m, err := r.nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: subjects.ResultLocal(key)})
	if err != nil {
		return brainReply{}, false, fmt.Errorf("request %s: %w", subjects.ResultLocal(key), err)
	}
	switch st := m.Header.Get("Status"); st {
	case "":
	case "404":
		return brainReply{}, false, nil
	default:
		return brainReply{}, false, fmt.Errorf("request %s: status %s %s", subjects.ResultLocal(key), st, m.Header.Get("Description"))
	}
	if !storedUnder(m, key) {
		// Not found either: the live reply or a later look answers.
		return brainReply{}, false, fmt.Errorf("request %s: the answer is not that turn's stored reply (a forged response)", subjects.ResultLocal(key))
	}
	rep, err = parseReply(m)
	if err != nil {
		return brainReply{}, false, err
	}
	linkReply(ctx, m.Header)
	return rep, true, nil
}

// storedUnder reports whether m is what RESULTS holds for key: the server
// names the subject a republished or directly read message was stored
// under in Nats-Subject, brain.reply.<account>.<key>. Anything else on
// reply.<key>, or in answer to a read of it, was sent there by a request
// whose reply subject was set to it (a direct get of another key's reply,
// a PubAck, an API answer), which the server publishes for whoever asks.
func storedUnder(m *nats.Msg, key string) bool {
	_, stored, err := subjects.ParseReply(m.Header.Get(jetstream.SubjectHeader))
	return err == nil && stored == key
}

// apiTimeout bounds one tenant API call to the brain.
const apiTimeout = 5 * time.Second

// Call calls a tenant API method (api.<method>, core NATS request-reply)
// and returns the brain's reply body, exactly. A brain error comes back as
// its *wire.Error; no brain, a timeout or a lost connection as unavailable.
func (r *relay) Call(ctx context.Context, method string, req any) ([]byte, error) {
	data, err := json.Marshal(req)
	if err != nil { // cannot happen for the wire types
		return nil, internal(err, "internal error")
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	subject := subjects.APILocal(method)
	// No responders means no brain got the request (a replica restarting):
	// asking again is safe, within the call's budget.
	ctx, span := telemetry.Start(ctx, "brain api "+method, trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	var hdr nats.Header
	if span.SpanContext().IsValid() {
		hdr = nats.Header{}
		telemetry.Inject(ctx, hdr)
	}
	var m *nats.Msg
	wait := backoff.WithContext(backoff.NewExponentialBackOff(backoff.WithInitialInterval(25*time.Millisecond),
		backoff.WithMaxInterval(500*time.Millisecond), backoff.WithMaxElapsedTime(0)), ctx)
	for {
		m, err = r.nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: subject, Data: data, Header: hdr})
		if !errors.Is(err, nats.ErrNoResponders) {
			break
		}
		d := wait.NextBackOff()
		if d == backoff.Stop {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(d):
			continue
		}
		break
	}
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		// No replica holds the tenant's API subscription: brains down or
		// restarting, or this tenant paused after a flood of refused calls.
		return nil, unavailable(err, "no brain is serving this tenant's API right now (brains restarting, "+
			"or this tenant's calls paused after a flood of refused ones: the brain's log says which); retry later")
	case err != nil:
		return nil, unavailable(fmt.Errorf("request %s: %w", subject, err), "the brain did not answer in time; retry")
	}
	switch st := m.Header.Get(wire.HeaderStatus); st {
	case wire.StatusOK:
		if !json.Valid(m.Data) {
			return nil, internal(fmt.Errorf("%w on %s: the body is not JSON", errMalformedReply, subject), "the brain's reply is unreadable")
		}
		return m.Data, nil
	case wire.StatusError:
		return nil, brainReply{body: m.Data}.brainError()
	default:
		return nil, internal(fmt.Errorf("%w on %s: header %s is %q", errMalformedReply, subject, wire.HeaderStatus, st),
			"the brain's reply is unreadable")
	}
}

// eventSubscriber is a watermill Subscriber over the core NATS
// subscription to the tenant's events (event.<event_id>).
//
// Why an adapter and not gochannel: gochannel hands a subscriber one
// message at a time and waits for its ack before the next, and re-sends a
// nacked message at once. One event retrying against a webhook that is down
// would hold every other event behind it. This adapter hands each NATS
// message to the router as it arrives (the router runs each in its own
// goroutine), and ack and nack mean nothing here: core NATS has no acks.
// The acknowledgement that counts is api.event.ack, and the redelivery that
// counts is the brain publishing an unacknowledged event again.
type eventSubscriber struct {
	nc *nats.Conn

	mu   sync.Mutex
	subs []*eventSub
}

// Subscribe subscribes to topic, a NATS subject, until ctx is done or the
// subscriber is closed. It returns once the server has the subscription.
func (s *eventSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	es := &eventSub{out: make(chan *message.Message), closing: make(chan struct{})}
	sub, err := s.nc.Subscribe(topic, func(m *nats.Msg) {
		id, _ := strings.CutPrefix(m.Subject, subjects.LocalEvent)
		wm := message.NewMessage(id, m.Data)
		wm.SetContext(ctx)
		es.send(wm)
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", topic, err)
	}
	es.sub = sub
	if err := s.nc.FlushTimeout(5 * time.Second); err != nil {
		es.close()
		return nil, fmt.Errorf("flush subscription to %s: %w", topic, err)
	}
	s.mu.Lock()
	s.subs = append(s.subs, es)
	s.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
			es.close()
		case <-es.closing:
		}
	}()
	return es.out, nil
}

// Close ends every subscription and closes their channels.
func (s *eventSubscriber) Close() error {
	s.mu.Lock()
	subs := s.subs
	s.subs = nil
	s.mu.Unlock()
	for _, es := range subs {
		es.close()
	}
	return nil
}

// eventSub is one subscription and the channel the router reads.
type eventSub struct {
	sub       *nats.Subscription
	out       chan *message.Message
	closing   chan struct{}
	closeOnce sync.Once

	mu     sync.Mutex // held while sending, so out is never closed under a sender
	closed bool
}

func (es *eventSub) send(m *message.Message) {
	es.mu.Lock()
	defer es.mu.Unlock()
	if es.closed {
		return // the brain publishes it again
	}
	select {
	case es.out <- m:
	case <-es.closing:
	}
}

func (es *eventSub) close() {
	es.closeOnce.Do(func() {
		close(es.closing) // frees a blocked send
		if es.sub != nil {
			_ = es.sub.Unsubscribe() // fails only when the connection is already closed
		}
		es.mu.Lock()
		es.closed = true
		close(es.out)
		es.mu.Unlock()
	})
}
