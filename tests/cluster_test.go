package tests

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"n8nbrain/brain"
	"n8nbrain/deploy/devstack"
	"n8nbrain/edge"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// A three-node NATS cluster with every stream replicated on all three (R3):
// one node is killed while turns flow. Nothing is lost (every turn is
// decided), nothing is decided twice, and the edge and the brains carry on
// through the other nodes by themselves; the node comes back and catches up.
//
// The node killed leads the tenant's turn stream, and the edge and brain r1
// are connected to it: they are given that node's URL alone (nats.go would
// otherwise pick one of a list at random, and often nobody was on the
// killed node) and learn the others from the cluster, as a client given the
// whole list would have them. They must reconnect elsewhere by themselves
// (their reconnect counters move, the surviving nodes list their
// connections) and keep working: r1 alone decides a turn after the load.
func TestClusterNodeDiesUnderLoad(t *testing.T) {
	t.Parallel()
	s := newSystemWith(t, func(c *devstack.Config) { c.NATSNodes = 3 })
	a := s.tenant(spec("cluster-a"))
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
	leaderURL := s.stack.NATS.Node(leader).ClientURL()
	brainOps, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	edgeOps, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r1, edgeMetrics := "http://"+brainOps.Addr().String(), "http://"+edgeOps.Addr().String()
	s.startBrain("r1", func(c *brain.Config) {
		c.NATSURL = leaderURL
		c.OpsListener = brainOps
	})
	stopR2 := s.startBrain("r2", nil)
	ea := s.startEdge(a, func(c *edge.Config) {
		c.TurnWait = 5 * time.Second
		c.NATSURL = leaderURL
		c.MetricsListener = edgeOps
	})
	names := []string{"brain-r1", "edge-" + string(a.ID)}
	// connectedTo lists the nodes (from 0) each of names is connected to.
	connectedTo := func() map[string][]int {
		out := map[string][]int{}
		for i := range s.stack.NATS.Size() {
			srv := s.stack.NATS.Node(i)
			if srv == nil {
				continue
			}
			cz, err := srv.Connz(&server.ConnzOptions{Limit: 1024})
			if err != nil {
				t.Errorf("connz of node %d: %v", i+1, err)
				continue
			}
			for _, c := range cz.Conns {
				out[c.Name] = append(out[c.Name], i)
			}
		}
		return out
	}
	eventually(t, 10*time.Second, "brain r1 and the edge to be connected to the stream leader", func() bool {
		on := connectedTo()
		for _, n := range names {
			if len(on[n]) != 1 || on[n][0] != leader {
				return false
			}
		}
		return true
	})
	if n := sumMetric(t, r1, "brain_nats_reconnects_total") + sumMetric(t, edgeMetrics, "edge_nats_reconnects_total"); n != 0 {
		t.Fatalf("%v reconnects before any node died", n)
	}

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
	s.stack.NATS.Kill(leader)
	killed := time.Now()
	// Brain r1 and the edge reconnect by themselves, to another node.
	eventually(t, 30*time.Second, "brain r1 and the edge to reconnect to another node", func() bool {
		if sumMetric(t, r1, "brain_nats_reconnects_total") < 1 || sumMetric(t, edgeMetrics, "edge_nats_reconnects_total") < 1 {
			return false
		}
		on := connectedTo()
		for _, n := range names {
			if len(on[n]) != 1 || on[n][0] == leader {
				return false
			}
		}
		return true
	})
	t.Logf("brain r1 and the edge reconnected to another node %s after the kill", time.Since(killed))
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
	// Brain r1, reconnected, keeps working: with r2 gone, it alone decides
	// the next turn, relayed by the reconnected edge.
	stopR2()
	decided := sumMetric(t, r1, "brain_turns_total", `outcome="decided"`)
	ea.submit(quoteEmail("<cluster-r1-alone@customer.example>")).reply(t)
	// The replica counts a turn after its reply is stored, so the edge's 200
	// can come first: wait for the count, then check it is exactly one.
	eventually(t, 5*time.Second, "brain r1 to count the turn it decided alone", func() bool {
		return sumMetric(t, r1, "brain_turns_total", `outcome="decided"`) > decided
	})
	if got := sumMetric(t, r1, "brain_turns_total", `outcome="decided"`); got != decided+1 {
		t.Fatalf("brain r1 decided %v turns after r2 stopped, want 1", got-decided)
	}
	// The node comes back and the cluster serves on it again.
	if err := s.stack.NATS.Restart(leader); err != nil {
		t.Fatal(err)
	}
	ea.submit(quoteEmail("<cluster-after@customer.example>")).reply(t)
}
