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
	"unicode/utf8"
)

// DecodeError says what was wrong with a JSON document and where. Field is a
// dotted path ("email.subject", "to[2]"); it is empty for document-level
// problems (syntax, trailing data, size).
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
// numbers out of range or with a fraction for an integer, trailing data after
// the document and invalid UTF-8. Every rejection is a *DecodeError.
//
// v must be a pointer to a struct whose fields carry json tags.
func Decode(data []byte, v any) error {
	if !utf8.Valid(data) {
		return &DecodeError{Problem: "document is not valid UTF-8"}
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		panic("wire.Decode: v must be a non-nil pointer")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	c := checker{dec: dec}
	if err := c.value(rv.Type().Elem(), ""); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &DecodeError{Problem: "unexpected data after the JSON document"}
	}
	// The walk above proved the shape; the standard decoder fills the value.
	std := json.NewDecoder(bytes.NewReader(data))
	std.DisallowUnknownFields()
	if err := std.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return &DecodeError{Field: te.Field, Problem: "expected " + te.Type.String()}
		}
		return &DecodeError{Problem: err.Error()}
	}
	return nil
}

type checker struct {
	dec *json.Decoder
}

var (
	rawMessageType  = reflect.TypeFor[json.RawMessage]()
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
)

func (c *checker) token(path string) (json.Token, error) {
	tok, err := c.dec.Token()
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, &DecodeError{Field: path, Problem: "unexpected end of document"}
		}
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, &DecodeError{Problem: fmt.Sprintf("syntax error at byte %d: %s", se.Offset, se.Error())}
		}
		return nil, &DecodeError{Field: path, Problem: err.Error()}
	}
	return tok, nil
}

// value checks the next JSON value against type t.
func (c *checker) value(t reflect.Type, path string) error {
	tok, err := c.token(path)
	if err != nil {
		return err
	}
	return c.valueFrom(tok, t, path)
}

func (c *checker) valueFrom(tok json.Token, t reflect.Type, path string) error {
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
	// Types with their own decoding (time.Time, json.RawMessage, …) and
	// interfaces are checked for duplicate keys only; encoding/json applies
	// their own rules afterwards.
	if t.Kind() == reflect.Interface || t == rawMessageType || reflect.PointerTo(t).Implements(unmarshalerType) {
		return c.any(tok, path)
	}
	if t.Kind() == reflect.Pointer {
		return c.valueFrom(tok, t.Elem(), path)
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
		tok, err := c.token(path)
		if err != nil {
			return err
		}
		key, ok := tok.(string)
		if !ok {
			return &DecodeError{Field: path, Problem: "object key is not a string"}
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

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
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
