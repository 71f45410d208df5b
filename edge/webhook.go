package edge

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/nats-io/nats.go"

	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// Event delivery (DESIGN §9): the brain publishes each undelivered event on
// event.<event_id>, again and again until it is acknowledged. The edge POSTs
// it to n8n's webhook and, only after n8n answered 2xx, acknowledges it with
// api.event.ack (with the events accepted meanwhile: acker, eventack.go).
//
// The pipeline is a watermill Router fed by eventSubscriber (relay.go), with
// these middlewares, outermost first:
//
//   - PoisonQueue: an event whose retries are exhausted is parked: logged at
//     Warn with its id and kind. It is not lost: it was never acknowledged,
//     so the brain publishes it again later and delivery starts over.
//     Outermost, so that an event is out of the in-flight set by the time it
//     is reported parked: the next publication of it is delivered.
//   - once: an event already being delivered is skipped, so the brain's
//     re-publishing never runs two deliveries of one event at once.
//   - decoded: the event is decoded strictly, once; an event the edge cannot
//     read goes straight to the poison queue, since retrying cannot cure it.
//   - Retry: exponential backoff per the Webhook* settings.
//
// Duplicates that still reach n8n (an ack lost after a 2xx) are harmless:
// the Idempotency-Key is the event id and n8n's next turn is idempotent.

// Headers of a webhook delivery.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderEventKind      = "X-Brain-Event"
	// HeaderWebhookToken carries the webhook secret, for n8n's Webhook node
	// with a Header Auth credential.
	HeaderWebhookToken = "X-Brain-Webhook-Token"
	// HeaderSignature is "sha256=" and the hex HMAC-SHA256 of the body with
	// the webhook secret, for a Code node that verifies the body itself.
	HeaderSignature = "X-Brain-Signature"
	// HeaderTimestamp is the Unix time of the attempt, in seconds. The
	// signature covers the body only, so the timestamp is informative: a
	// replayed delivery is harmless anyway (the next turn is idempotent).
	HeaderTimestamp = "X-Brain-Timestamp"
)

const (
	// maxDeliveries bounds the events in delivery at once; an event over
	// the bound is left to the brain's next publication.
	maxDeliveries = 256
	// eventsCloseTimeout bounds the router's shutdown. Deliveries stop at
	// once (their context ends), so this is only a safety net.
	eventsCloseTimeout = 10 * time.Second
	// maxWebhookReply is how much of n8n's answer is read, to reuse the
	// connection; the answer itself is ignored.
	maxWebhookReply = 64 << 10
	// parkedTopic is the poison queue's topic; the parking lot only logs.
	parkedTopic = "parked"
	// metaKind is the metadata key of an event's kind, once decoded.
	metaKind = "kind"
)

// webhook delivers one event to n8n and acknowledges it to the brain.
type webhook struct {
	url    string
	secret []byte
	client *http.Client
	acks   *acker
	logger *slog.Logger
}

// events is the running event pipeline.
type events struct {
	router *message.Router
	done   chan error
	client *http.Client
}

// startEvents subscribes to the tenant's events and starts delivering them
// to cfg.WebhookURL. It returns once the subscription is in place.
func startEvents(nc *nats.Conn, cfg Config, brain brainClient, m *metrics, logger *slog.Logger) (*events, error) {
	logger = logger.With("component", "events")
	transport := http.DefaultTransport.(*http.Transport).Clone()
	// Every delivery goes to one host, n8n: keep a connection for each one
	// that can be in flight. Go's default keeps two idle per host, so each
	// burst of events closed the rest and dialled them again, one TCP
	// handshake (and a TIME_WAIT socket here) per event.
	transport.MaxIdleConns, transport.MaxIdleConnsPerHost = maxDeliveries, maxDeliveries
	client := &http.Client{
		Transport: transport,
		Timeout:   cfg.WebhookTimeout,
		// A redirect would carry the secret and the body elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	wh := &webhook{url: cfg.WebhookURL, secret: []byte(cfg.WebhookSecret), client: client,
		acks: &acker{brain: brain, metrics: m, logger: logger}, logger: logger}

	// Watermill's Info lines (router started, handler stopped) are Debug here.
	wlog := watermill.NewSlogLoggerWithLevelMapping(logger, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug})
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: eventsCloseTimeout}, wlog)
	if err != nil {
		return nil, fmt.Errorf("event router: %w", err)
	}
	parked := &parkingLot{logger: logger}
	poison, err := middleware.PoisonQueueWithFilter(parked, parkedTopic, func(err error) bool {
		// Shutdown interrupts deliveries; that is not a failed event.
		return !errors.Is(err, context.Canceled)
	})
	if err != nil {
		return nil, fmt.Errorf("poison queue: %w", err)
	}
	inFlight := &onceSet{ids: map[string]bool{}, logger: logger}
	router.AddMiddleware(
		poison,
		inFlight.middleware,
		decoded,
		// No ShouldRetry: watermill's Retry advances its backoff once more
		// for each call of it, doubling every wait again.
		middleware.Retry{
			MaxRetries:      cfg.WebhookRetries,
			InitialInterval: cfg.WebhookInitialInterval,
			MaxInterval:     cfg.WebhookMaxInterval,
			Multiplier:      2,
			// One edge per tenant: a little jitter is enough.
			RandomizationFactor: 0.1,
		}.Middleware,
	)
	router.AddConsumerHandler("webhook", subjects.LocalEvent+">", &eventSubscriber{nc: nc}, wh.deliver)

	ev := &events{router: router, done: make(chan error, 1), client: client}
	go func() { ev.done <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case err := <-ev.done:
		transport.CloseIdleConnections()
		if err == nil {
			err = errors.New("the router stopped before it ran")
		}
		return nil, fmt.Errorf("event router: %w", err)
	}
	u, _ := url.Parse(cfg.WebhookURL) // validated
	logger.Info("event delivery on", "webhook_host", u.Host, "retries", cfg.WebhookRetries)
	return ev, nil
}

// stop ends every delivery in progress (none is acknowledged, so the brain
// publishes them again) and waits for the router to stop.
func (ev *events) stop(logger *slog.Logger) {
	if err := ev.router.Close(); err != nil {
		logger.Warn("event router close", "error", err)
	}
	if err := <-ev.done; err != nil {
		logger.Warn("event router", "error", err)
	}
	ev.client.CloseIdleConnections()
}

// eventKey is the context key of a decoded event.
type eventKey struct{}

// decodedEvent is an event and the body to POST: the event re-encoded, so
// n8n only ever sees the fields of wire.Event.
type decodedEvent struct {
	ev   wire.Event
	body []byte
}

// decoded decodes an event strictly before its delivery attempts and
// checks it against its subject token. Watermill's Retry keeps the message
// context across attempts, so the event is decoded once.
func decoded(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		var ev wire.Event
		if err := wire.DecodeAPI(msg.Payload, &ev); err != nil {
			return nil, fmt.Errorf("event on %s%s is malformed: %w", subjects.LocalEvent, msg.UUID, err)
		}
		msg.Metadata.Set(metaKind, string(ev.Kind))
		switch {
		case ev.EventID != msg.UUID:
			return nil, fmt.Errorf("event on %s%s has event_id %q", subjects.LocalEvent, msg.UUID, ev.EventID)
		case ev.Kind == "":
			return nil, fmt.Errorf("event %s has no kind", ev.EventID)
		}
		body, err := json.Marshal(ev)
		if err != nil { // cannot happen for a decoded event
			return nil, fmt.Errorf("encode event %s: %w", ev.EventID, err)
		}
		msg.SetContext(context.WithValue(msg.Context(), eventKey{}, decodedEvent{ev: ev, body: body}))
		return h(msg)
	}
}

// deliver is the router's handler, one attempt: POST the event, then
// acknowledge it.
func (wh *webhook) deliver(msg *message.Message) error {
	ctx := msg.Context()
	de, ok := ctx.Value(eventKey{}).(decodedEvent)
	if !ok {
		return errors.New("deliver: the event was not decoded") // a bug in the middleware chain
	}
	ev := de.ev
	if err := wh.post(ctx, ev, de.body); err != nil {
		if ctx.Err() == nil {
			wh.logger.Info("event delivery attempt failed", "event_id", ev.EventID, "kind", ev.Kind, "error", err)
		}
		return err
	}
	if err := wh.acks.ack(ctx, ev.EventID); err != nil {
		// n8n has it; it will see it again, which is harmless.
		if ctx.Err() == nil {
			wh.logger.Warn("event delivered but not acknowledged; it will be delivered again", "event_id", ev.EventID, "kind", ev.Kind, "error", err)
		}
		return fmt.Errorf("acknowledge event %s: %w", ev.EventID, err)
	}
	wh.logger.Info("event delivered", "event_id", ev.EventID, "kind", ev.Kind)
	return nil
}

// post sends one delivery attempt; only a 2xx is success.
func (wh *webhook) post(ctx context.Context, ev wire.Event, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, wh.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("build webhook request: %w", err)
	}
	mac := hmac.New(sha256.New, wh.secret)
	mac.Write(body)
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set(HeaderIdempotencyKey, ev.EventID)
	h.Set(HeaderEventKind, string(ev.Kind))
	h.Set(HeaderWebhookToken, string(wh.secret))
	h.Set(HeaderSignature, "sha256="+hex.EncodeToString(mac.Sum(nil)))
	h.Set(HeaderTimestamp, strconv.FormatInt(time.Now().Unix(), 10))
	resp, err := wh.client.Do(req)
	if err != nil {
		// Not the *url.Error itself: a webhook URL's path is a capability.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("post to webhook: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxWebhookReply))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("webhook answered %s", resp.Status)
	}
	return nil
}

// onceSet holds the ids of the events being delivered.
type onceSet struct {
	logger *slog.Logger
	mu     sync.Mutex
	ids    map[string]bool
}

// middleware skips an event already being delivered (the brain published
// it again meanwhile) and an event over maxDeliveries; the brain publishes
// both again until one is acknowledged.
func (s *onceSet) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		id := msg.UUID
		s.mu.Lock()
		busy, full := s.ids[id], len(s.ids) >= maxDeliveries
		if !busy && !full {
			s.ids[id] = true
		}
		s.mu.Unlock()
		switch {
		case busy:
			s.logger.Debug("event already in delivery; skipped", "event_id", id)
			return nil, nil
		case full:
			s.logger.Warn("too many events in delivery; this one waits for the brain to publish it again", "event_id", id)
			return nil, nil
		}
		defer func() {
			s.mu.Lock()
			delete(s.ids, id)
			s.mu.Unlock()
		}()
		return h(msg)
	}
}

// parkingLot is the poison queue's publisher: it logs each parked event.
// The event needs no storage here: the brain holds it until acknowledged.
type parkingLot struct{ logger *slog.Logger }

func (p *parkingLot) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		p.logger.Warn("event parked: delivery failed after every retry; the brain will publish it again",
			"event_id", m.UUID, "kind", m.Metadata.Get(metaKind), "error", m.Metadata.Get(middleware.ReasonForPoisonedKey))
	}
	return nil
}

func (p *parkingLot) Close() error { return nil }
