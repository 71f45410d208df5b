package tests

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"n8nbrain/deploy/devstack"
	"n8nbrain/edge"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// A three-node NATS cluster with every stream replicated on all three (R3):
// one node is killed while turns flow. Nothing is lost (every turn is
// decided), nothing is decided twice, and the edge and the brains carry on
// through the other nodes by themselves; the node comes back and catches up.
func TestClusterNodeDiesUnderLoad(t *testing.T) {
	t.Parallel()
	s := newSystemWith(t, func(c *devstack.Config) { c.NATSNodes = 3 })
	a := s.tenant(spec("cluster-a"))
	s.startBrain("r1", nil)
	s.startBrain("r2", nil)
	ea := s.startEdge(a, func(c *edge.Config) { c.TurnWait = 5 * time.Second })

	const callers, perCaller = 6, 40
	var (
		mu       sync.Mutex
		answered = map[string]wire.TurnSubmitReply{}
		retries  atomic.Int64
		sent     atomic.Int64
	)
	// A caller is n8n: it submits each turn until it has the decision, and
	// treats 202 and 503 as "ask again with the same turn".
	submit := func(id string) {
		req := quoteEmail(id)
		deadline := time.Now().Add(2 * time.Minute)
		for {
			r := ea.submit(req)
			sent.Add(1)
			switch r.Status {
			case http.StatusOK:
				rep := r.reply(t)
				mu.Lock()
				answered[id] = rep
				mu.Unlock()
				return
			case http.StatusAccepted, http.StatusServiceUnavailable:
				retries.Add(1)
			default:
				t.Errorf("turn %s: %d %s", id, r.Status, r.Body)
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("turn %s never decided", id)
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	var wg sync.WaitGroup
	started := make(chan struct{})
	var once sync.Once
	for c := range callers {
		wg.Go(func() {
			for i := range perCaller {
				if i == perCaller/4 {
					once.Do(func() { close(started) })
				}
				submit(fmt.Sprintf("<cluster-%d-%d@customer.example>", c, i))
			}
		})
	}
	<-started
	// The node that leads the tenant's turn stream: its death makes the
	// cluster elect another leader while turns are being written.
	st, err := s.stack.Streams.JS.Stream(context.Background(), subjects.TurnsStream(a.Account.Public))
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("the turn stream is not replicated on three nodes: %d replicas, %+v", info.Config.Replicas, info.Cluster)
	}
	leader := -1
	for i := range s.stack.NATS.Size() {
		if fmt.Sprintf("brain-nats-%d", i+1) == info.Cluster.Leader {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatalf("stream leader %q is not a node of the stack", info.Cluster.Leader)
	}
	s.stack.NATS.Kill(leader)
	killed := time.Now()
	wg.Wait()
	t.Logf("%d turns, %d submissions (%d asked again) in %s after the stream leader (%s) died", callers*perCaller, sent.Load(),
		retries.Load(), time.Since(killed), info.Cluster.Leader)

	if len(answered) != callers*perCaller {
		t.Fatalf("%d of %d turns decided", len(answered), callers*perCaller)
	}
	db := s.tenantDB(a)
	if n := count(t, db, `SELECT count(*) FROM decisions`); n != callers*perCaller {
		t.Fatalf("%d decisions for %d turns", n, callers*perCaller)
	}
	if n := count(t, db, `SELECT count(*) FROM (SELECT work_item_id FROM decisions GROUP BY work_item_id, turn HAVING count(*) > 1) d`); n != 0 {
		t.Fatalf("%d turns decided twice", n)
	}
	for id, rep := range answered {
		if rep.WorkItemID != id || rep.Action == nil || rep.Action.ApprovalID == "" {
			t.Fatalf("answer for %s: %+v", id, rep)
		}
	}
	// Approvals: exactly one per decided turn (the decision, not a retry, made it).
	if n := count(t, db, `SELECT count(*) FROM approvals`); n != callers*perCaller {
		t.Fatalf("%d approvals for %d turns", n, callers*perCaller)
	}
	// The node comes back and the cluster serves on it again.
	if err := s.stack.NATS.Restart(leader); err != nil {
		t.Fatal(err)
	}
	ea.submit(quoteEmail("<cluster-after@customer.example>")).reply(t)
}
