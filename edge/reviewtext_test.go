package edge

import (
	"html/template"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestHiddenCharactersAreVisible(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in, marked string
	}{
		{"RightToLeftOverride", "report\u202Efdp.exe", "report⟦U+202E right-to-left override⟧fdp.exe"},
		{"ZeroWidthSpace", "pay\u200Bpal", "pay⟦U+200B zero-width space⟧pal"},
		{"Isolate", "\u2067abc\u2069", "⟦U+2067 right-to-left isolate⟧abc⟦U+2069 pop directional isolate⟧"},
		{"Escape", "a\x1bb", "a⟦U+001B control character⟧b"},
		{"Tag", "x\U000E0041", "x⟦U+E0041 invisible character⟧"},
		{"PlainTextKept", "Hi Jo,\n\tthanks — ok? مرحبا 你好", "Hi Jo,\n\tthanks — ok? مرحبا 你好"},
		// Text shaped like a marker stays text: its ⟦ is marked.
		{"LiteralMarker", "refund⟦U+202E see attached⟧fdp.exe", "refund⟦U+27E6 bracket as written⟧U+202E see attached⟧fdp.exe"},
		{"LiteralControlMarker", ".⟦U+000D⟧", ".⟦U+27E6 bracket as written⟧U+000D⟧"},
		// Variation selectors carry a message byte by byte ("hi"), and
		// others render as nothing: all marked.
		{"SmuggledInSelectors", "OK\U000E0158\U000E0159", "OK⟦U+E0158 invisible character⟧⟦U+E0159 invisible character⟧"},
		{"Selector", "a\uFE0F", "a⟦U+FE0F invisible character⟧"},
		{"KhmerInherentVowel", "x\u17B4", "x⟦U+17B4 invisible character⟧"},
		{"MongolianSelector", "x\u180B", "x⟦U+180B invisible character⟧"},
		{"BrailleBlank", "x\u2800y", "x⟦U+2800 braille blank⟧y"},
		{"HangulFiller", "\u3164", "⟦U+3164 invisible character⟧"},
		{"LatinOneControl", "a\u0085b", "a⟦U+0085 control character⟧b"},
		// An emoji's presentation selector only picks how it is drawn.
		{"EmojiPresentation", "thanks ❤\uFE0F ☺\uFE0E", "thanks ❤\uFE0F ☺\uFE0E"},
		{"SecondSelectorAfterEmoji", "❤\uFE0F\uFE0F", "❤\uFE0F⟦U+FE0F invisible character⟧"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := marked(tc.in); got != tc.marked {
				t.Errorf("marked(%q) = %q, want %q", tc.in, got, tc.marked)
			}
			if got := unmarked(marked(tc.in)); got != tc.in {
				t.Errorf("unmarked(marked(%q)) = %q", tc.in, got)
			}
			html := string(visible(tc.in))
			if want := template.HTMLEscapeString(tc.marked); strings.ReplaceAll(strings.ReplaceAll(html, `<span class="hidden-char">`, ""), "</span>", "") != want {
				t.Errorf("visible(%q) = %s, want the markers of %q", tc.in, html, tc.marked)
			}
			if want := strings.Count(tc.marked, "⟦"); hiddenCount(tc.in) != want {
				t.Errorf("hiddenCount(%q) = %d, want %d (its markers)", tc.in, hiddenCount(tc.in), want)
			}
		})
	}
	// A marker for a character that is not hidden is text, not a character.
	if got := unmarked("⟦U+0041 letter A⟧"); got != "⟦U+0041 letter A⟧" {
		t.Errorf("unmarked turned a visible character's marker into %q", got)
	}
	if got := string(visible(`<script>&"`)); got != "&lt;script&gt;&amp;&#34;" {
		t.Errorf("visible does not escape: %s", got)
	}
	if got := string(visible("a\u202Eb")); got != `a<span class="hidden-char">⟦U+202E right-to-left override⟧</span>b` {
		t.Errorf("visible marks up: %s", got)
	}
}

// What a form shows comes back as it was: unmarked(marked(s)) == s, so a
// form sent back unchanged is an approval as proposed, and no text of the
// draft (a marker typed as text) becomes a character the page never had.
func FuzzMarkedRoundTrips(f *testing.F) {
	for _, s := range []string{"", "plain", "a\u202Eb", "⟦U+202E x⟧", "⟦U+27E6 bracket as written⟧", "⟦⟦U+200B⟧⟧", "❤\uFE0F", "\r\n.\r\n", "\U000E0100"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return // form values and drafts are UTF-8 (the catalogue refuses anything else)
		}
		m := marked(s)
		if got := unmarked(m); got != s {
			t.Fatalf("unmarked(marked(%+q)) = %+q", s, got)
		}
		prev := rune(0)
		for _, r := range m {
			if r != markerOpen && shownAsMarker(prev, r) {
				t.Fatalf("marked(%+q) = %+q keeps %U", s, m, r)
			}
			prev = r
		}
	})
}

func TestSplitPreview(t *testing.T) {
	t.Parallel()
	short := "Hi,\nplease quote.\n"
	if p, r := splitPreview(short); p != short || r != "" {
		t.Errorf("a short body was split: %q %q", p, r)
	}
	long := strings.Repeat("line of text\n", 100)
	p, r := splitPreview(long)
	if p+r != long || strings.Count(p, "\n") != previewLines {
		t.Errorf("by lines: %d lines shown, parts join: %v", strings.Count(p, "\n"), p+r == long)
	}
	wide := strings.Repeat("word ", 1000)
	p, r = splitPreview(wide)
	if p+r != wide || len([]rune(p)) != previewRunes {
		t.Errorf("by characters: %d shown", len([]rune(p)))
	}
}

func TestWords(t *testing.T) {
	t.Parallel()
	if got := words("quote_request"); got != "Quote request" {
		t.Errorf("words: %q", got)
	}
	for in, want := range map[string][2]string{
		"Jo Bloggs <jo@x.example>": {"Jo Bloggs", "jo@x.example"},
		"jo@x.example":             {"jo@x.example", "jo@x.example"},
		"not an address":           {"not an address", ""},
	} {
		if n, a := person(in); n != want[0] || a != want[1] {
			t.Errorf("person(%q) = %q, %q", in, n, a)
		}
	}
	for d, want := range map[time.Duration]string{
		30 * time.Second: "less than a minute", 45 * time.Minute: "45 min", 2*time.Hour + 5*time.Minute: "2 h 5 min",
		3 * time.Hour: "3 h", 11*time.Hour + 30*time.Minute: "11 h", 72 * time.Hour: "3 days",
	} {
		if got := span(d); got != want {
			t.Errorf("span(%s) = %q, want %q", d, got, want)
		}
	}
	syd, err := time.LoadLocation("Australia/Sydney")
	must(t, err)
	now := time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
	c := &reviewClock{loc: syd, now: func() time.Time { return now }}
	tv := c.view(now.Add(2*time.Hour + 5*time.Minute))
	if tv.Text != "Mon 2 Mar, 13:05 AEDT" || tv.Relative != "in 2 h 5 min" || tv.ISO != "2026-03-02T02:05:00Z" {
		t.Errorf("view: %+v", tv)
	}
	if tv := c.view(now.Add(-10 * time.Minute)); tv.Relative != "10 min ago" {
		t.Errorf("past: %+v", tv)
	}
}
