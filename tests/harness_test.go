package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"n8nbrain/brain"
	"n8nbrain/catalogue"
	"n8nbrain/deploy/devstack"
	"n8nbrain/edge"
	"n8nbrain/internal/testdb"
	"n8nbrain/nats/account"
	"n8nbrain/nats/stream"
	"n8nbrain/provision"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// system is one whole stack for one test: its own embedded NATS server in
// operator mode, its own registry database and tenant databases (names
// prefixed so parallel tests share one Postgres cluster), real brain
// replicas and real edges. Everything started is stopped by t.Cleanup.
type system struct {
	t        testing.TB
	adminURL string
	stack    *devstack.Stack
	logs     *logSink
	streams  stream.Config

	mu  sync.Mutex
	dbs map[string]*pgx.Conn
	// secrets are what no log line may carry: every e-mail a test sent
	// through an edge, tenants' database passwords, edge tokens and NATS
	// seeds, the sealing key (by kind, for the failure message).
	secrets map[string]string
}

// secret records text that no log line of the system may carry.
func (s *system) secret(kind, text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.secrets == nil {
		s.secrets = map[string]string{}
	}
	if text != "" {
		s.secrets[text] = kind
	}
}

// secretsInLogs names each recorded secret that a log line carries, in
// any form a JSON log writes it (never the secret itself).
func (s *system) secretsInLogs() []string {
	logs := s.logs.String()
	s.mu.Lock()
	defer s.mu.Unlock()
	var found []string
	for text, kind := range s.secrets {
		for _, v := range logForms(text) {
			if strings.Contains(logs, v) {
				found = append(found, fmt.Sprintf("%s (%d bytes; %d bytes of it matched)", kind, len(text), len(v)))
				break
			}
		}
	}
	return found
}

// noteEmail records a submitted turn's e-mail as a secret.
func (s *system) noteEmail(body any) {
	var req *wire.TurnSubmitRequest
	switch b := body.(type) {
	case *wire.TurnSubmitRequest:
		req = b
	case wire.TurnSubmitRequest:
		req = &b
	}
	if req != nil && req.Email != nil {
		s.secret("e-mail subject", req.Email.Subject)
		s.secret("e-mail body", req.Email.Body)
	}
}

func newSystem(t testing.TB) *system { return newSystemWith(t, nil) }

// newSystemWith is newSystem with the stack's configuration edited (a NATS
// cluster, say).
func newSystemWith(t testing.TB, edit func(*devstack.Config)) *system {
	t.Helper()
	return newSystemAt(t, testdb.AdminURL(t), edit)
}

// newSystemAt is newSystemWith on the Postgres cluster adminURL names (a
// private cluster of the test's own) instead of the suite's shared one.
func newSystemAt(t testing.TB, adminURL string, edit func(*devstack.Config)) *system {
	t.Helper()
	prefix := "x" + randomHex(4) + "_"
	logs := &logSink{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := devstack.Config{
		Dir:      t.TempDir(),
		AdminURL: adminURL,
		Prefix:   prefix,
		Streams:  stream.Config{AckWait: 2 * time.Second},
		Logger:   slog.New(logs.handler()),
	}
	if edit != nil {
		edit(&cfg)
	}
	st, err := devstack.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start stack: %v", err)
	}
	s := &system{t: t, adminURL: adminURL, stack: st, logs: logs, streams: cfg.Streams}
	s.secret("sealing key", hex.EncodeToString(st.SealingKey))
	if u, err := url.Parse(adminURL); err == nil {
		if pw, ok := u.User.Password(); ok {
			s.secret("admin password", pw)
		}
	}
	t.Cleanup(func() {
		if found := s.secretsInLogs(); len(found) > 0 {
			t.Errorf("the system's logs carry what they must not: %s", strings.Join(found, "; "))
		}
		if t.Failed() {
			t.Logf("system logs:\n%s", logs)
		}
		st.Close()
		// BenchmarkScale's thousand databases take minutes to drop.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if err := st.Ops.DropPrefixed(ctx); err != nil {
			t.Errorf("drop test databases: %v", err)
		}
	})
	return s
}

// spec is a tenant configuration most tests start from: every v1 action
// enabled and one confident rule for quote requests.
func spec(id string) provision.TenantSpec {
	return provision.TenantSpec{
		ID:             registry.TenantID(id),
		TurnCeiling:    8,
		EnabledActions: []catalogue.Name{catalogue.DraftReply, catalogue.SendReply, catalogue.CreateJob, catalogue.EscalateItem, catalogue.CloseItem, catalogue.VerifyReplySent, catalogue.VerifyJob},
		Rules: []registry.Rule{{
			Name:       "quotes",
			Match:      registry.Match{SubjectKeywords: []string{"quote"}},
			Category:   "quote_request",
			Priority:   "high",
			Action:     catalogue.DraftReply,
			Params:     json.RawMessage(`{"subject":"Re: your quote request","body":"Thanks, we will send a quote shortly.","tone":"friendly"}`),
			Confidence: 0.95,
		}, {
			Name:       "invoices",
			Match:      registry.Match{SubjectKeywords: []string{"invoice"}},
			Category:   "invoice",
			Priority:   "normal",
			Action:     catalogue.CloseItem,
			Params:     json.RawMessage(`{"resolution":"invoices are handled by accounts"}`),
			Confidence: 0.9,
		}},
	}
}

func (s *system) tenant(sp provision.TenantSpec) *devstack.Tenant {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tn, err := s.stack.AddTenant(ctx, sp)
	if err != nil {
		s.t.Fatalf("add tenant %s: %v", sp.ID, err)
	}
	s.secret("edge token", tn.Token)
	if tn.DB != nil {
		s.secret("tenant database password", tn.DB.AppPassword)
	}
	if creds, err := os.ReadFile(tn.EdgeCreds); err == nil {
		for _, line := range strings.Fields(string(creds)) {
			if strings.HasPrefix(line, "SU") && len(line) == 58 {
				s.secret("edge user's NATS seed", line)
			}
		}
	}
	return tn
}

// startOpsBrain is startBrain with the replica's ops endpoints on a port
// of their own; it also returns their base URL (for /metrics).
func (s *system) startOpsBrain(replica string, mutate func(*brain.Config)) (stop func(), ops string) {
	s.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.t.Fatal(err)
	}
	stop = s.startBrain(replica, func(c *brain.Config) {
		c.OpsListener = ln
		if mutate != nil {
			mutate(c)
		}
	})
	return stop, "http://" + ln.Addr().String()
}

// startBrain runs a brain replica until the returned stop is called (or
// the test ends).
func (s *system) startBrain(replica string, mutate func(*brain.Config)) (stop func()) {
	s.t.Helper()
	cfg := s.stack.BrainConfig(replica)
	cfg.RegistryRefresh = time.Second
	if mutate != nil {
		mutate(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- brain.Run(ctx, cfg, slog.New(s.logs.handler()).With("component", "brain")) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				s.t.Errorf("brain %s: %v", replica, err)
			}
		})
	}
	s.t.Cleanup(stop)
	return stop
}

// edgeClient talks to a running edge as n8n would.
type edgeClient struct {
	t     testing.TB
	sys   *system // records what it submits, for the log check
	base  string
	token string
	stop  func()
}

func (s *system) startEdge(tn *devstack.Tenant, mutate func(*edge.Config)) *edgeClient {
	s.t.Helper()
	cfg := s.stack.EdgeConfig(tn)
	cfg.TurnWait = 15 * time.Second
	if mutate != nil {
		mutate(&cfg)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- edge.Serve(ctx, ln, cfg, slog.New(s.logs.handler()).With("component", "edge")) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				s.t.Errorf("edge %s: %v", tn.ID, err)
			}
		})
	}
	s.t.Cleanup(stop)
	return &edgeClient{t: s.t, sys: s, base: "http://" + ln.Addr().String(), token: tn.Token, stop: stop}
}

type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r response) reply(t *testing.T) wire.TurnSubmitReply {
	t.Helper()
	if r.Status != http.StatusOK {
		t.Fatalf("want 200, got %d: %s", r.Status, r.Body)
	}
	var rep wire.TurnSubmitReply
	if err := json.Unmarshal(r.Body, &rep); err != nil {
		t.Fatalf("decode reply %s: %v", r.Body, err)
	}
	return rep
}

func (r response) error(t *testing.T, status int) *wire.Error {
	t.Helper()
	if r.Status != status {
		t.Fatalf("want %d, got %d: %s", status, r.Status, r.Body)
	}
	var er wire.ErrorReply
	if err := json.Unmarshal(r.Body, &er); err != nil || er.Error == nil {
		t.Fatalf("want an error body, got %s (%v)", r.Body, err)
	}
	return er.Error
}

func (c *edgeClient) do(method, path string, body any) response {
	c.t.Helper()
	if c.sys != nil {
		c.sys.noteEmail(body)
	}
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return response{Status: res.StatusCode, Header: res.Header, Body: b}
}

func (c *edgeClient) submit(req any) response { return c.do(http.MethodPost, "/v1/turns", req) }

// quoteEmail is turn 1 of a quote request that the "quotes" rule decides.
func quoteEmail(id string) *wire.TurnSubmitRequest {
	return &wire.TurnSubmitRequest{WorkItemID: id, Turn: 1, Email: &wire.Email{
		MessageID: id, From: "Jo Bloggs <jo@customer.example>", Subject: "Quote for a new deck please",
		Body: "Hi, could you quote for a 20m2 hardwood deck? Thanks, Jo"}}
}

// closedInvoice is turn 1 of an invoice, closed by its rule: it leaves
// nothing pending (no approval, no event to deliver).
func closedInvoice(id string) *wire.TurnSubmitRequest {
	req := quoteEmail(id)
	req.Email.Subject = "Invoice 1042"
	return req
}

// tenantDB is a connection to the tenant's database as the admin, for
// assertions only; one per tenant and test, however often it is asked for.
func (s *system) tenantDB(tn *devstack.Tenant) *pgx.Conn {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.dbs[tn.DB.DBName]; ok {
		return c
	}
	if s.dbs == nil {
		s.dbs = map[string]*pgx.Conn{}
	}
	c := s.adminConn(tn.DB.DBName)
	s.dbs[tn.DB.DBName] = c
	return c
}

// registryExec runs one statement on the registry as its owner, behind the
// ops tool's back (a row changed by hand, a rule it would refuse).
func (s *system) registryExec(sql string, args ...any) {
	s.t.Helper()
	ctx := context.Background()
	reg, err := s.stack.Ops.RegistryAdmin(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	defer reg.Close(ctx)
	if _, err := reg.Exec(ctx, sql, args...); err != nil {
		s.t.Fatalf("%s: %v", sql, err)
	}
}

func (s *system) adminConn(db string) *pgx.Conn {
	s.t.Helper()
	cfg, err := pgx.ParseConfig(s.adminURL)
	if err != nil {
		s.t.Fatal(err)
	}
	cfg.Database = db
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		s.t.Fatalf("connect %s as admin: %v", db, err)
	}
	s.t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func count(t testing.TB, conn *pgx.Conn, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// brainConn is a BRAIN-account connection, as a brain replica has.
func (s *system) brainConn() *nats.Conn {
	s.t.Helper()
	nc, err := nats.Connect(s.stack.NATS.ClientURL(), nats.UserCredentials(s.stack.BrainCreds))
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(nc.Close)
	return nc
}

// tenantConn is a connection with the tenant's edge credentials.
func (s *system) tenantConn(tn *devstack.Tenant) *nats.Conn {
	s.t.Helper()
	nc, err := nats.Connect(s.stack.NATS.ClientURL(), nats.UserCredentials(tn.EdgeCreds))
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(nc.Close)
	return nc
}

// logSink collects every log line of the system under test, so a test can
// assert what never reaches a log.
type logSink struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logSink) handler() slog.Handler {
	return slog.NewJSONHandler(&lockedWriter{l}, &slog.HandlerOptions{Level: slog.LevelDebug})
}

type lockedWriter struct{ l *logSink }

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.l.mu.Lock()
	defer w.l.mu.Unlock()
	return w.l.buf.Write(p)
}

func (l *logSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// eventually polls cond until it holds or the deadline passes. It is for
// state that has no signal to wait on (a registry reload); each poll is a
// real check, never a fixed sleep standing in for one.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func metric(t testing.TB, url, name string) int {
	t.Helper()
	res, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	for _, line := range strings.Split(string(b), "\n") {
		var n int
		if _, err := fmt.Sscanf(line, name+" %d", &n); err == nil {
			return n
		}
	}
	t.Fatalf("metric %s not found in %s", name, b)
	return 0
}

func writeFile(path string, b []byte) error { return os.WriteFile(path, b, 0o600) }

// attacker connects as a user of an account the attacker controls: signed by
// the operator, as onboarding would sign it, with whatever imports edit
// writes (forged ones included), and no permission limits.
func (s *system) attacker(name string, edit func(*jwt.AccountClaims)) *nats.Conn {
	s.t.Helper()
	acc, err := s.stack.Operator.SignTenantClaims(name, nil, edit)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.stack.NATS.PutAccount(acc.Public, acc.JWT); err != nil {
		s.t.Fatal(err)
	}
	creds, err := account.UserCreds(acc, "attacker", account.RoleUnrestricted)
	if err != nil {
		s.t.Fatal(err)
	}
	path := s.t.TempDir() + "/" + name + ".creds"
	if err := writeFile(path, creds); err != nil {
		s.t.Fatal(err)
	}
	nc, err := nats.Connect(s.stack.NATS.ClientURL(), nats.UserCredentials(path))
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(nc.Close)
	return nc
}
