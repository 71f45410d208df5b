package eval

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode"
)

// A fact of the labels (required or forbidden): alternatives separated by
// " | ", each plain text or "re:" and a regular expression.
type fact struct {
	text string
	alts []alt
}

type alt struct {
	plain string         // normalised (normalise)
	re    *regexp.Regexp // or this
}

// factSep separates a fact's alternatives.
const factSep = " | "

func parseFact(s string) (fact, error) {
	if strings.TrimSpace(s) == "" {
		return fact{}, errors.New("empty fact")
	}
	f := fact{text: s}
	for part := range strings.SplitSeq(s, factSep) {
		if expr, ok := strings.CutPrefix(part, "re:"); ok {
			re, err := regexp.Compile(expr)
			if err != nil {
				return fact{}, fmt.Errorf("regular expression %q: %v", expr, err)
			}
			f.alts = append(f.alts, alt{re: re})
			continue
		}
		p := normalise(part)
		if p == "" {
			return fact{}, fmt.Errorf("fact %q has an empty alternative", s)
		}
		f.alts = append(f.alts, alt{plain: p})
	}
	return f, nil
}

// in reports whether any alternative occurs in text.
func (f fact) in(text string) bool {
	norm := normalise(text)
	for _, a := range f.alts {
		if a.re != nil && a.re.MatchString(text) || a.re == nil && strings.Contains(norm, a.plain) {
			return true
		}
	}
	return false
}

// example is how a good draft would state the fact (its first alternative,
// plain for required facts).
func (f fact) example() string {
	part, _, _ := strings.Cut(f.text, factSep)
	return part
}

// normalise lowercases, unifies typographic quotes and dashes, and
// collapses white space, so "Thursday  3 pm" matches "thursday 3 pm".
func normalise(s string) string {
	s = strings.Map(func(r rune) rune {
		switch r {
		case '\u2018', '\u2019', '\u201b', '\u2032':
			return '\''
		case '\u201c', '\u201d', '\u201f', '\u2033':
			return '"'
		case '\u2010', '\u2011', '\u2012', '\u2013', '\u2014', '\u2212':
			return '-'
		case '\u00a0', '\u202f':
			return ' '
		}
		return unicode.ToLower(r)
	}, s)
	return strings.Join(strings.Fields(s), " ")
}

// DraftCheck is the deterministic check of one draft against its labels.
type DraftCheck struct {
	Required  int      `json:"required"`
	Present   int      `json:"present"`
	Missing   []string `json:"missing,omitempty"`
	Forbidden []string `json:"forbidden,omitempty"` // forbidden facts found
	Judge     *Verdict `json:"judge,omitempty"`
}

// checkDraft checks a draft's text (subject and body) against the labels.
// The facts were validated when the set was loaded.
func checkDraft(text string, l Labels) *DraftCheck {
	c := &DraftCheck{Required: len(l.RequiredFacts)}
	for _, s := range l.RequiredFacts {
		f, _ := parseFact(s)
		if f.in(text) {
			c.Present++
		} else {
			c.Missing = append(c.Missing, s)
		}
	}
	for _, s := range l.Forbidden {
		f, _ := parseFact(s)
		if f.in(text) {
			c.Forbidden = append(c.Forbidden, s)
		}
	}
	return c
}
