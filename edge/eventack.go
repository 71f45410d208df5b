package edge

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// acker sends api.event.ack for the events n8n accepted. One call is in
// flight at a time, and the events accepted meanwhile go together in the
// next one (event_ids): at a busy tenant, one call and one transaction in
// the brain stand for many events, and an event alone costs what it did
// before (event_id, with no wait). A brain that refuses event_ids (an older
// release, during a rolling upgrade) gets one call per event from then on.
type acker struct {
	brain   brainClient
	metrics *metrics
	logger  *slog.Logger
	single  atomic.Bool // the brain refused event_ids

	mu      sync.Mutex
	queue   []*pendingAck
	sending bool
}

type pendingAck struct {
	id   string
	done chan error // buffered: the sender never waits for the caller
}

// ack acknowledges one event, in the next call to the brain, and returns
// that call's answer for it: nil, or why the event is not marked delivered.
func (a *acker) ack(ctx context.Context, id string) error {
	p := &pendingAck{id: id, done: make(chan error, 1)}
	a.mu.Lock()
	a.queue = append(a.queue, p)
	lead := !a.sending
	a.sending = true
	a.mu.Unlock()
	if lead {
		// Not in the caller's context: the batch carries other events, whose
		// callers still wait when this one gives up. apiTimeout bounds it.
		go a.send()
	}
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// send makes calls until no event waits.
func (a *acker) send() {
	for {
		a.mu.Lock()
		n := min(len(a.queue), wire.MaxEventAckBatch)
		if n == 0 {
			a.sending = false
			a.mu.Unlock()
			return
		}
		batch := a.queue[:n:n]
		a.queue = a.queue[n:]
		a.mu.Unlock()
		a.call(batch)
	}
}

func (a *acker) call(batch []*pendingAck) {
	ctx := context.Background()
	if len(batch) == 1 || a.single.Load() {
		for _, p := range batch {
			a.metrics.observeAckBatch(1)
			var rep wire.EventAckReply
			p.done <- callJSON(ctx, a.brain, subjects.APIEventAck, wire.EventAckRequest{EventID: p.id}, &rep)
		}
		return
	}
	req := wire.EventAckRequest{EventIDs: make([]string, len(batch))}
	for i, p := range batch {
		req.EventIDs[i] = p.id
	}
	var rep wire.EventAckReply
	a.metrics.observeAckBatch(len(batch))
	err := callJSON(ctx, a.brain, subjects.APIEventAck, req, &rep)
	if e := wire.ErrorOf(err); err != nil && e.Code == wire.CodeInvalid && e.Field == "event_ids" {
		a.logger.Info("the brain does not take event_ids; acknowledging one event per call", "error", e.Message)
		a.single.Store(true)
		a.call(batch)
		return
	}
	unknown := make(map[string]bool, len(rep.Unknown))
	for _, id := range rep.Unknown {
		unknown[id] = true
	}
	for _, p := range batch {
		switch {
		case err != nil:
			p.done <- err
		case unknown[p.id]:
			p.done <- &wire.Error{Code: wire.CodeNotFound, Message: fmt.Sprintf("the brain has no event %s", p.id)}
		default:
			p.done <- nil
		}
	}
}
