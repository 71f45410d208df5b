package brain

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/brain/internal/fair"
	"n8nbrain/registry"
	"n8nbrain/subjects"
)

// consumers keeps, for every tenant in the registry, its API subscription
// and one Consume on its turn consumer feeding the fair scheduler.
// Provisioning creates the streams and consumers; a tenant whose consumer
// does not exist yet is retried, and said once, not on every pass.
type consumers struct {
	js    jetstream.JetStream
	sched *fair.Scheduler[queued]
	api   *apiServer
	log   *slog.Logger

	mu      sync.Mutex
	running map[string]*tenantConsumer // by account
	missing map[string]time.Time       // account → when to look again
	apiSubs map[string]*tenantAPI      // by account
}

type tenantConsumer struct {
	tenant  registry.TenantID
	cc      jetstream.ConsumeContext
	ackWait time.Duration
}

const (
	// pullExpiry and pullHeartbeat keep an idle tenant's pull cheap: one
	// pull per expiry and one heartbeat per interval per replica (see
	// shared/reference/nats-multitenant, B).
	pullExpiry    = 5 * time.Minute
	pullHeartbeat = 30 * time.Second
	// haltTimeout bounds the wait for stopped pulls to unsubscribe (halt).
	haltTimeout = 2 * time.Second
	// missingRetry is how often a tenant without a consumer is looked for.
	missingRetry = 10 * time.Second
	// reconcileEvery is how often the running consumers are compared with
	// the registry.
	reconcileEvery = time.Second
	// bindTimeout bounds reading one consumer's info.
	bindTimeout = 5 * time.Second
)

func newConsumers(js jetstream.JetStream, sched *fair.Scheduler[queued], log *slog.Logger) *consumers {
	return &consumers{js: js, sched: sched, log: log, running: map[string]*tenantConsumer{}, missing: map[string]time.Time{},
		apiSubs: map[string]*tenantAPI{}}
}

// run reconciles until ctx is done, then stops every consumer.
func (c *consumers) run(ctx context.Context, tenants func() []*registry.Tenant) {
	t := time.NewTicker(reconcileEvery)
	defer t.Stop()
	for {
		c.reconcile(ctx, tenants())
		select {
		case <-ctx.Done():
			c.stopAll()
			return
		case <-t.C:
		}
	}
}

// reconcile starts a consumer for every tenant without one and stops those
// of accounts no longer in the registry. Turns of a stopped tenant that
// were queued here are handed back at once.
func (c *consumers) reconcile(ctx context.Context, tenants []*registry.Tenant) {
	want := make(map[string]registry.TenantID, len(tenants))
	for _, t := range tenants {
		want[t.NATSAccount] = t.ID
	}
	c.reconcileAPI(want)
	c.mu.Lock()
	var stop []string
	for acc := range c.running {
		if _, ok := want[acc]; !ok {
			stop = append(stop, acc)
		}
	}
	var start []string
	now := time.Now()
	for acc := range want {
		if _, ok := c.running[acc]; ok {
			continue
		}
		if at, ok := c.missing[acc]; ok && now.Before(at) {
			continue
		}
		start = append(start, acc)
	}
	c.mu.Unlock()
	for _, acc := range stop {
		c.stop(acc)
	}
	for _, acc := range start {
		if ctx.Err() != nil {
			return
		}
		c.start(ctx, acc, want[acc])
	}
}

// reconcileAPI opens the API subscription of every wanted account and
// closes the others.
func (c *consumers) reconcileAPI(want map[string]registry.TenantID) {
	if c.api == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for acc, sub := range c.apiSubs {
		if _, ok := want[acc]; !ok {
			_ = sub.close(false)
			delete(c.apiSubs, acc)
		}
	}
	for acc, id := range want {
		if _, ok := c.apiSubs[acc]; ok {
			continue
		}
		sub, err := c.api.subscribe(acc, id)
		if err != nil {
			c.log.Warn("subscribe to a tenant's API; retrying", "tenant_id", id, "error", err)
			continue
		}
		c.apiSubs[acc] = sub
	}
}

func (c *consumers) start(ctx context.Context, acc string, id registry.TenantID) {
	bctx, cancel := context.WithTimeout(ctx, bindTimeout)
	cons, err := c.js.Consumer(bctx, subjects.TurnsStream(acc), subjects.TurnsConsumer)
	cancel()
	if err != nil {
		c.mu.Lock()
		_, known := c.missing[acc]
		c.missing[acc] = time.Now().Add(missingRetry)
		c.mu.Unlock()
		if !known && ctx.Err() == nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) {
				c.log.Warn("tenant has no turn stream or consumer yet: its turns are not taken until provisioning creates them",
					"tenant_id", id, "stream", subjects.TurnsStream(acc), "error", err)
			} else {
				c.log.Warn("bind tenant's turn consumer; retrying", "tenant_id", id, "error", err)
			}
		}
		return
	}
	info := cons.CachedInfo()
	tc := &tenantConsumer{tenant: id, ackWait: info.Config.AckWait}
	if tc.ackWait <= 0 {
		tc.ackWait = 30 * time.Second
	}
	batch := min(max(info.Config.MaxAckPending, 1), 64)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		c.sched.Push(acc, queued{m: m, account: acc, ackWait: tc.ackWait, at: time.Now()})
	},
		jetstream.PullMaxMessages(batch),
		jetstream.PullExpiry(pullExpiry),
		jetstream.PullHeartbeat(pullHeartbeat),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			switch {
			case errors.Is(err, jetstream.ErrNoHeartbeat):
			case errors.Is(err, nats.ErrNoResponders):
				// The pull request found no consumer leader (a NATS node
				// died, or the server is starting). nats.go still counts
				// the pull as outstanding and would ask again only when
				// heartbeats are missed, 2×pullHeartbeat later: this
				// replica would take none of the tenant's turns meanwhile.
				// Consume again instead, as nats.go's ordered consumer does.
				c.log.Warn("tenant's pull found no consumer leader; consuming again", "tenant_id", id)
				go c.restart(acc, tc)
			case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound):
				// Deprovisioned, or re-created: bind again on a later pass.
				c.log.Warn("tenant's turn consumer is gone; binding again later", "tenant_id", id, "error", err)
				go c.stop(acc)
			default:
				c.log.Warn("turn consumer", "tenant_id", id, "error", err)
			}
		}),
	)
	if err != nil {
		c.log.Warn("consume tenant's turns; retrying", "tenant_id", id, "error", err)
		c.mu.Lock()
		c.missing[acc] = time.Now().Add(missingRetry)
		c.mu.Unlock()
		return
	}
	c.mu.Lock()
	tc.cc = cc
	delete(c.missing, acc)
	c.running[acc] = tc
	c.mu.Unlock()
	c.log.Debug("consuming tenant's turns", "tenant_id", id, "ack_wait", tc.ackWait.String(), "max_inflight", info.Config.MaxAckPending)
}

func (c *consumers) stop(acc string) {
	c.mu.Lock()
	tc := c.running[acc]
	delete(c.running, acc)
	delete(c.missing, acc)
	c.mu.Unlock()
	if tc == nil {
		return
	}
	c.halt(tc.cc)
	for _, q := range c.sched.Remove(acc) {
		_ = q.m.Nak()
	}
	c.log.Info("stopped consuming the turns of a tenant no longer in the registry", "tenant_id", tc.tenant)
}

// restart stops tc, the consumer of acc, for the next reconcile pass to
// bind and pull again. Turns already queued here stay queued: they are
// delivered, and their acks still reach the server.
func (c *consumers) restart(acc string, tc *tenantConsumer) {
	for range 50 { // the handler may run before start has registered tc
		c.mu.Lock()
		if c.running[acc] == tc {
			delete(c.running, acc)
			c.missing[acc] = time.Now() // due at the next pass
			c.mu.Unlock()
			tc.cc.Stop()
			return
		}
		registered := tc.cc != nil
		c.mu.Unlock()
		if registered {
			return // stopped or replaced meanwhile
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// halt stops consuming with ccs and returns once the server knows their
// pulls are gone, so that a turn handed back after it (a NAK) is delivered
// to another replica. nats.go unsubscribes a stopped pull on a goroutine of
// its own: a NAK sent before that reached the server could be delivered to
// the dead pull, and the turn would wait out its ack wait.
func (c *consumers) halt(ccs ...jetstream.ConsumeContext) {
	for _, cc := range ccs {
		cc.Stop()
	}
	timeout := time.NewTimer(haltTimeout)
	defer timeout.Stop()
	for _, cc := range ccs {
		select {
		case <-cc.Closed():
		case <-timeout.C:
			c.log.Warn("a stopped turn pull did not unsubscribe in time; a turn handed back may wait out its ack wait",
				"timeout", haltTimeout.String())
			return
		}
	}
	// The server has read the unsubscriptions once it answers a ping sent after them.
	_ = c.js.Conn().FlushTimeout(haltTimeout)
}

// stopAll stops every consumer and drains every API subscription: no new
// turn or call is taken, the calls already received are still queued.
func (c *consumers) stopAll() {
	c.mu.Lock()
	running, subs := c.running, c.apiSubs
	c.running, c.apiSubs = map[string]*tenantConsumer{}, map[string]*tenantAPI{}
	c.mu.Unlock()
	ccs := make([]jetstream.ConsumeContext, 0, len(running))
	for _, tc := range running {
		ccs = append(ccs, tc.cc)
	}
	c.halt(ccs...)
	for _, sub := range subs {
		_ = sub.close(true)
	}
}

// minAckWait is the shortest ack wait of the running consumers (5s when none).
func (c *consumers) minAckWait() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := 5 * time.Second
	first := true
	for _, tc := range c.running {
		if first || tc.ackWait < d {
			d, first = tc.ackWait, false
		}
	}
	return max(d, 300*time.Millisecond)
}

// count is how many tenants are being consumed.
func (c *consumers) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.running)
}
