package wire

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// diffShape exercises every kind the strict decoder handles.
type diffShape struct {
	S   string            `json:"s"`
	I   int16             `json:"i"`
	U   uint8             `json:"u"`
	F   float32           `json:"f"`
	B   bool              `json:"b"`
	P   *diffShape        `json:"p"`
	L   []string          `json:"l"`
	A   [2]int            `json:"a"`
	M   map[string]int    `json:"m"`
	Raw json.RawMessage   `json:"raw"`
	Any any               `json:"any"`
	T   time.Time         `json:"t"`
	PT  *time.Time        `json:"pt"`
	MM  map[string][]bool `json:"mm"`
}

// syntaxClass reports whether a problem is about the document's syntax,
// whose wording differs between the two decoders.
func syntaxClass(problem string) bool {
	return strings.HasPrefix(problem, "syntax error") || problem == "unexpected end of document"
}

// compareDecoders decodes data with the single-pass scanner and with the
// token walk it replaced, into each shape, and fails on any difference:
// one accepts what the other refuses, another field, another problem
// (other than the wording of a syntax error), or another decoded value.
func compareDecoders(t *testing.T, data []byte) {
	t.Helper()
	for _, newV := range []func() any{
		func() any { return new(TurnSubmitRequest) },
		func() any { return new(ApprovalDecideRequest) },
		func() any { return new(diffShape) },
		// Every tenant API request the brain decodes (brain/api.go).
		func() any { return new(ApprovalListRequest) },
		func() any { return new(ApprovalGetRequest) },
		func() any { return new(EventAckRequest) },
		func() any { return new(ReportRequest) },
		func() any { return new(TenantLimitsRequest) },
	} {
		a, b := newV(), newV()
		got, want := decode(data, a), decodeReference(data, b)
		if (got == nil) != (want == nil) {
			t.Fatalf("%T %q: scanner %v, reference %v", a, data, got, want)
		}
		if got == nil {
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("%T %q: decoded values differ:\n%+v\n%+v", a, data, a, b)
			}
			continue
		}
		g, w := got.(*DecodeError), want.(*DecodeError)
		if w.Problem == "the document does not decode" && strings.HasPrefix(g.Problem, "nested more than") {
			continue // deeper than encoding/json allows: the scanner says so
		}
		if g.Field != w.Field || syntaxClass(g.Problem) != syntaxClass(w.Problem) ||
			(!syntaxClass(w.Problem) && g.Problem != w.Problem) {
			t.Fatalf("%T %q:\nscanner   %q: %s\nreference %q: %s", a, data, g.Field, g.Problem, w.Field, w.Problem)
		}
	}
}

func TestScannerMatchesTheTokenWalk(t *testing.T) {
	t.Parallel()
	for _, s := range diffSeeds {
		compareDecoders(t, []byte(s))
	}
}

var diffSeeds = []string{
	`{"work_item_id":"<a.b@c>","turn":1,"email":{"from":"a@b","subject":"s","body":"b","to":["x","y"],"received_at":"2026-01-02T03:04:05Z"}}`,
	`{"work_item_id":"w","turn":2,"latest_result":{"action":"send_reply","outcome":"closed_manual","human_action":{"kind":"replied","text":"t","at":"2026-01-02T03:04:05Z"}}}`,
	`{"approval_id":"a","decision":"edit","by":"x","edited":{"body":"b","n":[1,{"a":1,"a":2}]}}`,
	`{"s":"x","i":-32768,"u":255,"f":3.4e38,"b":true,"p":{"s":"y","p":null},"l":["a"],"a":[1,2],"m":{"k":1},"raw":{"x":[1,2,{"y":null}]},"any":[true,false,null,1.5e3,"s"],"t":"2026-01-02T03:04:05Z","pt":null,"mm":{"a":[true]}}`,
	`{"i":32768}`, `{"u":-1}`, `{"u":256}`, `{"f":3.5e38}`, `{"f":1e400}`, `{"i":1e2}`, `{"i":-0}`, `{"i":01}`, `{"i":-}`, `{"i":1.}`, `{"i":1e}`, `{"i":1e+}`,
	`{"a":[1,2,3]}`, `{"a":[1 2]}`, `{"a":[1,]}`, `{"a":[,1]}`, `{"l":["a" "b"]}`, `{"l":[1]}`, `{"l":"x"}`, `{"l":{}}`,
	`{"m":{"a":1,"a":2}}`, `{"m":{"a":"x"}}`, `{"m":[]}`, `{"p":{"p":{"p":{"zz":1}}}}`, `{"p":5}`, `{"s":null}`, `{"l":null}`, `{"m":null}`, `{"raw":null}`,
	`{"any":{"a":1,"a":1}}`, `{"any":[{"a":1,"a":1}]}`, `{"any":[1 2]}`, `{"any":["\ud800"]}`, `{"any":["\xff"]}`, `{"raw":{"k":"\udc00"}}`,
	`{"t":5}`, `{"t":"x"}`, `{"t":{"a":1}}`, `{"t":{"a":1,"a":2}}`, `{"t":null}`, `{"pt":"2026-01-02T03:04:05Z"}`, `{"pt":"soon"}`,
	`{"b":tru}`, `{"b":truex}`, `{"b":nul}`, `{"b":"true"}`, `{"b":1}`, `{"s":tru}`, `{"s":"a" "b"}`, `{"s":"a",}`, `{"s":"a"`, `{"s":"a`, `{"s":"\u12"}`, `{"s":"\uzzzz"}`, `{"s":"\x"}`, "{\"s\":\"a\x01b\"}",
	`{"s" "a"}`, `{"zz" "a"}`, `{"s":1 "t":2}`, `{,}`, `{"s":"a",}`, `{`, `[`, `{"s":`, `{"s"`, ``, ` `, `null`, `1`, `"x"`, `[1]`, `{}x`, `{} {}`, "{}\xff",
	`{"\u0073":"dup","s":"x"}`, `{"S":"case"}`, `{"\ud800":1}`, "{\"\xff\":1}", `{"s":"\ud83d\ude00"}`, `{"s":"\ud83dA"}`, `{"s":"\\ud800"}`, `{"s":"\"\ud800"}`,
	`{"limit":5,"cursor":"c","brief":true}`, `{"ids":["a","b"]}`, `{"approval_id":"a"}`, `{}`,
	`{"p":{"s":"x","s":"y"}}`, `{"mm":{"a":[true,1]}}`, `{"mm":{"a":[true,]}}`, `{"any":{"a" 1}}`, `{"any":{"a":1,}}`, `{"a":[1,2,3 4]}`,
}

func FuzzScannerMatchesTheTokenWalk(f *testing.F) {
	for _, s := range diffSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { compareDecoders(t, data) })
}

func BenchmarkDecodeTurnSubmitRequest(b *testing.B) {
	data := []byte(`{"work_item_id":"<CAF=quote.1234@mail.example>","turn":1,"email":{"from":"Jo Bloggs <jo@example.com>",` +
		`"to":["office@trades.example"],"subject":"Quote for a new boiler","received_at":"2026-11-30T09:15:00Z","body":"` +
		strings.Repeat("Hello, could you quote for replacing our boiler? ", 20) + `"}}`)
	b.Run("DecodeAndValidate", func(b *testing.B) {
		// What the edge and the brain run on every turn.
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeTurnSubmitRequest(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, impl := range []struct {
		name string
		fn   func([]byte, any) error
	}{{"Scanner", decode}, {"TokenWalk", decodeReference}} {
		b.Run(impl.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var r TurnSubmitRequest
				if err := impl.fn(data, &r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
