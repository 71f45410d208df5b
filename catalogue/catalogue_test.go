package catalogue

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestPublishedVersionsAreImmutable fails when the content of a published
// version changes. testdata/published.sha256 is append-only: publishing a
// new version adds a line; editing a line is never the fix.
func TestPublishedVersionsAreImmutable(t *testing.T) {
	t.Parallel()
	f, err := os.Open("testdata/published.sha256")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	golden := map[Version]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		v, sum, ok := strings.Cut(line, " ")
		n, err := strconv.Atoi(v)
		if !ok || err != nil {
			t.Fatalf("bad golden line %q", line)
		}
		golden[Version(n)] = sum
	}
	for _, v := range Versions() {
		c, err := Get(v)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(Canonical(c))
		got := hex.EncodeToString(sum[:])
		want, ok := golden[v]
		if !ok {
			t.Errorf("version %d is published but has no line in testdata/published.sha256; add: %d %s", v, v, got)
			continue
		}
		if got != want {
			t.Errorf("published version %d changed (sha256 %s, published %s): publish a new version instead", v, got, want)
		}
	}
	for v := range golden {
		if _, err := Get(v); err != nil {
			t.Errorf("version %d was published and is gone: %v", v, err)
		}
	}
}

var nameRe = regexp.MustCompile(`^[a-z]+(_[a-z0-9]+)+$`)

// Verbs in the present tense that name a real effect.
var verbs = map[string]bool{"draft": true, "send": true, "create": true, "escalate": true, "close": true, "verify": true, "update": true, "cancel": true}

// Product or vendor names that must never prefix an action.
var products = []string{"aroflo", "xero", "gmail", "outlook", "n8n", "imap", "smtp", "ms365", "google", "email", "mail", "job"}

func TestActionNames(t *testing.T) {
	t.Parallel()
	for _, v := range Versions() {
		c, _ := Get(v)
		seen := map[Name]bool{}
		for _, a := range c.Actions {
			n := string(a.Name)
			if !nameRe.MatchString(n) {
				t.Errorf("v%d %q: not verb_object lowercase snake case", v, n)
			}
			verb, _, _ := strings.Cut(n, "_")
			if !verbs[verb] {
				t.Errorf("v%d %q: %q is not a known present-tense verb", v, n, verb)
			}
			for _, p := range products {
				if verb == p {
					t.Errorf("v%d %q: starts with product name %q", v, n, p)
				}
			}
			if seen[a.Name] {
				t.Errorf("v%d %q: listed twice", v, n)
			}
			seen[a.Name] = true
			if a.Description == "" {
				t.Errorf("v%d %q: no description", v, n)
			}
		}
	}
}

func TestRequiredV1Actions(t *testing.T) {
	t.Parallel()
	for _, n := range []Name{DraftReply, SendReply, CreateJob, EscalateItem, CloseItem} {
		if _, ok := Lookup(1, n); !ok {
			t.Errorf("v1 lacks %s", n)
		}
	}
	draft, _ := Lookup(1, DraftReply)
	if !draft.RequiresApproval {
		t.Error("draft_reply must require approval")
	}
}

func TestGetReturnsACopy(t *testing.T) {
	t.Parallel()
	c, _ := Get(1)
	c.Actions[0].Params[0].Name = "tampered"
	c.Actions[0].RequiresApproval = false
	again, _ := Get(1)
	if again.Actions[0].Params[0].Name == "tampered" || !again.Actions[0].RequiresApproval {
		t.Fatal("mutating a returned catalogue changed the published one")
	}
}

func TestValidateParams(t *testing.T) {
	t.Parallel()
	send, _ := Lookup(1, SendReply)
	draft, _ := Lookup(1, DraftReply)
	hash := strings.Repeat("ab", 32)
	tests := []struct {
		name    string
		action  Action
		params  string
		want    string // canonical output, when valid
		problem string // ParamError.Param, when invalid
	}{
		{"Valid", draft, `{"body":"Hi","subject":"Re: x","tone":"friendly"}`, `{"body":"Hi","subject":"Re: x","tone":"friendly"}`, ""},
		{"KeysSorted", draft, ` { "subject":"Re: x", "body":"Hi" } `, `{"body":"Hi","subject":"Re: x"}`, ""},
		{"Missing", draft, `{"subject":"Re: x"}`, "", "body"},
		{"Unknown", draft, `{"subject":"s","body":"b","cc":"boss@x"}`, "", "cc"},
		{"WrongType", draft, `{"subject":1,"body":"b"}`, "", "subject"},
		{"EnumViolation", draft, `{"subject":"s","body":"b","tone":"furious"}`, "", "tone"},
		{"TooLong", draft, `{"subject":"` + strings.Repeat("x", 301) + `","body":"b"}`, "", "subject"},
		{"EmptyRequired", draft, `{"subject":"  ","body":"b"}`, "", "subject"},
		{"Duplicate", draft, `{"subject":"s","subject":"t","body":"b"}`, "", ""},
		{"Trailing", draft, `{"subject":"s","body":"b"} {}`, "", ""},
		{"NotObject", draft, `["subject"]`, "", ""},
		{"BadHash", send, `{"approval_id":"0b6f1a9e-5f1c-4d0e-9a59-3f8f5c1d2e3a","content_sha256":"xyz","abort_if_replied_since":"2026-01-01T00:00:00Z"}`, "", "content_sha256"},
		{"BadTime", send, `{"approval_id":"0b6f1a9e-5f1c-4d0e-9a59-3f8f5c1d2e3a","content_sha256":"` + hash + `","abort_if_replied_since":"yesterday"}`, "", "abort_if_replied_since"},
		{"SubjectCRLF", draft, `{"subject":"Re\r\nBcc: evil@attacker.example","body":"b"}`, "", "subject"},
		{"SubjectLineSeparator", draft, `{"subject":"Re: a\u2028b","body":"b"}`, "", "subject"},
		{"SubjectNEL", draft, `{"subject":"Re: a\u0085b","body":"b"}`, "", "subject"},
		{"BodyKeepsItsLines", draft, `{"subject":"Re: x","body":"Hi,\r\nthanks.\u2028Jo"}`, `{"body":"Hi,\r\nthanks.\u2028Jo","subject":"Re: x"}`, ""},
		{"BadUUID", send, `{"approval_id":"nope","content_sha256":"` + hash + `","abort_if_replied_since":"2026-01-01T00:00:00Z"}`, "", "approval_id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := tt.action.ValidateParams(json.RawMessage(tt.params))
			if tt.want != "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if string(got) != tt.want {
					t.Fatalf("got %s, want %s", got, tt.want)
				}
				return
			}
			var pe *ParamError
			if !errors.As(err, &pe) {
				t.Fatalf("want *ParamError, got %v", err)
			}
			if pe.Param != tt.problem {
				t.Fatalf("error names param %q, want %q (%v)", pe.Param, tt.problem, err)
			}
		})
	}
}

func TestParamsSchemaListsRequired(t *testing.T) {
	t.Parallel()
	draft, _ := Lookup(1, DraftReply)
	s := draft.ParamsSchema()
	req := s["required"].([]string)
	if len(req) != 2 || req[0] != "subject" || req[1] != "body" {
		t.Fatalf("required = %v", req)
	}
	if s["additionalProperties"] != false {
		t.Fatal("schema must forbid additional properties")
	}
}

// create_job's external_ref is the brain's, from the work item: the same
// for every turn of an item, another for another item, whatever a rule or a
// model wrote; a rule may not give it.
func TestExternalRefIsSetFromTheItem(t *testing.T) {
	t.Parallel()
	job, _ := Lookup(1, CreateJob)
	ref := ItemRef("<a@customer.example>")
	if ref != ItemRef("<a@customer.example>") || ref == ItemRef("<b@customer.example>") || !strings.HasPrefix(ref, "n8nbrain-") || len(ref) != 41 {
		t.Fatalf("ItemRef gives %q", ref)
	}
	got, err := job.WithItemParams(json.RawMessage(`{"title":"t","description":"d","external_ref":"JOB-OF-ANOTHER-ITEM"}`), "<a@customer.example>")
	if err != nil {
		t.Fatal(err)
	}
	canon, err := job.ValidateParams(got)
	if err != nil || string(canon) != `{"description":"d","external_ref":"`+ref+`","title":"t"}` {
		t.Fatalf("with the item's reference: %s, %v", canon, err)
	}
	draft, _ := Lookup(1, DraftReply)
	if raw := json.RawMessage(` {"subject":"s","body":"b"}`); string(must(draft.WithItemParams(raw, "x"))) != string(raw) {
		t.Error("an action without such parameters was rewritten")
	}

	rule, err := job.ValidateRuleParams(json.RawMessage(`{"title":"Leak","description":"Fix it"}`))
	if err != nil || string(rule) != `{"description":"Fix it","title":"Leak"}` {
		t.Fatalf("a rule's create_job: %s, %v", rule, err)
	}
	var pe *ParamError
	if _, err := job.ValidateRuleParams(json.RawMessage(`{"title":"Leak","description":"Fix it","external_ref":"r1"}`)); !errors.As(err, &pe) ||
		pe.Param != "external_ref" || !strings.Contains(err.Error(), "is set by the brain") {
		t.Fatalf("a rule giving external_ref: %v", err)
	}
	if _, err := job.ValidateRuleParams(json.RawMessage(`{"title":"Leak"}`)); !errors.As(err, &pe) || pe.Param != "description" {
		t.Fatalf("a rule missing description: %v", err)
	}
}

func must(b json.RawMessage, err error) json.RawMessage {
	if err != nil {
		panic(err)
	}
	return b
}
