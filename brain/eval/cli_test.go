package eval_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/net/html"

	"n8nbrain/brain/eval"
	"n8nbrain/brain/eval/evaltest"
	"n8nbrain/internal/ollamafake"
)

// The command end to end: a run against the double writes the three
// reports; compare of a report with itself passes, with a worse one fails
// (exit 1) naming the drop, and with another set refuses (exit 2).
func TestCommandRunAndCompare(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	set, err := eval.LoadSet(setDir)
	if err != nil {
		t.Fatal(err)
	}
	// A small set: 30 e-mails of the repo's set, in one file.
	var lines []string
	for _, it := range set.Items[:30] {
		b, _ := json.Marshal(it)
		lines = append(lines, string(b))
	}
	setFile := filepath.Join(dir, "small.jsonl")
	writeFile(t, setFile, strings.Join(lines, "\n")+"\n")
	d, err := evaltest.NewDouble(set.Items[:30])
	if err != nil {
		t.Fatal(err)
	}
	fake := ollamafake.New(t, d.Chat)
	main := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := eval.Main(t.Context(), args, &out, &errb)
		return code, out.String(), errb.String()
	}

	a := filepath.Join(dir, "a")
	code, out, errs := main("-set", setFile, "-config", "testdata/client-zero.json", "-ollama", fake.URL(), "-model", "test-model:1b", "-j", "4", "-out", a)
	if code != eval.ExitOK {
		t.Fatalf("run: exit %d\n%s\n%s", code, out, errs)
	}
	if !strings.Contains(out, "category accuracy") || !strings.Contains(errs, "brain-eval: 30/30 e-mails") {
		t.Fatalf("run output:\n%s\nprogress:\n%s", out, errs)
	}
	for _, ext := range []string{".json", ".txt", ".html"} {
		if st, err := os.Stat(a + ext); err != nil || st.Size() == 0 {
			t.Fatalf("report %s: %v", ext, err)
		}
	}
	page, _ := os.ReadFile(a + ".html")
	if _, err := html.Parse(bytes.NewReader(page)); err != nil || !bytes.Contains(page, []byte(`id="chart-confusion"`)) {
		t.Fatalf("html report: %v", err)
	}

	if code, out, _ := main("compare", a+".json", a+".json"); code != eval.ExitOK || !strings.Contains(out, "same configuration") {
		t.Fatalf("compare with itself: exit %d\n%s", code, out)
	}

	// B: the same run with its category accuracy five points lower.
	rep, err := eval.LoadReport(a + ".json")
	if err != nil {
		t.Fatal(err)
	}
	rep.Summary.CategoryAccuracy -= 0.05
	rep.Summary.ForbiddenRate += 0.1
	b := filepath.Join(dir, "b.json")
	raw, _ := json.Marshal(rep)
	writeFile(t, b, string(raw))
	code, out, _ = main("compare", a+".json", b)
	if code != eval.ExitRegression || !strings.Contains(out, "category accuracy dropped from") ||
		!strings.Contains(out, "drafts with forbidden facts rose") || !strings.Contains(out, "REGRESSION") {
		t.Fatalf("compare with a worse report: exit %d\n%s", code, out)
	}
	if code, _, _ = main("compare", "-max-drop", "0.06", "-max-forbidden-rise", "0.2", a+".json", b); code != eval.ExitOK {
		t.Fatalf("compare within the limits: exit %d", code)
	}
	rep.Identity.SetHash = strings.Repeat("0", 64)
	raw, _ = json.Marshal(rep)
	writeFile(t, b, string(raw))
	if code, out, _ = main("compare", "-max-drop", "0.06", "-max-forbidden-rise", "0.2", a+".json", b); code != eval.ExitUsage || !strings.Contains(out, "different labelled sets") {
		t.Fatalf("compare across sets: exit %d\n%s", code, out)
	}

	// A model server that does not answer is said before anything runs.
	down := ollamafake.New(t, nil)
	down.Close()
	if code, _, errs := main("-set", setFile, "-config", "testdata/client-zero.json", "-ollama", down.URL(), "-out", filepath.Join(dir, "c")); code != eval.ExitFailed ||
		!strings.Contains(errs, "the model server does not answer") {
		t.Errorf("run against a server that is down: exit %d, %s", code, errs)
	}
	if _, err := os.Stat(filepath.Join(dir, "c.json")); !os.IsNotExist(err) {
		t.Errorf("a report was written for a run that did not happen: %v", err)
	}

	// Mistakes in the command line say what is wrong.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-set", setFile, "-config", "testdata/client-zero.json", "-ollama", ""}, "no model server"},
		{[]string{"-set", setFile, "-ollama", fake.URL()}, "no tenant configuration"},
		{[]string{"-set", filepath.Join(dir, "nope"), "-config", "testdata/client-zero.json", "-ollama", fake.URL()}, "no such file"},
		{[]string{"compare", a + ".json"}, "A.json B.json"},
		{[]string{"store", "-report", a + ".json"}, "give -report and -admin-url"},
	} {
		if code, _, errs := main(tc.args...); code != eval.ExitUsage || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q does not say %q", tc.args, code, errs, tc.want)
		}
	}
}

// TestHelpShowsNoSecret: -h and a mistyped flag print the flags' defaults;
// URLs that come from the environment (and carry a password) are not among
// them, yet still used when the flag is not given.
func TestHelpShowsNoSecret(t *testing.T) {
	t.Setenv("BRAIN_ADMIN_URL", "postgres://admin:s3cret-pw@127.0.0.1:1/postgres")
	t.Setenv("OLLAMA_HOST", "http://user:s3cret-pw@127.0.0.1:1")
	for _, args := range [][]string{{"store", "-h"}, {"store", "-tenat", "x"}, {"run", "-h"}, {"-olama", "x"}} {
		var out, errOut bytes.Buffer
		if code := eval.Main(context.Background(), args, &out, &errOut); code != eval.ExitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, eval.ExitUsage)
		}
		if strings.Contains(out.String()+errOut.String(), "s3cret-pw") {
			t.Errorf("%v printed a password from the environment:\n%s%s", args, out.String(), errOut.String())
		}
		if !strings.Contains(errOut.String(), "$") {
			t.Errorf("%v: the usage does not name the variables:\n%s", args, errOut.String())
		}
	}
	// Without -admin-url the variable stands in for it: store goes on to
	// read the report (which does not exist), not "give -admin-url".
	var out, errOut bytes.Buffer
	code := eval.Main(context.Background(), []string{"store", "-report", "testdata/none.json"}, &out, &errOut)
	if code != eval.ExitUsage || !strings.Contains(errOut.String(), "none.json") || strings.Contains(errOut.String(), "s3cret-pw") {
		t.Errorf("store without -admin-url: exit %d, %s", code, errOut.String())
	}
}
