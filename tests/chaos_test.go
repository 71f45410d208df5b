package tests

// Turns keep coming while the brain replicas and the edge, each the real
// binary in a process of its own, are killed with SIGKILL and started again,
// over and over: nothing is lost and nothing is decided twice.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"n8nbrain/wire"
)

// process is a binary that can be killed and started again with the same
// command line and environment, its output appended to one log file.
type process struct {
	t    *testing.T
	name string
	bin  string
	env  []string
	log  *os.File

	mu  sync.Mutex
	cmd *exec.Cmd
}

func newProcess(t *testing.T, name, bin string, env []string) *process {
	t.Helper()
	log, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	p := &process{t: t, name: name, bin: bin, env: env, log: log}
	p.start()
	t.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.cmd != nil {
			_ = p.cmd.Process.Signal(os.Interrupt)
			_ = p.cmd.Wait()
		}
		if t.Failed() {
			_, _ = log.Seek(0, io.SeekStart)
			out, _ := io.ReadAll(log)
			t.Logf("%s's log (the last 4 KiB):\n%s", name, out[max(0, len(out)-4096):])
		}
		log.Close()
	})
	return p
}

func (p *process) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := exec.Command(p.bin)
	cmd.Env, cmd.Stdout, cmd.Stderr = p.env, p.log, p.log
	if err := cmd.Start(); err != nil {
		p.t.Errorf("start %s: %v", p.name, err)
		return
	}
	p.cmd = cmd
}

// kill9 kills the process with SIGKILL and waits for it to be gone.
func (p *process) kill9() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
	p.cmd = nil
}

// eventHook is n8n's events webhook for the crash tests: it takes every
// event and counts it by id (events, under mu).
type eventHook struct {
	addr   string
	mu     sync.Mutex
	events map[string]int
}

func startEventHook(t *testing.T) *eventHook {
	t.Helper()
	h := &eventHook{events: map[string]int{}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev wire.Event
		if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
			http.Error(w, "not an event", http.StatusBadRequest)
			return
		}
		h.mu.Lock()
		h.events[ev.EventID]++
		h.mu.Unlock()
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = ln.Addr().String()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return h
}

func TestKillNineLosesNothing(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	tn := s.tenant(spec("chaos"))
	brainBin, edgeBin := buildBinary(t, "../brain/cmd/brain"), buildBinary(t, "../edge/cmd/edge")

	hook := startEventHook(t)

	var procs []*process
	for _, r := range []string{"chaos-1", "chaos-2"} {
		// Events no edge acknowledged are published again within seconds.
		env := append(brainEnv(t, s, r, freeAddr(t)), "BRAIN_EVENT_RETRY_BASE=200ms", "BRAIN_EVENT_RETRY_MAX=2s")
		procs = append(procs, newProcess(t, r, brainBin, env))
	}
	ecfg := s.stack.EdgeConfig(tn)
	edgeAddr := freeAddr(t)
	procs = append(procs, newProcess(t, "edge", edgeBin, append(os.Environ(), "EDGE_NATS_URL="+ecfg.NATSURL,
		"EDGE_NATS_CREDS="+ecfg.CredsFile, "EDGE_TOKEN="+ecfg.Token, "EDGE_ADDR="+edgeAddr, "EDGE_TENANT_ID=chaos",
		"EDGE_LOG_LEVEL=warn", "EDGE_TURN_WAIT=3s", "EDGE_WEBHOOK_URL=http://"+hook.addr+"/webhook/brain-events",
		"EDGE_WEBHOOK_SECRET=chaos-webhook-secret-0123456789")))

	// Callers, for 40 seconds, each submitting its own work items one after
	// another, each turn again until a 200 (a killed edge drops the
	// connection, a 202 says the brain has not answered yet): every answer
	// is kept.
	const callers = 4
	type answer struct {
		key  string
		body []byte
	}
	answers := make(chan answer, 1<<16)
	var load sync.WaitGroup
	var started sync.Map
	var attempts atomic.Int64
	client := &http.Client{Timeout: 20 * time.Second}
	stopAt := time.Now().Add(40 * time.Second)
	deadline := stopAt.Add(3 * time.Minute)
	for c := range callers {
		load.Go(func() {
			for i := 0; time.Now().Before(stopAt); i++ {
				time.Sleep(50 * time.Millisecond)
				req := quoteEmail(fmt.Sprintf("<chaos-%d-%d@customer.example>", c, i))
				started.Store(req.WorkItemID, true)
				body, _ := json.Marshal(req)
				for time.Now().Before(deadline) {
					hr, _ := http.NewRequest(http.MethodPost, "http://"+edgeAddr+"/v1/turns", bytes.NewReader(body))
					hr.Header.Set("Authorization", "Bearer "+ecfg.Token)
					hr.Header.Set("Content-Type", "application/json")
					attempts.Add(1)
					res, err := client.Do(hr)
					if err == nil {
						b, rerr := io.ReadAll(res.Body)
						res.Body.Close()
						if rerr == nil && res.StatusCode == http.StatusOK {
							answers <- answer{key: req.WorkItemID, body: b}
							break
						}
						if res.StatusCode != http.StatusAccepted && res.StatusCode < 500 {
							t.Errorf("%s: %d %s", req.WorkItemID, res.StatusCode, b)
							return
						}
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
	// Chaos until the callers are done: one process at a time, at random,
	// killed mid-flight and started again a moment later.
	done := make(chan struct{})
	kills := 0
	var chaos sync.WaitGroup
	chaos.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Duration(700+rand.IntN(900)) * time.Millisecond):
			}
			p := procs[rand.IntN(len(procs))]
			p.kill9()
			kills++
			time.Sleep(time.Duration(100+rand.IntN(400)) * time.Millisecond)
			p.start()
		}
	})
	load.Wait()
	close(done)
	chaos.Wait()
	close(answers)
	if t.Failed() {
		return
	}

	// Every work item has one decision, and every answer any caller got for
	// it is that decision (a replay says so, and is otherwise the same).
	got := map[string][]byte{}
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
	if c := count(t, db, `SELECT count(*) FROM approvals`); c != items {
		t.Errorf("%d approvals for %d drafts", c, items)
	}
	// Every approval_requested event reaches n8n (at least once) and is
	// acknowledged, though edges died between the webhook's answer and
	// the acknowledgement.
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
	defer hook.mu.Unlock()
	for _, id := range ids {
		if hook.events[id] == 0 {
			t.Errorf("event %s is marked delivered but never reached the webhook", id)
		}
	}
	if kills < 10 {
		t.Errorf("only %d kills during the load: the test did not test much", kills)
	}
	t.Logf("%d turns (%d answers, %d HTTP attempts), %d kills, %d events delivered to the webhook", len(got), n, attempts.Load(), kills, len(hook.events))
}
