package wire

import (
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// Every rejection of the strict decoder names a field: the offending one, or
// DocumentField for the document as a whole.
func TestDecodeErrorsNameTheField(t *testing.T) {
	t.Parallel()
	const email = `"email":{"from":"a@b.example","subject":"s","body":"b"`
	valid := `{"work_item_id":"w","turn":1,` + email + `}}`
	for _, tc := range []struct {
		name, in, field, inMessage string
	}{
		{"InvalidUTF8InID", "{\"work_item_id\":\"\xff\",\"turn\":1," + email + "}}", "work_item_id", "UTF-8"},
		{"InvalidUTF8InBody", "{\"work_item_id\":\"w\",\"turn\":1,\"email\":{\"from\":\"a@b\",\"subject\":\"s\",\"body\":\"ok \xc3\x28\"}}", "email.body", "UTF-8"},
		{"InvalidUTF8InKey", "{\"work_item_id\":\"w\",\"turn\":1,\"email\":{\"fr\xffom\":\"a@b\"}}", "email", "a key is not valid UTF-8"},
		{"InvalidUTF8InArray", "{\"work_item_id\":\"w\",\"turn\":1,\"email\":{\"from\":\"a@b\",\"to\":[\"x@y\",\"\xfe\"],\"subject\":\"s\",\"body\":\"b\"}}", "email.to[1]", "UTF-8"},
		{"InvalidUTF8InParams", "{\"work_item_id\":\"w\",\"turn\":2,\"latest_result\":{\"action\":\"x\",\"outcome\":\"failed\",\"detail\":\"\xff\"}}", "latest_result.detail", "UTF-8"},
		{"Trailing", valid + `{}`, DocumentField, "after the JSON document"},
		{"TrailingGarbage", valid + ` x`, DocumentField, "after the JSON document"},
		{"TrailingInvalidUTF8", valid + "\xff", DocumentField, ""},
		{"Empty", ``, DocumentField, "end of document"},
		{"NotAnObject", `[1]`, DocumentField, "expected an object"},
		{"SyntaxInNested", `{"work_item_id":"w","turn":1,"email":{"from":"a" "subject":"s"}}`, "email", "syntax error"},
		{"ReceivedAtNumber", `{"work_item_id":"w","turn":1,` + email + `,"received_at":5}}`, "email.received_at", "RFC 3339"},
		{"ReceivedAtWord", `{"work_item_id":"w","turn":1,` + email + `,"received_at":"yesterday"}}`, "email.received_at", "RFC 3339"},
		{"ReceivedAtObject", `{"work_item_id":"w","turn":1,` + email + `,"received_at":{"a":1}}}`, "email.received_at", "RFC 3339"},
		{"ReceivedAtNoZone", `{"work_item_id":"w","turn":1,` + email + `,"received_at":"2026-01-02T03:04:05"}}`, "email.received_at", "RFC 3339"},
		{"HumanActionAtWord", `{"work_item_id":"w","turn":2,"latest_result":{"action":"x","outcome":"closed_manual","human_action":{"kind":"replied","at":"soon"}}}`, "latest_result.human_action.at", "RFC 3339"},
		{"LoneHighSurrogate", `{"work_item_id":"w","turn":1,"email":{"from":"a@b","subject":"\ud800","body":"b"}}`, "email.subject", "surrogate"},
		{"LoneLowSurrogate", `{"work_item_id":"w","turn":1,"email":{"from":"a@b","subject":"s","body":"x\udc00y"}}`, "email.body", "surrogate"},
		{"ReversedPair", `{"work_item_id":"\udc00\ud800","turn":1,` + email + `}}`, "work_item_id", "surrogate"},
		{"HighThenLetter", `{"work_item_id":"\ud83dA","turn":1,` + email + `}}`, "work_item_id", "surrogate"},
		{"HighThenOtherEscape", `{"work_item_id":"\ud83d\u0041","turn":1,` + email + `}}`, "work_item_id", "surrogate"},
		{"SurrogateInKey", `{"work_item_id":"w","turn":1,"\ud800":1}`, DocumentField, "a key contains a lone"},
		{"SurrogateInRawParams", `{"approval_id":"a","decision":"edit","by":"x","edited":{"body":"\udfff"}}`, "edited.body", "surrogate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var err error
			if strings.HasPrefix(tc.in, `{"approval_id"`) {
				err = DecodeAPI([]byte(tc.in), &ApprovalDecideRequest{})
			} else {
				_, err = DecodeTurnSubmitRequest([]byte(tc.in))
			}
			var e *Error
			if !errors.As(err, &e) || e.Code != CodeInvalid {
				t.Fatalf("got %v, want an invalid *wire.Error", err)
			}
			if e.Field != tc.field || !strings.Contains(e.Message, tc.inMessage) {
				t.Fatalf("field %q message %q; want field %q and a message with %q", e.Field, e.Message, tc.field, tc.inMessage)
			}
		})
	}
}

// What the strict decoder must still accept: escaped surrogate pairs, an
// escaped backslash before "ud800", U+FFFD written as itself or escaped in
// free text, an RFC 3339 time with an offset.
func TestDecodeAcceptsWhatIsText(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"work_item_id":"w","turn":1,"email":{"from":"a@b","subject":"\ud83d\ude00 pair","body":"\\ud800 is text here"}}`,
		`{"work_item_id":"w","turn":1,"email":{"from":"a@b","subject":"s","body":"\ufffd and ` + "\uFFFD" + ` in a body"}}`,
		`{"work_item_id":"w","turn":1,"email":{"from":"a@b","subject":"s","body":"b","received_at":"2026-01-02T03:04:05+10:00"}}`,
	} {
		if _, err := DecodeTurnSubmitRequest([]byte(in)); err != nil {
			t.Errorf("%s: %v", in, err)
		}
	}
}

// invisible's ASCII shortcut answers what the classes it tests would.
func TestNoASCIIIsInvisible(t *testing.T) {
	for r := rune(0); r < utf8.RuneSelf; r++ {
		if unicode.In(r, unicode.Cf, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector, unicode.Zl, unicode.Zp) {
			t.Errorf("%U is in a class invisible tests, but invisible's ASCII shortcut says it is not", r)
		}
	}
	if !invisible('\u202e') || !invisible('\u200b') || invisible('a') {
		t.Error("invisible no longer tells a bidi override and a zero-width space from a letter")
	}
}

// Identifiers refuse the characters that make one id display as another;
// free text keeps them (the review page shows them visibly); an e-mail
// address refuses them in the address, keeps them in the display name.
func TestIdentifiersRefuseInvisibleCharacters(t *testing.T) {
	t.Parallel()
	turn := func(workItem, messageID, threadID, from string, to ...string) *TurnSubmitRequest {
		return &TurnSubmitRequest{WorkItemID: workItem, Turn: 1, Email: &Email{MessageID: messageID, ThreadID: threadID,
			From: from, To: to, Subject: "s", Body: "b"}}
	}
	for _, tc := range []struct {
		name  string
		req   *TurnSubmitRequest
		field string // "" when valid
	}{
		{"RLOInWorkItem", turn("invoice-\u202efdp.exe", "", "", "a@b"), "work_item_id"},
		{"ZeroWidthSpaceInWorkItem", turn("<a\u200b@b>", "", "", "a@b"), "work_item_id"},
		{"BOMInMessageID", turn("w", "\ufeff<m@x>", "", "a@b"), "email.message_id"},
		{"IsolateInThreadID", turn("w", "", "t\u2066x\u2069", "a@b"), "email.thread_id"},
		{"HangulFillerInWorkItem", turn("w\u3164", "", "", "a@b"), "work_item_id"},
		{"VariationSelectorInWorkItem", turn("w\ufe0f", "", "", "a@b"), "work_item_id"},
		{"LineSeparatorInWorkItem", turn("w\u2028x", "", "", "a@b"), "work_item_id"},
		{"ReplacementCharInWorkItem", turn("w\ufffd", "", "", "a@b"), "work_item_id"},
		{"ZeroWidthInAddress", turn("w", "", "", "Jo <jo\u200b@b.example>"), "email.from"},
		{"RLOInBareAddress", turn("w", "", "", "\u202emoc.elpmaxe@oj"), "email.from"},
		{"InvisibleInSecondTo", turn("w", "", "", "a@b", "x@y", "z\u200d@y"), "email.to[1]"},
		{"ControlInDisplayName", turn("w", "", "", "Jo\x07 <jo@b>"), "email.from"},
		{"RLMInDisplayNameIsKept", turn("w", "", "", "\u05d9\u05d5\u05e1\u05d9\u200f <yossi@b.example>"), ""},
		{"ZWJInDisplayNameIsKept", turn("w", "", "", "\u0645\u200d\u0645 <m@b.example>"), ""},
		{"PlainUnicodeIDsAreFine", turn("<ünïcødé@例え.jp>", "<ünïcødé@例え.jp>", "thread-Ω", "a@b"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.req.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) || e.Field != tc.field || !strings.Contains(e.Message, "U+") {
				t.Fatalf("got %v; want field %s refused, naming the code point", err, tc.field)
			}
		})
	}
	// The same characters in free text are text.
	free := turn("w", "", "", "a@b")
	free.Email.Subject, free.Email.Body = "invoice-\u202efdp.exe", "zero\u200bwidth"
	if err := free.Validate(); err != nil {
		t.Errorf("free text refused: %v", err)
	}
	later := &TurnSubmitRequest{WorkItemID: "w", Turn: 2, LatestResult: &LatestResult{Action: "send\u200b_reply", Outcome: OutcomeSucceeded}}
	if e := ErrorOf(later.Validate()); e.Field != "latest_result.action" {
		t.Errorf("invisible character in latest_result.action: %+v", e)
	}
	dec := &ApprovalDecideRequest{ApprovalID: "a", Decision: DecisionApprove, By: "al\u202eice"}
	if e := ErrorOf(dec.Validate()); e.Field != "by" {
		t.Errorf("invisible character in by: %+v", e)
	}
}

// Client-chosen keys reach the field path, the message and the edge's log:
// they are escaped and cut there.
func TestFieldPathsAreClipped(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 60_000)
	_, err := DecodeTurnSubmitRequest([]byte(`{"work_item_id":"w","turn":1,"` + long + `":1}`))
	e := ErrorOf(err)
	if len(e.Field) > maxKeyBytes || len(e.Message) > 200 || !strings.HasSuffix(e.Field, "…") {
		t.Fatalf("a 60 KB unknown key: field %d bytes, message %d bytes", len(e.Field), len(e.Message))
	}
	_, err = DecodeTurnSubmitRequest([]byte(`{"work_item_id":"w","turn":1,"a\u001b[31m\u202eb":1}`))
	if e := ErrorOf(err); e.Field != `a\u001b[31m\u202eb` {
		t.Fatalf("a key with an escape sequence and a bidi control: field %q", e.Field)
	}
	deep := strings.Repeat(`{"abcdefgh":`, 5000) + "1" + strings.Repeat("}", 5000)
	_, err = DecodeTurnSubmitRequest([]byte(`{"work_item_id":"w","turn":1,"email":{"from":"a","subject":"s","body":"b","x":` + deep + `}}`))
	if e := ErrorOf(err); len(e.Field) > maxFieldBytes || len(e.Message) > maxFieldBytes+100 {
		t.Fatalf("a deep unknown path: field %d bytes, message %d bytes", len(e.Field), len(e.Message))
	}
}

func TestClip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"status", "status"},
		{"tab\there", `tab\u0009here`},
		{"back\\slash", `back\\slash`},
		{"bad\xffbyte", `bad\xffbyte`},
		{"zw\u200bsp", `zw\u200bsp`},
		{"emoji 😀 ok", "emoji 😀 ok"},
		{strings.Repeat("é", 40), strings.Repeat("é", 30) + "…"},
	} {
		if got := Clip(tc.in, 64); got != tc.want || len(got) > 64 || !utf8.ValidString(got) {
			t.Errorf("Clip(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// A rejection's reason is text Postgres stores: a NUL is a 400 naming it
// (it was a 500 on every retry), and spaces only are no reason.
func TestDecideReasonIsStorableText(t *testing.T) {
	t.Parallel()
	for _, reason := range []string{"no\u0000thanks", "   ", "\n\t"} {
		r := &ApprovalDecideRequest{ApprovalID: "a", Decision: DecisionReject, By: "alice", Reason: reason}
		var e *Error
		if err := r.Validate(); !errors.As(err, &e) || e.Field != "reason" {
			t.Errorf("reason %+q: %v, want an invalid reason", reason, err)
		}
	}
	ok := &ApprovalDecideRequest{ApprovalID: "a", Decision: DecisionReject, By: "alice", Reason: "answered by phone"}
	if err := ok.Validate(); err != nil {
		t.Errorf("a plain reason: %v", err)
	}
}

// A turn without its number says the field is required, not only its range.
func TestTurnWithoutNumberSaysItIsRequired(t *testing.T) {
	t.Parallel()
	r := &TurnSubmitRequest{WorkItemID: "w", Email: &Email{From: "a@b", Subject: "s", Body: "b"}}
	if e := ErrorOf(r.Validate()); e == nil || e.Field != "turn" || !strings.Contains(e.Message, "is required") {
		t.Fatalf("got %v; want field turn refused as required", e)
	}
	r.Turn = MaxTurn + 1
	if e := ErrorOf(r.Validate()); e == nil || e.Field != "turn" || !strings.Contains(e.Message, "between 1 and") {
		t.Fatalf("got %v; want field turn refused for its range", e)
	}
}
