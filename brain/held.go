package brain

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5/pgxpool"

	"n8nbrain/brain/internal/tenancy"
	"n8nbrain/registry"
)

// A tenant's database that does not answer (down, restarting, crashed
// under a statement) holds the tenant's turns on this replica instead of
// sending each back to JetStream with a growing delay: one probe per
// tenant asks the database again, 100 ms after the failure and then a
// second after each try (a try takes up to probeTimeout against a host
// that answers nothing), and the moment it answers every held turn goes
// back to the workers. A turn so held is not redelivered meanwhile, and
// the workers are free for other tenants.
//
// A turn is held Config.TurnHold at most; then it goes back to JetStream
// as before (redeliveryDelay), to be held again if the database is still
// down when it returns; its last delivery (Config.MaxDeliveries) is not
// held but tried, and answered unavailable, so a caller hears of an outage
// that outlasts its deliveries (about five minutes with the defaults).
const (
	// maxHolds bounds how often one delivery of a turn is held: a turn
	// whose database answers the probe but fails it again goes back to
	// JetStream, counted.
	maxHolds   = 3
	probeFirst = 100 * time.Millisecond
	probeEvery = time.Second
	// probeTimeout bounds one probe (a host that drops packets): past the
	// connect timeout, so that a probe that fails says why (the dial's own
	// error, or this replica's connection cap) rather than only that time
	// ran out.
	probeTimeout = tenancy.ConnectTimeout + time.Second
)

// held is this replica's held turns, by tenant account.
type held struct {
	b       *brain
	ctx     context.Context // the probes': done when the replica stops
	mu      sync.Mutex
	tenants map[string]*heldTenant
	closed  bool
	wg      sync.WaitGroup
}

type heldTenant struct {
	t     *registry.Tenant
	turns []heldTurn
	since time.Time
}

type heldTurn struct {
	q     queued
	until time.Time
}

func newHeld(ctx context.Context, b *brain) *held {
	return &held{b: b, ctx: ctx, tenants: map[string]*heldTenant{}}
}

// join holds q if its tenant's turns are being held already (its
// database is being probed): the turn waits with them untried. It reports
// whether it did.
func (h *held) join(t *registry.Tenant, q queued) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.tenants[q.account] != nil && h.addLocked(t, q)
}

// hold keeps q until t's database answers, starting the tenant's probe if
// none runs. It reports false when the replica is stopping or this delivery
// was held maxHolds times already (q is then the caller's to send back).
func (h *held) hold(t *registry.Tenant, q queued) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.addLocked(t, q)
}

func (h *held) addLocked(t *registry.Tenant, q queued) bool {
	if h.closed || q.holds >= maxHolds {
		return false
	}
	q.holds++
	ht := h.tenants[q.account]
	if ht == nil {
		ht = &heldTenant{t: t, since: time.Now()}
		h.tenants[q.account] = ht
		h.b.log.Warn("tenant database does not answer; holding its turns until it does",
			"tenant_id", string(t.ID))
		h.wg.Go(func() { h.probe(h.ctx, q.account, ht) })
	}
	ht.turns = append(ht.turns, heldTurn{q: q, until: time.Now().Add(h.b.cfg.TurnHold)})
	h.b.inst.turnDone(string(t.ID), OutcomeHeld, "database_unreachable")
	return true
}

// probe asks the tenant's database until it answers, sends back to
// JetStream the turns held for Config.TurnHold meanwhile, and then gives
// the rest to the workers (heartbeatQueued keeps them alive until then).
func (h *held) probe(ctx context.Context, account string, ht *heldTenant) {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.MaxElapsedTime = probeFirst, probeEvery, 0
	bo.Reset()
	for {
		select {
		case <-ctx.Done():
			return // close sends the held turns back
		case <-time.After(bo.NextBackOff()):
		}
		down, answer := h.ask(ctx, account)
		if ctx.Err() != nil {
			return // the replica stops: not an answer
		}
		now := time.Now()
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			return
		}
		if down {
			// Held long enough: back to JetStream, as a failed turn was before.
			ht.turns = slices.DeleteFunc(ht.turns, func(x heldTurn) bool {
				if now.Before(x.until) {
					return false
				}
				delivered := uint64(1)
				if md, _ := x.q.m.Metadata(); md != nil {
					delivered = md.NumDelivered
				}
				_ = x.q.m.NakWithDelay(redeliveryDelay(delivered))
				return true
			})
			h.mu.Unlock()
			h.b.log.Debug("tenant database still does not answer", "tenant_id", string(ht.t.ID), "error", answer)
			continue
		}
		turns := ht.turns
		delete(h.tenants, account)
		ht.turns = nil
		// Pushed before the lock is let go: close, which takes it, then
		// finds them in the queue it hands back (sched.Close after it).
		for _, x := range turns {
			x.q.at = now
			h.b.sched.Push(account, x.q)
		}
		h.mu.Unlock()
		h.b.log.Info("tenant database answers again; its held turns resume", "tenant_id", string(ht.t.ID),
			"held_turns", len(turns), "after_ms", now.Sub(ht.since).Milliseconds(), "answer", answer)
		return
	}
}

// ask pings the tenant's database as the registry now has it (an operator
// may have moved it meanwhile). It reports whether the database still does
// not answer, and else what ended the hold: an answer, a refusal (its role's
// password changed, say: the turns' to meet and report, as they would
// without the hold), or the tenant gone from the registry or disabled (the
// workers refuse its turns).
func (h *held) ask(ctx context.Context, account string) (down bool, answer string) {
	t, ok := h.b.dir.ByAccount(account)
	switch {
	case !ok:
		return false, "the tenant is no longer in the registry"
	case t.Status != registry.TenantStatusActive:
		return false, "the tenant is disabled"
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	err := h.b.dir.Visit(pctx, t, func(p *pgxpool.Pool) error { return p.Ping(pctx) })
	switch {
	case err == nil:
		return false, "ok"
	case errors.Is(err, tenancy.ErrAtCapacity):
		return false, "an answer: this replica is at its connection cap"
	case unreachable(err) || pctx.Err() != nil:
		// Its own deadline too: a host that takes the connection and never
		// speaks answers nothing within probeTimeout.
		return true, err.Error()
	}
	return false, "a refusal: " + err.Error()
}

// close ends the holding (a probe ends at its next try, or when the
// replica's context is done) and returns every held turn, for the caller
// to send back to JetStream: the replica is stopping.
func (h *held) close() []queued {
	h.mu.Lock()
	h.closed = true
	var out []queued
	for acc, ht := range h.tenants {
		for _, x := range ht.turns {
			out = append(out, x.q)
		}
		ht.turns = nil
		delete(h.tenants, acc)
	}
	h.mu.Unlock()
	return out
}

// each calls fn for every held turn, with the holding locked: fn must not
// block (heartbeatQueued tells JetStream with it that they are alive).
func (h *held) each(fn func(q queued)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ht := range h.tenants {
		for _, x := range ht.turns {
			fn(x.q)
		}
	}
}

// counts is how many turns each held tenant has held here, by account.
func (h *held) counts() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]int, len(h.tenants))
	for acc, ht := range h.tenants {
		out[acc] = len(ht.turns)
	}
	return out
}

// wait returns once every probe has ended.
func (h *held) wait() { h.wg.Wait() }
