package wire

// The strict decoder as it was before the single-pass scanner (decode.go),
// kept as the reference the differential fuzz test compares it with: both
// must accept and refuse the same documents, for the same field and reason.

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

func decodeReference(data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		panic("wire.Decode: v must be a non-nil pointer")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	c := refChecker{dec: dec, data: data}
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

type refChecker struct {
	dec  *json.Decoder
	data []byte
}

// token reads the next token; for a string (a key or a value) it checks the
// literal as sent: valid UTF-8 and no lone surrogate escape.
func (c *refChecker) token(path string) (json.Token, error) {
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
func (c *refChecker) key(path string) (string, error) {
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
func (c *refChecker) value(t reflect.Type, path string) error {
	start := c.dec.InputOffset()
	tok, err := c.token(path)
	if err != nil {
		return err
	}
	return c.valueFrom(tok, t, path, start)
}

// valueFrom checks a value whose first token is tok, read from start on.
func (c *refChecker) valueFrom(tok json.Token, t reflect.Type, path string, start int64) error {
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
			return refTypeError(path, "an object", tok)
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
			return refTypeError(path, "an object", tok)
		}
		if t.Key().Kind() != reflect.String {
			return &DecodeError{Field: path, Problem: "unsupported map key type"}
		}
		return c.object(path, func(_, p string) error { return c.value(t.Elem(), p) })
	case reflect.Slice, reflect.Array:
		if tok != json.Delim('[') {
			return refTypeError(path, "an array", tok)
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
			return refTypeError(path, "a string", tok)
		}
		return nil
	case reflect.Bool:
		if _, ok := tok.(bool); !ok {
			return refTypeError(path, "true or false", tok)
		}
		return nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := tok.(json.Number)
		if !ok {
			return refTypeError(path, "an integer", tok)
		}
		i, err := strconv.ParseInt(n.String(), 10, 64)
		if err != nil || i < minInt(t) || i > maxInt(t) {
			return &DecodeError{Field: path, Problem: fmt.Sprintf("expected an integer in range, got %s", n)}
		}
		return nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, ok := tok.(json.Number)
		if !ok {
			return refTypeError(path, "a non-negative integer", tok)
		}
		u, err := strconv.ParseUint(n.String(), 10, 64)
		if err != nil || u > maxUint(t) {
			return &DecodeError{Field: path, Problem: fmt.Sprintf("expected a non-negative integer in range, got %s", n)}
		}
		return nil
	case reflect.Float32, reflect.Float64:
		n, ok := tok.(json.Number)
		if !ok {
			return refTypeError(path, "a number", tok)
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
func (c *refChecker) object(path string, member func(key, path string) error) error {
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
func (c *refChecker) any(tok json.Token, path string) error {
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

func refTypeError(path, want string, tok json.Token) error {
	return &DecodeError{Field: path, Problem: "expected " + want + ", got " + refDescribe(tok)}
}

func refDescribe(tok json.Token) string {
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
