package devstack_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"n8nbrain/brain"
	"n8nbrain/deploy/devstack"
	"n8nbrain/edge"
	"n8nbrain/internal/testdb"
	"n8nbrain/provision"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

type initEnv struct {
	t        *testing.T
	adminURL string
	prefix   string
	dir      string
	opts     devstack.InitOptions
}

func newInitEnv(t *testing.T) *initEnv {
	t.Helper()
	adminURL := testdb.AdminURL(t)
	u, err := url.Parse(adminURL)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	e := &initEnv{t: t, adminURL: adminURL, prefix: "i" + randomHex(3) + "_", dir: t.TempDir()}
	e.opts = devstack.InitOptions{
		Dir:              e.dir,
		AdminURL:         adminURL,
		DBHost:           u.Hostname(),
		DBPort:           port,
		Prefix:           e.prefix,
		RegistryPassword: "reader-" + randomHex(8),
		SealingKey:       registry.NewKey(),
		EdgeToken:        "edge-token-" + randomHex(8),
		WebhookSecret:    "hook-secret-" + randomHex(8),
		ReviewerPassword: "reviewer-pw",
		N8NGroup:         os.Getgid(),
	}
	e.opts.NATS.Listen, e.opts.NATS.HTTP, e.opts.NATS.StoreDir = "127.0.0.1:-1", "127.0.0.1:-1", filepath.Join(e.dir, "js")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := (&provision.Ops{AdminURL: adminURL, Prefix: e.prefix}).DropPrefixed(ctx); err != nil {
			t.Errorf("drop test databases: %v", err)
		}
	})
	return e
}

func (e *initEnv) run(o devstack.InitOptions) (*devstack.InitResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return devstack.Init(ctx, o, nil)
}

// TestInitPreparesAWorkingStack runs the compose init step twice against a
// real Postgres, then runs the services from what it wrote, configured the
// way compose.yaml configures them: nats-server from nats.conf, a brain from
// brain.creds and the registry, client-zero's edge from its files. n8n's
// imported credentials are used as n8n would use them: the edge credential
// submits a turn, and the webhook credential is what the edge sends with an
// event after a reviewer approves.
func TestInitPreparesAWorkingStack(t *testing.T) {
	e := newInitEnv(t)
	first, err := e.run(e.opts)
	if err != nil {
		t.Fatalf("init: %v", err)
	}
	if !first.CreatedNow || first.Tenant != "client-zero" {
		t.Fatalf("first init: %+v", first)
	}
	again, err := e.run(e.opts)
	if err != nil {
		t.Fatalf("init again: %v", err)
	}
	if again.CreatedNow || again.TenantNATS != first.TenantNATS || again.BrainNATS != first.BrainNATS {
		t.Fatalf("init is not idempotent: %+v then %+v", first, again)
	}
	for path, mode := range map[string]os.FileMode{
		again.NATSConf: 0o644, again.BrainCreds: 0o600, again.EdgeCreds: 0o600, again.EdgeToken: 0o600,
		again.Webhook: 0o600, again.Reviewers: 0o600, again.N8NCredsFile: 0o640,
		filepath.Join(e.dir, "keys.json"): 0o600,
	} {
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v %v, want mode %v", path, fi, err, mode)
		}
	}
	if got := filepath.Join(e.dir, devstack.InitEdgeCreds); got != again.EdgeCreds {
		t.Errorf("edge creds at %s, compose.yaml expects %s", again.EdgeCreds, got)
	}

	// n8n's credentials, as `n8n import:credentials` reads them, and the
	// settings workflow with the edge's address as compose's n8n sees it.
	var creds []struct {
		ID, Name, Type string
		Data           map[string]any
	}
	b, err := os.ReadFile(again.N8NCredsFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &creds); err != nil || len(creds) != 5 {
		t.Fatalf("n8n credentials %s: %v", b, err)
	}
	byID := map[string]map[string]any{}
	for _, c := range creds {
		byID[c.ID] = c.Data
	}
	edgeAuth, hookAuth, intake := byID[devstack.N8NEdgeCredentialID], byID[devstack.N8NEventCredentialID], byID[devstack.N8NIntakeCredentialID]
	if edgeAuth["name"] != "Authorization" || hookAuth["name"] != edge.HeaderWebhookToken || intake["name"] != devstack.N8NIntakeHeader ||
		intake["value"] == hookAuth["value"] || byID[devstack.N8NIMAPCredentialID] == nil || byID[devstack.N8NSMTPCredentialID] == nil {
		t.Fatalf("n8n credentials: %+v", creds)
	}
	settings, err := os.ReadFile(again.N8NSettings)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(settings), `\"edge_url\":\"http://edge:8480\"`) {
		t.Fatalf("n8n settings without compose's edge address: %s", settings)
	}

	// nats-server from the written configuration.
	nopts, err := server.ProcessConfigFile(again.NATSConf)
	if err != nil {
		t.Fatalf("nats.conf: %v", err)
	}
	nopts.NoSigs = true
	ns, err := server.NewServer(nopts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}

	// compose's second one-shot step: the tenants' streams, once NATS runs.
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	if n, err := devstack.InitStreams(sctx, e.opts, ns.ClientURL(), nil); err != nil || n != 1 {
		t.Fatalf("init streams: %d tenants, %v", n, err)
	}

	// n8n's webhook node: checks the header its credential names.
	events := make(chan wire.Event, 4)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(hookAuth["name"].(string)) != hookAuth["value"] {
			http.Error(w, "Authorization data is wrong!", http.StatusForbidden)
			return
		}
		var ev wire.Event
		if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		events <- ev
	}))
	t.Cleanup(hook.Close)

	// brain and edge, configured from the environment as compose does.
	brainEnv := map[string]string{
		"BRAIN_NATS_URL":         ns.ClientURL(),
		"BRAIN_NATS_CREDS":       filepath.Join(e.dir, devstack.InitBrainCreds),
		"BRAIN_REGISTRY_URL":     again.RegistryURL,
		"BRAIN_SEALING_KEY":      e.opts.SealingKey,
		"BRAIN_REPLICA":          "init-test",
		"BRAIN_EVENT_RETRY_BASE": "200ms",
	}
	bcfg, err := brain.ConfigFromEnv(func(k string) string { return brainEnv[k] })
	if err != nil {
		t.Fatal(err)
	}
	edgeEnv := map[string]string{
		"EDGE_TENANT_ID":           "client-zero",
		"EDGE_NATS_URL":            ns.ClientURL(),
		"EDGE_NATS_CREDS":          filepath.Join(e.dir, devstack.InitEdgeCreds),
		"EDGE_TOKEN_FILE":          filepath.Join(e.dir, devstack.InitEdgeToken),
		"EDGE_REVIEWERS_FILE":      filepath.Join(e.dir, devstack.InitReviewers),
		"EDGE_WEBHOOK_URL":         hook.URL + "/webhook/brain-events",
		"EDGE_WEBHOOK_SECRET_FILE": filepath.Join(e.dir, devstack.InitWebhookSecret),
		"EDGE_TURN_WAIT":           "20s",
	}
	ecfg, err := edge.ConfigFromEnv(func(k string) string { return edgeEnv[k] })
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- brain.Run(ctx, bcfg, log.With("component", "brain")) }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- edge.Serve(ctx, ln, ecfg, log.With("component", "edge")) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("service: %v", err)
			}
		}
		if t.Failed() {
			t.Logf("logs:\n%s", logs.String())
		}
	})
	base := "http://" + ln.Addr().String()
	call := func(method, path string, body any) (int, []byte) {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequest(method, base+path, rd)
		req.Header.Set(edgeAuth["name"].(string), edgeAuth["value"].(string)) // as n8n's Header Auth sends it
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out
	}

	// client-zero's quote rule drafts a reply that waits for approval.
	status, body := call("POST", "/v1/turns", wire.TurnSubmitRequest{WorkItemID: "<init@customer.example>", Turn: 1,
		Email: &wire.Email{From: "Jo <jo@customer.example>", Subject: "Quote for a deck", Body: "Could you quote for a 20m2 deck?"}})
	if status != http.StatusOK {
		t.Fatalf("turn 1: %d %s", status, body)
	}
	var rep wire.TurnSubmitReply
	if err := json.Unmarshal(body, &rep); err != nil || rep.Status != wire.WorkItemStatusAwaitingApproval || rep.Action == nil || rep.Action.ApprovalID == "" {
		t.Fatalf("turn 1: %s", body)
	}
	if status, body := call("POST", "/v1/approvals/"+rep.Action.ApprovalID+"/approve", map[string]string{"by": "alice"}); status != http.StatusOK {
		t.Fatalf("approve: %d %s", status, body)
	}
	// Both events, in whichever order they are delivered: the request for
	// approval and the decision.
	seen := map[wire.EventKind]bool{}
	for len(seen) < 2 {
		select {
		case ev := <-events:
			if ev.WorkItemID != "<init@customer.example>" || ev.NextTurn != 2 ||
				ev.Kind != wire.EventApprovalDecided && ev.Kind != wire.EventApprovalRequested {
				t.Fatalf("event: %+v", ev)
			}
			seen[ev.Kind] = true
		case <-time.After(30 * time.Second):
			t.Fatalf("events %v reached the webhook with the n8n credential's token; want approval_requested and approval_decided", seen)
		}
	}

	// The review page signs in the reviewer of the reviewers file.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequest("POST", base+"/review/login",
		strings.NewReader(url.Values{"name": {"dev"}, "password": {e.opts.ReviewerPassword}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
		t.Fatalf("review page sign-in: %d, cookies %v", resp.StatusCode, resp.Cookies())
	}
}

// TestInitRefusesAChangedSealingKey: a brain with another key could not open
// the tenant's password, so init stops and says why.
func TestInitRefusesAChangedSealingKey(t *testing.T) {
	e := newInitEnv(t)
	if _, err := e.run(e.opts); err != nil {
		t.Fatal(err)
	}
	o := e.opts
	o.SealingKey = registry.NewKey()
	if _, err := e.run(o); err == nil || !strings.Contains(err.Error(), "BRAIN_SEALING_KEY") {
		t.Fatalf("init with another sealing key: %v", err)
	}
	// A state volume recreated without the database is refused too.
	o = e.opts
	o.Dir = t.TempDir()
	if _, err := e.run(o); err == nil || !strings.Contains(err.Error(), "down -v") {
		t.Fatalf("init with a fresh state volume: %v", err)
	}
}

func TestInitOptionsFromEnv(t *testing.T) {
	env := map[string]string{"INIT_ADMIN_URL": "postgres://a@b/c", "INIT_DB_PORT": "6543", "INIT_N8N_GID": "1000",
		"NATS_SYNC_INTERVAL": "1s", "EDGE_TOKEN": " tok "}
	o, err := devstack.InitOptionsFromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if o.DBPort != 6543 || o.N8NGroup != 1000 || o.NATS.Sync != "1s" || o.EdgeToken != "tok" || o.Dir != "" {
		t.Fatalf("%+v", o)
	}
	env["INIT_DB_PORT"] = "x"
	if _, err := devstack.InitOptionsFromEnv(func(k string) string { return env[k] }); err == nil {
		t.Fatal("bad port accepted")
	}
	// Invalid secrets are refused before anything is written.
	dir := t.TempDir()
	for name, o := range map[string]devstack.InitOptions{
		"short token":      {Dir: dir, AdminURL: "postgres://x", EdgeToken: "short"},
		"space in secret":  {Dir: dir, AdminURL: "postgres://x", WebhookSecret: "a secret with spaces"},
		"registry pw":      {Dir: dir, AdminURL: "postgres://x", RegistryPassword: "p@ss/word#with-url-chars"},
		"sealing key":      {Dir: dir, AdminURL: "postgres://x", SealingKey: "abc"},
		"no admin URL":     {Dir: dir},
		"reviewer name":    {Dir: dir, AdminURL: "postgres://x", ReviewerName: "a b"},
		"reviewer pw long": {Dir: dir, AdminURL: "postgres://x", ReviewerPassword: strings.Repeat("x", 73)},
	} {
		if _, err := devstack.Init(context.Background(), o, nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("invalid options wrote %d files", len(entries))
	}
}

// syncWriter serialises writes from the services' loggers.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
