package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ollama/ollama/api"

	"n8nbrain/brain"
	"n8nbrain/internal/ollamafake"
	"n8nbrain/wire"
)

// Helpers for the model tests: a brain wired to a fake Ollama, what the
// fake was asked, the ledger, labelled metrics, and the log check.

const testModel = "test-model:1b"

// startModelBrain runs a brain replica whose model is the fake, with short
// retry and timeouts; it returns the stop func and the ops base URL.
func (s *system) startModelBrain(replica string, fake *ollamafake.Server, mutate func(*brain.Config)) (stop func(), ops string) {
	s.t.Helper()
	return s.startOpsBrain(replica, func(c *brain.Config) {
		c.Model = brain.ModelConfig{URL: fake.URL(), Name: testModel, Timeout: 5 * time.Second, RetryDelay: 5 * time.Millisecond}
		if mutate != nil {
			mutate(c)
		}
	})
}

// breakerOff keeps the circuit breaker closed whatever the model answers:
// for tests that feed a model double many invalid answers on purpose (every
// invalid answer counts against the breaker, TestModelGarbageOpensTheBreaker)
// and check what becomes of each item.
func breakerOff(c *brain.Config) { c.Model.BreakerMinCalls = math.MaxInt32 }

// stepOf tells the fake which step a chat is: only the classification
// schema has a category.
func stepOf(req *api.ChatRequest) string {
	if bytes.Contains(req.Format, []byte(`"category"`)) {
		return "classify"
	}
	return "draft"
}

// attemptOf is 1 for a first question and 2 for the repair (the repair is
// a follow-up user message in the same chat).
func attemptOf(req *api.ChatRequest) int {
	n := 0
	for _, m := range req.Messages {
		if m.Role == "user" {
			n++
		}
	}
	return n
}

// promptEmail is the email as the model was shown it: the JSON data
// between the <email> delimiters of the user message.
type promptEmail struct {
	From      string   `json:"from"`
	To        []string `json:"to"`
	ToOmitted int      `json:"to_omitted"`
	Cc        []string `json:"cc"`
	CcOmitted int      `json:"cc_omitted"`
	Subject   string   `json:"subject"`
	Body      string   `json:"body"`
	Truncated []string `json:"truncated"`
}

func emailOf(req *api.ChatRequest) (promptEmail, bool) {
	for _, m := range req.Messages {
		if m.Role != "user" {
			continue
		}
		i, j := strings.Index(m.Content, "<email>\n"), strings.LastIndex(m.Content, "\n</email>")
		if i < 0 || j < i {
			continue
		}
		var e promptEmail
		if err := json.Unmarshal([]byte(m.Content[i+len("<email>\n"):j]), &e); err != nil {
			return e, false
		}
		return e, true
	}
	return promptEmail{}, false
}

func countSteps(reqs []api.ChatRequest, step string) int {
	n := 0
	for i := range reqs {
		if stepOf(&reqs[i]) == step {
			n++
		}
	}
	return n
}

type ledgerRow struct {
	Step          string
	Attempt       int
	Model         string
	PromptVersion string
	PromptTokens  int
	OutputTokens  int
	Outcome       string
}

func (r ledgerRow) String() string { return r.Step + ":" + r.Outcome }

func ledger(t *testing.T, db *pgx.Conn, workItemID string) []ledgerRow {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT step, attempt, model, prompt_version, prompt_tokens, output_tokens, outcome
		FROM model_calls WHERE work_item_id = $1 ORDER BY id`, workItemID)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ledgerRow])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func ledgerString(rows []ledgerRow) string {
	s := make([]string, len(rows))
	for i, r := range rows {
		s[i] = r.String()
	}
	return strings.Join(s, ",")
}

// labelled returns the value of one labelled sample, e.g.
// brain_model_calls_total{tenant="a",outcome="ok"}, or -1 when absent.
func labelled(t *testing.T, ops, sample string) int {
	t.Helper()
	res, err := http.Get(ops + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, sample+" "); ok {
			var n int
			if _, err := fmt.Sscanf(rest, "%d", &n); err == nil {
				return n
			}
		}
	}
	return -1
}

// trySubmit is submit for goroutines: it returns transport errors instead
// of failing the test from the wrong goroutine.
func (c *edgeClient) trySubmit(req *wire.TurnSubmitRequest) (response, error) {
	if c.sys != nil {
		c.sys.noteEmail(req)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return response{}, err
	}
	hr, err := http.NewRequest(http.MethodPost, c.base+"/v1/turns", bytes.NewReader(body))
	if err != nil {
		return response{}, err
	}
	hr.Header.Set("Authorization", "Bearer "+c.token)
	hr.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(hr)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return response{Status: res.StatusCode, Header: res.Header, Body: b}, err
}

// forTest is the edge client bound to a subtest's t.
func (c *edgeClient) forTest(t *testing.T) *edgeClient {
	cc := *c
	cc.t = t
	return &cc
}

// assertNoEmailInLogs fails when a subject or body of the given emails, or
// a distinctive piece of one, appears in any log line of the system.
func assertNoEmailInLogs(t *testing.T, s *system, emails ...*wire.Email) {
	t.Helper()
	logs := s.logs.String()
	for _, e := range emails {
		for _, text := range []string{e.Subject, e.Body} {
			for _, v := range logForms(text) {
				if strings.Contains(logs, v) {
					t.Errorf("a log line contains email content %q", v)
				}
			}
		}
	}
}

// logForms are the ways a text could appear in a JSON log line: raw,
// JSON-escaped with and without HTML escaping, and its first and last 32
// characters when it is long.
func logForms(text string) []string {
	var forms []string
	add := func(v string) {
		if len([]rune(v)) >= 10 {
			forms = append(forms, v)
		}
	}
	r := []rune(text)
	parts := []string{text}
	if len(r) > 48 {
		parts = append(parts, string(r[:32]), string(r[len(r)-32:]))
	}
	for _, p := range parts {
		add(p)
		j, _ := json.Marshal(p)
		add(string(j[1 : len(j)-1]))
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(p)
		add(strings.TrimSuffix(b.String(), "\n")[1 : b.Len()-2])
	}
	return forms
}

// publicTables lists the tables of a tenant database, whatever migrations
// have added since this test was written.
func publicTables(t *testing.T, db *pgx.Conn) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT table_name::text FROM information_schema.tables
		WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatal("no tables in the tenant database")
	}
	return names
}
