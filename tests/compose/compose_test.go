//go:build compose

// The test is behind the build tag: it needs a Docker engine and the images
// (make compose-test provides both). See doc.go.
package compose

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"n8nbrain/deploy/devstack"
	"n8nbrain/subjects"
	"n8nbrain/tests/internal/reviewform"
	"n8nbrain/wire"
)

const project = "n8nbrain-composetest"

// The services of the default profile and of the cpu profile.
var (
	longRunning = []string{"postgres", "nats", "brain", "edge", "n8n"}
	oneShots    = []string{"init", "streams", "n8n-import"}
	cpuProfile  = []string{"ollama-cpu"}
	cpuOneShots = []string{"ollama-pull-cpu"}
)

type stack struct {
	t        *testing.T
	root     string
	envFile  string
	profiles []string
	env      map[string]string
	edge     string // http://127.0.0.1:port
	n8n      string
	client   *http.Client
}

func TestComposeStack(t *testing.T) {
	testStarted := time.Now()
	s := newStack(t)
	s.compose(5*time.Minute, "down", "-v", "--remove-orphans") // a crashed earlier run
	t.Cleanup(func() {
		if out, err := s.composeErr(5*time.Minute, "down", "-v", "--remove-orphans"); err != nil {
			t.Errorf("docker compose down -v: %v\n%s", err, out)
		}
	})

	// The NATS cluster option is an override file compose must accept.
	cluster := exec.Command("docker", "compose", "--project-directory", s.root, "--file", filepath.Join(s.root, "compose.yaml"),
		"--file", filepath.Join(s.root, "deploy", "compose.nats-cluster.yaml"), "--env-file", s.envFile, "config", "-q")
	if out, err := cluster.CombinedOutput(); err != nil {
		t.Fatalf("docker compose rejects the NATS cluster override: %v\n%s", err, out)
	}

	started := time.Now()
	s.compose(10*time.Minute, "up", "-d", "--no-build", "--pull", "never")
	s.waitHealthy(longRunning, oneShots, 12*time.Minute)
	t.Logf("MEASURE compose up until every service is healthy: %s", time.Since(started).Round(time.Second))

	t.Run("OnlyTheDocumentedPortsArePublished", s.checkPorts)
	t.Run("ProjectImagesAreStaticNonRootWithoutShell", s.checkProjectImages)

	var first approvalFlow
	t.Run("TurnApprovedOnTheReviewPageThenSendReply", func(t *testing.T) { s.approvalFlow(t, &first) })
	t.Run("N8NImportedTheWorkflowAndRunsTheLoop", s.n8nLoop)
	t.Run("BrainAndNATSRestartMidLoadLoseNothing", s.restartUnderLoad)

	// down, then up again (with the cpu profile this time): the state is
	// still there, and the model profile's services start.
	s.compose(5*time.Minute, "down")
	s.profiles = []string{"cpu"}
	started = time.Now()
	s.compose(10*time.Minute, "up", "-d", "--no-build", "--pull", "never")
	s.waitHealthy(append(slices.Clone(longRunning), cpuProfile...), append(slices.Clone(oneShots), cpuOneShots...), 12*time.Minute)
	t.Logf("MEASURE compose up again (state kept, cpu profile) until healthy: %s", time.Since(started).Round(time.Second))
	t.Run("StateSurvivesDownAndUp", func(t *testing.T) { s.stateKept(t, first) })
	t.Run("CPUProfileModelURLReachesOllama", s.cpuProfile)

	s.compose(5*time.Minute, "down", "-v", "--remove-orphans")
	t.Run("DownVRemovesEverything", s.checkGone)
	t.Logf("MEASURE the whole compose test: %s", time.Since(testStarted).Round(time.Second))
}

func newStack(t *testing.T) *stack {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"POSTGRES_PASSWORD":       randomToken(t),
		"BRAIN_REGISTRY_PASSWORD": randomToken(t),
		"BRAIN_SEALING_KEY":       randomHex(t, 32),
		"EDGE_TOKEN":              randomToken(t),
		"EDGE_WEBHOOK_SECRET":     randomToken(t),
		"N8NBRAIN_INTAKE_SECRET":  randomToken(t),
		"REVIEWER_NAME":           "composetest",
		"REVIEWER_PASSWORD":       randomToken(t),
		"N8N_ENCRYPTION_KEY":      randomToken(t),
		"N8N_DB_PASSWORD":         randomToken(t),
		"EDGE_HOST_PORT":          freePort(t),
		"N8N_HOST_PORT":           freePort(t),
	}
	var lines []string
	switch images := os.Getenv("COMPOSE_TEST_IMAGES"); images {
	case "upstream":
	case "":
		images = filepath.Join(root, "deploy/local/images.env")
		fallthrough
	default:
		b, err := os.ReadFile(images)
		if err != nil {
			t.Fatalf("COMPOSE_TEST_IMAGES: %v", err)
		}
		lines = append(lines, string(b))
	}
	for k, v := range env {
		lines = append(lines, k+"="+v)
	}
	envFile := filepath.Join(t.TempDir(), "compose-test.env")
	if err := os.WriteFile(envFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &stack{
		t: t, root: root, envFile: envFile, env: env,
		edge:   "http://127.0.0.1:" + env["EDGE_HOST_PORT"],
		n8n:    "http://127.0.0.1:" + env["N8N_HOST_PORT"],
		client: &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
	}
}

// composeErr runs `docker compose` on this test's project and env file.
func (s *stack) composeErr(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	full := []string{"compose", "--project-name", project, "--project-directory", s.root,
		"--file", filepath.Join(s.root, "compose.yaml"), "--env-file", s.envFile}
	for _, p := range s.profiles {
		full = append(full, "--profile", p)
	}
	cmd := exec.CommandContext(ctx, "docker", append(full, args...)...)
	// Only the env file configures the stack, never this shell's variables.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (s *stack) compose(timeout time.Duration, args ...string) string {
	s.t.Helper()
	out, err := s.composeErr(timeout, args...)
	if err != nil {
		s.t.Fatalf("docker compose %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// psEntry is one line of `docker compose ps --format json`.
type psEntry struct {
	Name       string
	Service    string
	State      string
	Health     string
	ExitCode   int
	Publishers []struct {
		URL           string
		TargetPort    int
		PublishedPort int
		Protocol      string
	}
}

func (s *stack) ps(t *testing.T) []psEntry {
	t.Helper()
	out := s.compose(time.Minute, "ps", "--all", "--format", "json")
	var entries []psEntry
	if strings.HasPrefix(strings.TrimSpace(out), "[") { // older compose: one array
		if err := json.Unmarshal([]byte(out), &entries); err != nil {
			t.Fatalf("docker compose ps: %v\n%s", err, out)
		}
		return entries
	}
	dec := json.NewDecoder(strings.NewReader(out)) // one object a line
	for dec.More() {
		var e psEntry
		if err := dec.Decode(&e); err != nil {
			t.Fatalf("docker compose ps: %v\n%s", err, out)
		}
		entries = append(entries, e)
	}
	return entries
}

// waitHealthy waits until every long-running service's containers are
// running and healthy and every one-shot exited 0; a one-shot that failed
// ends the wait at once.
func (s *stack) waitHealthy(services, once []string, within time.Duration) {
	t := s.t
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		entries := s.ps(t)
		var waiting []string
		seen := map[string]bool{}
		for _, e := range entries {
			seen[e.Service] = true
			switch {
			case slices.Contains(once, e.Service):
				if e.State == "exited" && e.ExitCode != 0 {
					out, _ := s.composeErr(time.Minute, "logs", "--no-color", e.Service)
					t.Fatalf("one-shot %s exited %d:\n%s", e.Service, e.ExitCode, out)
				}
				if e.State != "exited" {
					waiting = append(waiting, e.Name+" "+e.State)
				}
			case e.State != "running" || e.Health != "healthy":
				waiting = append(waiting, e.Name+" "+e.State+"/"+e.Health)
			}
		}
		for _, svc := range append(slices.Clone(services), once...) {
			if !seen[svc] {
				waiting = append(waiting, svc+" not created")
			}
		}
		if len(waiting) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not healthy within %s: %s", within, strings.Join(waiting, ", "))
		}
		time.Sleep(2 * time.Second) // polling docker's own health state
	}
}

func (s *stack) checkPorts(t *testing.T) {
	want := []string{
		"edge 127.0.0.1:" + s.env["EDGE_HOST_PORT"] + "->8480/tcp",
		"n8n 127.0.0.1:" + s.env["N8N_HOST_PORT"] + "->5678/tcp",
	}
	var got []string
	for _, e := range s.ps(t) {
		for _, p := range e.Publishers {
			if p.PublishedPort != 0 {
				got = append(got, fmt.Sprintf("%s %s:%d->%d/%s", e.Service, p.URL, p.PublishedPort, p.TargetPort, p.Protocol))
			}
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("published ports %q, want exactly %q", got, want)
	}
}

// shells are the names a shell goes by: none may be in a project image.
var shells = []string{"sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "busybox"}

func (s *stack) checkProjectImages(t *testing.T) {
	for _, img := range []struct{ svc, binary string }{
		{"brain", "usr/local/bin/brain"}, {"edge", "usr/local/bin/edge"}, {"init", "usr/local/bin/devstack"},
	} {
		id := imageOfService(t, s, img.svc)
		user := docker(t, "image", "inspect", "-f", "{{.Config.User}}", id)
		if strings.TrimSpace(user) != "65532:65532" {
			t.Errorf("%s image runs as %q, want 65532:65532", img.svc, strings.TrimSpace(user))
		}
		// No shell: the health checks run the binaries themselves. The
		// image's files as docker export lists them: its binary is there (so
		// the listing is the image's), and nothing named like a shell is,
		// in any folder, file or symbolic link.
		files := imageFiles(t, id)
		if !files[img.binary] {
			t.Errorf("%s image: no /%s among its %d files; the listing is not of this image", img.svc, img.binary, len(files))
		}
		for name := range files {
			if slices.Contains(shells, path.Base(name)) {
				t.Errorf("%s image has a shell: /%s", img.svc, name)
			}
		}
		// And starting one fails for that reason: docker run exits 127 only
		// when the command cannot be found (125 is the engine's own failure,
		// 126 a command that cannot be invoked).
		out, err := exec.Command("docker", "run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", id, "-c", "true").CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 127 || !strings.Contains(string(out), "/bin/sh") {
			t.Errorf("%s image: docker run --entrypoint /bin/sh: %v, want exit status 127 (not found) naming /bin/sh:\n%s", img.svc, err, out)
		}
	}
	for _, svc := range []string{"brain", "edge"} {
		test := docker(t, "inspect", "-f", "{{json .Config.Healthcheck.Test}}", project+"-"+svc+"-1")
		if want := `["CMD","/usr/local/bin/` + svc + `","healthcheck"]`; strings.TrimSpace(test) != want {
			t.Errorf("%s health check %s, want %s", svc, test, want)
		}
	}
}

// imageFiles lists every entry of an image's filesystem (paths without the
// leading slash), from docker export of a container created from it and
// never started.
func imageFiles(t *testing.T, image string) map[string]bool {
	t.Helper()
	cid := strings.TrimSpace(docker(t, "create", "--network", "none", image))
	defer func() {
		if out, err := exec.Command("docker", "rm", "-f", cid).CombinedOutput(); err != nil {
			t.Errorf("docker rm %s: %v\n%s", cid, err, out)
		}
	}()
	cmd := exec.Command("docker", "export", cid)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("docker export: %v", err)
	}
	files := map[string]bool{}
	tr := tar.NewReader(stdout)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("read docker export of %s: %v\n%s", image, err, stderr.Bytes())
		}
		files[strings.TrimPrefix(path.Clean("/"+h.Name), "/")] = true
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("docker export of %s: %v\n%s", image, err, stderr.Bytes())
	}
	return files
}

func imageOfService(t *testing.T, s *stack, svc string) string {
	t.Helper()
	var cfg struct {
		Services map[string]struct{ Image string } `json:"services"`
	}
	if err := json.Unmarshal([]byte(s.compose(time.Minute, "config", "--format", "json")), &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg.Services[svc].Image
}

func docker(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("docker", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// --- the edge's API ------------------------------------------------------

type response struct {
	status int
	body   []byte
	header http.Header
}

func (s *stack) do(method, url string, body []byte, header map[string]string) (response, error) {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return response{}, err
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, body: b, header: resp.Header}, err
}

func (s *stack) api(method, path string, body any) (response, error) {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return response{}, err
		}
	}
	return s.do(method, s.edge+path, b, map[string]string{
		"Authorization": "Bearer " + s.env["EDGE_TOKEN"], "Content-Type": "application/json",
	})
}

// decide submits a turn and waits for its decision: a 202 is followed by
// GETs of its result_url. Errors the edge answers are returned as *wire.Error.
func (s *stack) decide(req *wire.TurnSubmitRequest, within time.Duration) (wire.TurnSubmitReply, error) {
	var rep wire.TurnSubmitReply
	r, err := s.api(http.MethodPost, "/v1/turns", req)
	if err != nil {
		return rep, err
	}
	deadline := time.Now().Add(within)
	for r.status == http.StatusAccepted || r.status == http.StatusNotFound {
		var pending wire.TurnPendingReply
		if r.status == http.StatusAccepted {
			if err := json.Unmarshal(r.body, &pending); err != nil {
				return rep, err
			}
		} else {
			pending.ResultURL = "/v1/turns/" + subjects.TurnKey(req.WorkItemID, req.Turn)
		}
		if time.Now().After(deadline) {
			return rep, fmt.Errorf("turn %d of %s still pending after %s", req.Turn, req.WorkItemID, within)
		}
		time.Sleep(500 * time.Millisecond) // the edge's own Retry-After is seconds
		if r, err = s.api(http.MethodGet, pending.ResultURL, nil); err != nil {
			return rep, err
		}
	}
	if r.status != http.StatusOK {
		var e wire.ErrorReply
		if json.Unmarshal(r.body, &e) == nil && e.Error != nil {
			return rep, e.Error
		}
		return rep, fmt.Errorf("POST /v1/turns: %d %s", r.status, r.body)
	}
	return rep, json.Unmarshal(r.body, &rep)
}

func quote(workItemID string) *wire.TurnSubmitRequest {
	return &wire.TurnSubmitRequest{WorkItemID: workItemID, Turn: 1, Email: &wire.Email{
		From: "Jo <jo@customer.example>", Subject: "Quote for a new deck",
		Body: "Hi, could you quote for a 20m2 deck? Thanks, Jo",
	}}
}

type approvalFlow struct {
	workItemID string
	approvalID string
	turn1      wire.TurnSubmitReply
	turn2      wire.TurnSubmitReply
}

// approvalFlow: turn 1 through the published edge port is a draft awaiting
// approval; a reviewer approves it on the review page; turn 2 is send_reply
// with that approval.
func (s *stack) approvalFlow(t *testing.T, f *approvalFlow) {
	s.logsOnFailure(t, "edge", "brain")
	f.workItemID = "<composetest-" + randomHex(t, 6) + "@customer.example>"
	var err error
	if f.turn1, err = s.decide(quote(f.workItemID), 2*time.Minute); err != nil {
		t.Fatalf("turn 1: %v", err)
	}
	if f.turn1.Status != wire.WorkItemStatusAwaitingApproval || f.turn1.Action == nil ||
		f.turn1.Action.Name != "draft_reply" || f.turn1.Action.ApprovalID == "" {
		t.Fatalf("turn 1: %s, want draft_reply awaiting approval", describe(f.turn1))
	}
	f.approvalID = f.turn1.Action.ApprovalID

	// The review page: sign in, load the approval, post its approve form
	// with the fields as the page filled them (approved as proposed).
	cookie := s.reviewSignIn(t)
	page, err := s.do(http.MethodGet, s.edge+"/review/approvals/"+f.approvalID, nil, map[string]string{"Cookie": cookie})
	if err != nil || page.status != http.StatusOK {
		t.Fatalf("review page: %v %d %s", err, page.status, page.body)
	}
	form, ok := reviewform.Approve(string(page.body))
	if !ok {
		t.Fatalf("no approve form on the review page:\n%s", page.body)
	}
	form.Set("decision", "approve")
	post, err := s.do(http.MethodPost, s.edge+"/review/approvals/"+f.approvalID, []byte(form.Encode()), map[string]string{
		"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded",
		"Origin": s.edge, "Sec-Fetch-Site": "same-origin",
	})
	if err != nil || post.status != http.StatusSeeOther {
		t.Fatalf("approve on the review page: %v %d %s", err, post.status, post.body)
	}
	var got wire.ApprovalGetReply
	r, err := s.api(http.MethodGet, "/v1/approvals/"+f.approvalID, nil)
	if err != nil || r.status != http.StatusOK || json.Unmarshal(r.body, &got) != nil {
		t.Fatalf("GET approval: %v %d %s", err, r.status, r.body)
	}
	if got.Approval.Status != wire.ApprovalStatusApproved || got.Approval.DecidedBy != "reviewer:"+s.env["REVIEWER_NAME"] {
		t.Fatalf("approval after the review page: %+v", got.Approval)
	}

	// Turn 2. The example workflow in n8n gets the approval_decided event
	// too and may submit this same turn first; the brain then replays it.
	f.turn2 = s.turn2(t, f.workItemID)
	if got := sendReplyOf(f.turn2); got != f.approvalID {
		t.Fatalf("turn 2: %s, want send_reply of approval %s", describe(f.turn2), f.approvalID)
	}
}

// sendReplyOf is the approval a send_reply decision sends, or "".
func sendReplyOf(rep wire.TurnSubmitReply) string {
	var p struct {
		ApprovalID string `json:"approval_id"`
	}
	if rep.Action == nil || rep.Action.Name != "send_reply" || json.Unmarshal(rep.Action.Params, &p) != nil {
		return ""
	}
	return p.ApprovalID
}

func describe(rep wire.TurnSubmitReply) string {
	b, _ := json.Marshal(rep)
	return string(b)
}

// turn2 submits {work_item_id, turn 2}: the body n8n's events workflow
// submits for the approval's event too, so whichever comes first decides
// it and the other gets the same decision.
func (s *stack) turn2(t *testing.T, workItemID string) wire.TurnSubmitReply {
	t.Helper()
	rep, err := s.decide(&wire.TurnSubmitRequest{WorkItemID: workItemID, Turn: 2}, 2*time.Minute)
	if err != nil {
		t.Fatalf("turn 2: %v", err)
	}
	return rep
}

// n8nLoop: the import step published the shipped workflows with their
// credentials and settings, so an e-mail posted to n8n's intake webhook
// (with the intake secret, never the events one) becomes a turn at the
// edge; once approved, the edge's event reaches n8n's events webhook, and
// n8n submits turn 2 itself.
func (s *stack) n8nLoop(t *testing.T) {
	mid := "<composetest-n8n-" + randomHex(t, 6) + "@customer.example>"
	body, _ := json.Marshal(map[string]string{
		"message_id": mid, "from": "Sam <sam@customer.example>",
		"subject": "Quote for a fence", "text": "Could you quote for 30m of fencing?",
	})
	s.logsOnFailure(t, "n8n-import", "n8n", "edge")
	// n8n reports healthy before it has registered the published
	// workflow's webhooks: until then the webhook is a 404 (and runs nothing).
	var r response
	var err error
	waitFor(t, 3*time.Minute, "n8n's New email webhook", func() bool {
		// 404 until the webhook is registered; 503 while n8n's database
		// connection is not ready yet.
		r, err = s.do(http.MethodPost, s.n8n+"/webhook/new-email", body, map[string]string{
			"Content-Type": "application/json", devstack.N8NIntakeHeader: s.env["N8NBRAIN_INTAKE_SECRET"],
		})
		// A closed connection (EOF) while n8n is still starting is retried
		// too: the same e-mail again is one work item (its message id).
		return err == nil && r.status != http.StatusNotFound && r.status != http.StatusServiceUnavailable
	})
	if err != nil || r.status != http.StatusOK {
		t.Fatalf("n8n new-email webhook: %v %d %s", err, r.status, r.body)
	}
	var approval wire.Approval
	waitFor(t, 3*time.Minute, "n8n's turn 1 at the edge", func() bool {
		var list wire.ApprovalListReply
		r, err := s.api(http.MethodGet, "/v1/approvals?status=pending&limit=50", nil)
		if err != nil || r.status != http.StatusOK || json.Unmarshal(r.body, &list) != nil {
			return false
		}
		for _, a := range list.Approvals {
			if a.WorkItemID == mid {
				approval = a
				return true
			}
		}
		return false
	})
	r, err = s.api(http.MethodPost, "/v1/approvals/"+approval.ID+"/approve", map[string]string{"by": "composetest"})
	if err != nil || r.status != http.StatusOK {
		t.Fatalf("approve: %v %d %s", err, r.status, r.body)
	}
	// n8n submits {work_item_id, turn: next_turn} for the event; its
	// decision is served for that payload's fingerprint only. That turn
	// also proves that n8n loaded n8nbrain's Send Reply node from the
	// bind mount (N8N_CUSTOM_EXTENSIONS): without it n8n refuses every run
	// that calls the act workflow, the events webhook answers 500, and no
	// turn 2 comes (tried with the variable pointing nowhere).
	fp := wire.Fingerprint(&wire.TurnSubmitRequest{WorkItemID: mid, Turn: 2})
	var turn2 wire.TurnSubmitReply
	waitFor(t, 3*time.Minute, "n8n's turn 2 after the approval event", func() bool {
		r, err := s.api(http.MethodGet, "/v1/turns/"+subjects.TurnKey(mid, 2)+"?fingerprint="+fp, nil)
		return err == nil && r.status == http.StatusOK && json.Unmarshal(r.body, &turn2) == nil
	})
	if got := sendReplyOf(turn2); got != approval.ID {
		t.Fatalf("n8n's turn 2: %s, want send_reply of %s", describe(turn2), approval.ID)
	}
}

// restartUnderLoad keeps a few clients submitting new work items while one
// brain container and then the NATS container restart. A client retries a
// turn the edge could not take (it is idempotent); at the end every item has
// a decision, and it is the decision the client was first given.
func (s *stack) restartUnderLoad(t *testing.T) {
	s.logsOnFailure(t, "edge", "brain", "nats")
	const clients, maxItems = 4, 2000
	var retried, seq atomic.Int64
	type result struct {
		id         string
		reply      wire.TurnSubmitReply
		err        error
		start, end time.Time
	}
	results := make(chan result, maxItems)
	progress := make(chan struct{}, maxItems)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	prefix := randomHex(t, 4)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := seq.Add(1)
				if i > maxItems {
					return
				}
				id := fmt.Sprintf("<load-%s-%d@customer.example>", prefix, i)
				start := time.Now()
				deadline := start.Add(4 * time.Minute)
				var rep wire.TurnSubmitReply
				var err error
				for {
					rep, err = s.decide(quote(id), time.Minute)
					if err == nil || time.Now().After(deadline) {
						break
					}
					retried.Add(1)
					time.Sleep(time.Second) // the edge answers 503 with Retry-After: 1
				}
				results <- result{id, rep, err, start, time.Now()}
				progress <- struct{}{}
			}
		}()
	}
	waitProgress := func(n int) {
		t.Helper()
		for range n {
			select {
			case <-progress:
			case <-time.After(5 * time.Minute):
				close(stop)
				t.Fatalf("load stalled")
			}
		}
	}
	type window struct {
		container  string
		start, end time.Time
	}
	var restarts []window
	for _, c := range []string{project + "-brain-1", project + "-nats-1"} {
		waitProgress(8)
		w := window{container: c, start: time.Now()}
		docker(t, "restart", c)
		w.end = time.Now()
		restarts = append(restarts, w)
	}
	waitProgress(8)
	close(stop)
	wg.Wait()
	close(results)
	items := len(results)
	t.Logf("%d items decided; %d submissions were retried while a brain or NATS restarted", items, retried.Load())
	during := make([]int, len(restarts))
	for r := range results {
		for i, w := range restarts {
			if r.start.Before(w.end) && r.end.After(w.start) {
				during[i]++
			}
		}
		if r.err != nil {
			t.Errorf("%s: no decision: %v", r.id, r.err)
			continue
		}
		if r.reply.Action == nil || r.reply.Action.Name != "draft_reply" || r.reply.Action.ApprovalID == "" {
			t.Errorf("%s: %s, want draft_reply awaiting approval", r.id, describe(r.reply))
			continue
		}
		// Nothing lost, nothing decided twice: the same turn again is the
		// stored decision, with the same approval.
		again, err := s.decide(quote(r.id), time.Minute)
		if err != nil || !again.Replayed || again.Action == nil || again.Action.ApprovalID != r.reply.Action.ApprovalID {
			t.Errorf("%s again: %s %v; first decision had approval %s", r.id, describe(again), err, r.reply.Action.ApprovalID)
		}
	}
	for i, w := range restarts {
		t.Logf("%s restarted in %s; %d items were in flight meanwhile", w.container, w.end.Sub(w.start).Round(100*time.Millisecond), during[i])
		if during[i] == 0 {
			t.Errorf("no item was in flight while %s restarted: the load did not cover the restart", w.container)
		}
	}
	s.waitHealthy(longRunning, oneShots, 5*time.Minute)
}

// stateKept: after down and up, the first flow's decisions, its approval and
// n8n's import marker are still there.
func (s *stack) stateKept(t *testing.T, f approvalFlow) {
	if f.turn2.Action == nil {
		t.Fatal("the first flow did not get as far as turn 2")
	}
	s.logsOnFailure(t, "edge", "brain", "n8n-import")
	turn2 := s.turn2(t, f.workItemID)
	if !turn2.Replayed || sendReplyOf(turn2) != f.approvalID {
		t.Errorf("turn 2 after down and up: %s, want the stored send_reply of %s", describe(turn2), f.approvalID)
	}
	var got wire.ApprovalGetReply
	r, err := s.api(http.MethodGet, "/v1/approvals/"+f.approvalID, nil)
	if err != nil || r.status != http.StatusOK || json.Unmarshal(r.body, &got) != nil || got.Approval.Status != wire.ApprovalStatusApproved {
		t.Errorf("approval after down and up: %v %d %s", err, r.status, r.body)
	}
	if out := s.compose(time.Minute, "logs", "--no-color", "n8n-import"); !strings.Contains(out, "imported on an earlier start") {
		t.Errorf("n8n-import did not find its earlier import:\n%s", out)
	}
}

// cpuProfile: the profile's Ollama answers at the brain's model URL (the
// local image is the stand-in: it has no model and answers chats 503, which
// the brain escalates), and the pull step recorded BRAIN_MODEL.
func (s *stack) cpuProfile(t *testing.T) {
	s.logsOnFailure(t, "ollama-cpu", "ollama-pull-cpu", "brain")
	if out := s.compose(time.Minute, "logs", "--no-color", "ollama-pull-cpu"); !strings.Contains(out, "qwen3:4b") {
		t.Errorf("ollama-pull-cpu did not pull BRAIN_MODEL:\n%s", out)
	}
	rep, err := s.decide(&wire.TurnSubmitRequest{WorkItemID: "<composetest-model-" + randomHex(t, 6) + "@customer.example>", Turn: 1,
		Email: &wire.Email{From: "Al <al@customer.example>", Subject: "Opening hours", Body: "When are you open on Saturdays?"}}, 3*time.Minute)
	if err != nil {
		t.Fatalf("turn for the model: %v", err)
	}
	if rep.Status != wire.WorkItemStatusEscalated {
		t.Errorf("no rule decides it and the stand-in has no model: %s, want escalated", describe(rep))
	}
	if out := s.compose(time.Minute, "logs", "--no-color", "ollama-cpu"); !strings.Contains(out, "path=/api/chat") {
		t.Errorf("the brain's model call did not reach the cpu profile's Ollama:\n%s", out)
	}
}

func (s *stack) checkGone(t *testing.T) {
	for _, what := range [][]string{
		{"ps", "--all", "--quiet", "--filter", "label=com.docker.compose.project=" + project},
		{"volume", "ls", "--quiet", "--filter", "label=com.docker.compose.project=" + project},
		{"network", "ls", "--quiet", "--filter", "label=com.docker.compose.project=" + project},
	} {
		if out := strings.TrimSpace(docker(t, what...)); out != "" {
			t.Errorf("docker %s after down -v: %s", what[0], out)
		}
	}
}

// --- helpers ----------------------------------------------------------------

// logsOnFailure shows the services' recent logs if t fails, while the
// stack is still up.
func (s *stack) logsOnFailure(t *testing.T, services ...string) {
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := s.composeErr(2*time.Minute, append([]string{"logs", "--no-color", "--tail", "60"}, services...)...)
			t.Logf("logs of %s:\n%s", strings.Join(services, ", "), out)
		}
	})
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(time.Second) // polling the stack's own API
	}
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// randomToken is URL-safe: the Postgres passwords end up in URLs.
func randomToken(t *testing.T) string { return "ct" + randomHex(t, 16) }

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// reviewSignIn signs the reviewer in on the review page and returns the
// session cookie to send.
func (s *stack) reviewSignIn(t *testing.T) string {
	t.Helper()
	form := url.Values{"name": {s.env["REVIEWER_NAME"]}, "password": {s.env["REVIEWER_PASSWORD"]}, "next": {"/review"}}
	r, err := s.do(http.MethodPost, s.edge+"/review/login", []byte(form.Encode()), map[string]string{
		"Content-Type": "application/x-www-form-urlencoded", "Origin": s.edge, "Sec-Fetch-Site": "same-origin",
	})
	if err != nil || r.status != http.StatusSeeOther {
		t.Fatalf("review sign-in: %v %d %s", err, r.status, r.body)
	}
	for _, c := range r.header.Values("Set-Cookie") {
		return strings.SplitN(c, ";", 2)[0]
	}
	t.Fatal("review sign-in set no cookie")
	return ""
}
