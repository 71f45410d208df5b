package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// DocumentField is the field of the wire.Error (ErrorOf) of a problem with
// the document as a whole rather than one of its fields: a syntax error
// outside any field, data after the document, an empty body, a document
// that is not an object. A DecodeError leaves its Field empty then.
const DocumentField = "$"

// Limits on what a Field may carry: it names client-chosen keys, and it is
// both returned and logged.
const (
	maxKeyBytes   = 64
	maxFieldBytes = 256
)

// DecodeError says what was wrong with a JSON document and where. Field is a
// dotted path ("email.subject", "to[2]"), empty for the document as a whole
// (ErrorOf names it DocumentField). Keys in the path
// are as the client sent them when they are printable and short; otherwise
// escaped and cut (see Clip).
type DecodeError struct {
	Field   string
	Problem string
}

func (e *DecodeError) Error() string {
	if e.Field == "" {
		return "invalid JSON: " + e.Problem
	}
	return fmt.Sprintf("invalid JSON: field %q: %s", e.Field, e.Problem)
}

// Decode decodes data into v strictly. Unlike encoding/json it rejects:
// unknown fields, keys that differ from the declared name only in case,
// duplicate keys, null for a value that is not a pointer, slice or map,
// numbers out of range or with a fraction for an integer, values a type's own
// decoder refuses (a time that is not RFC 3339), trailing data after the
// document, invalid UTF-8 and lone UTF-16 surrogate escapes ("\ud800"), which
// encoding/json would silently turn into U+FFFD. Every rejection is a
// *DecodeError.
//
// v must be a pointer to a struct whose fields carry json tags.
func Decode(data []byte, v any) error {
	err := decode(data, v)
	var de *DecodeError
	if errors.As(err, &de) && len(de.Field) > maxFieldBytes {
		de.Field = Clip(de.Field, maxFieldBytes)
	}
	return err
}

func decode(data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		panic("wire.Decode: v must be a non-nil pointer")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	c := checker{dec: dec, data: data}
	if err := c.value(rv.Type().Elem(), ""); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &DecodeError{Problem: "unexpected data after the JSON document"}
	}
	// Every string was checked on the way; what is left is outside them.
	if !utf8.Valid(data) {
		return &DecodeError{Problem: "document is not valid UTF-8"}
	}
	// The walk above proved the shape; the standard decoder fills the value.
	std := json.NewDecoder(bytes.NewReader(data))
	std.DisallowUnknownFields()
	if err := std.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return &DecodeError{Field: te.Field, Problem: "expected " + te.Type.String()}
		}
		return &DecodeError{Problem: "the document does not decode"}
	}
	return nil
}

type checker struct {
	dec  *json.Decoder
	data []byte
}

var (
	rawMessageType  = reflect.TypeFor[json.RawMessage]()
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	timeType        = reflect.TypeFor[time.Time]()
)

// token reads the next token; for a string (a key or a value) it checks the
// literal as sent: valid UTF-8 and no lone surrogate escape.
func (c *checker) token(path string) (json.Token, error) {
	before := c.dec.InputOffset()
	tok, err := c.dec.Token()
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, &DecodeError{Field: path, Problem: "unexpected end of document"}
		}
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, &DecodeError{Field: path, Problem: fmt.Sprintf("syntax error at byte %d: %s", se.Offset, se.Error())}
		}
		return nil, &DecodeError{Field: path, Problem: "the document does not decode"}
	}
	if _, ok := tok.(string); ok {
		lit := c.data[before:c.dec.InputOffset()]
		if !utf8.Valid(lit) {
			return nil, &DecodeError{Field: path, Problem: "is not valid UTF-8"}
		}
		if loneSurrogate(lit) {
			return nil, &DecodeError{Field: path, Problem: "contains a lone UTF-16 surrogate escape (\\ud800 to \\udfff without its pair): it is no character"}
		}
	}
	return tok, nil
}

// key reads an object's key: a string token, checked as token does, with a
// problem in the key itself reported as such.
func (c *checker) key(path string) (string, error) {
	tok, err := c.token(path)
	if err != nil {
		var de *DecodeError
		if errors.As(err, &de) && de.Field == path && (strings.HasPrefix(de.Problem, "is not") || strings.HasPrefix(de.Problem, "contains")) {
			de.Problem = "a key " + de.Problem
		}
		return "", err
	}
	key, ok := tok.(string)
	if !ok {
		return "", &DecodeError{Field: path, Problem: "object key is not a string"}
	}
	return key, nil
}

// value checks the next JSON value against type t.
func (c *checker) value(t reflect.Type, path string) error {
	start := c.dec.InputOffset()
	tok, err := c.token(path)
	if err != nil {
		return err
	}
	return c.valueFrom(tok, t, path, start)
}

// valueFrom checks a value whose first token is tok, read from start on.
func (c *checker) valueFrom(tok json.Token, t reflect.Type, path string, start int64) error {
	if tok == nil { // JSON null
		switch t.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Map, reflect.Interface:
			return nil
		}
		if t == rawMessageType {
			return nil
		}
		return &DecodeError{Field: path, Problem: "must not be null"}
	}
	// Interfaces and raw messages are checked for duplicate keys only.
	if t.Kind() == reflect.Interface || t == rawMessageType {
		return c.any(tok, path)
	}
	// Types with their own decoding (time.Time, …) are walked for duplicate
	// keys, then decoded on their own, so that what they refuse is reported
	// with its field.
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		if err := c.any(tok, path); err != nil {
			return err
		}
		raw := bytes.TrimLeft(c.data[start:c.dec.InputOffset()], " \t\r\n,:")
		if err := json.Unmarshal(raw, reflect.New(t).Interface()); err != nil {
			if t == timeType {
				return &DecodeError{Field: path, Problem: "expected an RFC 3339 date-time string such as \"2026-01-31T09:30:00Z\""}
			}
			return &DecodeError{Field: path, Problem: "is not a valid " + t.String()}
		}
		return nil
	}
	if t.Kind() == reflect.Pointer {
		return c.valueFrom(tok, t.Elem(), path, start)
	}
	switch t.Kind() {
	case reflect.Struct:
		if tok != json.Delim('{') {
			return typeError(path, "an object", tok)
		}
		return c.object(path, func(key, p string) error {
			f, ok := structField(t, key)
			if !ok {
				return &DecodeError{Field: p, Problem: "unknown field"}
			}
			return c.value(f.Type, p)
		})
	case reflect.Map:
		if tok != json.Delim('{') {
			return typeError(path, "an object", tok)
		}
		if t.Key().Kind() != reflect.String {
			return &DecodeError{Field: path, Problem: "unsupported map key type"}
		}
		return c.object(path, func(_, p string) error { return c.value(t.Elem(), p) })
	case reflect.Slice, reflect.Array:
		if tok != json.Delim('[') {
			return typeError(path, "an array", tok)
		}
		for i := 0; c.dec.More(); i++ {
			if t.Kind() == reflect.Array && i >= t.Len() {
				return &DecodeError{Field: path, Problem: fmt.Sprintf("at most %d elements", t.Len())}
			}
			if err := c.value(t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		_, err := c.token(path) // ']'
		return err
	case reflect.String:
		if _, ok := tok.(string); !ok {
			return typeError(path, "a string", tok)
		}
		return nil
	case reflect.Bool:
		if _, ok := tok.(bool); !ok {
			return typeError(path, "true or false", tok)
		}
		return nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := tok.(json.Number)
		if !ok {
			return typeError(path, "an integer", tok)
		}
		i, err := strconv.ParseInt(n.String(), 10, 64)
		if err != nil || i < minInt(t) || i > maxInt(t) {
			return &DecodeError{Field: path, Problem: fmt.Sprintf("expected an integer in range, got %s", n)}
		}
		return nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, ok := tok.(json.Number)
		if !ok {
			return typeError(path, "a non-negative integer", tok)
		}
		u, err := strconv.ParseUint(n.String(), 10, 64)
		if err != nil || u > maxUint(t) {
			return &DecodeError{Field: path, Problem: fmt.Sprintf("expected a non-negative integer in range, got %s", n)}
		}
		return nil
	case reflect.Float32, reflect.Float64:
		n, ok := tok.(json.Number)
		if !ok {
			return typeError(path, "a number", tok)
		}
		f, err := n.Float64()
		if err != nil || math.IsInf(f, 0) || (t.Kind() == reflect.Float32 && math.Abs(f) > math.MaxFloat32) {
			return &DecodeError{Field: path, Problem: fmt.Sprintf("number %s out of range", n)}
		}
		return nil
	}
	return &DecodeError{Field: path, Problem: "unsupported type " + t.String()}
}

// object walks the members of an object whose '{' was already read,
// rejecting duplicate keys, and calls member for each key.
func (c *checker) object(path string, member func(key, path string) error) error {
	seen := map[string]bool{}
	for c.dec.More() {
		key, err := c.key(path)
		if err != nil {
			return err
		}
		p := joinPath(path, key)
		if seen[key] {
			return &DecodeError{Field: p, Problem: "duplicate key"}
		}
		seen[key] = true
		if err := member(key, p); err != nil {
			return err
		}
	}
	_, err := c.token(path) // '}'
	return err
}

// any checks a value of unknown type for duplicate keys.
func (c *checker) any(tok json.Token, path string) error {
	switch tok {
	case json.Delim('{'):
		return c.object(path, func(_, p string) error {
			t, err := c.token(p)
			if err != nil {
				return err
			}
			return c.any(t, p)
		})
	case json.Delim('['):
		for i := 0; c.dec.More(); i++ {
			t, err := c.token(path)
			if err != nil {
				return err
			}
			if err := c.any(t, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		_, err := c.token(path)
		return err
	}
	return nil
}

func typeError(path, want string, tok json.Token) error {
	return &DecodeError{Field: path, Problem: "expected " + want + ", got " + describe(tok)}
}

func describe(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		if v == '{' {
			return "an object"
		}
		return "an array"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", tok)
}

// joinPath appends a key to a field path, the key escaped and cut to
// maxKeyBytes (see Clip): the path is returned to the client and logged.
func joinPath(path, key string) string {
	key = Clip(key, maxKeyBytes)
	if path == "" {
		return key
	}
	return path + "." + key
}

// Clip makes a client-chosen string safe to return and to log: at most max
// bytes, with what a reader would not see as itself escaped (control, format
// and other invisible characters as \u escapes, bytes that are not UTF-8 as
// \x escapes) and "…" where it was cut.
func Clip(s string, max int) string {
	clean := true
	for _, r := range s {
		if r == '\\' || !unicode.IsPrint(r) || invisible(r) {
			clean = false
			break
		}
	}
	if clean && len(s) <= max {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		var piece string
		switch {
		case r == utf8.RuneError && size == 1:
			piece = fmt.Sprintf("\\x%02x", s[i])
		case r == '\\':
			piece = `\\`
		case !unicode.IsPrint(r) || invisible(r):
			if r > 0xffff {
				piece = fmt.Sprintf("\\U%08x", r)
			} else {
				piece = fmt.Sprintf("\\u%04x", r)
			}
		default:
			piece = s[i : i+size]
		}
		if b.Len()+len(piece) > max-len("…") {
			b.WriteString("…")
			return b.String()
		}
		b.WriteString(piece)
		i += size
	}
	return b.String()
}

// loneSurrogate reports whether a JSON string literal, as sent, has a \u
// escape of a UTF-16 surrogate that is not half of a high-low pair.
func loneSurrogate(lit []byte) bool {
	for i := 0; i < len(lit); i++ {
		if lit[i] != '\\' {
			continue
		}
		if i+1 < len(lit) && lit[i+1] != 'u' {
			i++ // \", \\, \n, …: the escaped byte is not an escape
			continue
		}
		if i+6 > len(lit) {
			return false // a malformed escape is the tokenizer's syntax error
		}
		r := hex4(lit[i+2 : i+6])
		switch {
		case r >= 0xd800 && r < 0xdc00:
			if i+12 <= len(lit) && lit[i+6] == '\\' && lit[i+7] == 'u' {
				if lo := hex4(lit[i+8 : i+12]); lo >= 0xdc00 && lo < 0xe000 {
					i += 11
					continue
				}
			}
			return true
		case r >= 0xdc00 && r < 0xe000:
			return true
		}
		i += 5
	}
	return false
}

func hex4(b []byte) rune {
	n, err := strconv.ParseUint(string(b), 16, 16)
	if err != nil {
		return -1
	}
	return rune(n)
}

// structField finds the field whose json name is exactly key (encoding/json
// would also accept a case-insensitive match; a strict decoder does not).
func structField(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if name == key {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func minInt(t reflect.Type) int64 { return -1 << (t.Bits() - 1) }
func maxInt(t reflect.Type) int64 { return 1<<(t.Bits()-1) - 1 }
func maxUint(t reflect.Type) uint64 {
	if t.Bits() == 64 {
		return math.MaxUint64
	}
	return 1<<t.Bits() - 1
}
