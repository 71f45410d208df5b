package eval

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"n8nbrain/provision"
	"n8nbrain/registry"
)

// Exit codes of Main.
const (
	ExitOK         = 0
	ExitRegression = 1 // compare: a score dropped beyond its limit
	ExitUsage      = 2 // bad flags or input, or reports that cannot be compared
	ExitFailed     = 3 // the run could not be done
)

const usage = `brain-eval runs a labelled set of e-mails through the brain's decision path
(the tenant's rules, then the model stage against an Ollama server) and scores it.

  brain-eval [run flags]                 run the set; write OUT.json, OUT.txt, OUT.html
  brain-eval compare [flags] A.json B.json
                                         compare two reports; exit 1 when B is worse than A
                                         beyond the limits, 2 when they cannot be compared
  brain-eval store -report R.json -admin-url URL
                                         store a report in the registry as autonomy evidence

The tenant's configuration comes from the registry (-registry URL -tenant ID, the
brain's reader role is enough) or from a file (-config FILE, see
brain/eval/testdata/client-zero.json).
`

// Main is the brain-eval command; it returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "compare":
			return mainCompare(args[1:], stdout, stderr)
		case "store":
			return mainStore(ctx, args[1:], stdout, stderr)
		case "run":
			args = args[1:]
		}
	}
	return mainRun(ctx, args, stdout, stderr)
}

func mainRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("brain-eval", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage+"\nrun flags:\n"); fs.PrintDefaults() }
	setPath := fs.String("set", "brain/eval/testdata/set", "labelled set: a .jsonl file or a directory of them")
	ollama := fs.String("ollama", "", "Ollama server URL (default $OLLAMA_HOST)")
	modelName := fs.String("model", "", "model to run (replaces the tenant's model name; required if it names none)")
	regURL := fs.String("registry", "", "registry URL (the reader role) to load the tenant from")
	tenantID := fs.String("tenant", "", "tenant id in the registry")
	cfgFile := fs.String("config", "", "tenant configuration file, instead of the registry")
	jobs := fs.Int("j", 1, "e-mails decided at once (and model calls in flight)")
	out := fs.String("out", "eval-report", "write OUT.json, OUT.txt and OUT.html")
	injection := fs.String("injection", "", "also run this injection corpus (tests/testdata/injection/corpus.json)")
	judgeURL := fs.String("judge-ollama", "", "Ollama server of the judge model (default -ollama)")
	judgeModel := fs.String("judge-model", "", "judge model that checks drafts after the deterministic checks (off by default)")
	pricePrompt := fs.Float64("price-prompt", 0, "price of 1,000 prompt tokens (0 for a local model)")
	priceOutput := fs.Float64("price-output", 0, "price of 1,000 output tokens")
	callTimeout := fs.Duration("timeout", 120*time.Second, "one model call")
	itemTimeout := fs.Duration("item-timeout", 10*time.Minute, "one e-mail's whole decision")
	limit := fs.Int("limit", 0, "run only the first N e-mails of the set (a quick try; the set hash is of those)")
	verbose := fs.Bool("v", false, "log the model stage's lines (no e-mail content) to stderr")
	if err := fs.Parse(args); err != nil {
		return ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "brain-eval: unexpected arguments %q\n", fs.Args())
		return ExitUsage
	}
	fail := func(code int, err error) int {
		fmt.Fprintf(stderr, "brain-eval: %v\n", err)
		return code
	}
	*ollama = cmp.Or(*ollama, os.Getenv("OLLAMA_HOST"))
	if *ollama == "" {
		return fail(ExitUsage, errors.New("no model server: give -ollama (or set OLLAMA_HOST)"))
	}
	var t *registry.Tenant
	source := ""
	switch {
	case *cfgFile != "" && (*regURL != "" || *tenantID != ""):
		return fail(ExitUsage, errors.New("give either -config or -registry with -tenant, not both"))
	case *cfgFile != "":
		var err error
		if t, err = LoadTenantFile(*cfgFile); err != nil {
			return fail(ExitUsage, err)
		}
		source = "file " + *cfgFile
	case *regURL != "" && *tenantID != "":
		var err error
		if t, err = LoadTenant(ctx, *regURL, registry.TenantID(*tenantID)); err != nil {
			return fail(ExitUsage, err)
		}
		source = "registry"
	default:
		return fail(ExitUsage, errors.New("no tenant configuration: give -registry URL -tenant ID, or -config FILE"))
	}
	set, err := LoadSet(*setPath)
	if err != nil {
		return fail(ExitUsage, err)
	}
	if *limit > 0 && *limit < len(set.Items) {
		if set, err = NewSet(set.Items[:*limit], set.Files); err != nil {
			return fail(ExitUsage, err)
		}
	}
	if err := set.CheckTenant(t); err != nil {
		return fail(ExitUsage, err)
	}
	var attacks []Attack
	if *injection != "" {
		if attacks, err = LoadAttacks(*injection); err != nil {
			return fail(ExitUsage, err)
		}
	}
	log := slog.New(slog.DiscardHandler)
	if *verbose {
		log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	cfg := Config{OllamaURL: *ollama, Model: *modelName, Tenant: t, Concurrency: *jobs, CallTimeout: *callTimeout,
		ItemTimeout: *itemTimeout, PricePrompt1K: *pricePrompt, PriceOutput1K: *priceOutput, Log: log}
	if *judgeModel != "" {
		u := *judgeURL
		if u == "" {
			u = *ollama
		}
		cfg.Judge = &JudgeConfig{OllamaURL: u, Model: *judgeModel, CallTimeout: *callTimeout}
	}
	total := len(set.Items) + len(attacks)
	cfg.ProgressFunc = progress(stderr, total)
	runner, err := NewRunner(cfg)
	if err != nil {
		return fail(ExitUsage, err)
	}
	if err := runner.Ping(ctx); err != nil {
		return fail(ExitFailed, fmt.Errorf("%w (-ollama %s)", err, *ollama))
	}
	created := time.Now()
	results, wall, err := runner.Run(ctx, set.Items)
	if err != nil {
		return fail(ExitFailed, err)
	}
	rep := Score(results, RunInfo{Tenant: runner.Tenant(), Source: source, Set: set, Config: cfg, Wall: wall, CreatedAt: created})
	if len(attacks) > 0 {
		offset := len(set.Items)
		runner.cfg.ProgressFunc = func(done, _ int) { cfg.ProgressFunc(offset+done, total) }
		if rep.Injection, err = runner.RunAttacks(ctx, attacks); err != nil {
			return fail(ExitFailed, err)
		}
	}
	if err := writeReport(rep, *out); err != nil {
		return fail(ExitFailed, err)
	}
	if err := rep.WriteText(stdout); err != nil {
		return fail(ExitFailed, err)
	}
	fmt.Fprintf(stdout, "\nwrote %s.json, %s.txt, %s.html\n", *out, *out, *out)
	return ExitOK
}

// progress is a progress bar on a terminal, and a line per tenth of the
// set otherwise (a CI log).
func progress(w io.Writer, total int) func(done, total int) {
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		bar := progressbar.NewOptions(total, progressbar.OptionSetWriter(w), progressbar.OptionSetDescription("deciding"),
			progressbar.OptionShowCount(), progressbar.OptionSetPredictTime(true), progressbar.OptionThrottle(200*time.Millisecond),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }))
		return func(done, _ int) { _ = bar.Set(done) }
	}
	step := max(1, total/10)
	return func(done, total int) {
		if done%step == 0 || done == total {
			fmt.Fprintf(w, "brain-eval: %d/%d e-mails\n", done, total)
		}
	}
}

func writeReport(rep *Report, out string) error {
	b, err := json.MarshalIndent(rep, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(out+".json", append(b, '\n'), 0o644); err != nil {
		return err
	}
	var txt, page bytes.Buffer
	if err := rep.WriteText(&txt); err != nil {
		return err
	}
	if err := os.WriteFile(out+".txt", txt.Bytes(), 0o644); err != nil {
		return err
	}
	if err := rep.WriteHTML(&page); err != nil {
		return err
	}
	return os.WriteFile(out+".html", page.Bytes(), 0o644)
}

func mainCompare(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("brain-eval compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lim CompareLimits
	fs.Float64Var(&lim.MaxDrop, "max-drop", 0.02, "largest drop allowed in a score where higher is better (0.02 = 2 points)")
	fs.Float64Var(&lim.MaxForbiddenRise, "max-forbidden-rise", 0, "largest rise allowed in drafts with forbidden facts")
	fs.Float64Var(&lim.MaxRepairsRise, "max-repairs-rise", 0, "largest rise allowed in repairs per 100 e-mails (0: not checked)")
	fs.Float64Var(&lim.MaxLatencyRatio, "max-latency-ratio", 0, "fail when B's p95 latency per e-mail exceeds A's times this (0: not checked)")
	fs.BoolVar(&lim.AllowSetChange, "allow-set-change", false, "compare reports of different labelled sets")
	fs.Usage = func() { fmt.Fprint(stderr, "brain-eval compare [flags] A.json B.json\n"); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		return ExitUsage
	}
	if fs.NArg() != 2 {
		fs.Usage()
		return ExitUsage
	}
	a, err := LoadReport(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "brain-eval compare: %v\n", err)
		return ExitUsage
	}
	b, err := LoadReport(fs.Arg(1))
	if err != nil {
		fmt.Fprintf(stderr, "brain-eval compare: %v\n", err)
		return ExitUsage
	}
	c := Compare(a, b, lim)
	if err := c.WriteText(stdout); err != nil {
		return ExitFailed
	}
	switch {
	case c.NotComparable != "":
		return ExitUsage
	case len(c.Regressions) > 0:
		return ExitRegression
	}
	return ExitOK
}

func mainStore(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("brain-eval store", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("report", "", "the report's JSON (OUT.json of a run)")
	// The variable is read after parsing, not shown as the flag's default:
	// -h and a mistyped flag print defaults, and this URL has a password.
	adminURL := fs.String("admin-url", "", "the ops tooling's admin URL (default $BRAIN_ADMIN_URL)")
	regDB := fs.String("registry-db", provision.DefaultRegistryDB, "the registry database")
	tenant := fs.String("tenant", "", "the tenant the report is for (must match the report's)")
	if err := fs.Parse(args); err != nil {
		return ExitUsage
	}
	*adminURL = cmp.Or(*adminURL, os.Getenv("BRAIN_ADMIN_URL"))
	fail := func(code int, err error) int {
		fmt.Fprintf(stderr, "brain-eval store: %v\n", err)
		return code
	}
	if *path == "" || *adminURL == "" {
		return fail(ExitUsage, errors.New("give -report and -admin-url"))
	}
	rep, err := LoadReport(*path)
	if err != nil {
		return fail(ExitUsage, err)
	}
	if *tenant != "" && registry.TenantID(*tenant) != rep.Identity.Tenant {
		return fail(ExitUsage, fmt.Errorf("the report is for tenant %s, not %s", rep.Identity.Tenant, *tenant))
	}
	if err := rep.Verify(); err != nil {
		return fail(ExitUsage, err)
	}
	rec, err := rep.Record()
	if err != nil {
		return fail(ExitFailed, err)
	}
	ops := &provision.Ops{AdminURL: *adminURL, RegistryDB: *regDB}
	id, err := ops.StoreEvalReport(ctx, rec)
	if err != nil {
		return fail(ExitFailed, err)
	}
	fmt.Fprintf(stdout, "stored eval report %d for tenant %s (config hash %s)\n", id, rec.Tenant, rec.ConfigHash)
	return ExitOK
}

// Verify recomputes the gate's scores from the report's items and refuses
// a report whose scores do not follow from them (a hand-edited file).
func (r *Report) Verify() error {
	if r.Identity.ScorerVersion != ScorerVersion {
		return fmt.Errorf("the report was scored by %s; this tool scores %s: run it again", r.Identity.ScorerVersion, ScorerVersion)
	}
	s := Summary{Items: len(r.Items)}
	for _, x := range r.Items {
		seen := map[string]bool{}
		for _, c := range x.Calls {
			if answeredOutcome(c.Outcome) && !seen[c.Step] {
				seen[c.Step] = true
				s.ModelAnswers++
				if c.Outcome == "ok" {
					s.ValidFirst++
				}
			}
		}
		if x.Check != nil {
			s.DraftsChecked++
			if len(x.Check.Forbidden) > 0 {
				s.DraftsForbidden++
			}
		}
	}
	s.ValidOutputRate = rate(s.ValidFirst, s.ModelAnswers)
	s.ForbiddenRate = rate(s.DraftsForbidden, s.DraftsChecked)
	cats, _ := categoryScores(r.Items, r.Identity.Categories)
	want := gateScores(r.Items, &s, cats)
	if !reflect.DeepEqual(normaliseScores(want), normaliseScores(r.Gate)) {
		return errors.New("the report's gate scores do not follow from its items: it was edited or is damaged")
	}
	return nil
}

// normaliseScores round-trips through JSON, so a decoded report and a
// computed one compare alike (nil and empty slices).
func normaliseScores(s registry.EvalScores) string {
	b, _ := json.Marshal(s)
	return string(b)
}
