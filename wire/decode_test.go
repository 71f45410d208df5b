package wire

import (
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestDecodeTurnSubmitRequest(t *testing.T) {
	t.Parallel()
	valid := `{"work_item_id":"<a.b@c>","turn":1,"email":{"from":"a@b.example","subject":"s","body":"b"}}`
	tests := []struct {
		name  string
		in    string
		field string // "" with ok=true: valid
		ok    bool
	}{
		{"Valid", valid, "", true},
		{"ValidLaterTurn", `{"work_item_id":"w","turn":2,"latest_result":{"action":"send_reply","outcome":"succeeded"}}`, "", true},
		{"UnknownField", `{"work_item_id":"w","turn":1,"email":{"from":"a","subject":"s","body":"b"},"priority":"high"}`, "priority", false},
		{"UnknownNestedField", `{"work_item_id":"w","turn":1,"email":{"from":"a","subject":"s","body":"b","bcc":"x"}}`, "email.bcc", false},
		{"CaseVariantIsUnknown", `{"Work_Item_ID":"w","turn":1}`, "Work_Item_ID", false},
		{"DuplicateKey", `{"work_item_id":"w","work_item_id":"v","turn":1}`, "work_item_id", false},
		{"DuplicateNestedKey", `{"work_item_id":"w","turn":1,"email":{"from":"a","from":"b","subject":"s","body":"b"}}`, "email.from", false},
		{"Trailing", valid + `{}`, "", false},
		{"TrailingGarbage", valid + ` x`, "", false},
		{"WrongType", `{"work_item_id":"w","turn":"1"}`, "turn", false},
		{"Fraction", `{"work_item_id":"w","turn":1.5}`, "turn", false},
		{"Overflow", `{"work_item_id":"w","turn":99999999999999999999}`, "turn", false},
		{"NullScalar", `{"work_item_id":null,"turn":1}`, "work_item_id", false},
		{"NullPointerIsAbsent", `{"work_item_id":"w","turn":2,"email":null}`, "", true},
		{"ArrayElementType", `{"work_item_id":"w","turn":1,"email":{"from":"a","to":["x",3],"subject":"s","body":"b"}}`, "email.to[1]", false},
		{"NotObject", `[1,2]`, "", false},
		{"Empty", ``, "", false},
		{"InvalidUTF8", "{\"work_item_id\":\"\xff\",\"turn\":1}", "", false},
		{"MissingEmailOnTurnOne", `{"work_item_id":"w","turn":1}`, "email", false},
		{"TurnZero", `{"work_item_id":"w","turn":0}`, "turn", false},
		{"ControlCharInID", `{"work_item_id":"a\u0000b","turn":2}`, "work_item_id", false},
		{"BadOutcome", `{"work_item_id":"w","turn":2,"latest_result":{"action":"x","outcome":"maybe"}}`, "latest_result.outcome", false},
		{"ClosedManualNeedsHumanAction", `{"work_item_id":"w","turn":2,"latest_result":{"action":"send_reply","outcome":"closed_manual"}}`, "latest_result.human_action", false},
		{"BadTime", `{"work_item_id":"w","turn":1,"email":{"from":"a","subject":"s","body":"b","received_at":"yesterday"}}`, "", false},
		{"NULInBody", `{"work_item_id":"w","turn":1,"email":{"from":"a","subject":"s","body":"a\u0000b"}}`, "email.body", false},
		{"NULInHumanText", `{"work_item_id":"w","turn":2,"latest_result":{"action":"x","outcome":"closed_manual","human_action":{"kind":"replied","text":"\u0000"}}}`, "latest_result.human_action.text", false},
		{"NULInDetail", `{"work_item_id":"w","turn":2,"latest_result":{"action":"x","outcome":"failed","detail":"x\u0000"}}`, "latest_result.detail", false},
		{"BlankWorkItem", `{"work_item_id":"   ","turn":1,"email":{"from":"a","subject":"s","body":"b"}}`, "work_item_id", false},
		{"LongMessageID", `{"work_item_id":"w","turn":1,"email":{"message_id":"` + strings.Repeat("m", 513) + `","from":"a","subject":"s","body":"b"}}`, "email.message_id", false},
		{"LongThreadID", `{"work_item_id":"w","turn":1,"email":{"thread_id":"` + strings.Repeat("t", 513) + `","from":"a","subject":"s","body":"b"}}`, "email.thread_id", false},
		{"LongRecipient", `{"work_item_id":"w","turn":1,"email":{"from":"a","to":["a@b","` + strings.Repeat("x", 513) + `"],"subject":"s","body":"b"}}`, "email.to[1]", false},
		{"LongCc", `{"work_item_id":"w","turn":1,"email":{"from":"a","cc":["` + strings.Repeat("x", 513) + `"],"subject":"s","body":"b"}}`, "email.cc[0]", false},
		{"LongAction", `{"work_item_id":"w","turn":2,"latest_result":{"action":"` + strings.Repeat("a", 65) + `","outcome":"failed"}}`, "latest_result.action", false},
		{"LongHumanKind", `{"work_item_id":"w","turn":2,"latest_result":{"action":"x","outcome":"closed_manual","human_action":{"kind":"` + strings.Repeat("k", 65) + `"}}}`, "latest_result.human_action.kind", false},
		{"TooLarge", `{"work_item_id":"w","turn":1,"email":{"from":"a","subject":"s","body":"` + strings.Repeat("x", MaxTurnBytes) + `"}}`, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := DecodeTurnSubmitRequest([]byte(tt.in))
			if tt.ok {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("want *wire.Error, got %T %v", err, err)
			}
			if e.Code != CodeInvalid {
				t.Fatalf("code %q, want invalid", e.Code)
			}
			if tt.field != "" && e.Field != tt.field {
				t.Fatalf("field %q, want %q (%v)", e.Field, tt.field, e)
			}
			if e.Message == "" {
				t.Fatal("empty message")
			}
		})
	}
}

func TestFingerprintIgnoresEncoding(t *testing.T) {
	t.Parallel()
	a, err := DecodeTurnSubmitRequest([]byte(`{"turn":1,"work_item_id":"w","email":{"body":"b","from":"a","subject":"s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := DecodeTurnSubmitRequest([]byte("{ \"work_item_id\" : \"w\",\n \"turn\": 1, \"email\": {\"from\":\"a\",\"subject\":\"s\",\"body\":\"b\"} }"))
	if err != nil {
		t.Fatal(err)
	}
	if Fingerprint(a) != Fingerprint(b) {
		t.Fatal("same request, different fingerprints")
	}
	b.Email.Body = "c"
	if Fingerprint(a) == Fingerprint(b) {
		t.Fatal("different requests, same fingerprint")
	}
}

func TestMarkReplayedIsStable(t *testing.T) {
	t.Parallel()
	orig, err := EncodeReply(&TurnSubmitReply{WorkItemID: "<x@y>", Turn: 1, NextTurn: 2, Status: WorkItemStatusOpen,
		Action: &Action{Name: "close_item", Params: []byte(`{"resolution":"done"}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(orig), `"<x@y>"`) {
		t.Fatalf("work item id escaped: %s", orig)
	}
	a, err := MarkReplayed(orig)
	if err != nil {
		t.Fatal(err)
	}
	b, err := MarkReplayed(a)
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) || !strings.Contains(string(a), `"replayed":true`) {
		t.Fatalf("replays differ or unmarked:\n%s\n%s", a, b)
	}
	if strings.Replace(string(a), `"replayed":true`, `"replayed":false`, 1) != string(orig) {
		t.Fatalf("replay changed more than the flag:\n%s\n%s", orig, a)
	}
}

// FuzzDecodeTurnSubmitRequest is the brain's message decoder (and the
// edge's): no input panics, every rejection is a typed invalid error, and
// whatever is accepted re-encodes to an accepted request with the same
// fingerprint.
func FuzzDecodeTurnSubmitRequest(f *testing.F) {
	for _, s := range []string{
		`{"work_item_id":"<a.b@c>","turn":1,"email":{"from":"a@b","subject":"s","body":"b"}}`,
		`{"work_item_id":"w","turn":2,"latest_result":{"action":"send_reply","outcome":"closed_manual","human_action":{"kind":"replied","text":"t"}}}`,
		`{"work_item_id":"w","turn":1,"email":{"from":"a","subject":"s","body":"b","received_at":"2026-01-02T03:04:05Z"}}`,
		`{"work_item_id":"w","work_item_id":"w","turn":1}`,
		`{"a":{"b":{"c":[[[[[]]]]]}}}`,
		`{"work_item_id":"w","turn":1e400}`,
		"\xff\xfe",
		``,
		`null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeTurnSubmitRequest(data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code != CodeInvalid || e.Message == "" {
				t.Fatalf("rejection is not a typed invalid error: %T %v", err, err)
			}
			if e.Field == "" && e.Reason != ReasonTooLarge {
				t.Fatalf("rejection names no field: %v", e)
			}
			if len(e.Field) > maxFieldBytes {
				t.Fatalf("field path of %d bytes", len(e.Field))
			}
			return
		}
		again, err := DecodeTurnSubmitRequest(mustMarshal(t, req))
		if err != nil {
			t.Fatalf("accepted request does not re-decode: %v", err)
		}
		if Fingerprint(req) != Fingerprint(again) {
			t.Fatal("fingerprint changed across a re-encode")
		}
	})
}

// shouted decodes itself from text, as a uuid.UUID or a netip.Addr does
// (TestDecodeTextUnmarshalerOfAnyKind).
type shouted string

func (s *shouted) UnmarshalText(b []byte) error {
	if string(b) == "quiet" {
		return errors.New("not loud")
	}
	*s = shouted(strings.ToUpper(string(b)))
	return nil
}

// The scanner fills what it reads, but a type that decodes itself from text
// is decoded by its own method, as encoding/json decodes it, and what that
// method refuses is named at its field.
func TestDecodeTextUnmarshaler(t *testing.T) {
	t.Parallel()
	type doc struct {
		Name  shouted         `json:"name"`
		ByKey map[shouted]int `json:"by_key"`
		List  []shouted       `json:"list"`
	}
	var d doc
	if err := Decode([]byte(`{"name":"hi\u00e9","by_key":{"a":1},"list":["x","y"]}`), &d); err != nil {
		t.Fatal(err)
	}
	if d.Name != "HIÉ" || d.ByKey["A"] != 1 || len(d.List) != 2 || d.List[1] != "Y" {
		t.Fatalf("decoded %+v", d)
	}
	err := Decode([]byte(`{"list":["x","quiet"]}`), &doc{})
	var de *DecodeError
	if !errors.As(err, &de) || de.Field != "list[1]" || de.Problem != "is not a valid wire.shouted" {
		t.Fatalf("got %v", err)
	}
	if err := Decode([]byte(`{"name":5}`), &doc{}); !errors.As(err, &de) || de.Field != "name" {
		t.Fatalf("a number for a text type: %v", err)
	}
}

// A type that decodes itself from text is given the string whatever its
// own kind: a uuid.UUID is an array of 16 bytes, a netip.Addr a struct.
func TestDecodeTextUnmarshalerOfAnyKind(t *testing.T) {
	t.Parallel()
	type doc struct {
		ID   uuid.UUID  `json:"id"`
		Addr netip.Addr `json:"addr"`
	}
	const in = `{"id":"6ba7b810-9dad-11d1-80b4-00c04fd430c8","addr":"192.0.2.1"}`
	var got, want doc
	if err := Decode([]byte(in), &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(in), &want); err != nil {
		t.Fatal(err)
	}
	if got != want || got.ID == (uuid.UUID{}) {
		t.Fatalf("decoded %+v, encoding/json %+v", got, want)
	}
	var de *DecodeError
	for in, field := range map[string]string{
		`{"id":"not-a-uuid"}`:  "id",
		`{"id":[1,2]}`:         "id",
		`{"addr":{}}`:          "addr",
		`{"addr":"300.1.1.1"}`: "addr",
	} {
		if err := Decode([]byte(in), &doc{}); !errors.As(err, &de) || de.Field != field {
			t.Errorf("%s: %v; want a DecodeError at %s", in, err, field)
		}
	}
}

// A json.Number takes a number literal, checked as any number is, and
// keeps it as sent; a string is not a number.
func TestDecodeNumber(t *testing.T) {
	t.Parallel()
	type doc struct {
		N json.Number `json:"n"`
	}
	var d doc
	if err := Decode([]byte(`{"n":-12.5e3}`), &d); err != nil || d.N != "-12.5e3" {
		t.Fatalf("decoded %+v, %v", d, err)
	}
	var de *DecodeError
	for _, in := range []string{`{"n":"12"}`, `{"n":"x"}`, `{"n":1.}`, `{"n":true}`} {
		if err := Decode([]byte(in), &doc{}); !errors.As(err, &de) || de.Field != "n" {
			t.Errorf("%s: %v; want a DecodeError at n", in, err)
		}
	}
}

// nullAware decodes null with its own method, as encoding/json lets it.
type nullAware []int

func (n *nullAware) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*n = nullAware{-1}
		return nil
	}
	var v []int
	err := json.Unmarshal(b, &v)
	*n = v
	return err
}

// A slice or map type with its own UnmarshalJSON is given null too, as
// encoding/json gives it; a pointer to one is still set to nil.
func TestDecodeNullToUnmarshaler(t *testing.T) {
	t.Parallel()
	type doc struct {
		N nullAware  `json:"n"`
		P *nullAware `json:"p"`
	}
	const in = `{"n":null,"p":null}`
	var got, want doc
	if err := Decode([]byte(in), &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(in), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) || len(got.N) != 1 || got.P != nil {
		t.Fatalf("decoded %+v, encoding/json %+v", got, want)
	}
}

// A struct embedding another without a json name is refused, naming the
// type: encoding/json would promote the embedded fields, and this decoder
// would otherwise read them as one field of the embedded type's name.
func TestDecodeRefusesEmbeddedStructs(t *testing.T) {
	t.Parallel()
	type inner struct {
		A string `json:"a"`
	}
	type outer struct {
		inner
		B string `json:"b"`
	}
	type named struct {
		In inner `json:"in"`
	}
	var de *DecodeError
	err := Decode([]byte(`{"a":"x","b":"y"}`), &outer{})
	if !errors.As(err, &de) || !strings.HasPrefix(de.Problem, "unsupported type wire.outer") {
		t.Fatalf("got %v; want the embedding refused", err)
	}
	var n named
	if err := Decode([]byte(`{"in":{"a":"x"}}`), &n); err != nil || n.In.A != "x" {
		t.Fatalf("a named struct field: %+v %v", n, err)
	}
	// A type that decodes itself uses its (promoted) method, embedding or not.
	type stamped struct {
		At struct{ time.Time } `json:"at"`
	}
	var st stamped
	if err := Decode([]byte(`{"at":"2026-01-31T09:30:00Z"}`), &st); err != nil || st.At.Year() != 2026 {
		t.Fatalf("a type embedding time.Time: %+v %v", st, err)
	}
}

// Every escape JSON has comes out as encoding/json decodes it.
func TestDecodeStringEscapes(t *testing.T) {
	t.Parallel()
	in := `{"s":"\"\\\/\b\f\n\r\t\u0041\u00e9\u20ac\ud83d\ude00 \u0000 plain é😀"}`
	var got, want struct {
		S string `json:"s"`
	}
	if err := Decode([]byte(in), &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(in), &want); err != nil {
		t.Fatal(err)
	}
	if got.S != want.S {
		t.Fatalf("got %q, encoding/json %q", got.S, want.S)
	}
}
