package tests

// Turns keep coming while the Postgres cluster holding the registry and the
// tenant's database crashes and comes back, over and over: nothing is lost
// and nothing is decided twice. The cluster is the test's own (crashing the
// suite's shared one would break every other test); the brain replicas and
// the edge are the real binaries, as in TestKillNineLosesNothing.

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
	"syscall"
	"testing"
	"time"

	"n8nbrain/deploy/localpg"
	"n8nbrain/internal/testdb"
	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// outage is a span of time the cluster was down: from the crash until it
// accepted connections again.
type outage struct {
	how        string
	down, up   time.Time
	restartErr []string // failed attempts to start it again
}

func TestPostgresCrashLosesNothing(t *testing.T) {
	t.Parallel()
	pg := testdb.PrivateCluster(t)
	s := newSystemAt(t, pg.AdminURL(), nil)
	tn := s.tenant(spec("pgcrash"))
	brainBin, edgeBin := buildBinary(t, "../brain/cmd/brain"), buildBinary(t, "../edge/cmd/edge")

	hook := startEventHook(t)

	var opsURLs []string
	var procs []*process
	for _, r := range []string{"pgcrash-1", "pgcrash-2"} {
		ops := freeAddr(t)
		opsURLs = append(opsURLs, "http://"+ops)
		env := append(brainEnv(t, s, r, ops), "BRAIN_EVENT_RETRY_BASE=200ms", "BRAIN_EVENT_RETRY_MAX=2s")
		procs = append(procs, newProcess(t, r, brainBin, env))
	}
	ecfg := s.stack.EdgeConfig(tn)
	edgeAddr := freeAddr(t)
	procs = append(procs, newProcess(t, "edge", edgeBin, append(os.Environ(), "EDGE_NATS_URL="+ecfg.NATSURL,
		"EDGE_NATS_CREDS="+ecfg.CredsFile, "EDGE_TOKEN="+ecfg.Token, "EDGE_ADDR="+edgeAddr, "EDGE_TENANT_ID=pgcrash",
		"EDGE_LOG_LEVEL=warn", "EDGE_TURN_WAIT=3s", "EDGE_WEBHOOK_URL=http://"+hook.addr+"/webhook/brain-events",
		"EDGE_WEBHOOK_SECRET=pgcrash-webhook-secret-0123456789")))

	// Every replica serves before the chaos begins (a replica that cannot
	// reach the registry at its start exits, which is not what is tested).
	client := &http.Client{Timeout: 20 * time.Second}
	for _, u := range opsURLs {
		eventually(t, time.Minute, u+"/readyz", func() bool {
			res, err := client.Get(u + "/readyz")
			if err != nil {
				return false
			}
			res.Body.Close()
			return res.StatusCode == http.StatusOK
		})
	}

	// Callers, for 30 seconds, each submitting its own work items one after
	// another, each turn again until a 200 (a 202 says the brain has not
	// answered yet; a 5xx is retried, and counted).
	const callers = 4
	type answer struct {
		key        string
		body       []byte
		begun, end time.Time
		attempts   int
	}
	answers := make(chan answer, 1<<16)
	var load sync.WaitGroup
	var started sync.Map
	var attempts atomic.Int64
	var statusMu sync.Mutex
	statuses := map[int]int{}   // every non-200 answer, by status
	samples := map[string]int{} // and its body (status + body), to show
	netErrs := map[string]int{} // errors without an HTTP answer
	stopAt := time.Now().Add(30 * time.Second)
	deadline := stopAt.Add(3 * time.Minute)
	for c := range callers {
		load.Go(func() {
			for i := 0; time.Now().Before(stopAt); i++ {
				time.Sleep(50 * time.Millisecond)
				req := quoteEmail(fmt.Sprintf("<pgcrash-%d-%d@customer.example>", c, i))
				started.Store(req.WorkItemID, true)
				body, _ := json.Marshal(req)
				begun, tries := time.Now(), 0
				for time.Now().Before(deadline) {
					hr, _ := http.NewRequest(http.MethodPost, "http://"+edgeAddr+"/v1/turns", bytes.NewReader(body))
					hr.Header.Set("Authorization", "Bearer "+ecfg.Token)
					hr.Header.Set("Content-Type", "application/json")
					attempts.Add(1)
					tries++
					res, err := client.Do(hr)
					if err != nil {
						statusMu.Lock()
						netErrs[err.Error()]++
						statusMu.Unlock()
					} else {
						b, rerr := io.ReadAll(res.Body)
						res.Body.Close()
						if rerr == nil && res.StatusCode == http.StatusOK {
							answers <- answer{key: req.WorkItemID, body: b, begun: begun, end: time.Now(), attempts: tries}
							break
						}
						statusMu.Lock()
						statuses[res.StatusCode]++
						if res.StatusCode != http.StatusAccepted {
							samples[fmt.Sprintf("%d %s", res.StatusCode, bytes.TrimSpace(b))]++
						}
						statusMu.Unlock()
						if res.StatusCode != http.StatusAccepted && res.StatusCode < 500 {
							t.Errorf("%s: %d %s", req.WorkItemID, res.StatusCode, b)
							return
						}
						if res.StatusCode == http.StatusInternalServerError {
							t.Errorf("%s: a 500 to the caller: %s", req.WorkItemID, b)
						}
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}

	// A reviewer's list of pending approvals, read every 100 ms through the
	// edge while the database crashes: a 503 saying to retry shortly is
	// right, a 500 is not (a connection the crash cut mid-statement was one).
	apiStatuses := map[string]int{} // status and body, but of a 200 only the status
	load.Go(func() {
		for time.Now().Before(stopAt) {
			time.Sleep(100 * time.Millisecond)
			hr, _ := http.NewRequest(http.MethodGet, "http://"+edgeAddr+"/v1/approvals?limit=1&brief=true", nil)
			hr.Header.Set("Authorization", "Bearer "+ecfg.Token)
			res, err := client.Do(hr)
			k := ""
			if err != nil {
				k = "no answer: " + err.Error()
			} else {
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				k = fmt.Sprint(res.StatusCode)
				if res.StatusCode != http.StatusOK {
					k += " " + string(bytes.TrimSpace(b))
				}
			}
			statusMu.Lock()
			apiStatuses[k]++
			statusMu.Unlock()
			if strings.HasPrefix(k, "500") {
				t.Errorf("GET /v1/approvals during an outage: %s", k)
			}
		}
	})

	// Chaos while the callers begin turns: the cluster is crashed (pg_ctl's
	// immediate mode: no checkpoint, WAL replay at the next start) or its
	// postmaster killed with SIGKILL (every third time), then started
	// again 1-3 s later. It stops with the load, leaving the cluster up,
	// and the callers finish the turns they began against it.
	var outages []outage
	var chaos sync.WaitGroup
	chaos.Go(func() {
		for n := 0; ; n++ {
			time.Sleep(time.Duration(2000+rand.IntN(2000)) * time.Millisecond)
			if !time.Now().Before(stopAt) {
				return
			}
			o := outage{how: "pg_ctl stop -m immediate", down: time.Now()}
			if n%3 == 1 {
				o.how = "kill -9 postmaster"
				pid := pg.PostmasterPID()
				if pid <= 0 {
					t.Errorf("no postmaster.pid to kill")
					return
				}
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Errorf("kill -9 postmaster %d: %v", pid, err)
					return
				}
			} else if err := pg.Crash(context.Background()); err != nil {
				t.Errorf("crash the cluster: %v", err)
				return
			}
			time.Sleep(time.Duration(1000+rand.IntN(2000)) * time.Millisecond)
			// Ensure starts it again (the same folder, port and password):
			// after a SIGKILL the postmaster's children may still be
			// leaving, and postgres refuses to start until they have.
			for {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				_, err := localpg.Ensure(ctx, localpg.Config{Dir: pg.Dir, Port: pg.Port})
				cancel()
				if err == nil {
					break
				}
				o.restartErr = append(o.restartErr, err.Error())
				if len(o.restartErr) >= 20 {
					t.Errorf("the cluster does not start again after %s: %s", o.how, strings.Join(o.restartErr, "\n"))
					return
				}
				time.Sleep(500 * time.Millisecond)
			}
			o.up = time.Now()
			outages = append(outages, o)
		}
	})
	chaos.Wait()
	load.Wait()
	close(answers)
	loadEnd := time.Now()
	lastUp := time.Now()
	if len(outages) > 0 {
		lastUp = outages[len(outages)-1].up
	}
	t.Logf("the last turn was answered %.1fs after the cluster came back for the last time", loadEnd.Sub(lastUp).Seconds())
	for i, o := range outages {
		t.Logf("outage %d: %s, down %.1fs (at +%.1fs)", i+1, o.how, o.up.Sub(o.down).Seconds(), o.down.Sub(stopAt.Add(-30*time.Second)).Seconds())
		for _, e := range o.restartErr {
			t.Logf("  a start that failed: %s", e)
		}
	}
	// Each crash was one: the next start replayed the WAL.
	if b, err := os.ReadFile(filepath.Join(pg.Dir, "postgres.log")); err != nil {
		t.Error(err)
	} else if r := strings.Count(string(b), "automatic recovery in progress"); r < len(outages) {
		t.Errorf("postgres.log shows %d recoveries for %d crashes", r, len(outages))
	} else {
		t.Logf("postgres.log: %d recoveries from a crash (WAL replay) for %d crashes", r, len(outages))
	}
	// What the replicas and the edge said about it (warn and above).
	for _, p := range procs {
		t.Logf("%s's log: %s", p.name, logSummary(p))
	}
	statusMu.Lock()
	t.Logf("non-200 answers by status: %v; errors without an answer: %v", statuses, netErrs)
	for k, n := range samples {
		t.Logf("  %d× %s", n, k)
	}
	t.Logf("GET /v1/approvals during the load:")
	for k, n := range apiStatuses {
		t.Logf("  %d× %s", n, k)
	}
	statusMu.Unlock()
	if t.Failed() {
		return
	}

	// Every work item has one decision, and every answer any caller got for
	// it is that decision (a replay says so, and is otherwise the same).
	got := map[string][]byte{}
	var during, outside []time.Duration
	var slowest answer
	n := 0
	for a := range answers {
		n++
		var rep wire.TurnSubmitReply
		if err := json.Unmarshal(a.body, &rep); err != nil {
			t.Fatalf("%s: %s", a.key, a.body)
		}
		rep.Replayed = false
		norm := mustJSON(t, rep)
		if prev, ok := got[a.key]; ok && !bytes.Equal(prev, norm) {
			t.Errorf("%s was answered two different decisions:\n%s\n%s", a.key, prev, norm)
		}
		got[a.key] = norm
		if a.end.Sub(a.begun) > slowest.end.Sub(slowest.begun) {
			slowest = a
		}
		// A turn "met an outage" when the cluster was down at some point
		// between its first attempt and its 200.
		met := slices.ContainsFunc(outages, func(o outage) bool { return a.begun.Before(o.up) && a.end.After(o.down) })
		if met {
			during = append(during, a.end.Sub(a.begun))
		} else {
			outside = append(outside, a.end.Sub(a.begun))
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
	t.Logf("turn time, turns that met an outage: %s; the others: %s", durations(during), durations(outside))
	// The slowest turn, and what the replicas said about it.
	if slowest.key != "" {
		t0 := stopAt.Add(-30 * time.Second)
		t.Logf("the slowest turn, %s: begun at +%.1fs, answered at +%.1fs (%.1fs, %d HTTP attempts); the replicas' lines about it:",
			slowest.key, slowest.begun.Sub(t0).Seconds(), slowest.end.Sub(t0).Seconds(), slowest.end.Sub(slowest.begun).Seconds(), slowest.attempts)
		key := subjects.TurnKey(slowest.key, 1)
		for _, p := range procs {
			b, _ := os.ReadFile(p.log.Name())
			for line := range strings.Lines(string(b)) {
				if strings.Contains(line, key) {
					t.Logf("  %s: %s", p.name, strings.TrimSpace(line))
				}
			}
		}
	}

	db := s.tenantDB(tn)
	if c := count(t, db, `SELECT count(*) FROM decisions`); c != items {
		t.Errorf("%d decisions for %d turns", c, items)
	}
	// (decisions' key is (work_item_id, turn): every item here has turn 1
	// only, so the count is the check.) Approvals have their own key, so
	// one per item is checked as such.
	if c := count(t, db, `SELECT count(*) FROM approvals`); c != items {
		t.Errorf("%d approvals for %d drafts", c, items)
	}
	if c := count(t, db, `SELECT count(DISTINCT work_item_id) FROM approvals`); c != items {
		t.Errorf("approvals for %d work items, of %d", c, items)
	}
	// Every decision was answered before some of the crashes, so each must
	// have been committed before it was answered: the reply the tenant's
	// database holds now, after the WAL replays, is the one the caller got.
	rows, err := db.Query(context.Background(), `SELECT work_item_id, reply FROM decisions`)
	if err != nil {
		t.Fatal(err)
	}
	same := 0
	for rows.Next() {
		var id string
		var reply []byte
		if err := rows.Scan(&id, &reply); err != nil {
			t.Fatal(err)
		}
		var rep wire.TurnSubmitReply
		if err := json.Unmarshal(reply, &rep); err != nil {
			t.Fatalf("%s: stored reply %s: %v", id, reply, err)
		}
		rep.Replayed = false
		if norm := mustJSON(t, rep); !bytes.Equal(norm, got[id]) {
			t.Errorf("%s: the caller was answered one decision, the database holds another:\n%s\n%s", id, got[id], norm)
		} else {
			same++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	t.Logf("%d decisions in the database are the ones answered", same)
	// Every approval_requested event reaches n8n (at least once) and is
	// acknowledged, though the database crashed between the webhook's
	// answer and the acknowledgement's commit.
	eventually(t, 2*time.Minute, "every event delivered and acknowledged", func() bool {
		return count(t, db, `SELECT count(*) FROM outbox WHERE delivered_at IS NULL`) == 0
	})
	delivered := time.Since(loadEnd)
	rows, err = db.Query(context.Background(), `SELECT id::text FROM outbox`)
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
	for _, id := range ids {
		if hook.events[id] == 0 {
			t.Errorf("event %s is marked delivered but never reached the webhook", id)
		}
	}
	nEvents := len(hook.events)
	hook.mu.Unlock()

	// Both replicas are still serving (neither gave up on the database, nor
	// took a crash for a tenant whose role is refused): each says ready.
	for _, u := range opsURLs {
		res, err := client.Get(u + "/readyz")
		if err != nil {
			t.Errorf("%s: %v", u, err)
			continue
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(`"ready"`)) || bytes.Contains(b, []byte("tenant_problems")) {
			t.Errorf("%s/readyz after the crashes: %d %s", u, res.StatusCode, b)
		}
	}
	kills := 0
	for _, o := range outages {
		if o.how == "kill -9 postmaster" {
			kills++
		}
	}
	if len(outages) < 4 || kills < 1 {
		t.Errorf("only %d outages (%d by kill -9) during the load: the test did not test much", len(outages), kills)
	}
	t.Logf("%d turns (%d answers, %d HTTP attempts), %d outages (%d by kill -9 of the postmaster), %d events delivered to the webhook (the last %.1fs after the load)",
		len(got), n, attempts.Load(), len(outages), kills, nEvents, delivered.Seconds())
}

// durations summarises turn times: how many, the median, the 99th
// percentile and the longest.
func durations(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	slices.Sort(d)
	q := func(p float64) time.Duration { return d[min(len(d)-1, int(p*float64(len(d))))].Round(time.Millisecond) }
	return fmt.Sprintf("%d, median %s, p99 %s, max %s", len(d), q(0.5), q(0.99), d[len(d)-1].Round(time.Millisecond))
}

// logSummary counts a process's JSON log lines by level and message, with
// the first few distinct errors each message carried.
func logSummary(p *process) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := os.ReadFile(p.log.Name())
	if err != nil {
		return err.Error()
	}
	type entry struct {
		n      int
		errors []string // the first few distinct ones
	}
	byMsg := map[string]*entry{}
	var keys []string
	for line := range strings.Lines(string(b)) {
		var l struct{ Level, Msg, Error string }
		if json.Unmarshal([]byte(line), &l) != nil {
			l.Msg = "(not JSON) " + strings.TrimSpace(line)
		}
		k := l.Level + " " + l.Msg
		e, ok := byMsg[k]
		if !ok {
			e = &entry{}
			byMsg[k] = e
			keys = append(keys, k)
		}
		e.n++
		if l.Error != "" && len(e.errors) < 4 && !slices.Contains(e.errors, l.Error) {
			e.errors = append(e.errors, l.Error)
		}
	}
	if len(keys) == 0 {
		return "nothing"
	}
	var out strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&out, "\n    %d× %s", byMsg[k].n, k)
		for _, e := range byMsg[k].errors {
			fmt.Fprintf(&out, "\n        error: %s", e)
		}
	}
	return out.String()
}
