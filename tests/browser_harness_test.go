package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"golang.org/x/crypto/bcrypt"
)

// The review page is tested in a real browser: Debian's chromium, driven
// over the DevTools protocol by chromedp, against a real edge, brain, NATS
// and Postgres. A browser test fails when chromium is missing (install it
// with apt-get install chromium), unless -short is given. When a test
// fails (or REVIEW_SCREENSHOTS is set), every page it had open is saved as
// a screenshot under .data/test-screenshots/<test name>/ in the
// repository, and the test log says where.

// chromiumPath finds the browser, or fails (skips with -short).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "/usr/bin/chromium"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if testing.Short() {
		t.Skip("chromium is not installed; the browser tests of the review page are skipped with -short")
	}
	t.Fatal("chromium is not installed: the review page's browser tests need it (apt-get install chromium)")
	return ""
}

// browser is one headless Chromium process for a test.
type browser struct {
	t     *testing.T
	root  context.Context
	shots string

	mu      sync.Mutex
	tabs    []*tab
	cancels []context.CancelFunc
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := chromiumPath(t)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	root, cancelRoot := chromedp.NewContext(alloc)
	if err := chromedp.Do(root); err != nil { // starts the browser
		cancelRoot()
		cancelAlloc()
		t.Fatalf("start chromium (%s): %v", path, err)
	}
	b := &browser{t: t, root: root}
	name := regexp.MustCompile(`[^A-Za-z0-9_.-]+`).ReplaceAllString(t.Name(), "_")
	shots, err := filepath.Abs(filepath.Join("..", ".data", "test-screenshots", name))
	if err != nil {
		t.Fatal(err)
	}
	b.shots = shots
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("REVIEW_SCREENSHOTS") != "" {
			b.screenshots()
		}
		b.mu.Lock()
		for _, c := range b.cancels {
			c()
		}
		b.mu.Unlock()
		cancelRoot()
		cancelAlloc()
	})
	return b
}

// tab is a page in its own browser context: its own cookies, as another
// person's browser would have.
type tab struct {
	b    *browser
	name string
	ctx  context.Context

	mu         sync.Mutex
	dialogs    []string
	exceptions []string
	failed     []string // "404 http://…": responses of 400 and above
}

func (b *browser) tab(name string, width, height int64) *tab {
	b.t.Helper()
	ctx, cancel := chromedp.NewContext(b.root, chromedp.WithNewBrowserContext())
	tb := &tab{b: b, name: name, ctx: ctx}
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(width, height)); err != nil {
		cancel()
		b.t.Fatalf("open a browser tab: %v", err)
	}
	err := chromedp.Listen(ctx, func(ev any) {
		switch e := ev.(type) {
		case *page.EventJavascriptDialogOpening:
			tb.mu.Lock()
			tb.dialogs = append(tb.dialogs, e.Message)
			tb.mu.Unlock()
			// A dialog blocks the page: close it, outside the event loop.
			go chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		case *runtime.EventExceptionThrown:
			tb.mu.Lock()
			tb.exceptions = append(tb.exceptions, e.ExceptionDetails.Text)
			tb.mu.Unlock()
		case *network.EventResponseReceived:
			if e.Response.Status >= 400 {
				tb.mu.Lock()
				tb.failed = append(tb.failed, fmt.Sprintf("%d %s", e.Response.Status, e.Response.URL))
				tb.mu.Unlock()
			}
		}
	})
	if err != nil {
		cancel()
		b.t.Fatalf("listen to the browser tab: %v", err)
	}
	b.mu.Lock()
	b.tabs = append(b.tabs, tb)
	b.cancels = append(b.cancels, cancel)
	b.mu.Unlock()
	return tb
}

// screenshots saves every open tab's page.
func (b *browser) screenshots() {
	if err := os.MkdirAll(b.shots, 0o755); err != nil {
		b.t.Logf("screenshots: %v", err)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, tb := range b.tabs {
		ctx, cancel := context.WithTimeout(tb.ctx, 10*time.Second)
		img, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		cancel()
		if err != nil {
			b.t.Logf("screenshot of tab %s: %v", tb.name, err)
			continue
		}
		if err := os.WriteFile(filepath.Join(b.shots, fmt.Sprintf("%02d-%s.png", i, tb.name)), img, 0o644); err != nil {
			b.t.Logf("screenshot: %v", err)
		}
	}
	b.t.Logf("screenshots of the test's pages: %s", b.shots)
}

// do runs browser steps with a deadline, failing the test on error.
func (tb *tab) do(t *testing.T, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 10*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("browser (%s): %v", tb.name, err)
	}
}

// eval evaluates a JavaScript expression in the tab (with
// chromedp.EvalAwaitPromise, the value its promise resolves to).
func eval[T any](t *testing.T, tb *tab, expr string, opts ...chromedp.EvaluateOption) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, opts...))
	if err != nil {
		t.Fatalf("browser (%s): evaluate %s: %v", tb.name, expr, err)
	}
	return v
}

// waitFor polls a JavaScript condition until it holds, for what has no
// element to wait on (a navigation that replaces a page with a similar
// one). An evaluation cut short by the navigation itself is retried.
func (tb *tab) waitFor(t *testing.T, cond string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(tb.ctx, time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](cond))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("browser (%s): timed out waiting for %s (last error %v)", tb.name, cond, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// text is the visible text of the page's main element.
func (tb *tab) text(t *testing.T) string {
	t.Helper()
	return eval[string](t, tb, `document.querySelector("main").innerText`)
}

// location is the page's current URL path and query.
func (tb *tab) location(t *testing.T) string {
	t.Helper()
	return eval[string](t, tb, `location.pathname + location.search`)
}

// wantText fails unless the main element's text contains each of want.
func (tb *tab) wantText(t *testing.T, want ...string) {
	t.Helper()
	got := tb.text(t)
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("page %s lacks %q; it reads:\n%s", tb.location(t), w, got)
		}
	}
}

// noScriptRan fails if any page script of the tab opened a dialog or threw.
func (tb *tab) noScriptRan(t *testing.T) {
	t.Helper()
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if len(tb.dialogs) > 0 || len(tb.exceptions) > 0 {
		t.Errorf("scripts ran in tab %s: dialogs %q, exceptions %q", tb.name, tb.dialogs, tb.exceptions)
	}
}

// noRequestFailed fails if any request the tab's pages made (documents,
// style sheets, scripts, images) was answered with an error status. The
// browser's own request for /favicon.ico is not among them: the page's
// network events do not show it.
func (tb *tab) noRequestFailed(t *testing.T) {
	t.Helper()
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if len(tb.failed) > 0 {
		t.Errorf("requests of tab %s failed: %q", tb.name, tb.failed)
	}
}

// writeReviewers writes a reviewers file, at bcrypt's lowest cost.
func writeReviewers(t *testing.T, accounts map[string]string) string {
	t.Helper()
	var b strings.Builder
	for name, pw := range accounts {
		h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(name + ":" + string(h) + "\n")
	}
	p := filepath.Join(t.TempDir(), "reviewers")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// signIn signs a tab in through the form.
func (tb *tab) signIn(t *testing.T, base, name, password string) {
	t.Helper()
	tb.do(t,
		chromedp.Navigate(base+"/review"),
		chromedp.WaitVisible(css("#name")),
		chromedp.SendKeys(css("#name"), name),
		chromedp.SendKeys(css("#password"), password),
		chromedp.Click(css(`form[action="/review/login"] button[type=submit]`)),
		chromedp.WaitVisible(css(`header.top form[action="/review/logout"]`)),
	)
}

// css selects the first element matching a CSS selector.
func css(sel string) chromedp.CSS { return chromedp.CSS(sel) }
