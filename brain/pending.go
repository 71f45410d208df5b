package brain

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"n8nbrain/brain/internal/store"
	"n8nbrain/brain/internal/tenancy"
	"n8nbrain/registry"
)

// What waits for a human (pending approvals, by age and by time to expiry)
// and what waits for an edge (undelivered events) lives in each tenant's
// own database. Scanning every tenant's database on an interval would make
// the brain's cost grow with tenants that do nothing, so it is counted only
// for tenants that are active: after a turn this replica decided, an API
// call it answered (a reviewer's list, a decision, an event ack), a timer
// it handled, and the reconciliation pass (BRAIN_RECONCILE_INTERVAL, which
// visits each tenant once per interval anyway). Each count is at most one
// query of each kind per tenant per pendingDebounce, on the partial indexes
// of pending approvals and undelivered events.
//
// The counts are kept with the approvals' times, so ages and times to
// expiry are computed at scrape time and stay right between counts; an
// approval past its expiry is no longer counted as pending. What another
// replica changed since (an approval decided there) shows here at this
// replica's next count: every series carries the time of its count
// (brain_pending_snapshot_timestamp_seconds), and the alert rules read each
// tenant's figures from the replica with the newest one.

// pendingDebounce groups the kicks of a busy tenant into one count.
const pendingDebounce = time.Second

// pendingListLimit bounds the approvals whose times are kept per tenant.
// Beyond it the rest (which expire later) are counted in the age bucket
// of the youngest approval listed.
const pendingListLimit = 1000

type pendingSnapshot struct {
	tenant    registry.TenantID
	account   string
	at        time.Time
	approvals []store.PendingApproval
	total     int // pending approvals, listed or not
	outboxN   int
	outboxOld time.Time
}

type pendingWatch struct {
	dir *tenancy.Directory
	log *slog.Logger

	mu     sync.Mutex
	kicked map[registry.TenantID]*registry.Tenant
	snaps  map[registry.TenantID]*pendingSnapshot
	wake   chan struct{}
}

func newPendingWatch(dir *tenancy.Directory, log *slog.Logger) *pendingWatch {
	return &pendingWatch{dir: dir, log: log, kicked: map[registry.TenantID]*registry.Tenant{},
		snaps: map[registry.TenantID]*pendingSnapshot{}, wake: make(chan struct{}, 1)}
}

// kick asks for t's pending work to be counted soon. It never blocks.
func (w *pendingWatch) kick(t *registry.Tenant) {
	if t == nil || t.Status != registry.TenantStatusActive {
		return
	}
	w.mu.Lock()
	w.kicked[t.ID] = t
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run counts the kicked tenants' pending work until ctx is done.
func (w *pendingWatch) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(pendingDebounce):
		}
		w.mu.Lock()
		batch := w.kicked
		w.kicked = map[registry.TenantID]*registry.Tenant{}
		w.mu.Unlock()
		for _, t := range batch {
			if ctx.Err() != nil {
				return
			}
			if err := w.count(ctx, t); err != nil && ctx.Err() == nil {
				w.log.Debug("count pending approvals and events", "tenant_id", t.ID, "error", err)
			}
		}
	}
}

func (w *pendingWatch) count(ctx context.Context, t *registry.Tenant) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pool, release, err := w.dir.Lease(ctx, t)
	if err != nil {
		return err
	}
	defer release()
	return w.countOn(ctx, t, pool)
}

// countOn counts t's pending work on a tenant database the caller holds
// (the reconciliation pass's visit).
func (w *pendingWatch) countOn(ctx context.Context, t *registry.Tenant, q store.DBTX) error {
	var err error
	s := &pendingSnapshot{tenant: t.ID, account: t.NATSAccount, at: time.Now()}
	if s.approvals, s.total, err = store.ApprovalPendingTimes(ctx, q, pendingListLimit); err != nil {
		return err
	}
	if s.outboxN, s.outboxOld, err = store.OutboxBacklog(ctx, q); err != nil {
		return err
	}
	w.mu.Lock()
	w.snaps[t.ID] = s
	w.mu.Unlock()
	return nil
}

// snapshots returns the counts of tenants still in the registry, and
// forgets the others.
func (w *pendingWatch) snapshots() []*pendingSnapshot {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]*pendingSnapshot, 0, len(w.snaps))
	for id, s := range w.snaps {
		if t, ok := w.dir.ByAccount(s.account); !ok || t.ID != id {
			delete(w.snaps, id)
			continue
		}
		out = append(out, s)
	}
	return out
}

// approvalAges are the age buckets of brain_approvals_pending: label and
// upper bound.
var approvalAges = []struct {
	label string
	upTo  time.Duration
}{
	{"lt15m", 15 * time.Minute}, {"15m-1h", time.Hour}, {"1h-4h", 4 * time.Hour}, {"4h-24h", 24 * time.Hour}, {"gt24h", 1 << 62},
}

// approvalExpiries are the windows of brain_approvals_expiring.
var approvalExpiries = []struct {
	label  string
	within time.Duration
}{{"15m", 15 * time.Minute}, {"1h", time.Hour}, {"4h", 4 * time.Hour}}

var (
	pendingSnapshotDesc = prometheus.NewDesc("brain_pending_snapshot_timestamp_seconds",
		"When this replica last counted the tenant's pending approvals and undelivered events (Unix time).", []string{"tenant"}, nil)
	approvalsPendingDesc = prometheus.NewDesc("brain_approvals_pending",
		"Approvals waiting for a human, by tenant and age (lt15m, 15m-1h, 1h-4h, 4h-24h, gt24h), as of the last count.",
		[]string{"tenant", "age"}, nil)
	approvalsExpiringDesc = prometheus.NewDesc("brain_approvals_expiring",
		"Pending approvals that expire within the window (15m, 1h, 4h) unless a human decides them, by tenant.",
		[]string{"tenant", "within"}, nil)
	approvalsOldestDesc = prometheus.NewDesc("brain_approvals_oldest_pending_age_seconds",
		"Age of the tenant's oldest pending approval (0 when none).", []string{"tenant"}, nil)
	outboxUndeliveredDesc = prometheus.NewDesc("brain_outbox_undelivered",
		"Events written for the tenant's n8n and not yet acknowledged by its edge, as of the last count.", []string{"tenant"}, nil)
	outboxLagDesc = prometheus.NewDesc("brain_outbox_lag_seconds",
		"Age of the tenant's oldest undelivered event (0 when every event is delivered).", []string{"tenant"}, nil)
)

// pendingCollector reports the counts at scrape time, ages computed now.
type pendingCollector struct{ b *brain }

func (c *pendingCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{pendingSnapshotDesc, approvalsPendingDesc, approvalsExpiringDesc, approvalsOldestDesc,
		outboxUndeliveredDesc, outboxLagDesc} {
		ch <- d
	}
}

func (c *pendingCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, s := range c.b.pending.snapshots() {
		id := string(s.tenant)
		ch <- prometheus.MustNewConstMetric(pendingSnapshotDesc, prometheus.GaugeValue, float64(s.at.UnixMilli())/1000, id)
		ages := make([]int, len(approvalAges))
		expiring := make([]int, len(approvalExpiries))
		var oldest time.Duration
		youngest := -1
		for _, a := range s.approvals {
			if !a.ExpiresAt.After(now) {
				continue // expired: the expiry timer re-queues it
			}
			age := now.Sub(a.CreatedAt)
			oldest = max(oldest, age)
			for i, b := range approvalAges {
				if age < b.upTo {
					ages[i]++
					if youngest < 0 || i < youngest {
						youngest = i
					}
					break
				}
			}
			for i, e := range approvalExpiries {
				if a.ExpiresAt.Sub(now) <= e.within {
					expiring[i]++
				}
			}
		}
		if rest := s.total - len(s.approvals); rest > 0 && youngest >= 0 {
			ages[youngest] += rest
		}
		for i, b := range approvalAges {
			ch <- prometheus.MustNewConstMetric(approvalsPendingDesc, prometheus.GaugeValue, float64(ages[i]), id, b.label)
		}
		for i, e := range approvalExpiries {
			ch <- prometheus.MustNewConstMetric(approvalsExpiringDesc, prometheus.GaugeValue, float64(expiring[i]), id, e.label)
		}
		ch <- prometheus.MustNewConstMetric(approvalsOldestDesc, prometheus.GaugeValue, oldest.Seconds(), id)
		lag := 0.0
		if s.outboxN > 0 && !s.outboxOld.IsZero() {
			lag = max(now.Sub(s.outboxOld), 0).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(outboxUndeliveredDesc, prometheus.GaugeValue, float64(s.outboxN), id)
		ch <- prometheus.MustNewConstMetric(outboxLagDesc, prometheus.GaugeValue, lag, id)
	}
}
