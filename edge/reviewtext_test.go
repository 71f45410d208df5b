package edge

import (
	"strings"
	"testing"
	"time"
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := marked(tc.in); got != tc.marked {
				t.Errorf("marked(%q) = %q, want %q", tc.in, got, tc.marked)
			}
			if got := unmarked(marked(tc.in)); got != tc.in {
				t.Errorf("unmarked(marked(%q)) = %q", tc.in, got)
			}
			html := string(visible(tc.in))
			for _, r := range tc.in {
				if isHidden(r) && strings.ContainsRune(html, r) {
					t.Errorf("visible(%q) keeps the hidden %U: %s", tc.in, r, html)
				}
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
