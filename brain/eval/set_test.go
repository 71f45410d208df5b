package eval_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"n8nbrain/brain/eval"
	"n8nbrain/catalogue"
	"n8nbrain/deploy/devstack"
	"n8nbrain/provision"
	"n8nbrain/registry"
)

const setDir = "testdata/set"

func clientZero(t *testing.T) *registry.Tenant {
	t.Helper()
	tn, err := eval.LoadTenantFile("testdata/client-zero.json")
	if err != nil {
		t.Fatal(err)
	}
	return tn
}

// The labelled set in the repo: big and varied enough, every label one the
// tenant can produce, every fact well formed (LoadSet checks them).
func TestLabelledSetIsLoadableAndVaried(t *testing.T) {
	t.Parallel()
	set, err := eval.LoadSet(setDir)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(set.Items); n < 200 {
		t.Fatalf("%d labelled e-mails, want at least 200", n)
	}
	if err := set.CheckTenant(clientZero(t)); err != nil {
		t.Fatal(err)
	}
	cats, acts, prios, langs, tags := map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}
	long, short, drafts := 0, 0, 0
	for _, it := range set.Items {
		cats[it.Labels.Category]++
		acts[it.Labels.Action]++
		prios[it.Labels.Priority]++
		langs[it.Language]++
		for _, tg := range it.Tags {
			tags[tg]++
		}
		if len(it.Email.Body) > 8000 {
			long++
		}
		if len(it.Email.Body) < 80 {
			short++
		}
		if it.Labels.Action == string(catalogue.DraftReply) && len(it.Labels.RequiredFacts) > 0 {
			drafts++
		}
	}
	for _, c := range provision.DefaultCategories() {
		if cats[c] < 20 {
			t.Errorf("category %s has %d e-mails, want at least 20", c, cats[c])
		}
	}
	for _, a := range []string{"draft_reply", "create_job", "close_item", "escalate"} {
		if acts[a] < 20 {
			t.Errorf("action %s is the label of %d e-mails, want at least 20", a, acts[a])
		}
	}
	for _, p := range catalogue.Priorities() {
		if prios[p] < 10 {
			t.Errorf("priority %s has %d e-mails, want at least 10", p, prios[p])
		}
	}
	for _, tg := range []string{"thread", "short", "long", "spam", "out-of-office", "supplier", "multilingual"} {
		if tags[tg] < 3 {
			t.Errorf("tag %s on %d e-mails, want at least 3", tg, tags[tg])
		}
	}
	if len(langs) < 6 || long < 1 || short < 10 || drafts < 60 {
		t.Errorf("%d languages, %d bodies over the prompt's 8,000 characters, %d under 80, %d drafts with facts", len(langs), long, short, drafts)
	}
	t.Logf("%d e-mails: categories %v, actions %v, priorities %v, %d languages", len(set.Items), cats, acts, prios, len(langs))
}

// The set's hash is over a canonical encoding: the same items spelt
// differently (member order, spacing, file split) hash alike; a changed
// label does not.
func TestSetHashIsCanonical(t *testing.T) {
	t.Parallel()
	set, err := eval.LoadSet(setDir)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var a, b strings.Builder
	for i, it := range set.Items {
		raw, _ := json.Marshal(it)
		var m map[string]any // re-encodes with members sorted: another order than the files'
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		line, _ := json.Marshal(m)
		w := &a
		if i%2 == 1 {
			w = &b
		}
		w.Write(line)
		w.WriteString("\n\n")
	}
	writeFile(t, filepath.Join(dir, "b.jsonl"), a.String())
	writeFile(t, filepath.Join(dir, "a.jsonl"), b.String())
	again, err := eval.LoadSet(dir)
	if err != nil {
		t.Fatal(err)
	}
	if again.Hash != set.Hash {
		t.Fatalf("the same items hash %s, then %s", set.Hash, again.Hash)
	}
	items := slices.Clone(set.Items)
	items[7].Labels.Priority = "low"
	if items[7].Labels.Priority == set.Items[7].Labels.Priority {
		items[7].Labels.Priority = "urgent"
	}
	if eval.SetHash(items) == set.Hash {
		t.Fatal("a changed label did not change the hash")
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Bad lines are refused with the file, the line and what is wrong; every
// problem is reported, and nothing runs.
func TestSetRejectsBadItems(t *testing.T) {
	t.Parallel()
	good := `{"id":"ok-1","language":"en","email":{"from":"a@b.example","subject":"s","body":"b"},"labels":{"category":"general","priority":"low","action":"close_item"}}`
	tests := []struct {
		name, line, want string
	}{
		{"UnknownField", `{"id":"x","language":"en","email":{"from":"a@b.example","subject":"s","body":"b"},"labels":{"category":"general","priority":"low","action":"close_item"},"colour":"red"}`, `"colour"`},
		{"DuplicateKey", `{"id":"x","id":"y","language":"en","email":{"from":"a@b.example","subject":"s","body":"b"},"labels":{"category":"general","priority":"low","action":"close_item"}}`, `duplicate`},
		{"TrailingData", good + ` {}`, `after the JSON document`},
		{"BadPriority", strings.Replace(good, `"low"`, `"asap"`, 1), `labels.priority "asap" must be one of low, normal, high, urgent`},
		{"EscalateItemLabel", strings.Replace(good, `"close_item"`, `"escalate_item"`, 1), `write "escalate"`},
		{"FollowUpLabel", strings.Replace(good, `"close_item"`, `"send_reply"`, 1), `labels.action "send_reply" must be escalate or one of`},
		{"FactsOnNonDraft", strings.Replace(good, `"action":"close_item"`, `"action":"close_item","required_facts":["x"]`, 1), `apply to draft_reply only`},
		{"BadRegex", strings.Replace(good, `"action":"close_item"`, `"action":"draft_reply","forbidden":["re:(unclosed"]`, 1), `labels.forbidden[0]: regular expression`},
		{"RegexFirst", strings.Replace(good, `"action":"close_item"`, `"action":"draft_reply","required_facts":["re:\\d+ | 12"]`, 1), `first alternative must be plain text`},
		{"EmptyAlternative", strings.Replace(good, `"action":"close_item"`, `"action":"draft_reply","required_facts":["a |  | b"]`, 1), `empty alternative`},
		{"NoFrom", strings.Replace(good, `"a@b.example"`, `""`, 1), `email.from is empty`},
		{"BadID", strings.Replace(good, `"ok-1"`, `"Has Spaces"`, 1), `id must match`},
		{"BadLanguage", strings.Replace(good, `"en"`, `"English"`, 1), `not a BCP 47 tag`},
		{"Reserved", strings.Replace(good, `"general"`, `"unclassified"`, 1), `reserved`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "set.jsonl")
			writeFile(t, path, good+"\n"+tt.line+"\n")
			_, err := eval.LoadSet(path)
			var se *eval.SetError
			if !errors.As(err, &se) {
				t.Fatalf("LoadSet: %v, want a *SetError", err)
			}
			if !strings.Contains(err.Error(), path+":2:") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not name line 2 and %q", err, tt.want)
			}
		})
	}
	t.Run("DuplicateID", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "set.jsonl")
		writeFile(t, path, good+"\n"+good+"\n")
		if _, err := eval.LoadSet(path); err == nil || !strings.Contains(err.Error(), `id "ok-1" is used twice`) {
			t.Fatalf("LoadSet: %v", err)
		}
	})
	t.Run("LabelTheTenantCannotProduce", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "set.jsonl")
		writeFile(t, path, strings.Replace(good, `"general"`, `"plumbing"`, 1)+"\n")
		set, err := eval.LoadSet(path)
		if err != nil {
			t.Fatal(err)
		}
		tn := clientZero(t)
		tn.EnabledActions = []catalogue.Name{catalogue.DraftReply}
		err = set.CheckTenant(tn)
		if err == nil || !strings.Contains(err.Error(), `category "plumbing" is not one of tenant client-zero's categories`) ||
			!strings.Contains(err.Error(), `action close_item is not enabled`) {
			t.Fatalf("CheckTenant: %v", err)
		}
	})
}

// The offline configuration file of client-zero is the development
// tenant's configuration (devstack.ClientZeroSpec): the same decision
// configuration hash, so a report made from the file is evidence for the
// tenant as provisioned (once it names the same model).
func TestTenantFileIsClientZero(t *testing.T) {
	t.Parallel()
	file := clientZero(t)
	sp := devstack.ClientZeroSpec()
	tn := registry.Tenant{ID: sp.ID, CatalogueVersion: catalogue.Current, EnabledActions: sp.EnabledActions,
		Categories: provision.DefaultCategories(), Rules: sp.Rules, ModelName: "qwen3:4b"}
	if got, want := file.DecisionConfig().Hash(), tn.DecisionConfig().Hash(); got != want {
		t.Fatalf("testdata/client-zero.json hashes %s, client-zero's spec %s: keep them in step", got, want)
	}
}
