package tests

// Turns keep coming while the one NATS server of the stack (the dev stack's
// shape: one embedded server, one JetStream store) is shut down and started
// again on the same port and store, several times, with two brain replicas
// and the edge running as real binaries connected over TCP: they reconnect
// by themselves, nothing is lost and nothing is decided twice.
//
// The server is stopped with its Shutdown, which is what nats-server does
// on SIGTERM or SIGINT (server/signal.go: Shutdown, WaitForShutdown, exit):
// every stream's file store flushes its last block and writes its state
// before the server is gone. So this is a restart, not a crash: the
// JetStream sync setting (the stack's default leaves fsync to the server's
// sync interval, 2 minutes) makes no difference to a clean shutdown, and
// only a power failure or kernel crash could lose what was acknowledged
// but not yet fsynced. A crash cannot be simulated in-process: the server
// has no way to stop without flushing, and SIGKILL would kill the test
// itself.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"n8nbrain/wire"
)

func TestNATSRestartLosesNothing(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	if s.stack.NATS.Size() != 1 {
		t.Fatalf("the stack runs %d NATS nodes, want the dev stack's one", s.stack.NATS.Size())
	}
	tn := s.tenant(spec("natsrestart"))
	brainBin, edgeBin := buildBinary(t, "../brain/cmd/brain"), buildBinary(t, "../edge/cmd/edge")
	storeDir := filepath.Join(s.stack.IDs.Dir(), "jetstream")
	js0 := jetStreamState(t, s.stack.NATS.Node(0))
	t.Logf("JetStream store %s: %d streams, %d consumers", js0.dir, len(js0.lastSeq), js0.consumers)

	hook := startEventHook(t)

	natsURL := s.stack.NATS.ClientURL()
	type watched struct {
		p       *process
		ops     string // base URL of /readyz and /metrics
		metric  string // its reconnect counter
		readyz  string
		initial float64
	}
	var procs []*watched
	for _, r := range []string{"restart-1", "restart-2"} {
		ops := freeAddr(t)
		env := append(brainEnv(t, s, r, ops), "BRAIN_EVENT_RETRY_BASE=200ms", "BRAIN_EVENT_RETRY_MAX=2s")
		procs = append(procs, &watched{p: newProcess(t, "brain-"+r, brainBin, env), ops: "http://" + ops,
			metric: "brain_nats_reconnects_total", readyz: "http://" + ops + "/readyz"})
	}
	ecfg := s.stack.EdgeConfig(tn)
	if ecfg.NATSURL != natsURL {
		t.Fatalf("edge NATS URL %s, brains' %s", ecfg.NATSURL, natsURL)
	}
	edgeAddr, edgeMetrics := freeAddr(t), freeAddr(t)
	procs = append(procs, &watched{p: newProcess(t, "edge", edgeBin, append(os.Environ(), "EDGE_NATS_URL="+ecfg.NATSURL,
		"EDGE_NATS_CREDS="+ecfg.CredsFile, "EDGE_TOKEN="+ecfg.Token, "EDGE_ADDR="+edgeAddr, "EDGE_METRICS_ADDR="+edgeMetrics,
		"EDGE_TENANT_ID=natsrestart", "EDGE_LOG_LEVEL=warn", "EDGE_TURN_WAIT=3s",
		"EDGE_WEBHOOK_URL=http://"+hook.addr+"/webhook/brain-events",
		"EDGE_WEBHOOK_SECRET=natsrestart-webhook-secret-0123456789")),
		ops: "http://" + edgeMetrics, metric: "edge_nats_reconnects_total", readyz: "http://" + edgeAddr + "/readyz"})

	probe := &http.Client{Timeout: 2 * time.Second}
	ready := func(w *watched) (bool, string) {
		res, err := probe.Get(w.readyz)
		if err != nil {
			return false, err.Error()
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res.StatusCode == http.StatusOK, fmt.Sprintf("%d %s", res.StatusCode, bytes.TrimSpace(b))
	}
	allReady := func() bool {
		for _, w := range procs {
			if ok, _ := ready(w); !ok {
				return false
			}
		}
		return true
	}
	eventually(t, 30*time.Second, "the brains and the edge to be ready", allReady)
	for _, w := range procs {
		w.initial = sumMetric(t, w.ops, w.metric)
	}

	// Callers, for 30 seconds, each submitting its own work items one after
	// another, each turn again until a 200 (a 202 says the brain has not
	// answered yet, a 503 that NATS is away): every answer is kept, and
	// every other answer counted by what it said.
	const callers = 4
	type answer struct {
		key        string
		body       []byte
		start, end time.Time
		attempts   int
		dup        bool // the second of two sent at once
	}
	answers := make(chan answer, 1<<16)
	var load sync.WaitGroup
	var started sync.Map
	var attempts atomic.Int64
	var otherMu sync.Mutex
	other := map[string]int{} // "503 {body}" or a transport error → times seen
	note := func(k string) {
		otherMu.Lock()
		other[k]++
		otherMu.Unlock()
	}
	client := &http.Client{Timeout: 20 * time.Second}
	loadStart := time.Now()
	stopAt := loadStart.Add(30 * time.Second)
	deadline := stopAt.Add(3 * time.Minute)
	// submit sends one turn until it is answered 200 and keeps the answer;
	// false when the test has already failed for it.
	submit := func(req *wire.TurnSubmitRequest, body []byte, dup bool) bool {
		begun, n := time.Now(), 0
		for {
			if time.Now().After(deadline) {
				t.Errorf("%s: no 200 after %d attempts in %s", req.WorkItemID, n, time.Since(begun))
				return false
			}
			hr, _ := http.NewRequest(http.MethodPost, "http://"+edgeAddr+"/v1/turns", bytes.NewReader(body))
			hr.Header.Set("Authorization", "Bearer "+ecfg.Token)
			hr.Header.Set("Content-Type", "application/json")
			attempts.Add(1)
			n++
			res, err := client.Do(hr)
			if err != nil {
				note("transport: " + err.Error())
			} else {
				b, rerr := io.ReadAll(res.Body)
				res.Body.Close()
				if rerr == nil && res.StatusCode == http.StatusOK {
					answers <- answer{key: req.WorkItemID, body: b, start: begun, end: time.Now(), attempts: n, dup: dup}
					return true
				}
				note(fmt.Sprintf("%d %s", res.StatusCode, strings.ReplaceAll(string(bytes.TrimSpace(b)), req.WorkItemID, "<id>")))
				if res.StatusCode != http.StatusAccepted && res.StatusCode < 500 {
					t.Errorf("%s: %d %s", req.WorkItemID, res.StatusCode, b)
					return false
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for c := range callers {
		load.Go(func() {
			for i := 0; time.Now().Before(stopAt); i++ {
				time.Sleep(50 * time.Millisecond)
				req := quoteEmail(fmt.Sprintf("<natsrestart-%d-%d@customer.example>", c, i))
				s.noteEmail(req)
				started.Store(req.WorkItemID, true)
				body, _ := json.Marshal(req)
				if i%4 != 0 {
					if !submit(req, body, false) {
						return
					}
					continue
				}
				// Every fourth turn is sent twice at once, as n8n sends a
				// turn again when its own request timed out: both get the
				// one decision, restart or not.
				var both sync.WaitGroup
				var ok atomic.Int32
				for _, dup := range []bool{false, true} {
					both.Go(func() {
						if submit(req, body, dup) {
							ok.Add(1)
						}
					})
				}
				both.Wait()
				if ok.Load() != 2 {
					return
				}
			}
		})
	}

	// The restarts: the server shut down a few seconds into the load, down
	// 1–3 s, started again on the same port and store, then every process
	// waited for until /readyz says it is back (or 20 s, a finding).
	type outage struct{ down, up, allReady time.Time }
	var outages []outage
	var restarts sync.WaitGroup
	restarts.Go(func() {
		for len(outages) < 5 {
			time.Sleep(time.Duration(2000+rand.IntN(2000)) * time.Millisecond)
			if time.Until(stopAt) < 4*time.Second {
				return
			}
			before := jetStreamState(t, s.stack.NATS.Node(0))
			o := outage{down: time.Now()}
			s.stack.NATS.Kill(0)
			time.Sleep(time.Duration(1000+rand.IntN(2000)) * time.Millisecond)
			if err := s.stack.NATS.Restart(0); err != nil {
				t.Errorf("restart %d of the NATS server: %v", len(outages)+1, err)
				return
			}
			o.up = time.Now()
			if got := s.stack.NATS.ClientURL(); got != natsURL {
				t.Errorf("the restarted server is at %s, not %s", got, natsURL)
			}
			// The same store, reloaded: every stream and consumer is back,
			// none behind where it was when the server went down.
			after := jetStreamState(t, s.stack.NATS.Node(0))
			if after.dir != before.dir || !strings.HasPrefix(before.dir, storeDir) {
				t.Errorf("JetStream store %s before restart %d, %s after; want one under %s", before.dir, len(outages)+1, after.dir, storeDir)
			}
			if after.consumers != before.consumers {
				t.Errorf("%d consumers before restart %d, %d after", before.consumers, len(outages)+1, after.consumers)
			}
			for name, seq := range before.lastSeq {
				if a, ok := after.lastSeq[name]; !ok || a < seq {
					t.Errorf("stream %s: last sequence %d before restart %d, %d after (there: %v)", name, seq, len(outages)+1, a, ok)
				}
			}
			for time.Since(o.up) < 20*time.Second && !allReady() {
				time.Sleep(20 * time.Millisecond)
			}
			if allReady() {
				o.allReady = time.Now()
			} else {
				for _, w := range procs {
					if ok, what := ready(w); !ok {
						t.Errorf("%s not ready 20s after restart %d of the NATS server: %s", w.p.name, len(outages)+1, what)
					}
				}
			}
			outages = append(outages, o)
		}
	})
	load.Wait()
	restarts.Wait()
	close(answers)
	loadTime := time.Since(loadStart)
	if t.Failed() {
		return
	}
	if len(outages) < 3 {
		t.Fatalf("only %d restarts during the load: the test did not test much", len(outages))
	}

	// Every work item has one decision, and every answer any caller got for
	// it is that decision (a replay says so, and is otherwise the same).
	got := map[string][]byte{}
	var all []answer
	for a := range answers {
		all = append(all, a)
		var rep wire.TurnSubmitReply
		if err := json.Unmarshal(a.body, &rep); err != nil {
			t.Fatalf("%s: %s", a.key, a.body)
		}
		if rep.WorkItemID != a.key || rep.Action == nil || rep.Action.ApprovalID == "" {
			t.Errorf("answer for %s: %s", a.key, a.body)
		}
		rep.Replayed = false
		norm := mustJSON(t, rep)
		if prev, ok := got[a.key]; ok && !bytes.Equal(prev, norm) {
			t.Errorf("%s was answered two different decisions:\n%s\n%s", a.key, prev, norm)
		}
		got[a.key] = norm
	}
	dups := 0
	for _, a := range all {
		if a.dup {
			dups++
		}
	}
	items := 0
	started.Range(func(k, _ any) bool {
		items++
		if _, ok := got[k.(string)]; !ok {
			t.Errorf("%s was never answered", k)
		}
		return true
	})
	db := s.tenantDB(tn)
	if c := count(t, db, `SELECT count(*) FROM decisions`); c != items {
		t.Errorf("%d decisions for %d turns", c, items)
	}
	if c := count(t, db, `SELECT count(*) FROM (SELECT work_item_id FROM decisions GROUP BY work_item_id HAVING count(*) > 1) d`); c != 0 {
		t.Errorf("%d work items decided more than once", c)
	}
	if c := count(t, db, `SELECT count(DISTINCT work_item_id) FROM decisions`); c != items {
		t.Errorf("%d work items decided of %d begun", c, items)
	}
	if c := count(t, db, `SELECT count(*) FROM approvals`); c != items {
		t.Errorf("%d approvals for %d drafts", c, items)
	}
	// Every approval_requested event reaches n8n (at least once) and is
	// acknowledged, though the server went away between the webhook's
	// answer and the acknowledgement.
	eventually(t, 2*time.Minute, "every event delivered and acknowledged", func() bool {
		return count(t, db, `SELECT count(*) FROM outbox WHERE delivered_at IS NULL`) == 0
	})
	rows, err := db.Query(context.Background(), `SELECT id::text FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	hook.mu.Lock()
	delivered, redelivered := len(hook.events), 0
	for _, id := range ids {
		if hook.events[id] == 0 {
			t.Errorf("event %s is marked delivered but never reached the webhook", id)
		}
		redelivered += max(hook.events[id]-1, 0)
	}
	hook.mu.Unlock()
	if len(ids) != items {
		t.Errorf("%d outbox events for %d approvals", len(ids), items)
	}

	// Every process is the one started at the beginning (none exited and
	// none was restarted), it is ready, and it reconnected at each restart.
	for _, w := range procs {
		w.p.mu.Lock()
		pid := w.p.cmd.Process.Pid
		w.p.mu.Unlock()
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil {
			t.Errorf("%s (pid %d) is gone: %v", w.p.name, pid, err)
		} else if f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:])); len(f) == 0 || f[0] == "Z" {
			t.Errorf("%s (pid %d) has exited: %s", w.p.name, pid, st)
		}
		if ok, what := ready(w); !ok {
			t.Errorf("%s is not ready after the load: %s", w.p.name, what)
		}
		n := sumMetric(t, w.ops, w.metric) - w.initial
		if int(n) < len(outages) {
			t.Errorf("%s reconnected %v times through %d restarts of the NATS server", w.p.name, n, len(outages))
		}
		t.Logf("%s: %v reconnects (%s)", w.p.name, n, w.metric)
	}

	// Every turn once more, after the restarts: each is a replay of the
	// decision its callers got.
	var replay sync.WaitGroup
	keys := make(chan string, len(got))
	for k := range got {
		keys <- k
	}
	close(keys)
	var replayed atomic.Int64
	for range callers {
		replay.Go(func() {
			for k := range keys {
				body, _ := json.Marshal(quoteEmail(k))
				hr, _ := http.NewRequest(http.MethodPost, "http://"+edgeAddr+"/v1/turns", bytes.NewReader(body))
				hr.Header.Set("Authorization", "Bearer "+ecfg.Token)
				hr.Header.Set("Content-Type", "application/json")
				res, err := client.Do(hr)
				if err != nil {
					t.Errorf("replay of %s: %v", k, err)
					continue
				}
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				var rep wire.TurnSubmitReply
				if res.StatusCode != http.StatusOK || json.Unmarshal(b, &rep) != nil {
					t.Errorf("replay of %s: %d %s", k, res.StatusCode, b)
					continue
				}
				if !rep.Replayed {
					t.Errorf("replay of %s is not marked replayed: %s", k, b)
				}
				rep.Replayed = false
				if norm := mustJSON(t, rep); !bytes.Equal(norm, got[k]) {
					t.Errorf("%s replayed as another decision:\n%s\n%s", k, got[k], norm)
				}
				replayed.Add(1)
			}
		})
	}
	replay.Wait()

	// How long turns took: those that overlapped an outage (begun before
	// the server came back, answered after it went down) and the others.
	var calm, across []time.Duration
	for _, a := range all {
		hit := false
		for _, o := range outages {
			if a.start.Before(o.up) && a.end.After(o.down) {
				hit = true
			}
		}
		if hit {
			across = append(across, a.end.Sub(a.start))
		} else {
			calm = append(calm, a.end.Sub(a.start))
		}
	}
	for i, o := range outages {
		var last time.Time
		for _, a := range all {
			if a.start.Before(o.up) && a.end.After(o.down) && a.end.After(last) {
				last = a.end
			}
		}
		back := "never"
		if !o.allReady.IsZero() {
			back = o.allReady.Sub(o.up).Round(time.Millisecond).String()
		}
		caught := "no turn was caught in it"
		if !last.IsZero() {
			caught = "the last turn caught in it answered " + last.Sub(o.up).Round(time.Millisecond).String() + " after the server was back"
		}
		t.Logf("restart %d at %s: down %s; every process ready %s after; %s",
			i+1, o.down.Sub(loadStart).Round(time.Millisecond), o.up.Sub(o.down).Round(time.Millisecond), back, caught)
	}
	t.Logf("turn durations, no outage: %s; across an outage: %s", quantiles(calm), quantiles(across))
	otherMu.Lock()
	kinds := make([]string, 0, len(other))
	for k := range other {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		t.Logf("callers got %d× %.300s", other[k], k)
	}
	otherMu.Unlock()
	t.Logf("%d turns (%d of them sent twice at once; %d HTTP attempts) in %s, %d restarts of the NATS server (store %s), "+
		"%d events delivered to the webhook (%d again), %d turns replayed afterwards as the same decision",
		len(got), dups, attempts.Load(), loadTime.Round(time.Millisecond), len(outages), storeDir, delivered, redelivered, replayed.Load())
}

// jsState is what a server's JetStream holds: its store directory, each
// stream's last sequence, and the number of consumers.
type jsState struct {
	dir       string
	lastSeq   map[string]uint64
	consumers int
}

func jetStreamState(t *testing.T, srv interface {
	Jsz(*server.JSzOptions) (*server.JSInfo, error)
	StoreDir() string
}) jsState {
	t.Helper()
	st := jsState{dir: srv.StoreDir(), lastSeq: map[string]uint64{}}
	info, err := srv.Jsz(&server.JSzOptions{Accounts: true, Streams: true})
	if err != nil {
		t.Errorf("jsz: %v", err)
		return st
	}
	st.consumers = info.Consumers
	for _, a := range info.AccountDetails {
		for _, sd := range a.Streams {
			st.lastSeq[a.Id+"/"+sd.Name] = sd.State.LastSeq
		}
	}
	return st
}

// quantiles summarises durations: how many, p50, p95 and max.
func quantiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	slices.Sort(ds)
	q := func(p float64) time.Duration {
		return ds[min(len(ds)-1, int(p*float64(len(ds))))].Round(time.Millisecond)
	}
	return fmt.Sprintf("n=%d p50=%s p95=%s max=%s", len(ds), q(0.5), q(0.95), ds[len(ds)-1].Round(time.Millisecond))
}
