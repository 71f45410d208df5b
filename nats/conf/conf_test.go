package conf_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/nats/account"
	"n8nbrain/nats/conf"
	"n8nbrain/nats/stream"
	"n8nbrain/subjects"
)

type identities struct {
	op               *account.Operator
	sys, brain       *account.Account
	streams          *account.Account
	tenant           *account.Account
	accounts         map[string]string
	brainCreds       string
	provisionerCreds string
	tenantCreds      string
}

func newIdentities(t *testing.T) *identities {
	t.Helper()
	dir := t.TempDir()
	sysKP, sysPub, err := account.NewAccountKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	op, err := account.NewOperator("conf-test", nil, sysPub)
	if err != nil {
		t.Fatal(err)
	}
	sys, err := op.SystemAccount(sysKP)
	if err != nil {
		t.Fatal(err)
	}
	st, err := op.StreamsAccount(nil)
	if err != nil {
		t.Fatal(err)
	}
	br, err := op.BrainAccount(nil, st)
	if err != nil {
		t.Fatal(err)
	}
	tn, err := op.TenantAccount("tenant-a", nil, br.Public, st.Public)
	if err != nil {
		t.Fatal(err)
	}
	id := &identities{op: op, sys: sys, brain: br, streams: st, tenant: tn,
		accounts: map[string]string{sys.Public: sys.JWT, st.Public: st.JWT, br.Public: br.JWT, tn.Public: tn.JWT}}
	write := func(acc *account.Account, user string, r account.Role) string {
		b, err := account.UserCreds(acc, user, r)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, user+".creds")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	id.brainCreds = write(br, "brain", account.RoleBrain)
	id.provisionerCreds = write(st, "provisioner", account.RoleProvisioner)
	id.tenantCreds = write(tn, "edge", account.RoleEdge)
	return id
}

func (id *identities) config(storeDir string) conf.Config {
	return conf.Config{
		Listen:        "127.0.0.1:-1",
		HTTP:          "127.0.0.1:-1",
		StoreDir:      storeDir,
		OperatorJWT:   id.op.JWT,
		SystemAccount: id.sys.Public,
		Accounts:      id.accounts,
	}
}

// TestServerFromConfigFileRelaysATurn is the proof that the file compose
// runs is real: nats-server's own parser loads it, the server starts in
// operator mode with JetStream, provisioning creates a tenant's streams, the
// brain binds to its consumer through its imports, and the tenant's edge
// user publishes a turn through its import that lands in the tenant's turn
// stream with the tenant's account key in token 3.
func TestServerFromConfigFileRelaysATurn(t *testing.T) {
	id := newIdentities(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "nats", "nats.conf")
	if err := conf.WriteFile(path, id.config(filepath.Join(dir, "jetstream"))); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("config file mode: %v %v", fi, err)
	}

	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server rejects the config: %v", err)
	}
	switch {
	case !opts.JetStream || opts.StoreDir != filepath.Join(dir, "jetstream"):
		t.Fatalf("jetstream: %v %q", opts.JetStream, opts.StoreDir)
	case !opts.SyncAlways:
		t.Fatal("sync_interval always was not applied")
	case opts.MaxPayload != 1<<20:
		t.Fatalf("max_payload %d", opts.MaxPayload)
	case opts.JetStreamMaxStore != conf.DefaultMaxStore:
		t.Fatalf("max_file_store %d, want %d", opts.JetStreamMaxStore, conf.DefaultMaxStore)
	case len(opts.TrustedOperators) != 1 || opts.TrustedOperators[0].Subject != id.op.Public:
		t.Fatalf("trusted operators: %+v", opts.TrustedOperators)
	case opts.SystemAccount != id.sys.Public:
		t.Fatalf("system account %q", opts.SystemAccount)
	}
	if _, ok := opts.AccountResolver.(*server.MemAccResolver); !ok {
		t.Fatalf("resolver is %T, want the MEMORY resolver", opts.AccountResolver)
	}
	opts.NoSigs = true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}

	// The compose health check.
	mon := srv.MonitorAddr()
	if mon == nil {
		t.Fatal("monitoring port is off")
	}
	resp, err := http.Get("http://" + mon.String() + "/healthz?js-enabled-only=true")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %d", resp.StatusCode)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pnc, err := nats.Connect(srv.ClientURL(), nats.UserCredentials(id.provisionerCreds))
	if err != nil {
		t.Fatalf("provisioner connects: %v", err)
	}
	defer pnc.Close()
	pjs, err := jetstream.New(pnc)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.EnsureTenant(ctx, pjs, stream.Config{}, id.tenant.Public, stream.Limits{}); err != nil {
		t.Fatalf("provisioning creates the tenant's streams: %v", err)
	}
	// The brain binds to the tenant's consumer through its imports.
	bnc, err := nats.Connect(srv.ClientURL(), nats.UserCredentials(id.brainCreds))
	if err != nil {
		t.Fatalf("brain connects: %v", err)
	}
	defer bnc.Close()
	bjs, err := jetstream.NewWithAPIPrefix(bnc, subjects.StreamsAPIPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bjs.Consumer(ctx, subjects.TurnsStream(id.tenant.Public), subjects.TurnsConsumer); err != nil {
		t.Fatalf("brain binds to the tenant's consumer: %v", err)
	}

	tnc, err := nats.Connect(srv.ClientURL(), nats.UserCredentials(id.tenantCreds),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // the violation below is expected
	if err != nil {
		t.Fatalf("tenant edge connects: %v", err)
	}
	defer tnc.Close()
	tjs, err := jetstream.New(tnc)
	if err != nil {
		t.Fatal(err)
	}
	key := subjects.TurnKey("<conf@example>", 1)
	ack, err := tjs.Publish(ctx, subjects.TurnLocal(key), []byte(`{"work_item_id":"<conf@example>","turn":1}`),
		jetstream.WithMsgID(key), jetstream.WithExpectLastSequencePerSubject(0))
	if err != nil {
		t.Fatalf("publish a turn through the import: %v", err)
	}
	if ack.Stream != subjects.TurnsStream(id.tenant.Public) {
		t.Fatalf("turn stored in %q, want %s", ack.Stream, subjects.TurnsStream(id.tenant.Public))
	}
	turns, err := pjs.Stream(ctx, subjects.TurnsStream(id.tenant.Public))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := turns.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	acc, gotKey, err := subjects.ParseTurn(msg.Subject)
	if err != nil {
		t.Fatalf("stored subject %q: %v", msg.Subject, err)
	}
	if acc != id.tenant.Public || gotKey != key || strings.Split(msg.Subject, ".")[2] != id.tenant.Public {
		t.Fatalf("stored subject %q: account %s key %s, want %s %s", msg.Subject, acc, gotKey, id.tenant.Public, key)
	}

	// The edge user may not publish into the brain's subjects directly.
	if err := tnc.Publish(subjects.Turn(id.tenant.Public, key), nil); err != nil {
		t.Fatal(err)
	}
	if err := tnc.FlushTimeout(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := tnc.LastError(); err == nil || !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
		t.Fatalf("edge published to brain.turn.> directly: last error %v", err)
	}
}

func TestRenderSyncIntervalAndDefaults(t *testing.T) {
	id := newIdentities(t)
	dir := t.TempDir()
	c := id.config(filepath.Join(dir, "js"))
	c.Listen, c.HTTP = "", "" // defaults
	c.Sync = "2m"
	path := filepath.Join(dir, "nats.conf")
	if err := conf.WriteFile(path, c); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if opts.SyncAlways || opts.SyncInterval != 2*time.Minute {
		t.Fatalf("sync: always=%v interval=%v", opts.SyncAlways, opts.SyncInterval)
	}
	if opts.Host != "0.0.0.0" || opts.Port != 4222 || opts.HTTPHost != "0.0.0.0" || opts.HTTPPort != 8222 {
		t.Fatalf("listeners: %s:%d http %s:%d", opts.Host, opts.Port, opts.HTTPHost, opts.HTTPPort)
	}
}

func TestRenderRejects(t *testing.T) {
	id := newIdentities(t)
	for name, edit := range map[string]func(*conf.Config){
		"no store dir":        func(c *conf.Config) { c.StoreDir = "" },
		"quote in store dir":  func(c *conf.Config) { c.StoreDir = `/data/"js` },
		"bad sync":            func(c *conf.Config) { c.Sync = "sometimes" },
		"bad listen":          func(c *conf.Config) { c.Listen = "4222" },
		"no operator":         func(c *conf.Config) { c.OperatorJWT = "" },
		"system account JWT":  func(c *conf.Config) { delete(c.Accounts, id.sys.Public) },
		"JWT under wrong key": func(c *conf.Config) { c.Accounts = map[string]string{id.sys.Public: id.brain.JWT} },
	} {
		c := id.config("/data/jetstream")
		c.Accounts = map[string]string{}
		for k, v := range id.accounts {
			c.Accounts[k] = v
		}
		edit(&c)
		if _, err := conf.Render(c); err == nil {
			t.Errorf("%s: rendered", name)
		}
	}
}

// The cluster files compose's cluster option runs (INIT_NATS_NODES=3) are
// real: nats-server's parser loads three, the servers route to each other,
// and the provisioner creates a tenant's streams with three replicas.
func TestClusterConfigFilesFormACluster(t *testing.T) {
	id := newIdentities(t)
	dir := t.TempDir()
	var routePorts []int
	for range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		routePorts = append(routePorts, ln.Addr().(*net.TCPAddr).Port)
		ln.Close()
	}
	var urls []string
	var servers []*server.Server
	for i := range 3 {
		c := id.config(filepath.Join(dir, fmt.Sprintf("js-%d", i)))
		c.ServerName = fmt.Sprintf("node-%d", i+1)
		c.Cluster = conf.Cluster{Name: "brain-nats", Listen: fmt.Sprintf("127.0.0.1:%d", routePorts[i])}
		for j := range 3 {
			if j != i {
				c.Cluster.Routes = append(c.Cluster.Routes, fmt.Sprintf("nats-route://127.0.0.1:%d", routePorts[j]))
			}
		}
		path := filepath.Join(dir, fmt.Sprintf("nats-%d.conf", i+1))
		if err := conf.WriteFile(path, c); err != nil {
			t.Fatal(err)
		}
		opts, err := server.ProcessConfigFile(path)
		if err != nil {
			t.Fatalf("nats-server rejects node %d's config: %v", i+1, err)
		}
		if opts.Cluster.Name != "brain-nats" || len(opts.Routes) != 2 || opts.ServerName != c.ServerName {
			t.Fatalf("node %d: cluster %q, %d routes, name %q", i+1, opts.Cluster.Name, len(opts.Routes), opts.ServerName)
		}
		opts.NoSigs = true
		srv, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go srv.Start()
		t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
		servers = append(servers, srv)
	}
	for _, srv := range servers {
		if !srv.ReadyForConnections(10 * time.Second) {
			t.Fatal("a node is not ready")
		}
		urls = append(urls, srv.ClientURL())
	}
	pnc, err := nats.Connect(strings.Join(urls, ","), nats.UserCredentials(id.provisionerCreds), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	defer pnc.Close()
	pjs, err := jetstream.New(pnc)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = stream.EnsureTenant(ctx, pjs, stream.Config{Replicas: 3}, id.tenant.Public, stream.Limits{})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("three replicas of the tenant's streams: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	st, err := pjs.Stream(context.Background(), subjects.TurnsStream(id.tenant.Public))
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("the stream is not on three nodes: %+v", info.Cluster)
	}
}

func TestRedactURLs(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                 "nats://127.0.0.1:4222",
		"nats://u:s3cret@a:4222,nats://b:4222":  "nats://u:xxxxx@a:4222,nats://b:4222",
		"tls://s3cret@nats.example:4222":        "tls://xxxxx@nats.example:4222",
		"nats://a:4222, nats://u:s3cret@b:4222": "nats://a:4222,nats://u:xxxxx@b:4222",
		"nats://%zz:s3cret@a:4222":              "(a URL that does not parse)",
	} {
		if got := conf.RedactURLs(in); got != want || strings.Contains(got, "s3cret") {
			t.Errorf("RedactURLs(%q) = %q, want %q", in, got, want)
		}
	}
}
