package catalogue

import (
	"encoding/json"
	"testing"
)

// TestEveryActionHasAForm: a review page can show every action of every
// published version in words, one field per parameter.
func TestEveryActionHasAForm(t *testing.T) {
	t.Parallel()
	for _, v := range Versions() {
		c, _ := Get(v)
		for _, a := range c.Actions {
			f, ok := FormOf(v, a.Name)
			if !ok {
				t.Errorf("v%d %s has no form", v, a.Name)
				continue
			}
			if f.Title == "" {
				t.Errorf("v%d %s: no title", v, a.Name)
			}
			if len(f.Fields) != len(a.Params) {
				t.Errorf("v%d %s: %d fields for %d params", v, a.Name, len(f.Fields), len(a.Params))
			}
			words := forms[v][a.Name].fields
			for i, p := range a.Params {
				if f.Fields[i].Param.Name != p.Name {
					t.Errorf("v%d %s: field %d is %s, want %s", v, a.Name, i, f.Fields[i].Param.Name, p.Name)
				}
				if _, ok := words[p.Name]; !ok {
					t.Errorf("v%d %s: parameter %s has no label", v, a.Name, p.Name)
				}
			}
			for name := range words {
				found := false
				for _, p := range a.Params {
					found = found || p.Name == name
				}
				if !found {
					t.Errorf("v%d %s: the form words %q, which is not a parameter", v, a.Name, name)
				}
			}
		}
	}
}

func TestFormInputs(t *testing.T) {
	t.Parallel()
	f, _ := FormOf(1, DraftReply)
	want := map[string]Input{"subject": InputLine, "body": InputText, "tone": InputChoice}
	for _, fd := range f.Fields {
		if fd.Input != want[fd.Param.Name] {
			t.Errorf("%s: input %s, want %s", fd.Param.Name, fd.Input, want[fd.Param.Name])
		}
	}
	job, _ := FormOf(1, CreateJob)
	for _, fd := range job.Fields {
		if (fd.Param.Name == "external_ref") != fd.ReadOnly {
			t.Errorf("create_job %s: read-only %v", fd.Param.Name, fd.ReadOnly)
		}
	}
}

func TestReadOnlyChange(t *testing.T) {
	t.Parallel()
	job, _ := FormOf(1, CreateJob)
	proposed := json.RawMessage(`{"title":"Fix tap","description":"d","external_ref":"wi-1"}`)
	for _, tc := range []struct {
		name, edited, want string
	}{
		{"Kept", `{"title":"Fix the tap","description":"d","external_ref":"wi-1"}`, ""},
		{"KeptOtherSpelling", `{ "external_ref" : "wi\u002d1", "title":"x","description":"d"}`, ""},
		{"Changed", `{"title":"Fix tap","description":"d","external_ref":"wi-2"}`, "external_ref"},
		{"Dropped", `{"title":"Fix tap","description":"d"}`, "external_ref"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := job.ReadOnlyChange(proposed, json.RawMessage(tc.edited))
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if _, err := job.ReadOnlyChange(proposed, json.RawMessage(`[]`)); err == nil {
		t.Error("an edit that is not an object must be an error")
	}
}
