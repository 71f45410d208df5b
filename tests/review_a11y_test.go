package tests

import (
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// a11yChecks is run in a page: every problem it finds with forms, labels
// and meaning carried by colour alone, as text.
const a11yChecks = `(() => {
  const p = [];
  const text = e => (e && e.textContent || "").trim();
  const name = e => e.id ? "#" + e.id : e.tagName.toLowerCase() + (e.name ? "[name=" + e.name + "]" : "") +
    (e.getAttribute("action") ? "[action=" + e.getAttribute("action") + "]" : "");
  const heading = e => !!e && /^H[1-6]$/.test(e.tagName) && text(e) !== "";
  // Every form has a heading: inside it, or naming it (aria-labelledby). A
  // form of one button and no fields (sign out) is named by its button.
  for (const f of document.forms) {
    const fields = [...f.elements].filter(e => e.type !== "hidden" && e.tagName !== "BUTTON");
    if (fields.length === 0) {
      const buttons = [...f.querySelectorAll("button")].filter(b => !b.hidden);
      if (buttons.length !== 1 || text(buttons[0]) === "") p.push("form " + name(f) + ": no fields, and not one button with words");
      continue;
    }
    const inside = [...f.querySelectorAll("h1, h2, h3, h4, h5, h6")].some(heading);
    const named = (f.getAttribute("aria-labelledby") || "").split(/\s+/).some(id => heading(document.getElementById(id)));
    if (!inside && !named) p.push("form " + name(f) + ": no heading");
  }
  // Every field has a label: label[for] (or around it), aria-label, or aria-labelledby, with words.
  for (const e of document.querySelectorAll("input, select, textarea")) {
    if (e.type === "hidden") continue;
    const labels = [...(e.labels || [])].filter(l => text(l) !== "");
    const aria = (e.getAttribute("aria-label") || "").trim();
    const by = (e.getAttribute("aria-labelledby") || "").split(/\s+/).filter(id => text(document.getElementById(id)) !== "");
    if (labels.length === 0 && aria === "" && by.length === 0) p.push(name(e) + ": no label");
  }
  // Meaning is never colour alone: each coloured mark says in words what its colour does.
  const levels = {};
  for (const b of document.querySelectorAll(".prio")) {
    const t = text(b).toLowerCase();
    if (t === "") { p.push("a priority badge without words"); continue; }
    const lvl = [...b.classList].find(c => c.startsWith("prio-"));
    if (!lvl) continue;
    const word = lvl === "prio-none" ? "no priority" : lvl.slice(5);
    if (!t.includes(word)) p.push("badge " + lvl + " reads " + JSON.stringify(t) + ", not " + JSON.stringify(word));
    (levels[t] ??= new Set()).add(lvl);
  }
  for (const [t, set] of Object.entries(levels)) if (set.size > 1) p.push("badges " + [...set].join(", ") + " all read " + JSON.stringify(t));
  for (const e of document.querySelectorAll(".late")) if (!/expired/i.test(text(e))) p.push(".late reads " + JSON.stringify(text(e)));
  for (const e of document.querySelectorAll(".error")) if (text(e) === "" || e.getAttribute("role") !== "alert") p.push(".error without words or role=alert");
  for (const e of document.querySelectorAll(".field-error")) if (text(e) === "") p.push(".field-error without words");
  for (const e of document.querySelectorAll(".done")) if (![...e.querySelectorAll("h1, h2, h3")].some(heading)) p.push(".done without a heading");
  for (const e of document.querySelectorAll(".hidden-char")) if (!text(e).startsWith("⟦")) p.push(".hidden-char reads " + JSON.stringify(text(e)));
  for (const e of document.querySelectorAll(".notice")) if (text(e) === "") p.push(".notice without words");
  const approve = document.querySelector("button.approve"), reject = document.querySelector("button.reject");
  if (approve && reject && (text(approve) === "" || text(approve) === text(reject))) p.push("approve and reject buttons differ by colour only");
  return p;
})()`

// focusStep is what the focused element shows after a Tab.
const focusStep = `(() => {
  const e = document.activeElement;
  if (!e || e === document.body || e === document.documentElement) return {id: 0};
  window.__focusIDs ??= new Map();
  let id = window.__focusIDs.get(e);
  if (id === undefined) { id = window.__focusIDs.size + 1; window.__focusIDs.set(e, id); }
  const s = getComputedStyle(e), r = e.getBoundingClientRect();
  return {id, what: e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") + " " + JSON.stringify((e.textContent || e.name || "").trim().slice(0, 40)),
    style: s.outlineStyle, width: parseFloat(s.outlineWidth) || 0, color: s.outlineColor, w: r.width, h: r.height};
})()`

// audit checks the page the tab shows: forms, labels and colour (a11yChecks)
// and, Tabbing through every element that takes the focus, that each shows
// a visible focus outline. It returns how many elements took the focus.
func (tb *tab) audit(t *testing.T, page string) int {
	t.Helper()
	for _, p := range eval[[]string](t, tb, a11yChecks) {
		t.Errorf("%s: %s", page, p)
	}
	tb.do(t, chromedp.Evaluate[chromedp.Void](`window.__focusIDs = new Map(); document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0)`))
	stops := 0
	for i := 0; i < 120; i++ {
		tb.do(t, chromedp.KeyEvent(kb.Tab))
		f := eval[struct {
			ID          int
			What, Style string
			Width       float64
			Color       string
			W, H        float64
		}](t, tb, focusStep)
		if f.ID == 0 {
			if stops > 0 {
				return stops // past the last element
			}
			continue
		}
		if f.ID <= stops {
			return stops // round again to the first
		}
		stops++
		if f.Style == "none" || f.Style == "hidden" || f.Width < 2 || f.Color == "rgba(0, 0, 0, 0)" || f.Color == "transparent" {
			t.Errorf("%s: focused %s shows no visible focus (outline %s %vpx %s)", page, f.What, f.Style, f.Width, f.Color)
		}
		if f.W == 0 || f.H == 0 {
			t.Errorf("%s: focused %s is not on the page (%vx%v)", page, f.What, f.W, f.H)
		}
	}
	t.Fatalf("%s: Tab never came round to the first element again", page)
	return stops
}

// tabTo presses Tab until the focused element matches a CSS selector.
func (tb *tab) tabTo(t *testing.T, sel string) {
	t.Helper()
	for i := 0; i < 60; i++ {
		tb.do(t, chromedp.KeyEvent(kb.Tab))
		if eval[bool](t, tb, fmt.Sprintf(`document.activeElement.matches(%q)`, sel)) {
			return
		}
	}
	t.Fatalf("Tab never reached %s on %s", sel, tb.location(t))
}

// TestReviewPageAccessible checks every kind of review page in a real
// browser: each form has a heading, each field a label, the element with
// the focus a visible outline, and no meaning is carried by colour alone;
// and a reviewer signs in, opens an approval from the list, rejects it,
// goes on to the next and approves it with the keyboard only.
func TestReviewPageAccessible(t *testing.T) {
	rs := newReviewSystem(t, "a11y-a", nil)
	base := rs.edge.base
	jo := rs.submitEmail(t, "<jo@customer.example>", "Jo Bloggs <jo@customer.example>", "Quote for a new deck please", "Hi, could you quote for a deck? Jo")
	job := rs.submitEmail(t, "<leak@smith.example>", "Smith & Sons <office@smith.example>", "Leak in the kitchen", "Water everywhere.")
	low := rs.submitEmail(t, "<hi@low.example>", "Larry <larry@low.example>", "hello from Larry", "Just saying hello.")
	hostile := rs.submitEmail(t, "<hostile@evil.example>", "Mallory \u202Efdp.exe <m@evil.example>", "hostile file", "see report\u202Efdp.exe\u200b")
	late := rs.submitEmail(t, "<late@customer.example>", "Lee <lee@customer.example>", "a question, late", "Which tiles?")
	if _, err := rs.tenantDB(rs.tenantID).Exec(t.Context(),
		`UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = $1`, late); err != nil {
		t.Fatal(err)
	}
	kbd := rs.browser.tab("keyboard", 1280, 900)

	t.Run("SignInPage", func(t *testing.T) {
		kbd.do(t, chromedp.Navigate(base+"/review"), chromedp.WaitVisible(css("#name")))
		kbd.audit(t, "sign-in page")
		// Keyboard only: Tab to the name, type, Tab to the password, type, Enter.
		kbd.do(t, chromedp.Evaluate[chromedp.Void](`document.activeElement.blur()`))
		kbd.tabTo(t, "#name")
		kbd.do(t, chromedp.KeyEvent("alice"))
		kbd.tabTo(t, "#password")
		kbd.do(t, chromedp.KeyEvent(alicePassword), chromedp.KeyEvent(kb.Enter),
			chromedp.WaitVisible(css(`header.top form[action="/review/logout"]`)))
		if loc := kbd.location(t); loc != "/review" {
			t.Fatalf("signed in with the keyboard: at %s, want /review", loc)
		}
	})

	t.Run("Pages", func(t *testing.T) {
		for _, pg := range []struct{ name, path, wait string }{
			{"list", "/review", "ol.queue"},
			{"list, nothing found", "/review?q=nobody-at-all", "main h1"},
			{"reply approval", "/review/approvals/" + jo, "#approve-form"},
			{"job approval", "/review/approvals/" + job, "#approve-form"},
			{"approval with hidden characters", "/review/approvals/" + hostile, "#approve-form"},
			{"expired approval", "/review/approvals/" + late, "main h1"},
			{"no such approval", "/review/approvals/not-an-approval", "main h1"},
		} {
			kbd.do(t, chromedp.Navigate(base+pg.path), chromedp.WaitVisible(css(pg.wait)))
			n := kbd.audit(t, pg.name)
			t.Logf("%s: %d focus stops", pg.name, n)
			if n < 3 {
				t.Errorf("%s: only %d elements take the focus", pg.name, n)
			}
		}
		// The pages audited have what the checks look at.
		kbd.do(t, chromedp.Navigate(base+"/review"), chromedp.WaitVisible(css("ol.queue")))
		if n := eval[int](t, kbd, `document.querySelectorAll(".prio.prio-urgent, .prio.prio-high, .prio.prio-low").length`); n < 3 {
			t.Errorf("the list shows %d urgent, high and low badges, want one of each at least", n)
		}
	})

	t.Run("KeyboardRejectThenApproveNext", func(t *testing.T) {
		kbd.do(t, chromedp.Navigate(base+"/review"), chromedp.WaitVisible(css("ol.queue")),
			chromedp.Evaluate[chromedp.Void](`document.activeElement.blur()`))
		kbd.tabTo(t, `a[href="/review/approvals/`+low+`"]`)
		kbd.do(t, chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(css("#reject-form")),
			chromedp.Evaluate[chromedp.Void](`document.activeElement.blur()`))
		kbd.tabTo(t, "#reason")
		kbd.do(t, chromedp.KeyEvent("We do not reply to greetings."))
		kbd.tabTo(t, `#reject-form button[value=reject]`)
		kbd.do(t, chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(css("#done-h")))
		kbd.wantText(t, "Rejected", "Nothing will be sent or created")
		if status, by, _, reason := rs.approvalRow(t, low); status != "rejected" || by != "reviewer:alice" || reason != "We do not reply to greetings." {
			t.Fatalf("keyboard rejection recorded %s by %s because %q", status, by, reason)
		}
		kbd.audit(t, "confirmation of a rejection")

		// On to the next with the keyboard, and approve it.
		kbd.do(t, chromedp.Evaluate[chromedp.Void](`document.activeElement.blur()`))
		kbd.tabTo(t, "#next")
		next := eval[string](t, kbd, `document.activeElement.getAttribute("href")`)
		kbd.do(t, chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(css("#approve-form")),
			chromedp.Evaluate[chromedp.Void](`document.activeElement.blur()`))
		if loc := kbd.location(t); loc != next {
			t.Fatalf("Enter on Next went to %s, want %s", loc, next)
		}
		kbd.tabTo(t, `#approve-form button[value=approve]`)
		kbd.do(t, chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(css("#done-h")))
		id := strings.TrimPrefix(next, "/review/approvals/")
		if status, by, _, _ := rs.approvalRow(t, id); status != "approved" || by != "reviewer:alice" {
			t.Fatalf("keyboard approval of the next item recorded %s by %s", status, by)
		}
		kbd.audit(t, "confirmation of an approval")
		// The decided approval, read back.
		kbd.do(t, chromedp.Navigate(base+"/review/approvals/"+low), chromedp.WaitVisible(css("main h1")))
		kbd.audit(t, "a rejected approval")
		kbd.noScriptRan(t)
	})
}
