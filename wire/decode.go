package wire

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf16"
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
// encoding/json would silently turn into U+FFFD, a value other than a
// string for a type that decodes itself from text (uuid.UUID, netip.Addr),
// a quoted json.Number. Every rejection is a *DecodeError, and v may then be
// partly filled. A struct that embeds another without naming it in a json
// tag is refused as unsupported (encoding/json promotes the embedded
// fields; this decoder does not).
//
// What it accepts, it stores as encoding/json would, in the same pass over
// the bytes (FuzzScannerMatchesTheTokenWalk compares the two).
//
// v must be a pointer to a struct whose fields carry json tags, holding its
// zero value: unlike encoding/json, elements already in a slice are zeroed
// before they are decoded into, not merged with.
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
	s := scanner{data: data}
	if err := s.value(rv.Elem(), rv.Type().Elem(), nil); err != nil {
		return err
	}
	s.space()
	if s.pos < len(s.data) {
		return &DecodeError{Problem: "unexpected data after the JSON document"}
	}
	return nil
}

// maxDepth is encoding/json's own limit on nesting.
const maxDepth = 10000

var (
	rawMessageType      = reflect.TypeFor[json.RawMessage]()
	numberType          = reflect.TypeFor[json.Number]()
	unmarshalerType     = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	timeType            = reflect.TypeFor[time.Time]()
)

// typeInfo is what the scanner needs of a Go type, worked out once.
type typeInfo struct {
	unmarshaler bool // *T decodes itself (time.Time, …)
	// text: *T decodes itself from text (encoding.TextUnmarshaler): the
	// value must be a string, which encoding/json then gives the method.
	text bool
	// standard: a map keyed by such a type, checked by the scanner and
	// filled by encoding/json, whose rules for its keys the scanner does
	// not repeat.
	standard bool
	fields   map[string]fieldInfo // a struct's fields by exact json name
	// unsupported says why the decoder refuses the type (an embedded struct).
	unsupported string
}

type fieldInfo struct {
	typ   reflect.Type
	index int
}

var typeInfos sync.Map // reflect.Type → *typeInfo

func infoOf(t reflect.Type) *typeInfo {
	if ti, ok := typeInfos.Load(t); ok {
		return ti.(*typeInfo)
	}
	pt := reflect.PointerTo(t)
	ti := &typeInfo{unmarshaler: pt.Implements(unmarshalerType)}
	ti.text = !ti.unmarshaler && pt.Implements(textUnmarshalerType)
	switch t.Kind() {
	case reflect.Map:
		ti.standard = !ti.unmarshaler && !ti.text && reflect.PointerTo(t.Key()).Implements(textUnmarshalerType)
	case reflect.Struct:
		ti.fields = map[string]fieldInfo{}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			// (A type that decodes itself uses no field of its own.)
			if f.Anonymous && name == "" && ft.Kind() == reflect.Struct && !ti.unmarshaler && !ti.text {
				ti.unsupported = "it embeds " + f.Type.String() + " without a json name"
			}
			if !f.IsExported() {
				continue
			}
			if name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			if _, dup := ti.fields[name]; !dup { // the first field of a name wins, as in structField
				ti.fields[name] = fieldInfo{typ: f.Type, index: i}
			}
		}
	}
	typeInfos.Store(t, ti)
	return ti
}

// path is where the scanner is: a chain of members and elements, rendered
// as a dotted path ("email.to[2]") only when there is an error to report.
type path struct {
	up    *path
	key   string
	index int
	elem  bool // an array element (index), else an object member (key)
}

func (p *path) String() string {
	if p == nil {
		return ""
	}
	if p.elem {
		return p.up.String() + "[" + strconv.Itoa(p.index) + "]"
	}
	return joinPath(p.up.String(), p.key)
}

// scanner checks a JSON document against a Go type in one pass over its
// bytes, with encoding/json's grammar, filling the value as it goes, and
// reports every problem as a *DecodeError naming the field where
// encoding/json's tokenizer would have met it.
type scanner struct {
	data  []byte
	pos   int
	depth int
	// colon is set after an object's key, comma between an array's
	// elements: the next value must be preceded by it, checked where the
	// value is read (so a problem is reported where encoding/json's
	// tokenizer reports it, after the key's or the length's own checks).
	colon, comma bool
}

func (s *scanner) space() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// syntax is the error at s.pos: the end of the document, or a byte that
// may not be there.
func (s *scanner) syntax(p *path, context string) error {
	if s.pos >= len(s.data) {
		return &DecodeError{Field: p.String(), Problem: "unexpected end of document"}
	}
	c := s.data[s.pos]
	what := fmt.Sprintf("invalid character %q", rune(c))
	if c >= utf8.RuneSelf {
		what = fmt.Sprintf("invalid byte 0x%02x", c)
	}
	return &DecodeError{Field: p.String(), Problem: fmt.Sprintf("syntax error at byte %d: %s %s", s.pos+1, what, context)}
}

// start moves to the first byte of a value (past the colon after a key);
// it fails at the end of the document.
func (s *scanner) start(p *path) error {
	s.space()
	if s.comma {
		if s.pos >= len(s.data) || s.data[s.pos] != ',' {
			return s.syntax(p, "after array element")
		}
		s.comma = false
		s.pos++
		s.space()
	}
	if s.colon {
		if s.pos >= len(s.data) || s.data[s.pos] != ':' {
			return s.syntax(p, "after object key")
		}
		s.colon = false
		s.pos++
		s.space()
	}
	if s.pos >= len(s.data) {
		return s.syntax(p, "")
	}
	return nil
}

// value checks the next value against type t and, when v is valid (a
// settable value of type t), stores it in v as encoding/json would. An
// invalid v checks only: the value is then filled by encoding/json (see
// typeInfo.standard).
func (s *scanner) value(v reflect.Value, t reflect.Type, p *path) error {
	if err := s.start(p); err != nil {
		return err
	}
	c := s.data[s.pos]
	if c == 'n' && !decodesNull(t) {
		if err := s.literal(p, "null"); err != nil {
			return err
		}
		switch t.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Map, reflect.Interface:
			if v.IsValid() {
				if t == rawMessageType {
					v.SetBytes([]byte("null")) // a raw message keeps the null it was sent
				} else {
					v.SetZero()
				}
			}
			return nil
		}
		return &DecodeError{Field: p.String(), Problem: "must not be null"}
	}
	from := s.pos
	// Interfaces and raw messages are checked for duplicate keys only.
	if t.Kind() == reflect.Interface || t == rawMessageType {
		if err := s.anyValue(p, p); err != nil {
			return err
		}
		if !v.IsValid() {
			return nil
		}
		if t == rawMessageType {
			v.SetBytes(bytes.Clone(s.data[from:s.pos]))
			return nil
		}
		return s.standard(v, from, p)
	}
	ti := infoOf(t)
	if ti.unsupported != "" {
		return &DecodeError{Field: p.String(), Problem: "unsupported type " + t.String() + ": " + ti.unsupported}
	}
	// Types with their own decoding (time.Time, …) are walked for duplicate
	// keys, then decoded on their own, so that what they refuse is reported
	// with its field.
	if ti.unmarshaler {
		if err := s.anyValue(p, p); err != nil {
			return err
		}
		if !v.IsValid() {
			v = reflect.New(t).Elem()
		}
		if err := json.Unmarshal(s.data[from:s.pos], v.Addr().Interface()); err != nil {
			if t == timeType {
				return &DecodeError{Field: p.String(), Problem: "expected an RFC 3339 date-time string such as \"2026-01-31T09:30:00Z\""}
			}
			return &DecodeError{Field: p.String(), Problem: "is not a valid " + t.String()}
		}
		return nil
	}
	switch {
	case ti.text:
		if c != '"' {
			return s.typeError(p, "a string")
		}
		if _, err := s.str(p, false); err != nil || !v.IsValid() {
			return err
		}
		return s.standard(v, from, p)
	case t == numberType:
		n, err := s.numberOr(p, "a number")
		if err == nil && v.IsValid() {
			v.SetString(string(n))
		}
		return err
	case ti.standard && v.IsValid():
		if err := s.value(reflect.Value{}, t, p); err != nil {
			return err
		}
		return s.standard(v, from, p)
	}
	switch t.Kind() {
	case reflect.Pointer:
		var ev reflect.Value
		if v.IsValid() {
			if v.IsNil() {
				v.Set(reflect.New(t.Elem()))
			}
			ev = v.Elem()
		}
		return s.value(ev, t.Elem(), p)
	case reflect.Struct:
		if c != '{' {
			return s.typeError(p, "an object")
		}
		return s.object(p, func(key string, mp *path) error {
			f, ok := ti.fields[key]
			if !ok {
				return &DecodeError{Field: mp.String(), Problem: "unknown field"}
			}
			var fv reflect.Value
			if v.IsValid() {
				fv = v.Field(f.index)
			}
			return s.value(fv, f.typ, mp)
		})
	case reflect.Map:
		if c != '{' {
			return s.typeError(p, "an object")
		}
		if t.Key().Kind() != reflect.String {
			return &DecodeError{Field: p.String(), Problem: "unsupported map key type"}
		}
		if v.IsValid() && v.IsNil() {
			v.Set(reflect.MakeMap(t))
		}
		return s.object(p, func(key string, mp *path) error {
			if !v.IsValid() {
				return s.value(v, t.Elem(), mp)
			}
			ev := reflect.New(t.Elem()).Elem()
			if err := s.value(ev, t.Elem(), mp); err != nil {
				return err
			}
			v.SetMapIndex(reflect.ValueOf(key).Convert(t.Key()), ev)
			return nil
		})
	case reflect.Slice, reflect.Array:
		if c != '[' {
			return s.typeError(p, "an array")
		}
		slice := t.Kind() == reflect.Slice
		if v.IsValid() && slice {
			v.SetLen(0)
		}
		n := 0
		err := s.array(p, func(i int) error {
			if !slice && i >= t.Len() {
				return &DecodeError{Field: p.String(), Problem: fmt.Sprintf("at most %d elements", t.Len())}
			}
			var ev reflect.Value
			if v.IsValid() {
				if slice {
					if i >= v.Cap() {
						v.Grow(1)
					}
					v.SetLen(i + 1)
				}
				ev = v.Index(i)
				ev.SetZero()
			}
			n = i + 1
			return s.value(ev, t.Elem(), &path{up: p, index: i, elem: true})
		})
		if err != nil || !v.IsValid() {
			return err
		}
		if slice && n == 0 {
			v.Set(reflect.MakeSlice(t, 0, 0)) // [] is an empty slice, not nil
		}
		for i := n; !slice && i < t.Len(); i++ {
			v.Index(i).SetZero()
		}
		return nil
	case reflect.String:
		if c != '"' {
			return s.typeError(p, "a string")
		}
		escaped, err := s.str(p, false)
		if err == nil && v.IsValid() {
			v.SetString(s.text(from, escaped))
		}
		return err
	case reflect.Bool:
		if c != 't' && c != 'f' {
			return s.typeError(p, "true or false")
		}
		err := s.scalar(p)
		if err == nil && v.IsValid() {
			v.SetBool(c == 't')
		}
		return err
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := s.numberOr(p, "an integer")
		if err != nil {
			return err
		}
		i, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil || i < minInt(t) || i > maxInt(t) {
			return &DecodeError{Field: p.String(), Problem: fmt.Sprintf("expected an integer in range, got %s", n)}
		}
		if v.IsValid() {
			v.SetInt(i)
		}
		return nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, err := s.numberOr(p, "a non-negative integer")
		if err != nil {
			return err
		}
		u, err := strconv.ParseUint(string(n), 10, 64)
		if err != nil || u > maxUint(t) {
			return &DecodeError{Field: p.String(), Problem: fmt.Sprintf("expected a non-negative integer in range, got %s", n)}
		}
		if v.IsValid() {
			v.SetUint(u)
		}
		return nil
	case reflect.Float32, reflect.Float64:
		n, err := s.numberOr(p, "a number")
		if err != nil {
			return err
		}
		f, err := strconv.ParseFloat(string(n), 64)
		if err != nil || math.IsInf(f, 0) || (t.Kind() == reflect.Float32 && math.Abs(f) > math.MaxFloat32) {
			return &DecodeError{Field: p.String(), Problem: fmt.Sprintf("number %s out of range", n)}
		}
		if v.IsValid() {
			if t.Kind() == reflect.Float32 {
				f, _ = strconv.ParseFloat(string(n), 32) // rounded once, as encoding/json does
			}
			v.SetFloat(f)
		}
		return nil
	}
	return &DecodeError{Field: p.String(), Problem: "unsupported type " + t.String()}
}

// decodesNull reports whether t, a slice or map that may be null, decodes
// null with its own method, which encoding/json calls for it.
func decodesNull(t reflect.Type) bool {
	k := t.Kind()
	return (k == reflect.Slice || k == reflect.Map) && t != rawMessageType && infoOf(t).unmarshaler
}

// standard fills v with encoding/json from the value the scanner checked,
// s.data[from:s.pos].
func (s *scanner) standard(v reflect.Value, from int, p *path) error {
	if err := json.Unmarshal(s.data[from:s.pos], v.Addr().Interface()); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return &DecodeError{Field: joinField(p.String(), te.Field), Problem: "expected " + te.Type.String()}
		}
		return &DecodeError{Field: p.String(), Problem: "is not a valid " + v.Type().String()}
	}
	return nil
}

// joinField appends encoding/json's field path, relative to a value, to
// the value's own.
func joinField(at, rel string) string {
	switch {
	case rel == "":
		return at
	case at == "":
		return rel
	}
	return at + "." + rel
}

// text is the string literal the scanner read from s.data[from:s.pos],
// unescaped. Its escapes were checked (str): each is whole, and a \u
// escape of a surrogate is half of a pair.
func (s *scanner) text(from int, escaped bool) string {
	lit := s.data[from+1 : s.pos-1]
	if !escaped {
		return string(lit)
	}
	b := make([]byte, 0, len(lit))
	for i := 0; i < len(lit); {
		c := lit[i]
		if c != '\\' {
			b = append(b, c)
			i++
			continue
		}
		switch e := lit[i+1]; e {
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r := hexRune(lit[i+2 : i+6])
			if utf16.IsSurrogate(r) {
				r = utf16.DecodeRune(r, hexRune(lit[i+8:i+12]))
				i += 6
			}
			b = utf8.AppendRune(b, r)
			i += 6
			continue
		default: // " \ /
			b = append(b, e)
		}
		i += 2
	}
	return string(b)
}

// hexRune is the value of four hexadecimal digits (checked by str).
func hexRune(h []byte) rune {
	var r rune
	for _, c := range h {
		switch {
		case c >= 'a':
			c -= 'a' - 10
		case c >= 'A':
			c -= 'A' - 10
		default:
			c -= '0'
		}
		r = r<<4 | rune(c)
	}
	return r
}

// typeError refuses the value at s.pos as not what was wanted. A scalar is
// read whole first (its syntax, UTF-8 and escapes checked as any other), so
// a broken literal is reported as such rather than as the wrong type.
func (s *scanner) typeError(p *path, want string) error {
	got := describe(s.data[s.pos])
	if c := s.data[s.pos]; c != '{' && c != '[' {
		if err := s.scalar(p); err != nil {
			return err
		}
	}
	return &DecodeError{Field: p.String(), Problem: "expected " + want + ", got " + got}
}

// numberOr reads a number, or refuses another value as not the number wanted.
func (s *scanner) numberOr(p *path, want string) ([]byte, error) {
	if c := s.data[s.pos]; c != '-' && (c < '0' || c > '9') {
		return nil, s.typeError(p, want)
	}
	return s.number(p)
}

func describe(c byte) string {
	switch {
	case c == '{':
		return "an object"
	case c == '[':
		return "an array"
	case c == '"':
		return "a string"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == 'n':
		return "null"
	}
	return "a number"
}

// object walks the members of the object at s.pos, rejecting duplicate
// keys, and calls member for each (which reads the member's value).
func (s *scanner) object(p *path, member func(key string, mp *path) error) error {
	if s.depth++; s.depth > maxDepth {
		return &DecodeError{Field: p.String(), Problem: fmt.Sprintf("nested more than %d deep", maxDepth)}
	}
	s.pos++ // '{'
	var few [16]string
	seen := few[:0]
	var many map[string]bool
	s.space()
	if s.pos < len(s.data) && s.data[s.pos] == '}' {
		s.pos++
		s.depth--
		return nil
	}
	for {
		s.space()
		if s.pos >= len(s.data) || s.data[s.pos] != '"' {
			return s.syntax(p, "looking for beginning of object key string")
		}
		key, err := s.key(p)
		if err != nil {
			return err
		}
		mp := &path{up: p, key: key}
		if many != nil {
			if many[key] {
				return &DecodeError{Field: mp.String(), Problem: "duplicate key"}
			}
			many[key] = true
		} else {
			if slices.Contains(seen, key) {
				return &DecodeError{Field: mp.String(), Problem: "duplicate key"}
			}
			if seen = append(seen, key); len(seen) > len(few) {
				many = make(map[string]bool, 2*len(seen))
				for _, k := range seen {
					many[k] = true
				}
			}
		}
		s.colon = true
		if err := member(key, mp); err != nil {
			return err
		}
		s.space()
		if s.pos < len(s.data) && s.data[s.pos] == '}' {
			s.pos++
			s.depth--
			return nil
		}
		if s.pos >= len(s.data) || s.data[s.pos] != ',' {
			return s.syntax(p, "after object key:value pair")
		}
		s.pos++
	}
}

// array walks the elements of the array at s.pos, calling element for
// each (which reads it), the way encoding/json's tokenizer walks it: an
// element is read while the next byte does not end an array or object, and
// the comma before it is checked where the element's first token is read.
func (s *scanner) array(p *path, element func(i int) error) error {
	if s.depth++; s.depth > maxDepth {
		return &DecodeError{Field: p.String(), Problem: fmt.Sprintf("nested more than %d deep", maxDepth)}
	}
	s.pos++ // '['
	for i := 0; s.more(); i++ {
		s.comma = i > 0
		if err := element(i); err != nil {
			return err
		}
	}
	if s.pos >= len(s.data) || s.data[s.pos] != ']' {
		return s.syntax(p, "after array element")
	}
	s.pos++
	s.depth--
	return nil
}

// more reports whether another element follows (json.Decoder.More).
func (s *scanner) more() bool {
	s.space()
	return s.pos < len(s.data) && s.data[s.pos] != ']' && s.data[s.pos] != '}'
}

// anyValue checks a value of unknown type for duplicate keys (and its
// strings as any other). at is where its first token is reported, in the
// path of its nested members and elements.
func (s *scanner) anyValue(at, in *path) error {
	if err := s.start(at); err != nil {
		return err
	}
	switch s.data[s.pos] {
	case '{':
		return s.object(in, func(_ string, mp *path) error { return s.anyValue(mp, mp) })
	case '[':
		// An element's own token is reported at the array, as the walk
		// this replaced did; what is inside it, at the element.
		return s.array(in, func(i int) error { return s.anyValue(in, &path{up: in, index: i, elem: true}) })
	}
	return s.scalar(at)
}

// scalar reads a string, number or literal at s.pos.
func (s *scanner) scalar(p *path) error {
	switch c := s.data[s.pos]; {
	case c == '"':
		_, err := s.str(p, false)
		return err
	case c == 't':
		return s.literal(p, "true")
	case c == 'f':
		return s.literal(p, "false")
	case c == 'n':
		return s.literal(p, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		_, err := s.number(p)
		return err
	}
	return s.syntax(p, "looking for beginning of value")
}

func (s *scanner) literal(p *path, lit string) error {
	for i := 0; i < len(lit); i++ {
		if s.pos >= len(s.data) || s.data[s.pos] != lit[i] {
			return s.syntax(p, "in literal "+lit)
		}
		s.pos++
	}
	return nil
}

func (s *scanner) number(p *path) ([]byte, error) {
	d, from := s.data, s.pos
	digits := func() bool {
		if s.pos >= len(d) || d[s.pos] < '0' || d[s.pos] > '9' {
			return false
		}
		for s.pos < len(d) && d[s.pos] >= '0' && d[s.pos] <= '9' {
			s.pos++
		}
		return true
	}
	if d[s.pos] == '-' {
		s.pos++
	}
	switch {
	case s.pos < len(d) && d[s.pos] == '0':
		s.pos++
	case !digits():
		return nil, s.syntax(p, "in numeric literal")
	}
	if s.pos < len(d) && d[s.pos] == '.' {
		s.pos++
		if !digits() {
			return nil, s.syntax(p, "after decimal point in numeric literal")
		}
	}
	if s.pos < len(d) && (d[s.pos] == 'e' || d[s.pos] == 'E') {
		s.pos++
		if s.pos < len(d) && (d[s.pos] == '+' || d[s.pos] == '-') {
			s.pos++
		}
		if !digits() {
			return nil, s.syntax(p, "in exponent of numeric literal")
		}
	}
	return d[from:s.pos], nil
}

// key reads an object's key, checked as any string, with a problem in the
// key itself reported as such, and returns it unescaped.
func (s *scanner) key(p *path) (string, error) {
	from := s.pos
	escaped, err := s.str(p, true)
	if err != nil {
		return "", err
	}
	return s.text(from, escaped), nil
}

// str reads the string literal at s.pos and checks it as sent: its syntax
// (escapes, no raw control characters), then valid UTF-8, then no lone
// UTF-16 surrogate escape ("\ud800"), which encoding/json would silently
// turn into U+FFFD. It reports whether the literal has escapes.
func (s *scanner) str(p *path, isKey bool) (escaped bool, err error) {
	d := s.data
	from := s.pos + 1
	ascii := true
	i := from
	for {
		if i >= len(d) {
			s.pos = i
			return false, s.syntax(p, "")
		}
		c := d[i]
		if c == '"' {
			break
		}
		switch {
		case c == '\\':
			escaped = true
			if i+1 >= len(d) {
				s.pos = i + 1
				return false, s.syntax(p, "")
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				for j := i + 2; j < i+6; j++ {
					if j >= len(d) {
						s.pos = j
						return false, s.syntax(p, "")
					}
					if !isHex(d[j]) {
						s.pos = j
						return false, s.syntax(p, "in \\u hexadecimal character escape")
					}
				}
				i += 6
			default:
				s.pos = i + 1
				return false, s.syntax(p, "in string escape code")
			}
		case c < 0x20:
			s.pos = i
			return false, s.syntax(p, "in string literal")
		default:
			if c >= utf8.RuneSelf {
				ascii = false
			}
			i++
		}
	}
	s.pos = i + 1
	lit := d[from:i]
	prefix := ""
	if isKey {
		prefix = "a key "
	}
	if !ascii && !utf8.Valid(lit) {
		return false, &DecodeError{Field: p.String(), Problem: prefix + "is not valid UTF-8"}
	}
	if escaped && loneSurrogate(lit) {
		return false, &DecodeError{Field: p.String(), Problem: prefix + "contains a lone UTF-16 surrogate escape (\\ud800 to \\udfff without its pair): it is no character"}
	}
	return escaped, nil
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
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

func minInt(t reflect.Type) int64 { return -1 << (t.Bits() - 1) }
func maxInt(t reflect.Type) int64 { return 1<<(t.Bits()-1) - 1 }
func maxUint(t reflect.Type) uint64 {
	if t.Bits() == 64 {
		return math.MaxUint64
	}
	return 1<<t.Bits() - 1
}
