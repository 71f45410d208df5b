//go:build e2e

// Package e2e runs the shipped n8n workflows in a real n8n (installed from
// npm by tests/e2e/setup.sh) against the real brain and edge, a real IMAP
// server (dovecot) and a real SMTP server (go-smtp), on loopback. `make e2e`
// runs it; the default `go test ./...` does not (build tag e2e).
package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/bcrypt"

	"n8nbrain/brain"
	"n8nbrain/deploy/devstack"
	"n8nbrain/edge"
	"n8nbrain/internal/testdb"
	"n8nbrain/nats/stream"
	"n8nbrain/tests/internal/reviewform"
	"n8nbrain/wire"
)

const (
	mailFrom = "assistant@e2e.test"
	// notifyTo is the default (N8NBRAIN_NOTIFY_TO unset): the assistant's
	// own address, so every notification lands in the INBOX the assistant
	// reads, and must not become work.
	notifyTo = mailFrom
	customer = "jo@customer.example"
)

type world struct {
	t        *testing.T
	dir      string
	edgeURL  string
	token    string
	secret   string
	intake   string
	n8nURL   string
	n8nDB    *pgx.Conn
	tenantDB *pgx.Conn
	imap     *dovecot
	smtp     *smtpServer
	proxy    *proxy
	reviewer string
	revPass  string
	secrets  []string
	n8nLog   string
}

func TestAssistantEndToEnd(t *testing.T) {
	started := time.Now()
	w := setup(t)
	t.Logf("stack, mail servers and n8n ready in %s", time.Since(started).Round(time.Second))

	t.Run("ApproveOnTheReviewPageSendsTheApprovedTextOnce", func(t *testing.T) { w.approve(t) })
	t.Run("NotificationInTheOwnInboxIsNotWork", func(t *testing.T) { w.ownNotice(t) })
	t.Run("AutomaticMailIsNotWork", func(t *testing.T) { w.automaticMail(t) })
	t.Run("Reject", func(t *testing.T) { w.reject(t) })
	t.Run("EditSendsTheEditedText", func(t *testing.T) { w.edit(t) })
	t.Run("HumanReplyFirstClosesManualAndSendsNothing", func(t *testing.T) { w.humanFirst(t) })
	t.Run("HumanReplyAfterApprovalStopsTheSend", func(t *testing.T) { w.humanBeforeSend(t) })
	t.Run("OldHumanRepliesAreForgotten", func(t *testing.T) { w.oldReplies(t) })
	t.Run("RecipientRefusedIsFailed", func(t *testing.T) { w.refused(t) })
	t.Run("SMTPDownIsUnknownThenVerifiedFailed", func(t *testing.T) { w.smtpDown(t) })
	t.Run("AnswerLostIsUnknownThenVerifiedSent", func(t *testing.T) { w.answerLost(t) })
	t.Run("SameTextTwiceIsVerifiedByItsOwnCopy", func(t *testing.T) { w.sameTextTwice(t) })
	t.Run("FailedEventTurnIsAnswered503AndRedelivered", func(t *testing.T) { w.eventRedelivered(t) })
	t.Run("HaltedItemNotifiesAndSubmitsNoTurn", func(t *testing.T) { w.halted(t) })
	t.Run("ClientErrorIsPostedOnceAndFailsTheRun", func(t *testing.T) { w.clientError(t) })
	t.Run("WebhookIntakeVariant", func(t *testing.T) { w.webhookIntake(t) })
	t.Run("NoNotificationBecameWork", func(t *testing.T) { w.noNoticeWork(t) })
	t.Run("NoSecretInSavedRunData", func(t *testing.T) { w.noSecrets(t) })
	t.Logf("whole run %s", time.Since(started).Round(time.Second))
}

func setup(t *testing.T) *world {
	adminURL := testdb.AdminURL(t)
	dir, err := os.MkdirTemp("", "n8nbrain-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	w := &world{t: t, dir: dir}
	prefix := "e2e" + randomHex(3) + "_"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The brain's side: embedded NATS in operator mode, Postgres, client-zero.
	logf, err := os.Create(filepath.Join(dir, "stack.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	log := slog.New(slog.NewJSONHandler(logf, nil))
	st, err := devstack.Start(ctx, devstack.Config{Dir: filepath.Join(dir, "stack"), AdminURL: adminURL, Prefix: prefix,
		Streams: stream.Config{AckWait: 5 * time.Second}, Logger: log})
	if err != nil {
		t.Fatalf("start stack: %v", err)
	}
	t.Cleanup(func() {
		st.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := st.Ops.DropPrefixed(ctx); err != nil {
			t.Errorf("drop test databases: %v", err)
		}
	})
	spec := devstack.ClientZeroSpec()
	spec.ID = "client-zero-e2e"
	tn, err := st.AddTenant(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopAll := context.WithCancel(context.Background())
	bcfg := st.BrainConfig("e2e-1")
	bcfg.EventRetryBase, bcfg.EventRetryMax = 500*time.Millisecond, 2*time.Second
	brainDone := make(chan error, 1)
	go func() { brainDone <- brain.Run(runCtx, bcfg, log.With("component", "brain")) }()

	// Mail.
	w.imap = startDovecot(t, dir)
	w.smtp = newSMTP(t, mailFrom, w.imap)

	// n8n's address is needed by the edge; n8n needs the edge's. Both
	// talk through the proxy, which counts what passes.
	n8nPort := freePort(t)
	w.n8nURL = fmt.Sprintf("http://127.0.0.1:%d", n8nPort)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w.proxy = newProxy(t, "http://"+ln.Addr().String(), w.n8nURL)
	ecfg := st.EdgeConfig(tn)
	ecfg.WebhookURL = w.proxy.url + "/webhook/brain-events"
	ecfg.WebhookSecret = "events-" + randomHex(12)
	ecfg.WebhookTimeout = time.Minute
	ecfg.WebhookInitialInterval, ecfg.WebhookMaxInterval = 500*time.Millisecond, 2*time.Second
	// The review page's one reviewer.
	w.reviewer, w.revPass = "alice", "review-"+randomHex(8)
	hash, err := bcrypt.GenerateFromPassword([]byte(w.revPass), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	ecfg.ReviewersFile = filepath.Join(dir, "reviewers")
	if err := os.WriteFile(ecfg.ReviewersFile, []byte(w.reviewer+":"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	edgeDone := make(chan error, 1)
	go func() { edgeDone <- edge.Serve(runCtx, ln, ecfg, log.With("component", "edge")) }()
	t.Cleanup(func() {
		stopAll()
		if err := <-edgeDone; err != nil {
			t.Errorf("edge: %v", err)
		}
		if err := <-brainDone; err != nil {
			t.Errorf("brain: %v", err)
		}
	})
	w.edgeURL, w.token, w.secret = "http://"+ln.Addr().String(), tn.Token, ecfg.WebhookSecret

	// What the import reads: the same code `make dev` and compose's init
	// use, with N8NBRAIN_NOTIFY_TO left to its default. n8n reaches the
	// edge through the proxy; reviewers follow links to the edge itself.
	w.intake = "intake-" + randomHex(12)
	n8nDir := filepath.Join(dir, "n8n-import")
	_, err = devstack.WriteN8N(n8nDir, devstack.N8NOptions{
		EdgeURL: w.proxy.url, ReviewURL: w.edgeURL, EdgeToken: w.token, EventSecret: w.secret, IntakeSecret: w.intake,
		MailFrom:   mailFrom,
		IMAP:       devstack.MailServer{Host: "127.0.0.1", Port: w.imap.port, User: w.imap.user, Password: w.imap.password},
		SMTP:       devstack.MailServer{Host: "127.0.0.1", Port: w.smtp.port},
		VerifyWait: 5 * time.Second,
	}, -1)
	if err != nil {
		t.Fatal(err)
	}
	w.secrets = []string{w.token, w.secret, w.intake, w.imap.password, w.revPass}

	// n8n on its own database in the shared cluster.
	w.startN8N(adminURL, prefix, n8nPort, n8nDir)
	dbURL, err := url.Parse(adminURL)
	if err != nil {
		t.Fatal(err)
	}
	dbURL.Path = "/" + tn.DB.DBName
	if w.tenantDB, err = pgx.Connect(context.Background(), dbURL.String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.tenantDB.Close(context.Background()) })
	return w
}

// n8nEnv is the environment n8n and its CLI run with.
func (w *world) n8nEnv(adminURL, db string, port int) []string {
	u, _ := url.Parse(adminURL)
	pw, _ := u.User.Password()
	cache := os.Getenv("N8NBRAIN_CACHE")
	if cache == "" {
		c, _ := os.UserCacheDir()
		cache = filepath.Join(c, "n8nbrain")
	}
	nodeBin := filepath.Join(cache, "node-"+envOr("N8NBRAIN_NODE_VERSION", "24.22.3"), "package", "bin")
	n8nBin := filepath.Join(cache, "n8n-"+envOr("N8NBRAIN_N8N_VERSION", "2.40.7"), "node_modules", ".bin")
	if _, err := os.Stat(filepath.Join(n8nBin, "n8n")); err != nil {
		w.t.Fatalf("n8n is not installed in %s: run tests/e2e/setup.sh (make e2e does): %v", n8nBin, err)
	}
	nodes, err := filepath.Abs(filepath.Join("..", "..", "deploy", "n8n", "nodes"))
	if err != nil {
		w.t.Fatal(err)
	}
	return append(os.Environ(),
		"PATH="+nodeBin+":"+n8nBin+":"+os.Getenv("PATH"),
		"N8N_USER_FOLDER="+filepath.Join(w.dir, "n8n-home"),
		"N8N_ENCRYPTION_KEY=e2e-"+randomHex(16),
		fmt.Sprintf("N8N_PORT=%d", port), "N8N_LISTEN_ADDRESS=127.0.0.1", "N8N_HOST=127.0.0.1",
		fmt.Sprintf("WEBHOOK_URL=http://127.0.0.1:%d/", port),
		// The task broker's default port is n8n's own plus one: keep it apart.
		fmt.Sprintf("N8N_RUNNERS_BROKER_PORT=%d", freePort(w.t)),
		"N8N_DIAGNOSTICS_ENABLED=false", "N8N_PERSONALIZATION_ENABLED=false", "N8N_SECURE_COOKIE=false",
		"N8N_VERSION_NOTIFICATIONS_ENABLED=false", "N8N_TEMPLATES_ENABLED=false", "TZ=UTC", "GENERIC_TIMEZONE=UTC",
		// The Send Reply node, as the README says to load it.
		"N8N_CUSTOM_EXTENSIONS="+nodes,
		"DB_TYPE=postgresdb", "DB_POSTGRESDB_HOST="+u.Hostname(), "DB_POSTGRESDB_PORT="+u.Port(),
		"DB_POSTGRESDB_DATABASE="+db, "DB_POSTGRESDB_USER="+u.User.Username(), "DB_POSTGRESDB_PASSWORD="+pw,
	)
}

func (w *world) startN8N(adminURL, prefix string, port int, importDir string) {
	t := w.t
	ctx := context.Background()
	db := prefix + "n8n"
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	admin.Close(ctx)
	env := w.n8nEnv(adminURL, db, port)
	// Cleanups run last-in first-out: the database goes after n8n stopped.
	t.Cleanup(func() {
		if w.n8nDB != nil {
			w.n8nDB.Close(ctx)
		}
		admin, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			t.Errorf("drop n8n database: %v", err)
			return
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("drop n8n database: %v", err)
		}
	})

	// The import, exactly as README.md documents it.
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Join(filepath.Dir(file), "..", "..")
	started := time.Now()
	imp := exec.Command(filepath.Join(repo, "deploy", "n8n", "import.sh"), importDir, "imap", "webhook")
	imp.Env = env
	if out, err := imp.CombinedOutput(); err != nil {
		t.Fatalf("deploy/n8n/import.sh: %v\n%s", err, out)
	}
	t.Logf("import and publish: %s", time.Since(started).Round(time.Second))

	w.n8nLog = filepath.Join(w.dir, "n8n.log")
	logf, err := os.Create(w.n8nLog)
	if err != nil {
		t.Fatal(err)
	}
	var n8nPath string
	for _, e := range env {
		if p, ok := strings.CutPrefix(e, "PATH="); ok {
			n8nPath, _ = lookPathIn("n8n", p)
		}
	}
	cmd := exec.Command(n8nPath, "start")
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// n8n and anything it started (its task runner) are one group.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(w.n8nLog)
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("n8n log (tail):\n%s", b)
			s, _ := os.ReadFile(filepath.Join(w.dir, "stack.log"))
			if len(s) > 20000 {
				s = s[len(s)-20000:]
			}
			t.Logf("stack log (tail):\n%s", s)
		}
	})
	u, _ := url.Parse(adminURL)
	u.Path = "/" + db
	if w.n8nDB, err = pgx.Connect(ctx, u.String()); err != nil {
		t.Fatal(err)
	}
	// Ready: both webhooks registered (a request without the secret is
	// refused, not unknown) and both IMAP triggers logged in.
	eventually(t, 3*time.Minute, "n8n's webhooks to be registered", func() bool {
		return w.postStatus("/webhook/brain-events", nil, "{}") == http.StatusForbidden &&
			w.postStatus("/webhook/new-email", nil, "{}") == http.StatusForbidden
	})
	eventually(t, time.Minute, "n8n's two IMAP triggers to log in", func() bool { return w.imap.logins() >= 2 })
}

func lookPathIn(name, path string) (string, error) {
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	return "", os.ErrNotExist
}

func (w *world) postStatus(path string, header map[string]string, body string) int {
	req, _ := http.NewRequest(http.MethodPost, w.n8nURL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// edge calls the edge's API as a reviewer's tool would (the JSON approvals
// API with the edge token).
func (w *world) edge(method, path string, body any) (int, []byte) {
	w.t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, w.edgeURL+path, r)
	req.Header.Set("Authorization", "Bearer "+w.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// pendingApproval waits for the draft of a work item to await approval.
func (w *world) pendingApproval(t *testing.T, workItem string) wire.Approval {
	t.Helper()
	var found wire.Approval
	eventually(t, 90*time.Second, "a draft of "+workItem+" awaiting approval", func() bool {
		_, b := w.edge(http.MethodGet, "/v1/approvals?status=pending&limit=200", nil)
		var l wire.ApprovalListReply
		_ = json.Unmarshal(b, &l)
		for _, a := range l.Approvals {
			if a.WorkItemID == workItem {
				found = a
				return true
			}
		}
		return false
	})
	return found
}

func (w *world) item(t *testing.T, workItem string) (status, outcome string) {
	t.Helper()
	var o *string
	err := w.tenantDB.QueryRow(context.Background(), `SELECT status, outcome FROM work_items WHERE id = $1`, workItem).Scan(&status, &o)
	if err != nil && err != pgx.ErrNoRows {
		t.Fatal(err)
	}
	if o != nil {
		outcome = *o
	}
	return status, outcome
}

func (w *world) waitItem(t *testing.T, workItem, status, outcome string) {
	t.Helper()
	eventually(t, 2*time.Minute, fmt.Sprintf("%s to be %s/%s", workItem, status, outcome), func() bool {
		s, o := w.item(t, workItem)
		return s == status && o == outcome
	})
}

// idle waits until n8n runs nothing, and every event is delivered.
func (w *world) idle(t *testing.T) {
	t.Helper()
	eventually(t, 2*time.Minute, "n8n to finish every run and the edge to deliver every event", func() bool {
		var running, undelivered int
		// Workflows that keep no run data (the settings, the two webhook
		// receivers) leave their rows "running"; the work they start runs
		// in workflows that keep theirs.
		_ = w.n8nDB.QueryRow(context.Background(), `SELECT count(*) FROM execution_entity WHERE finished = false
			AND status NOT IN ('error', 'crashed', 'canceled') AND "workflowId" NOT IN ('n8nbrainSettings', 'n8nbrainEvents', 'n8nbrainIntake')`).Scan(&running)
		_ = w.tenantDB.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE delivered_at IS NULL`).Scan(&undelivered)
		return running == 0 && undelivered == 0
	})
}

// lastExecution is the id of n8n's latest run.
func (w *world) lastExecution() int {
	var id int
	_ = w.n8nDB.QueryRow(context.Background(), `SELECT COALESCE(max(id), 0) FROM execution_entity`).Scan(&id)
	return id
}

// actRuns waits for n finished runs of the act workflow after run mark.
func (w *world) actRuns(t *testing.T, mark, n int) {
	t.Helper()
	eventually(t, 2*time.Minute, fmt.Sprintf("%d runs of n8nbrain: act", n), func() bool {
		var c int
		_ = w.n8nDB.QueryRow(context.Background(), `SELECT count(*) FROM execution_entity WHERE id > $1
			AND "workflowId" = 'n8nbrainAct' AND finished`, mark).Scan(&c)
		return c >= n
	})
}

func (w *world) deliver(t *testing.T, id, subject, body string, headers ...string) {
	w.deliverFrom(t, customer, id, subject, body, headers...)
}

func (w *world) deliverFrom(t *testing.T, from, id, subject, body string, headers ...string) {
	t.Helper()
	if err := w.imap.save("INBOX", email(id, "Customer <"+from+">", mailFrom, subject, body, headers...)); err != nil {
		t.Fatal(err)
	}
}

func (w *world) decide(t *testing.T, approvalID, decision string, body any) wire.ApprovalDecideReply {
	t.Helper()
	status, b := w.edge(http.MethodPost, "/v1/approvals/"+approvalID+"/"+decision, body)
	if status != http.StatusOK {
		t.Fatalf("%s %s: %d %s", decision, approvalID, status, b)
	}
	var r wire.ApprovalDecideReply
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// replies are the messages sent to the customer about a subject.
func (w *world) replies(t *testing.T, subject string) []parsed {
	var out []parsed
	for _, m := range w.smtp.to(customer) {
		p := parse(t, m)
		if p.subject(t) == subject {
			out = append(out, p)
		}
	}
	return out
}

func (w *world) notifications(t *testing.T, contains string) int {
	n := 0
	for _, m := range w.smtp.to(notifyTo) {
		p := parse(t, m)
		if strings.Contains(p.subject(t)+"\n"+p.Body, contains) {
			n++
		}
	}
	return n
}

// The rule's draft, sent exactly as approved: subject and body.
const (
	approvedSubject = "Re: your quote request"
	approvedBody    = "Thanks for getting in touch. We are preparing your quote and will send it within two working days."
)

func (w *world) approve(t *testing.T) {
	id := "<approve-" + randomHex(6) + "@customer.example>"
	w.deliver(t, id, "Quote for a new deck", "Hi, could you quote for a 20m2 hardwood deck? Thanks, Jo")
	ap := w.pendingApproval(t, id)
	// Reviewers hear about it (approval_requested), with a link to the page.
	eventually(t, time.Minute, "the reviewers' notification", func() bool {
		return w.notifications(t, "/review/approvals/"+ap.ID) == 1
	})
	if n := len(w.replies(t, approvedSubject)); n != 0 {
		t.Fatalf("%d replies sent before approval", n)
	}
	before := len(w.smtp.to(customer))
	// The first delivery of the approval's event runs in n8n (it sends),
	// and n8n's answer is lost on its way back to the edge: the edge
	// delivers the event again, as it must.
	mark := w.proxy.count()
	w.proxy.add(&rule{Times: 1, AfterForward: true, Status: http.StatusBadGateway, Match: func(ex exchange) bool {
		return ex.EventKind == string(wire.EventApprovalDecided) && ex.WorkItemID == id
	}})
	w.approveOnReviewPage(t, ap.ID)
	w.waitItem(t, id, "closed", "succeeded")
	eventually(t, 2*time.Minute, "the approval's event delivered again and accepted", func() bool {
		d := deliveries(w.proxy.since(mark), string(wire.EventApprovalDecided), id)
		return len(d) >= 2 && d[len(d)-1].Answered == http.StatusOK
	})
	w.idle(t)
	d := deliveries(w.proxy.since(mark), string(wire.EventApprovalDecided), id)
	if d[0].Upstream != http.StatusOK || d[0].Answered != http.StatusBadGateway || d[1].EventID != d[0].EventID {
		t.Fatalf("deliveries of the approval's event: %+v", d)
	}
	got := w.smtp.to(customer)[before:]
	if len(got) != 1 {
		t.Fatalf("%d messages to the customer after approval and the event twice, want exactly 1", len(got))
	}
	p := parse(t, got[0])
	if p.subject(t) != approvedSubject || normalize(p.Body) != approvedBody {
		t.Fatalf("sent %q / %q, want the approved %q / %q", p.subject(t), p.Body, approvedSubject, approvedBody)
	}
	if !strings.EqualFold(got[0].From, mailFrom) {
		t.Fatalf("envelope sender %s", got[0].From)
	}
	threaded(t, p, ap.ID, id, id)
	// The turn that reported the send was submitted once: the second
	// delivery found the approval sent.
	if n := len(turnPosts(w.proxy.since(mark), id)); n != 3 {
		t.Fatalf("%d turn submissions for the item after approval (turn 2, its replay, turn 3), want 3: %+v", n, turnPosts(w.proxy.since(mark), id))
	}

	// And the same event posted twice more, directly, as the edge would.
	ev := wire.Event{EventID: d[0].EventID, Kind: wire.EventApprovalDecided, WorkItemID: id, NextTurn: ap.Turn + 1,
		ApprovalID: ap.ID, Decision: "approved", OccurredAt: time.Now().UTC()}
	execMark := w.lastExecution()
	for range 2 {
		if s := w.postEvent(ev); s != http.StatusOK {
			t.Fatalf("duplicate event answered %d", s)
		}
	}
	// Each delivery is two runs of act: accept the event, act on the decision.
	w.actRuns(t, execMark, 4)
	w.idle(t)
	if n := len(w.smtp.to(customer)) - before; n != 1 {
		t.Fatalf("%d messages to the customer after the event came four times, want 1", n)
	}
	// A duplicated approval_requested does not e-mail the reviewers again.
	req := wire.Event{EventID: "", Kind: wire.EventApprovalRequested, WorkItemID: id, NextTurn: ap.Turn + 1,
		ApprovalID: ap.ID, Action: "draft_reply", OccurredAt: time.Now().UTC()}
	if err := w.tenantDB.QueryRow(context.Background(), `SELECT id FROM outbox WHERE kind = 'approval_requested' AND work_item_id = $1`, id).Scan(&req.EventID); err != nil {
		t.Fatalf("the approval_requested event: %v", err)
	}
	execMark = w.lastExecution()
	if s := w.postEvent(req); s != http.StatusOK {
		t.Fatalf("duplicate approval_requested answered %d", s)
	}
	w.actRuns(t, execMark, 1)
	w.idle(t)
	if n := w.notifications(t, "/review/approvals/"+ap.ID); n != 1 {
		t.Fatalf("%d reviewer notifications after approval_requested came twice, want 1", n)
	}
}

// approveOnReviewPage approves as a reviewer does in a browser: sign in,
// open the approval, post its approve form as the page filled it.
func (w *world) approveOnReviewPage(t *testing.T, approvalID string) {
	t.Helper()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	browser := func(method, path string, form url.Values, cookie string) (*http.Response, string) {
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		req, _ := http.NewRequest(method, w.edgeURL+path, body)
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Origin", w.edgeURL)
			req.Header.Set("Sec-Fetch-Site", "same-origin")
		}
		if cookie != "" {
			req.Header.Set("Cookie", cookie)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := browser(http.MethodPost, "/review/login", url.Values{"name": {w.reviewer}, "password": {w.revPass}, "next": {"/review"}}, "")
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) == 0 {
		t.Fatalf("review sign-in: %d %s", resp.StatusCode, body)
	}
	cookie := resp.Cookies()[0].Name + "=" + resp.Cookies()[0].Value
	resp, page := browser(http.MethodGet, "/review/approvals/"+approvalID, nil, cookie)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("review page: %d %s", resp.StatusCode, page)
	}
	form, ok := reviewform.Approve(page)
	if !ok || form.Get("csrf") == "" {
		t.Fatalf("no approve form with its CSRF token on the review page:\n%s", page)
	}
	form.Set("decision", "approve")
	if resp, body := browser(http.MethodPost, "/review/approvals/"+approvalID, form, cookie); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("approve on the review page: %d %s", resp.StatusCode, body)
	}
	status, b := w.edge(http.MethodGet, "/v1/approvals/"+approvalID, nil)
	var got wire.ApprovalGetReply
	if status != http.StatusOK || json.Unmarshal(b, &got) != nil {
		t.Fatalf("GET approval: %d %s", status, b)
	}
	if got.Approval.Status != wire.ApprovalStatusApproved || got.Approval.DecidedBy != "reviewer:"+w.reviewer {
		t.Fatalf("approval after the review page: %+v", got.Approval)
	}
}

// ownNotice: the reviewers' notification goes to the assistant's own
// address (the default), so it arrives in the INBOX the assistant reads;
// so does a reviewer's reply to it from the same mailbox. n8n reads both
// and makes no work of them.
func (w *world) ownNotice(t *testing.T) {
	id := "<notice-" + randomHex(6) + "@customer.example>"
	w.deliver(t, id, "Quote for a patio", "Could you quote for a 12m2 patio?")
	ap := w.pendingApproval(t, id)
	var notice parsed
	eventually(t, time.Minute, "the reviewers' notification", func() bool {
		for _, m := range w.smtp.to(notifyTo) {
			if p := parse(t, m); strings.Contains(p.Body, "/review/approvals/"+ap.ID) {
				notice = p
				return true
			}
		}
		return false
	})
	noticeID := notice.Header.Get("Message-ID")
	if !strings.HasPrefix(notice.subject(t), "[n8nbrain] Approval needed: ") || noticeID == "" {
		t.Fatalf("notification subject %q, Message-ID %q", notice.subject(t), noticeID)
	}
	replyID := "<re-notice-" + randomHex(6) + "@e2e.test>"
	if err := w.imap.save("INBOX", email(replyID, "Assistant <"+mailFrom+">", mailFrom, "Re: "+notice.subject(t),
		"I'll look at it after lunch.", "In-Reply-To: "+noticeID)); err != nil {
		t.Fatal(err)
	}
	w.readButNoWork(t, "the notification and the reply to it", noticeID, replyID)
	w.decide(t, ap.ID, "reject", map[string]string{"by": "alice", "reason": "not now"})
	w.waitItem(t, id, "escalated", "")
	w.idle(t)
}

// noNoticeWork: over the whole run, every notification landed in INBOX
// too, and every work item is a customer's message.
// readButNoWork waits until n8n has read every message of ids from the
// INBOX and finished its runs, then checks that none became a work item.
func (w *world) readButNoWork(t *testing.T, what string, ids ...string) {
	t.Helper()
	for _, mid := range ids {
		eventually(t, time.Minute, "n8n to read "+mid+" from INBOX", func() bool {
			seen, err := w.imap.seen("INBOX", mid)
			if err != nil {
				t.Fatal(err)
			}
			return seen
		})
	}
	w.idle(t)
	var n int
	if err := w.tenantDB.QueryRow(context.Background(), `SELECT count(*) FROM work_items WHERE id = ANY($1)`, ids).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d work items for %s, want none", n, what)
	}
}

// automaticMail: an out-of-office (RFC 3834), an old-style auto-reply and
// a bounce land in the INBOX from customers' domain; n8n reads them and
// submits no turn. A message from a person, delivered last, still is work.
func (w *world) automaticMail(t *testing.T) {
	out, old, bounce := "<ooo-"+randomHex(6)+"@auto.example>", "<autoreply-"+randomHex(6)+"@auto.example>", "<bounce-"+randomHex(6)+"@auto.example>"
	for _, m := range [][]byte{
		email(out, "Customer <"+customer+">", mailFrom, "Out of office: Quote for a deck", "I am away until Monday.", "Auto-Submitted: auto-replied"),
		email(old, "Customer <"+customer+">", mailFrom, "Re: Quote for a deck", "Thanks, we got your message.", "X-Autoreply: yes"),
		email(bounce, "Mail Delivery System <MAILER-DAEMON@auto.example>", mailFrom, "Undelivered Mail Returned to Sender",
			"This is the mail system: your message could not be delivered.", "Return-Path: <>"),
	} {
		if err := w.imap.save("INBOX", m); err != nil {
			t.Fatal(err)
		}
	}
	person := "<person-" + randomHex(6) + "@customer.example>"
	w.deliver(t, person, "Quote for a deck", "Could you quote for a deck? I wrote this myself.", "Auto-Submitted: no")
	ap := w.pendingApproval(t, person)
	w.readButNoWork(t, "automatic mail", out, old, bounce)
	w.decide(t, ap.ID, "reject", map[string]string{"by": "alice", "reason": "not now"})
	w.waitItem(t, person, "escalated", "")
	w.idle(t)
}

func (w *world) noNoticeWork(t *testing.T) {
	w.idle(t)
	var ids []string
	rows, err := w.tenantDB.Query(context.Background(), `SELECT id FROM work_items WHERE id NOT LIKE '%@customer.example>'`)
	if err != nil {
		t.Fatal(err)
	}
	if ids, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 0 {
		t.Fatalf("work items that are no customer's message: %v", ids)
	}
	if n := len(w.smtp.to(notifyTo)); n < 10 {
		t.Fatalf("only %d notifications reached the INBOX: the check would prove little", n)
	}
}

func (w *world) postEvent(ev wire.Event) int {
	body, _ := json.Marshal(ev)
	mac := hmac.New(sha256.New, []byte(w.secret))
	mac.Write(body)
	return w.postStatus("/webhook/brain-events", map[string]string{
		edge.HeaderWebhookToken: w.secret, edge.HeaderIdempotencyKey: ev.EventID, edge.HeaderEventKind: string(ev.Kind),
		edge.HeaderSignature: "sha256=" + hex.EncodeToString(mac.Sum(nil)),
	}, string(body))
}

func (w *world) reject(t *testing.T) {
	id := "<reject-" + randomHex(6) + "@customer.example>"
	w.deliver(t, id, "Quote for a fence", "Could you quote for a fence?")
	ap := w.pendingApproval(t, id)
	before := len(w.smtp.to(customer))
	w.decide(t, ap.ID, "reject", map[string]string{"by": "alice", "reason": "we do not build fences"})
	w.waitItem(t, id, "escalated", "")
	eventually(t, time.Minute, "the escalation notice", func() bool { return w.notifications(t, id) >= 1 })
	w.idle(t)
	if n := len(w.smtp.to(customer)) - before; n != 0 {
		t.Fatalf("%d messages to the customer after a rejection", n)
	}
}

func (w *world) edit(t *testing.T) {
	// The customer's message answers an earlier one in a thread: the reply's
	// References name the thread's first message and this one.
	id := "<edit-" + randomHex(6) + "@customer.example>"
	root, earlier := "<edit-root-"+randomHex(6)+"@e2e.test>", "<edit-earlier-"+randomHex(6)+"@customer.example>"
	w.deliver(t, id, "Re: Quote for a pergola", "Could you quote for a pergola?",
		"In-Reply-To: "+earlier, "References: "+root+"\r\n "+earlier)
	ap := w.pendingApproval(t, id)
	edited := map[string]string{"subject": "Re: your pergola", "body": "Hi Jo,\nYour quote is attached: 4 200 € & no <surprises>.\nRegards", "tone": "formal"}
	before := len(w.smtp.to(customer))
	w.decide(t, ap.ID, "edit", map[string]any{"by": "alice", "params": edited})
	w.waitItem(t, id, "closed", "succeeded")
	w.idle(t)
	got := w.smtp.to(customer)[before:]
	if len(got) != 1 {
		t.Fatalf("%d messages after the edit, want 1", len(got))
	}
	p := parse(t, got[0])
	if p.subject(t) != edited["subject"] || normalize(p.Body) != edited["body"] {
		t.Fatalf("sent %q / %q, want the edited %q / %q", p.subject(t), p.Body, edited["subject"], edited["body"])
	}
	threaded(t, p, ap.ID, id, root, id)
}

// threaded checks that a sent reply answers the customer's message
// inReplyTo, with exactly these References, under the Message-ID the
// approval gives it (the Sent folder's trigger knows its own by it).
func threaded(t *testing.T, p parsed, approvalID, inReplyTo string, references ...string) {
	t.Helper()
	if got := p.Header.Get("In-Reply-To"); got != inReplyTo {
		t.Errorf("In-Reply-To %q, want %q", got, inReplyTo)
	}
	if got := strings.Fields(p.Header.Get("References")); !slices.Equal(got, references) {
		t.Errorf("References %q, want %q", got, references)
	}
	if got, want := p.Header.Get("Message-ID"), "<n8nbrain-reply."+approvalID+"@"; !strings.HasPrefix(got, want) {
		t.Errorf("Message-ID %q, want %s…>", got, want)
	}
}

func (w *world) humanFirst(t *testing.T) {
	id := "<human-" + randomHex(6) + "@customer.example>"
	w.deliver(t, id, "Quote for a shed", "Could you quote for a shed?")
	ap := w.pendingApproval(t, id)
	before := len(w.smtp.to(customer))
	// The owner answers from their own mail client: the reply lands in Sent.
	reply := email("<owner-"+randomHex(6)+"@e2e.test>", "Owner <"+mailFrom+">", customer, "Re: Quote for a shed",
		"Hi Jo, I'll call you this afternoon.", "In-Reply-To: "+id, "References: "+id)
	if err := w.imap.save("Sent", reply); err != nil {
		t.Fatal(err)
	}
	w.waitItem(t, id, "closed_manual", "closed_manual")
	status, b := w.edge(http.MethodPost, "/v1/approvals/"+ap.ID+"/approve", map[string]string{"by": "alice"})
	if status != http.StatusConflict {
		t.Fatalf("approving after the human replied: %d %s", status, b)
	}
	w.idle(t)
	if n := len(w.smtp.to(customer)) - before; n != 0 {
		t.Fatalf("%d messages to the customer after a human replied", n)
	}
	var human []byte
	_ = w.tenantDB.QueryRow(context.Background(), `SELECT human_action FROM work_items WHERE id = $1`, id).Scan(&human)
	if !strings.Contains(string(human), "call you this afternoon") {
		t.Fatalf("human_action %s", human)
	}
}

// oldReplies: a person's replies are kept for the check before a send for
// 90 days (n8n caps a data table's size): a reply dated 200 days ago is
// dropped when it is recorded, one of today is kept.
func (w *world) oldReplies(t *testing.T) {
	old, recent := "<gone-"+randomHex(6)+"@customer.example>", "<kept-"+randomHex(6)+"@customer.example>"
	long := time.Now().AddDate(0, 0, -200).UTC().Format(time.RFC1123Z)
	for _, m := range [][]byte{
		email("<owner-"+randomHex(6)+"@e2e.test>", "Owner <"+mailFrom+">", customer, "Re: An old thread", "Old answer.", "Date: "+long, "In-Reply-To: "+old),
		email("<owner-"+randomHex(6)+"@e2e.test>", "Owner <"+mailFrom+">", customer, "Re: A new thread", "New answer.", "In-Reply-To: "+recent),
	} {
		if err := w.imap.save("Sent", m); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, time.Minute, "today's reply recorded", func() bool { return w.replyRows(t, recent) == 1 })
	w.idle(t)
	if n := w.replyRows(t, old); n != 0 {
		t.Fatalf("%d rows kept for a reply of 200 days ago, want none", n)
	}
}

// replyRows counts the rows n8n's replies data table holds for a message id.
func (w *world) replyRows(t *testing.T, messageID string) int {
	t.Helper()
	ctx := context.Background()
	var id string
	err := w.n8nDB.QueryRow(ctx, `SELECT id FROM data_table WHERE name = 'n8nbrain_thread_replies'`).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0 // created by the first reply recorded
	}
	if err != nil {
		t.Fatalf("n8n's replies data table: %v", err)
	}
	var n int
	if err := w.n8nDB.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{"data_table_user_" + id}.Sanitize()+` WHERE thread_id = $1`, messageID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// humanBeforeSend: the reviewer approves, and a person answers the thread
// from their phone after the approval and before the send (the proxy holds
// n8n's read of the approval, the send path's first step). The check right
// before sending finds the reply, by the References header alone: nothing
// is sent, the item closes as closed_manual with what the person wrote.
func (w *world) humanBeforeSend(t *testing.T) {
	id := "<late-" + randomHex(6) + "@customer.example>"
	const lee = "lee@customer.example"
	w.deliverFrom(t, lee, id, "Quote for a retaining wall", "Could you quote for a 6m retaining wall?")
	ap := w.pendingApproval(t, id)
	eventually(t, time.Minute, "the reviewers' notification", func() bool {
		return w.notifications(t, "/review/approvals/"+ap.ID) == 1
	})
	// Every try of the read waits (n8n retries one that times out) until
	// the release; then they pass.
	hold := w.proxy.add(&rule{Hold: true, Match: func(ex exchange) bool {
		return ex.Method == http.MethodGet && ex.Path == "/v1/approvals/"+ap.ID
	}})
	mark := w.proxy.count()
	w.decide(t, ap.ID, "approve", map[string]string{"by": "alice"})
	hold.waitHeld(t, 2*time.Minute, "the send path's read of the approval")
	if p := turnPosts(w.proxy.since(mark), id); len(p) != 1 || p[0].Turn != 2 || p[0].Answered != http.StatusOK {
		t.Fatalf("before the send: turn submissions %+v, want turn 2 decided", p)
	}
	// The reply answers the customer's earlier message in the thread; only
	// its References name this one.
	earlier := "<earlier-" + randomHex(6) + "@customer.example>"
	reply := email("<owner-"+randomHex(6)+"@e2e.test>", "Owner <"+mailFrom+">", lee, "Re: Quote for a retaining wall",
		"Hi Lee, I'll come by on Monday to measure.", "In-Reply-To: "+earlier, "References: "+earlier+" "+id)
	if err := w.imap.save("Sent", reply); err != nil {
		t.Fatal(err)
	}
	// n8n recorded it once it reported closed_manual for the message the
	// reply answers (no work item: the edge says 409).
	eventually(t, 2*time.Minute, "n8n to record the person's reply", func() bool {
		for _, ex := range turnPosts(w.proxy.since(mark), earlier) {
			if ex.Outcome == "closed_manual" && ex.Answered != 0 {
				return true
			}
		}
		return false
	})
	hold.releaseOnce()
	w.waitItem(t, id, "closed_manual", "closed_manual")
	w.idle(t)
	if n := len(w.smtp.to(lee)); n != 0 {
		t.Fatalf("%d messages to the customer after a person replied first", n)
	}
	var human []byte
	_ = w.tenantDB.QueryRow(context.Background(), `SELECT human_action FROM work_items WHERE id = $1`, id).Scan(&human)
	if !strings.Contains(string(human), "Monday to measure") {
		t.Fatalf("human_action %s, want the person's reply", human)
	}
	posts := turnPosts(w.proxy.since(mark), id)
	if last := posts[len(posts)-1]; last.Turn != 3 || last.Outcome != "closed_manual" {
		t.Fatalf("turn submissions %+v, want turn 3 reporting closed_manual", posts)
	}
}

// refused: the SMTP server refuses the recipient (550 at RCPT TO, before
// any data): a definite refusal, reported failed (no verify_reply_sent),
// and the item escalated to a person.
func (w *world) refused(t *testing.T) {
	id := "<refused-" + randomHex(6) + "@customer.example>"
	const rex = "rex@customer.example"
	w.smtp.refuse(rex)
	w.deliverFrom(t, rex, id, "Quote for a skylight", "Could you quote for a skylight?")
	ap := w.pendingApproval(t, id)
	eventually(t, time.Minute, "the reviewers' notification", func() bool {
		return w.notifications(t, "/review/approvals/"+ap.ID) == 1
	})
	mark := w.proxy.count()
	w.decide(t, ap.ID, "approve", map[string]string{"by": "alice"})
	w.waitItem(t, id, "escalated", "failed")
	if got := w.actions(t, id); got != "draft_reply,send_reply,escalate_item" {
		t.Fatalf("actions %s", got)
	}
	var reported *exchange
	for _, ex := range turnPosts(w.proxy.since(mark), id) {
		if ex.Turn == 3 {
			reported = &ex
		}
	}
	if reported == nil || reported.Outcome != "failed" || !strings.Contains(reported.Detail, "550") {
		t.Fatalf("turn 3 reported %+v, want failed with the server's 550", reported)
	}
	eventually(t, time.Minute, "the escalation notice", func() bool { return w.notifications(t, id) >= 1 })
	w.idle(t)
	if n := len(w.smtp.to(rex)); n != 0 {
		t.Fatalf("%d messages accepted for the refused recipient", n)
	}
}

func (w *world) actions(t *testing.T, id string) string {
	t.Helper()
	rows, _ := w.tenantDB.Query(context.Background(), `SELECT action FROM decisions WHERE work_item_id = $1 AND action IS NOT NULL ORDER BY turn`, id)
	actions, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(actions, ",")
}

func (w *world) smtpDown(t *testing.T) {
	id := "<down-" + randomHex(6) + "@customer.example>"
	// Its own customer, so that what reaches them can be counted.
	const sam = "sam@customer.example"
	w.deliverFrom(t, sam, id, "Quote for a carport", "Could you quote for a carport?")
	w.approveWithSMTPDown(t, id)
	if n := len(w.smtp.to(sam)); n != 0 {
		t.Fatalf("%d messages to the customer, want none: the reply was never accepted and is never resent", n)
	}
}

// sameTextTwice: two quote requests from one customer get the rule's same
// reply, minutes apart. The first is sent; the second's send finds SMTP
// down (unknown), and its verification must not take the first's copy in
// Sent, identical in recipient, subject and text, for its own: failed.
func (w *world) sameTextTwice(t *testing.T) {
	const lou = "lou@customer.example"
	first, second := "<twice-1-"+randomHex(6)+"@customer.example>", "<twice-2-"+randomHex(6)+"@customer.example>"
	w.deliverFrom(t, lou, first, "Quote for a pond", "Could you quote for a pond?")
	ap := w.pendingApproval(t, first)
	w.decide(t, ap.ID, "approve", map[string]string{"by": "alice"})
	w.waitItem(t, first, "closed", "succeeded")
	w.idle(t)
	w.deliverFrom(t, lou, second, "Quote for a second pond", "And one more pond, please.")
	w.approveWithSMTPDown(t, second)
	got := w.smtp.to(lou)
	if len(got) != 1 {
		t.Fatalf("%d messages to the customer, want 1: the second reply was never accepted", len(got))
	}
	if p := parse(t, got[0]); p.subject(t) != approvedSubject || normalize(p.Body) != approvedBody {
		t.Fatalf("sent %q / %q, want the rule's reply", p.subject(t), p.Body)
	}
}

// approveWithSMTPDown approves the item's pending draft while the SMTP
// server is stopped: send_reply ends unknown, verify_reply_sent finds no
// copy in Sent (failed), and the item is escalated. SMTP is back after.
func (w *world) approveWithSMTPDown(t *testing.T, id string) {
	t.Helper()
	ap := w.pendingApproval(t, id)
	eventually(t, time.Minute, "the reviewers' notification", func() bool {
		return w.notifications(t, "/review/approvals/"+ap.ID) == 1
	})
	w.smtp.stop()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			w.smtp.start()
		}
	})
	w.decide(t, ap.ID, "approve", map[string]string{"by": "alice"})
	w.waitItem(t, id, "escalated", "failed")
	if got := w.actions(t, id); got != "draft_reply,send_reply,verify_reply_sent,escalate_item" {
		t.Fatalf("actions %s", got)
	}
	w.smtp.start()
	restarted = true
	w.idle(t)
}

func (w *world) answerLost(t *testing.T) {
	id := "<lost-" + randomHex(6) + "@customer.example>"
	const kim = "kim@customer.example"
	w.deliverFrom(t, kim, id, "Quote for decking oil", "Could you quote for oiling my deck?")
	ap := w.pendingApproval(t, id)
	eventually(t, time.Minute, "the reviewers' notification", func() bool {
		return w.notifications(t, "/review/approvals/"+ap.ID) == 1
	})
	before := len(w.smtp.to(kim))
	w.smtp.mu.Lock()
	w.smtp.dropNext = true
	w.smtp.mu.Unlock()
	w.decide(t, ap.ID, "approve", map[string]string{"by": "alice"})
	// The server kept the message and the answer was lost: unknown; the
	// copy is in Sent, so verify_reply_sent reports succeeded. Never resent.
	w.waitItem(t, id, "closed", "succeeded")
	w.idle(t)
	got := w.smtp.to(kim)[before:]
	if len(got) != 1 {
		t.Fatalf("%d messages to the customer, want 1 (no blind repeat)", len(got))
	}
	if s := parse(t, got[0]).subject(t); s != approvedSubject {
		t.Fatalf("reply subject %q, want the approved %q", s, approvedSubject)
	}
	var last string
	_ = w.tenantDB.QueryRow(context.Background(), `SELECT last_action FROM work_items WHERE id = $1`, id).Scan(&last)
	if last != "verify_reply_sent" {
		t.Fatalf("last action %s, want verify_reply_sent", last)
	}
}

// eventRedelivered: n8n's turn 2 for an approval's event fails (the edge
// answers 503 to every attempt of n8n's run, as when the brain cannot be
// reached), so n8n answers the event 503; the edge delivers it again, and
// the item completes with one message sent.
func (w *world) eventRedelivered(t *testing.T) {
	id := "<redeliver-" + randomHex(6) + "@customer.example>"
	const ivy = "ivy@customer.example"
	w.deliverFrom(t, ivy, id, "Quote for a garden shed", "Could you quote for a garden shed?")
	ap := w.pendingApproval(t, id)
	eventually(t, time.Minute, "the reviewers' notification", func() bool {
		return w.notifications(t, "/review/approvals/"+ap.ID) == 1
	})
	// The submit-turn workflow makes 5 attempts per run.
	const failures = 5
	mark := w.proxy.count()
	w.proxy.add(&rule{Times: failures, Status: http.StatusServiceUnavailable, RetryAfter: "1", Match: func(ex exchange) bool {
		return ex.Method == http.MethodPost && ex.Path == "/v1/turns" && ex.WorkItemID == id && ex.Turn == 2
	}})
	w.decide(t, ap.ID, "approve", map[string]string{"by": "alice"})
	w.waitItem(t, id, "closed", "succeeded")
	w.idle(t)
	d := deliveries(w.proxy.since(mark), string(wire.EventApprovalDecided), id)
	if len(d) < 2 || d[0].Upstream != http.StatusServiceUnavailable || d[len(d)-1].Upstream != http.StatusOK {
		t.Fatalf("deliveries of the approval's event %+v, want n8n's 503 first and a later one accepted", d)
	}
	turn2 := 0
	for _, ex := range turnPosts(w.proxy.since(mark), id) {
		if ex.Turn == 2 {
			turn2++
		}
	}
	if turn2 < failures+1 {
		t.Fatalf("%d submissions of turn 2, want the %d refused and one more", turn2, failures)
	}
	if n := len(w.smtp.to(ivy)); n != 1 {
		t.Fatalf("%d messages to the customer, want 1", n)
	}
}

// halted: a work item past the tenant's turn ceiling halts; n8n gets
// item_halted, e-mails a person and submits no turn for it.
func (w *world) halted(t *testing.T) {
	id := "<halt-" + randomHex(6) + "@customer.example>"
	w.deliverFrom(t, "hal@customer.example", id, "Quote for a porch", "Could you quote for a porch?")
	ap := w.pendingApproval(t, id)
	eventually(t, time.Minute, "the reviewers' notification", func() bool {
		return w.notifications(t, "/review/approvals/"+ap.ID) == 1
	})
	mark := w.proxy.count()
	// Something other than n8n keeps submitting turns for the item, past
	// the ceiling (client-zero's is 8).
	var rep wire.TurnSubmitReply
	for turn := 2; rep.Status != wire.WorkItemStatusHalted; turn++ {
		if turn > 20 {
			t.Fatalf("no halt by turn 20: %+v", rep)
		}
		status, b := w.edge(http.MethodPost, "/v1/turns", wire.TurnSubmitRequest{WorkItemID: id, Turn: turn})
		if status != http.StatusOK || json.Unmarshal(b, &rep) != nil {
			t.Fatalf("turn %d: %d %s", turn, status, b)
		}
	}
	eventually(t, 2*time.Minute, "item_halted accepted by n8n", func() bool {
		d := deliveries(w.proxy.since(mark), string(wire.EventItemHalted), id)
		return len(d) > 0 && d[len(d)-1].Answered == http.StatusOK
	})
	w.idle(t)
	if n := w.notifications(t, "Work item: "+id); n != 1 {
		t.Fatalf("%d halt notices naming the item, want 1", n)
	}
	if p := turnPosts(w.proxy.since(mark), id); len(p) != 0 {
		t.Fatalf("n8n submitted turns for the halted item: %+v", p)
	}
	if s, _ := w.item(t, id); s != "halted" {
		t.Fatalf("item %s, want halted", s)
	}
}

// clientError: a message without a Message-ID gets the edge's 400 for its
// turn 1: n8n POSTs it once (no retries of a client error) and the run ends
// as an error carrying the edge's message.
func (w *world) clientError(t *testing.T) {
	mark, execMark := w.proxy.count(), w.lastExecution()
	if err := w.imap.save("INBOX", email("", "Customer <"+customer+">", mailFrom, "Quote for a gazebo", "Could you quote for a gazebo?")); err != nil {
		t.Fatal(err)
	}
	var refused exchange
	eventually(t, 2*time.Minute, "n8n's turn 1 without a work item", func() bool {
		for _, ex := range turnPosts(w.proxy.since(mark), "") {
			refused = ex
			return true
		}
		return false
	})
	w.idle(t)
	if p := turnPosts(w.proxy.since(mark), ""); len(p) != 1 || refused.Answered != http.StatusBadRequest {
		t.Fatalf("turn submissions without a work item %+v, want one, answered 400", p)
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(refused.Body), &e) != nil || e.Error.Message == "" {
		t.Fatalf("the edge's answer %q has no message", refused.Body)
	}
	quoted, _ := json.Marshal(e.Error.Message)
	var status, data string
	err := w.n8nDB.QueryRow(context.Background(), `SELECT e.status, d.data FROM execution_entity e JOIN execution_data d ON d."executionId" = e.id
		WHERE e.id > $1 AND e."workflowId" = 'n8nbrainImap' ORDER BY e.id DESC LIMIT 1`, execMark).Scan(&status, &data)
	if err != nil {
		t.Fatal(err)
	}
	if status != "error" || !strings.Contains(data, strings.Trim(string(quoted), `"`)) {
		t.Fatalf("the IMAP run ended %s, want error with the edge's message %q", status, e.Error.Message)
	}
}

func (w *world) webhookIntake(t *testing.T) {
	id, root := "<hook-"+randomHex(6)+"@customer.example>", "<hook-root-"+randomHex(6)+"@customer.example>"
	body := fmt.Sprintf(`{"message_id":%q,"thread_id":%q,"from":"Jo Bloggs <%s>","subject":"Quote for a gate","text":"Could you quote for a gate?"}`, id, root, customer)
	// The events secret does not open the intake.
	if s := w.postStatus("/webhook/new-email", map[string]string{devstack.N8NIntakeHeader: w.secret}, body); s != http.StatusForbidden {
		t.Fatalf("intake with the events secret: %d, want 403", s)
	}
	if s := w.postStatus("/webhook/new-email", map[string]string{devstack.N8NIntakeHeader: w.intake}, body); s != http.StatusOK {
		t.Fatalf("intake: %d", s)
	}
	ap := w.pendingApproval(t, id)
	before := len(w.smtp.to(customer))
	w.decide(t, ap.ID, "approve", map[string]string{"by": "alice"})
	w.waitItem(t, id, "closed", "succeeded")
	w.idle(t)
	if n := len(w.smtp.to(customer)) - before; n != 1 {
		t.Fatalf("%d replies, want 1", n)
	}
	threaded(t, parse(t, w.smtp.to(customer)[before]), ap.ID, id, root, id)
	// A bad request gets the edge's 400, once: no retries of client errors.
	mark := w.proxy.count()
	if s := w.postStatus("/webhook/new-email", map[string]string{devstack.N8NIntakeHeader: w.intake}, `{"from":"x"}`); s != http.StatusBadRequest {
		t.Fatalf("intake without a message id: %d, want the edge's 400", s)
	}
	w.idle(t)
	if p := turnPosts(w.proxy.since(mark), ""); len(p) != 1 || p[0].Answered != http.StatusBadRequest {
		t.Fatalf("turn submissions of the bad request %+v, want one, answered 400", p)
	}
}

// noSecrets: no kept run holds a secret. The two webhook workflows keep no
// run data, but n8n writes a webhook run's first data (the request headers,
// the secret among them) when the run starts; at its end n8n marks it
// deleted (hidden everywhere) and its pruning removes it. So: every run that
// is kept is clean, and every run that held a secret is one of those,
// already marked deleted.
func (w *world) noSecrets(t *testing.T) {
	w.idle(t)
	eventually(t, time.Minute, "every webhook run to end (and be marked deleted)", func() bool {
		var n int
		_ = w.n8nDB.QueryRow(context.Background(), `SELECT count(*) FROM execution_entity
			WHERE "workflowId" IN ('n8nbrainEvents', 'n8nbrainIntake') AND "deletedAt" IS NULL`).Scan(&n)
		return n == 0
	})
	rows, err := w.n8nDB.Query(context.Background(), `SELECT e.id, e."workflowId", e."deletedAt" IS NOT NULL, d.data
		FROM execution_data d JOIN execution_entity e ON e.id = d."executionId"`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		ID       int
		Workflow string
		Deleted  bool
		Data     string
	}
	all, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	kept := 0
	for _, r := range all {
		if !r.Deleted {
			kept++
		}
		for _, s := range w.secrets {
			if !strings.Contains(r.Data, s) {
				continue
			}
			receiver := r.Workflow == "n8nbrainEvents" || r.Workflow == "n8nbrainIntake"
			if !r.Deleted || !receiver {
				t.Errorf("run %d of %s (deleted: %v) keeps a secret (%s…)", r.ID, r.Workflow, r.Deleted, s[:6])
			}
		}
	}
	if kept < 10 {
		t.Fatalf("only %d kept runs: the check would prove nothing", kept)
	}
	t.Logf("%d kept runs, none with a secret; %d runs marked deleted", kept, len(all)-kept)
}

func normalize(s string) string {
	return strings.TrimRight(strings.ReplaceAll(s, "\r\n", "\n"), "\n")
}

func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func waitPort(t *testing.T, port int, d time.Duration, what string) {
	t.Helper()
	eventually(t, d, what+" to listen", func() bool {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
