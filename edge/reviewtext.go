package edge

import (
	"fmt"
	"html/template"
	"net/mail"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// What the review page shows of text it did not write (e-mails, drafts,
// ids): every character visible. A character that changes how the text
// around it reads without showing itself (a right-to-left override making
// "fdp.exe" read "exe.pdf", a zero-width space, a control character, a
// variation selector carrying a hidden message) is replaced by a visible
// marker, ⟦U+202E right-to-left override⟧, in what is displayed and in the
// form fields a reviewer edits. A marker left in an edited field stands for
// its character again when the form comes back, so an edit elsewhere
// neither drops nor hides it; deleting the marker deletes the character.
//
// Text that merely looks like a marker must not become its character: every
// ⟦ of the text itself is shown as a marker too (⟦U+27E6 bracket as
// written⟧), so a form sent back unchanged is exactly the text it showed,
// unmarked(marked(s)) == s for every s.

// markerOpen opens every marker.
const markerOpen = '⟦'

// hiddenNames names the hidden characters a reviewer is most likely to meet.
var hiddenNames = map[rune]string{
	0x00AD:     "soft hyphen",
	0x061C:     "Arabic letter mark",
	0x180E:     "Mongolian vowel separator",
	0x200B:     "zero-width space",
	0x200C:     "zero-width non-joiner",
	0x200D:     "zero-width joiner",
	0x200E:     "left-to-right mark",
	0x200F:     "right-to-left mark",
	0x2028:     "line separator",
	0x2029:     "paragraph separator",
	0x202A:     "left-to-right embedding",
	0x202B:     "right-to-left embedding",
	0x202C:     "pop directional formatting",
	0x202D:     "left-to-right override",
	0x202E:     "right-to-left override",
	0x2060:     "word joiner",
	0x2066:     "left-to-right isolate",
	0x2067:     "right-to-left isolate",
	0x2068:     "first strong isolate",
	0x2069:     "pop directional isolate",
	0x2800:     "braille blank",
	0xFEFF:     "zero-width no-break space",
	markerOpen: "bracket as written",
}

// isHidden reports whether r would not show itself: controls other than
// newline and tab, format characters (bidi controls, zero-width
// characters, tags), line and paragraph separators, variation selectors,
// the other default-ignorable code points (fillers, the grapheme joiner,
// Khmer's inherent vowels) and the braille blank.
func isHidden(r rune) bool {
	switch {
	case r == '\n' || r == '\t':
		return false
	case r < utf8.RuneSelf:
		return unicode.IsControl(r)
	case r == 0x2800, unicode.IsControl(r):
		return true
	}
	return unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp, unicode.Variation_Selector, unicode.Other_Default_Ignorable_Code_Point)
}

// shownAsMarker reports whether r, after prev, is shown as a marker: a
// hidden character or the text's own ⟦. An emoji's presentation selector
// (U+FE0E, U+FE0F right after a symbol, as in ❤️) is shown as it is: it
// only picks how the symbol is drawn, and one cannot carry a message.
func shownAsMarker(prev, r rune) bool {
	switch {
	case r == markerOpen:
		return true
	case (r == 0xFE0E || r == 0xFE0F) && prev >= utf8.RuneSelf && unicode.IsSymbol(prev):
		return false
	}
	return isHidden(r)
}

// marker is the visible stand-in of a hidden character.
func marker(r rune) string {
	name := hiddenNames[r]
	switch {
	case name != "":
	case unicode.IsControl(r):
		name = "control character"
	default:
		name = "invisible character"
	}
	return fmt.Sprintf("⟦U+%04X %s⟧", r, name)
}

// markerRe matches a marker as marker writes it.
var markerRe = regexp.MustCompile(`⟦U\+([0-9A-F]{4,6})(?: [^⟦⟧\n]{0,40})?⟧`)

// hiddenCount is how many characters of s are shown as markers.
func hiddenCount(s string) int {
	n, prev := 0, rune(0)
	for _, r := range s {
		if shownAsMarker(prev, r) {
			n++
		}
		prev = r
	}
	return n
}

// marked is s with each hidden character replaced by its marker: the
// value of a form field.
func marked(s string) string {
	if hiddenCount(s) == 0 {
		return s
	}
	var b strings.Builder
	prev := rune(0)
	for _, r := range s {
		if shownAsMarker(prev, r) {
			b.WriteString(marker(r))
		} else {
			b.WriteRune(r)
		}
		prev = r
	}
	return b.String()
}

// unmarked turns the markers in a submitted field back into their
// characters.
func unmarked(s string) string {
	return markerRe.ReplaceAllStringFunc(s, func(m string) string {
		sub := markerRe.FindStringSubmatch(m)
		n, err := strconv.ParseUint(sub[1], 16, 32)
		if err != nil || !utf8.ValidRune(rune(n)) || (rune(n) != markerOpen && !isHidden(rune(n))) {
			return m
		}
		return string(rune(n))
	})
}

// visible is s as HTML: escaped, each hidden character a marked-up marker.
func visible(s string) template.HTML {
	var b strings.Builder
	prev := rune(0)
	for _, r := range s {
		if shownAsMarker(prev, r) {
			b.WriteString(`<span class="hidden-char">`)
			b.WriteString(template.HTMLEscapeString(marker(r)))
			b.WriteString(`</span>`)
		} else {
			b.WriteString(template.HTMLEscapeString(string(r)))
		}
		prev = r
	}
	return template.HTML(b.String()) // every piece escaped above
}

// Long e-mail bodies are shown in part, the rest behind a "show" control.
const (
	previewRunes = 1500
	previewLines = 25
)

// splitPreview cuts s after previewLines lines or previewRunes characters,
// at a line end when there is one, and returns both parts; rest is "" when
// s is short.
func splitPreview(s string) (preview, rest string) {
	lines, runes := 0, 0
	for i, r := range s {
		runes++
		if r == '\n' {
			lines++
			if lines >= previewLines {
				return s[:i+1], s[i+1:]
			}
		}
		if runes >= previewRunes {
			cut := i + utf8.RuneLen(r)
			if nl := strings.LastIndexByte(s[:cut], '\n'); nl > cut/2 {
				cut = nl + 1
			}
			if cut >= len(s) {
				return s, ""
			}
			return s[:cut], s[cut:]
		}
	}
	return s, ""
}

// words turns a code such as quote_request into "Quote request".
func words(code string) string {
	if code == "" {
		return ""
	}
	s := strings.ReplaceAll(code, "_", " ")
	r, n := utf8.DecodeRuneInString(s)
	return string(unicode.ToUpper(r)) + s[n:]
}

// person is the display name of an address ("Jo Bloggs <jo@x>" → "Jo
// Bloggs"), or the address when it has none, or the text as it is.
func person(from string) (name, address string) {
	a, err := mail.ParseAddress(from)
	if err != nil {
		return from, ""
	}
	if a.Name == "" {
		return a.Address, a.Address
	}
	return a.Name, a.Address
}

// timeView is a time as the review page shows it: the instant for the
// browser (ISO), in the tenant's zone (Text), and relative to now.
type timeView struct {
	ISO      string
	Text     string
	Relative string
}

func (p *reviewClock) view(t time.Time) timeView {
	now := p.now()
	local := t.In(p.loc)
	layout := "Mon 2 Jan, 15:04 MST"
	if local.Year() != now.In(p.loc).Year() {
		layout = "Mon 2 Jan 2006, 15:04 MST"
	}
	tv := timeView{ISO: t.UTC().Format(time.RFC3339), Text: local.Format(layout)}
	if d := t.Sub(now); d >= 0 {
		tv.Relative = "in " + span(d)
	} else {
		tv.Relative = span(-d) + " ago"
	}
	return tv
}

// reviewClock is the review page's clock and time zone.
type reviewClock struct {
	loc *time.Location
	now func() time.Time
}

// span says a duration the way a person would: "45 min", "2 h 5 min",
// "3 days".
func span(d time.Duration) string {
	switch {
	case d < time.Minute:
		return "less than a minute"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + " min"
	case d < 48*time.Hour:
		h, m := int(d/time.Hour), int(d%time.Hour/time.Minute)
		if m == 0 || h >= 10 {
			return strconv.Itoa(h) + " h"
		}
		return strconv.Itoa(h) + " h " + strconv.Itoa(m) + " min"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + " days"
}
