//go:build nsc

// The nsc integration test is opt-in: nsc is not in Debian or the Go
// module proxy here, so CI cannot install it. Ops machines that have it run
// `go test -tags nsc ./deploy/`. The always-on tests in scripts_test.go
// keep the scripts' subjects and permissions in step with the code, and
// runbook_test.go runs the rest of the runbook.

package deploy_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/nats/account"
	"n8nbrain/nats/stream"
	"n8nbrain/provision"
	"n8nbrain/registry"
	"n8nbrain/subjects"
)

// nscStore is a scratch nsc home: its store and keys live under a temp
// HOME, so the test never touches the operator's own.
type nscStore struct {
	t    *testing.T
	home string
	env  []string
}

func newNSCStore(t *testing.T) *nscStore {
	t.Helper()
	if _, err := exec.LookPath("nsc"); err != nil {
		t.Fatal("this test runs the real nsc (build tag nsc): install nsc first")
	}
	home := t.TempDir()
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k == "XDG_CONFIG_HOME" || k == "XDG_DATA_HOME" || k == "NKEYS_PATH" || k == "NSC_HOME" || k == "HOME" {
			continue
		}
		env = append(env, kv)
	}
	return &nscStore{t: t, home: home, env: append(env, "HOME="+home)}
}

func (n *nscStore) exec(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = n.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (n *nscStore) run(name string, args ...string) string {
	n.t.Helper()
	out, err := n.exec(name, args...)
	if err != nil {
		n.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func (n *nscStore) key(acct string) string {
	n.t.Helper()
	return strings.Trim(strings.TrimSpace(n.run("nsc", "describe", "account", "--name", acct, "--field", "sub")), `"`)
}

func (n *nscStore) account(acct string) *jwt.AccountClaims {
	n.t.Helper()
	ac, err := jwt.DecodeAccountClaims(lastLine(n.run("nsc", "describe", "account", "--name", acct, "--raw")))
	if err != nil {
		n.t.Fatal(err)
	}
	return ac
}

func (n *nscStore) user(acct, name string) *jwt.UserClaims {
	n.t.Helper()
	uc, err := jwt.DecodeUserClaims(lastLine(n.run("nsc", "describe", "user", "--account", acct, "--name", name, "--raw")))
	if err != nil {
		n.t.Fatal(err)
	}
	return uc
}

// startServer runs a nats-server as deploy/README.md configures it: the
// operator's JWT, the system account, a full (JetStream-based) resolver
// preloaded with the system account, and JetStream.
func (n *nscStore) startServer(port int) *server.Server {
	n.t.Helper()
	dir := filepath.Join(n.home, "nats")
	for _, d := range []string{"jwt", "jetstream"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			n.t.Fatal(err)
		}
	}
	op := filepath.Join(dir, "operator.jwt")
	if err := os.WriteFile(op, []byte(lastLine(n.run("nsc", "describe", "operator", "--raw"))), 0o644); err != nil {
		n.t.Fatal(err)
	}
	sys := n.key("SYS")
	conf := fmt.Sprintf(`listen: 127.0.0.1:%d
operator: %q
system_account: %s
resolver {
  type: full
  dir: %q
  allow_delete: true
  interval: "2m"
  timeout: "1.9s"
}
resolver_preload {
  %s: %s
}
jetstream {
  store_dir: %q
}
`, port, op, sys, filepath.Join(dir, "jwt"), sys, lastLine(n.run("nsc", "describe", "account", "--name", "SYS", "--raw")), filepath.Join(dir, "jetstream"))
	path := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		n.t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		n.t.Fatalf("server config: %v", err)
	}
	opts.NoSigs = true
	srv, err := server.NewServer(opts)
	if err != nil {
		n.t.Fatal(err)
	}
	go srv.Start()
	n.t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		n.t.Fatal("server not ready")
	}
	return srv
}

func connect(t *testing.T, url, creds string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserCredentials(creds), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("connect with %s: %v", filepath.Base(creds), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestNSCScriptsBuildAWorkingTopology runs the three scripts with the real
// nsc against a nats-server configured as the runbook says (operator with
// signing keys, system account, full resolver, JetStream), pushing each
// account; checks that the claims nsc wrote are package account's; and
// relays a turn with the .creds the scripts wrote: the STREAMS provisioner
// creates the tenant's streams (EnsureTenant), the brain binds the
// consumer through its imports, the tenant publishes, the brain stores a
// reply, the tenant gets it live and fetches it. Then a second, overlapping
// brain user works while the first is revoked.
func TestNSCScriptsBuildAWorkingTopology(t *testing.T) {
	n := newNSCStore(t)
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	n.run("nsc", "add", "operator", "--name", "ops", "--sys", "--generate-signing-key")
	n.run("nsc", "edit", "operator", "--require-signing-keys", "--account-jwt-server-url", url)
	srv := n.startServer(port)

	creds := func(name string) string { return filepath.Join(n.home, name+".creds") }
	n.run("./nsc-streams-account.sh", "--creds", creds("provisioner"), "ops")
	n.run("./nsc-brain-account.sh", "--creds", creds("brain"), "ops")
	brainKey, streamsKey := n.key("BRAIN"), n.key("STREAMS")
	out := n.run("./nsc-onboard-tenant.sh", "--creds", creds("acme-edge"), "acme", "ops", brainKey, streamsKey)
	acmeKey := n.key("acme")
	if !strings.Contains(out, "brainctl tenant create acme --account "+acmeKey) {
		t.Errorf("onboarding does not print the brainctl command:\n%s", out)
	}
	n.run("./nsc-onboard-tenant.sh", "--creds", creds("bravo-edge"), "bravo", "ops", brainKey, streamsKey)
	// Running them again changes nothing that matters.
	n.run("./nsc-streams-account.sh", "--creds", creds("provisioner"), "ops")
	n.run("./nsc-brain-account.sh", "--creds", creds("brain"), "ops")
	n.run("./nsc-onboard-tenant.sh", "--creds", creds("acme-edge"), "acme", "ops", brainKey, streamsKey)

	t.Run("Claims", func(t *testing.T) {
		checkClaims(t, n, brainKey, streamsKey, acmeKey)
	})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The provisioner creates acme's streams and consumer from its quota.
	pjs, err := jetstream.New(connect(t, srv.ClientURL(), creds("provisioner")))
	if err != nil {
		t.Fatal(err)
	}
	streams := &provision.Streams{JS: pjs, Config: stream.Config{AckWait: 2 * time.Second}}
	if err := streams.EnsureTenant(ctx, &registry.Tenant{ID: "acme", NATSAccount: acmeKey}); err != nil {
		t.Fatalf("provisioner creates acme's streams: %v", err)
	}
	relay(ctx, t, srv.ClientURL(), creds("brain"), creds("acme-edge"), acmeKey, "<nsc-1@example>")

	// The brain user cannot administer streams, nor can a tenant.
	bjs, _ := jetstream.NewWithAPIPrefix(connect(t, srv.ClientURL(), creds("brain")), subjects.StreamsAPIPrefix)
	denied, cancelDenied := context.WithTimeout(ctx, 2*time.Second)
	defer cancelDenied()
	if err := bjs.DeleteStream(denied, subjects.TurnsStream(acmeKey)); err == nil {
		t.Error("the brain user deleted a tenant's stream")
	}
	if _, err := pjs.Stream(ctx, subjects.TurnsStream(acmeKey)); err != nil {
		t.Errorf("acme's stream after the brain's attempt: %v", err)
	}
	// Another tenant cannot read acme's results.
	bravo := connect(t, srv.ClientURL(), creds("bravo-edge"))
	if m, err := bravo.Request(subjects.ResultLocal(subjects.TurnKey("<nsc-1@example>", 1)), nil, time.Second); err == nil {
		t.Errorf("bravo fetched acme's result: %q", m.Data)
	}

	t.Run("OverlappingBrainUsers", func(t *testing.T) {
		// A second brain user, made while the first still works (--user).
		n.run("./nsc-brain-account.sh", "--user", "brain-2", "--creds", creds("brain-2"), "ops")
		old := connect(t, srv.ClientURL(), creds("brain"))
		closed := make(chan struct{})
		old.SetClosedHandler(func(*nats.Conn) { close(closed) })
		relay(ctx, t, srv.ClientURL(), creds("brain-2"), creds("acme-edge"), acmeKey, "<nsc-2@example>")
		// Revoking the first user closes its connections and refuses it.
		n.run("nsc", "revocations", "add-user", "--account", "BRAIN", "--name", "brain")
		n.run("nsc", "push", "--account", "BRAIN")
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("the revoked brain user's connection stayed open")
		}
		if nc, err := nats.Connect(srv.ClientURL(), nats.UserCredentials(creds("brain")), nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Fatal("the revoked brain user connected")
		}
		relay(ctx, t, srv.ClientURL(), creds("brain-2"), creds("acme-edge"), acmeKey, "<nsc-3@example>")
	})
}

// relay sends one turn from a tenant's edge credentials and answers it
// with a brain's, as the real components do over these subjects.
func relay(ctx context.Context, t *testing.T, url, brainCreds, edgeCreds, tenantKey, workItem string) {
	t.Helper()
	bnc := connect(t, url, brainCreds)
	bjs, err := jetstream.NewWithAPIPrefix(bnc, subjects.StreamsAPIPrefix)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := bjs.Consumer(ctx, subjects.TurnsStream(tenantKey), subjects.TurnsConsumer)
	if err != nil {
		t.Fatalf("brain binds the tenant's consumer through its imports: %v", err)
	}
	enc := connect(t, url, edgeCreds)
	ejs, err := jetstream.New(enc)
	if err != nil {
		t.Fatal(err)
	}
	key := subjects.TurnKey(workItem, 1)
	live, err := enc.SubscribeSync(subjects.ReplyLocal(key))
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := ejs.Publish(ctx, subjects.TurnLocal(key), []byte(`{}`), jetstream.WithMsgID(key)); err != nil {
		t.Fatalf("edge publishes a turn through its import: %v", err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var msg jetstream.Msg
	for m := range batch.Messages() {
		msg = m
	}
	if msg == nil {
		t.Fatalf("brain fetched no turn: %v", batch.Error())
	}
	if a, k, err := subjects.ParseTurn(msg.Subject()); err != nil || a != tenantKey || k != key {
		t.Fatalf("turn subject %q (%v): want the tenant's account %s and key %s", msg.Subject(), err, tenantKey, key)
	}
	reply := nats.NewMsg(subjects.Reply(tenantKey, key))
	reply.Data = []byte(`{"ok":true}`)
	if _, err := bjs.PublishMsg(ctx, reply); err != nil {
		t.Fatalf("brain stores a reply: %v", err)
	}
	if err := msg.Ack(); err != nil {
		t.Fatalf("brain acks: %v", err)
	}
	if m, err := live.NextMsg(5 * time.Second); err != nil || string(m.Data) != `{"ok":true}` {
		t.Fatalf("live reply: %v %v", m, err)
	}
	if m, err := enc.Request(subjects.ResultLocal(key), nil, 5*time.Second); err != nil || string(m.Data) != `{"ok":true}` {
		t.Fatalf("fetch result: %v %v", m, err)
	}
}

// checkClaims compares what nsc wrote with what package account writes.
func checkClaims(t *testing.T, n *nscStore, brainKey, streamsKey, acmeKey string) {
	exportsOf := func(ac *jwt.AccountClaims) []string {
		var out []string
		for _, e := range ac.Exports {
			out = append(out, fmt.Sprintf("%s %s pos=%d private=%v resp=%s/%s", e.Subject, e.Type, e.AccountTokenPosition, e.TokenReq,
				respType(e.Type, e.ResponseType), e.ResponseThreshold))
		}
		return sorted(out)
	}
	want := func(es []subjects.Export) []string {
		var out []string
		for _, e := range es {
			typ, resp, thr := jwt.Stream, "", time.Duration(0)
			if e.IsService {
				typ, resp = jwt.Service, string(jwt.ResponseTypeSingleton)
			}
			if e.Streamed {
				resp, thr = string(jwt.ResponseTypeStream), account.StreamedResponseThreshold
			}
			out = append(out, fmt.Sprintf("%s %s pos=%d private=%v resp=%s/%s", e.Subject, typ, e.TokenPosition, e.Private, resp, thr))
		}
		return sorted(out)
	}
	st, br, acme := n.account("STREAMS"), n.account("BRAIN"), n.account("acme")
	if got, w := exportsOf(st), want(subjects.StreamsExports()); !slices.Equal(got, w) {
		t.Errorf("STREAMS exports\n got %q\nwant %q", got, w)
	}
	if !st.Limits.IsJSEnabled() {
		t.Error("STREAMS has no JetStream")
	}
	if got, w := exportsOf(br), want(subjects.BrainExports()); !slices.Equal(got, w) {
		t.Errorf("BRAIN exports\n got %q\nwant %q", got, w)
	}
	if br.Limits.IsJSEnabled() || acme.Limits.IsJSEnabled() {
		t.Errorf("JetStream: BRAIN %v, acme %v; want neither", br.Limits.IsJSEnabled(), acme.Limits.IsJSEnabled())
	}
	// BRAIN's imports: from STREAMS, each with an activation token STREAMS
	// (or its signing key) issued to BRAIN for exactly that subject.
	var gotImp, wantImp []string
	for _, im := range br.Imports {
		act, err := jwt.DecodeActivationClaims(im.Token)
		if err != nil {
			t.Errorf("BRAIN import %s: token: %v", im.Subject, err)
			continue
		}
		issuer := act.Issuer
		if act.IssuerAccount != "" {
			issuer = act.IssuerAccount
		}
		if act.Subject != brainKey || issuer != streamsKey || string(act.ImportSubject) != string(im.Subject) {
			t.Errorf("BRAIN import %s: activation for %s by %s on %s", im.Subject, act.Subject, issuer, act.ImportSubject)
		}
		gotImp = append(gotImp, fmt.Sprintf("%s %s %s %s", im.Account, im.Subject, localOf(im), im.Type))
	}
	for _, im := range subjects.BrainImports() {
		local := im.Local
		if local == "" {
			local = im.Subject
		}
		wantImp = append(wantImp, fmt.Sprintf("%s %s %s %s", streamsKey, im.Subject, local, jwt.Service))
	}
	if !slices.Equal(sorted(gotImp), sorted(wantImp)) {
		t.Errorf("BRAIN imports\n got %q\nwant %q", gotImp, wantImp)
	}
	// The tenant: imports pinned to its own key, as account.ImportsFor writes them.
	gotImp, wantImp = nil, nil
	for _, im := range acme.Imports {
		gotImp = append(gotImp, fmt.Sprintf("%s %s %s %s", im.Account, im.Subject, localOf(im), im.Type))
	}
	for _, im := range account.ImportsFor(acmeKey, brainKey, streamsKey) {
		wantImp = append(wantImp, fmt.Sprintf("%s %s %s %s", im.Account, im.Subject, localOf(im), im.Type))
	}
	if !slices.Equal(sorted(gotImp), sorted(wantImp)) {
		t.Errorf("tenant imports\n got %q\nwant %q", gotImp, wantImp)
	}
	if acme.Limits.Conn != account.TenantMaxConns || acme.Limits.Payload != account.TenantMaxPayload || acme.Limits.Subs != account.TenantMaxSubs {
		t.Errorf("tenant limits: conns %d payload %d subs %d", acme.Limits.Conn, acme.Limits.Payload, acme.Limits.Subs)
	}
	// Users: exactly the roles' permissions.
	for _, u := range []struct {
		acct, name string
		role       account.Role
	}{{"STREAMS", "provisioner", account.RoleProvisioner}, {"BRAIN", "brain", account.RoleBrain}, {"acme", "edge", account.RoleEdge}} {
		uc := n.user(u.acct, u.name)
		want := account.Permissions(u.role)
		got := uc.Permissions
		if !slices.Equal(sorted(got.Pub.Allow), sorted(want.Pub.Allow)) || !slices.Equal(sorted(got.Pub.Deny), sorted(want.Pub.Deny)) ||
			!slices.Equal(sorted(got.Sub.Allow), sorted(want.Sub.Allow)) || !slices.Equal(sorted(got.Sub.Deny), sorted(want.Sub.Deny)) ||
			(got.Resp == nil) != (want.Resp == nil) || (got.Resp != nil && *got.Resp != *want.Resp) {
			t.Errorf("user %s/%s permissions\n got %+v resp %+v\nwant %+v resp %+v", u.acct, u.name, got, got.Resp, want, want.Resp)
		}
	}
}

func respType(t jwt.ExportType, r jwt.ResponseType) string {
	if t != jwt.Service {
		return ""
	}
	if r == "" {
		return string(jwt.ResponseTypeSingleton)
	}
	return string(r)
}

func localOf(im *jwt.Import) string {
	if im.LocalSubject != "" {
		return string(im.LocalSubject)
	}
	return string(im.Subject)
}
