package wire

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// invisible reports whether r shows nothing where a human reads it, or
// changes how the text around it shows: format characters (Cf: the bidi
// controls such as U+202E RIGHT-TO-LEFT OVERRIDE, zero-width spaces and
// joiners, the BOM), the other default-ignorable code points (Hangul fillers,
// U+034F), variation selectors, line and paragraph separators, and U+FFFD,
// which stands for bytes that were not text. In an identifier any of them can
// make one id look like another ("fdp.exe" shown as "exe.pdf").
func invisible(r rune) bool {
	if r < utf8.RuneSelf {
		// No ASCII code point is in any of these classes
		// (TestNoASCIIIsInvisible); identifiers and most text are ASCII.
		return false
	}
	return unicode.Is(unicode.Cf, r) || unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r) ||
		unicode.Is(unicode.Variation_Selector, r) || unicode.Is(unicode.Zl, r) || unicode.Is(unicode.Zp, r) ||
		r == utf8.RuneError
}

// identifierError refuses an identifier holding a control character or an
// invisible one (see invisible). The message names the code point, never
// the value.
func identifierError(field, s string) *Error {
	for _, r := range s {
		if unicode.IsControl(r) || invisible(r) {
			return invalidField(field, fmt.Sprintf("contains %U, a control, format or invisible character "+
				"(bidi control, zero-width character or similar): identifiers may not, since such a character "+
				"can make one id look like another", r))
		}
	}
	return nil
}

// addressError checks an e-mail address field ("Jo <jo@x.example>" or
// "jo@x.example"). The address itself is an identifier: no control or
// invisible character. The display name is a person's name as their mail
// client wrote it, where some scripts need joiners and right-to-left marks:
// it is kept (a review page shows such characters visibly), controls aside.
func addressError(field, v string) *Error {
	if i := strings.IndexFunc(v, unicode.IsControl); i >= 0 {
		r, _ := utf8.DecodeRuneInString(v[i:])
		return invalidField(field, fmt.Sprintf("contains %U, a control character", r))
	}
	addr := v
	if i := strings.LastIndexByte(v, '<'); i >= 0 {
		if j := strings.IndexByte(v[i:], '>'); j > 0 {
			addr = v[i+1 : i+j]
		}
	}
	if e := identifierError(field, addr); e != nil {
		e.Message = field + "'s address (the part in <>, or all of it) " + strings.TrimPrefix(e.Message, field+" ")
		return e
	}
	return nil
}
