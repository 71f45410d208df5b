//go:build nsc

// The nsc integration test is opt-in: nsc is not in Debian or the Go
// module proxy here, so CI cannot install it. Ops machines that have it run
// `go test -tags nsc ./deploy/`. The always-on tests in scripts_test.go
// keep the scripts' subjects and permissions in step with the code.

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
	"n8nbrain/subjects"
)

// TestNSCScriptsBuildAWorkingTopology runs both scripts with the real nsc
// in a scratch nsc store, compares the
// claims they wrote with package account's, and relays a turn through a
// nats-server configured by `nsc generate config --mem-resolver`, using the
// .creds files the scripts wrote.
func TestNSCScriptsBuildAWorkingTopology(t *testing.T) {
	if _, err := exec.LookPath("nsc"); err != nil {
		t.Fatal("this test runs the real nsc (build tag nsc): install nsc first")
	}
	home := t.TempDir()
	env := append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, "config"),
		"XDG_DATA_HOME="+filepath.Join(home, "data"), "NKEYS_PATH="+filepath.Join(home, "nkeys"), "NSC_NO_GIT_IGNORE=1")
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("nsc", "add", "operator", "--name", "ops", "--sys")
	brainCreds, edgeCreds := filepath.Join(home, "brain.creds"), filepath.Join(home, "acme-edge.creds")
	run("./nsc-brain-account.sh", "--no-push", "--creds", brainCreds, "ops")
	brainPub := strings.Trim(strings.TrimSpace(run("nsc", "describe", "account", "--name", "BRAIN", "--field", "sub")), `"`)
	run("./nsc-onboard-tenant.sh", "--no-push", "--creds", edgeCreds, "acme", "ops", brainPub)
	// Running them again changes nothing that matters.
	run("./nsc-brain-account.sh", "--no-push", "--creds", brainCreds, "ops")
	run("./nsc-onboard-tenant.sh", "--no-push", "--creds", edgeCreds, "acme", "ops", brainPub)

	claims := func(args ...string) string {
		return strings.TrimSpace(run("nsc", append([]string{"describe"}, append(args, "--raw")...)...))
	}
	bc, err := jwt.DecodeAccountClaims(lastLine(claims("account", "--name", "BRAIN")))
	if err != nil {
		t.Fatal(err)
	}
	tc, err := jwt.DecodeAccountClaims(lastLine(claims("account", "--name", "acme")))
	if err != nil {
		t.Fatal(err)
	}
	// BRAIN: exports and JetStream as account.BrainAccount writes them.
	var gotExp, wantExp []string
	for _, e := range bc.Exports {
		gotExp = append(gotExp, fmt.Sprintf("%s %s %d", e.Subject, e.Type, e.AccountTokenPosition))
	}
	for _, e := range subjects.BrainExports() {
		typ := jwt.Stream
		if e.IsService {
			typ = jwt.Service
		}
		wantExp = append(wantExp, fmt.Sprintf("%s %s %d", e.Subject, typ, e.TokenPosition))
	}
	if !slices.Equal(sorted(gotExp), sorted(wantExp)) {
		t.Errorf("BRAIN exports\n got %q\nwant %q", gotExp, wantExp)
	}
	if !bc.Limits.IsJSEnabled() {
		t.Error("BRAIN has no JetStream")
	}
	// The tenant: imports pinned to its own key, as account.ImportsFor writes them.
	var gotImp, wantImp []string
	for _, im := range tc.Imports {
		gotImp = append(gotImp, fmt.Sprintf("%s %s %s %s", im.Account, im.Subject, im.LocalSubject, im.Type))
	}
	for _, im := range account.ImportsFor(tc.Subject, brainPub) {
		wantImp = append(wantImp, fmt.Sprintf("%s %s %s %s", im.Account, im.Subject, im.LocalSubject, im.Type))
	}
	if !slices.Equal(sorted(gotImp), sorted(wantImp)) {
		t.Errorf("tenant imports\n got %q\nwant %q", gotImp, wantImp)
	}
	if tc.Limits.Conn != 32 || tc.Limits.IsJSEnabled() {
		t.Errorf("tenant limits: conns %d, JetStream %v", tc.Limits.Conn, tc.Limits.IsJSEnabled())
	}
	// Users: exactly the roles' permissions.
	for _, u := range []struct {
		acct, name string
		role       account.Role
	}{{"BRAIN", "brain", account.RoleBrain}, {"acme", "edge", account.RoleEdge}} {
		uc, err := jwt.DecodeUserClaims(lastLine(claims("user", "--account", u.acct, "--name", u.name)))
		if err != nil {
			t.Fatal(err)
		}
		want := account.Permissions(u.role)
		got := uc.Permissions
		if !slices.Equal(sorted(got.Pub.Allow), sorted(want.Pub.Allow)) || !slices.Equal(sorted(got.Pub.Deny), sorted(want.Pub.Deny)) ||
			!slices.Equal(sorted(got.Sub.Allow), sorted(want.Sub.Allow)) || !slices.Equal(sorted(got.Sub.Deny), sorted(want.Sub.Deny)) ||
			(got.Resp == nil) != (want.Resp == nil) || (got.Resp != nil && *got.Resp != *want.Resp) {
			t.Errorf("user %s/%s permissions\n got %+v resp %+v\nwant %+v resp %+v", u.acct, u.name, got, got.Resp, want, want.Resp)
		}
	}

	// A server with nsc's own configuration, JetStream on.
	confPath := filepath.Join(home, "nats.conf")
	run("nsc", "generate", "config", "--mem-resolver", "--config-file", confPath)
	opts, err := server.ProcessConfigFile(confPath)
	if err != nil {
		t.Fatalf("nsc's server config: %v", err)
	}
	opts.Host, opts.Port, opts.NoSigs = "127.0.0.1", -1, true
	opts.JetStream, opts.StoreDir = true, filepath.Join(home, "js")
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bnc, err := nats.Connect(srv.ClientURL(), nats.UserCredentials(brainCreds))
	if err != nil {
		t.Fatalf("brain connects: %v", err)
	}
	defer bnc.Close()
	bjs, _ := jetstream.New(bnc)
	if _, err := stream.Ensure(ctx, bjs, stream.Config{}); err != nil {
		t.Fatalf("brain creates its streams: %v", err)
	}
	enc, err := nats.Connect(srv.ClientURL(), nats.UserCredentials(edgeCreds))
	if err != nil {
		t.Fatalf("edge connects: %v", err)
	}
	defer enc.Close()
	ejs, _ := jetstream.New(enc)
	key := subjects.TurnKey("<nsc@example>", 1)
	ack, err := ejs.Publish(ctx, subjects.TurnLocal(key), []byte(`{}`), jetstream.WithMsgID(key))
	if err != nil {
		t.Fatalf("edge publishes a turn through its import: %v", err)
	}
	turns, err := bjs.Stream(ctx, subjects.TurnsStream)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := turns.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if a, k, err := subjects.ParseTurn(msg.Subject); err != nil || a != tc.Subject || k != key {
		t.Fatalf("stored turn subject %q (%v): want the tenant's account %s", msg.Subject, err, tc.Subject)
	}
	// The brain replies; the edge gets it live and can fetch it from RESULTS.
	live, err := enc.SubscribeSync(subjects.ReplyLocal(key))
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := bjs.Publish(ctx, subjects.Reply(tc.Subject, key), []byte(`{"ok":true}`)); err != nil {
		t.Fatalf("brain stores a reply: %v", err)
	}
	if m, err := live.NextMsg(5 * time.Second); err != nil || string(m.Data) != `{"ok":true}` {
		t.Fatalf("live reply: %v %v", m, err)
	}
	if m, err := enc.Request(subjects.ResultLocal(key), nil, 5*time.Second); err != nil || string(m.Data) != `{"ok":true}` {
		t.Fatalf("fetch result: %v %v", m, err)
	}
}
