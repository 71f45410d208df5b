package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// fakeBrainClient is an in-memory brainClient. The fuzz target is the HTTP
// decoding path, so nothing here pretends to be NATS.
type fakeBrainClient struct {
	SubmitFunc func(ctx context.Context, key string, payload []byte, fp string) (turnOutcome, error)
	ResultFunc func(ctx context.Context, key, fp string) (turnOutcome, error)
	CallFunc   func(ctx context.Context, method string, req any) ([]byte, error)
}

func (f *fakeBrainClient) Submit(ctx context.Context, key string, payload []byte, fp string) (turnOutcome, error) {
	return f.SubmitFunc(ctx, key, payload, fp)
}

func (f *fakeBrainClient) Result(ctx context.Context, key, fp string) (turnOutcome, error) {
	return f.ResultFunc(ctx, key, fp)
}

func (f *fakeBrainClient) Call(ctx context.Context, method string, req any) ([]byte, error) {
	return f.CallFunc(ctx, method, req)
}

// FuzzTurnSubmitDecode posts arbitrary bodies to POST /v1/turns. Whatever
// the body: no panic; a 2xx only for a body the strict decoder accepts,
// and then the brain gets the canonical payload, its fingerprint and its
// key; every other answer is a wire.ErrorReply with a code.
func FuzzTurnSubmitDecode(f *testing.F) {
	f.Add(turnBody("wi-fuzz", "hello"))
	f.Add([]byte(`{"work_item_id":"w","turn":2,"latest_result":{"action":"draft_reply","outcome":"succeeded"}}`))

	h := newHandler(deps{
		brain: &fakeBrainClient{
			SubmitFunc: func(_ context.Context, key string, payload []byte, fp string) (turnOutcome, error) {
				req, err := wire.DecodeTurnSubmitRequest(payload)
				if err != nil {
					return turnOutcome{}, internal(err, "the edge published a payload the strict decoder refuses")
				}
				canon, err := encodeTurn(req)
				if err != nil || !bytes.Equal(canon, payload) {
					return turnOutcome{}, internal(fmt.Errorf("payload %q is not canonical", payload), "the edge published a non-canonical payload")
				}
				if key != subjects.TurnKey(req.WorkItemID, req.Turn) || fp != wire.Fingerprint(req) {
					return turnOutcome{}, internal(errors.New("mismatch"), "key or fingerprint does not match the payload")
				}
				return turnOutcome{Body: decision(req)}, nil
			},
			ResultFunc: func(context.Context, string, string) (turnOutcome, error) {
				return turnOutcome{}, &wire.Error{Code: wire.CodeNotFound, Message: "none"}
			},
		},
		token:     testToken,
		connected: func() bool { return true },
		logger:    slog.New(slog.DiscardHandler),
	})

	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest(http.MethodPost, "/v1/turns", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testToken)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)

		_, decodeErr := wire.DecodeTurnSubmitRequest(body)
		if rec.Code >= 200 && rec.Code < 300 {
			if decodeErr != nil {
				t.Fatalf("status %d for a body the decoder refuses (%v)", rec.Code, decodeErr)
			}
			if !json.Valid(rec.Body.Bytes()) {
				t.Fatalf("status %d with a body that is not JSON: %q", rec.Code, rec.Body.Bytes())
			}
			return
		}
		var er wire.ErrorReply
		if err := json.Unmarshal(rec.Body.Bytes(), &er); err != nil || er.Error == nil || er.Error.Code == "" {
			t.Fatalf("status %d with body %q: not a wire.ErrorReply with a code (%v)", rec.Code, rec.Body.Bytes(), err)
		}
		if er.Error.Code == wire.CodeInternal {
			t.Fatalf("internal error for body %q: %s", body, er.Error.Message)
		}
		if decodeErr == nil {
			t.Fatalf("status %d (%s) for a body the decoder accepts", rec.Code, er.Error.Message)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("Content-Type %q", ct)
		}
	})
}

// FuzzApprovalDecideDecode posts arbitrary bodies to the three decision
// routes. Whatever the body: no panic; a 2xx only when the brain got a
// decide request that passes its own strict decoding and rules, by
// "n8n:<by>"; every other answer is a wire.ErrorReply with a code that is
// not internal.
func FuzzApprovalDecideDecode(f *testing.F) {
	f.Add(uint8(0), []byte(`{"by":"alice"}`))
	f.Add(uint8(1), []byte(`{"by":"alice","params":{"subject":"s","body":"b","tone":"formal"}}`))
	f.Add(uint8(2), []byte(`{"by":"alice","reason":"phoned instead"}`))
	f.Add(uint8(1), []byte(`{"by":"alice","params":{"body":"b","body":"c"}}`))
	f.Add(uint8(2), []byte(`{"by":"al\u0000ice","reason":"x"}`))
	f.Add(uint8(0), []byte(`{"by":"alice"} trailing`))
	f.Add(uint8(1), []byte(`{"by":"alice","params":null}`))

	decisions := []wire.ApprovalDecision{wire.DecisionApprove, wire.DecisionEdit, wire.DecisionReject}
	id := testUUID(1)
	h := newHandler(deps{
		brain: &fakeBrainClient{
			CallFunc: func(_ context.Context, method string, req any) ([]byte, error) {
				if method != subjects.APIApprovalDecide {
					return nil, internal(nil, "unexpected method "+method)
				}
				payload, err := json.Marshal(req)
				if err != nil {
					return nil, internal(err, "unencodable request")
				}
				var got wire.ApprovalDecideRequest
				if err := wire.DecodeAPI(payload, &got); err != nil {
					return nil, internal(err, "the brain would refuse the request")
				}
				if err := got.Validate(); err != nil || got.ApprovalID != id || !strings.HasPrefix(got.By, "n8n:") {
					return nil, internal(err, "the request breaks the brain's rules")
				}
				return json.Marshal(wire.ApprovalDecideReply{Approval: sampleApproval(id), EventID: testUUID(2)})
			},
		},
		token:     testToken,
		connected: func() bool { return true },
		logger:    slog.New(slog.DiscardHandler),
	})

	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		decision := decisions[int(which)%len(decisions)]
		req := httptest.NewRequest(http.MethodPost, "/v1/approvals/"+id+"/"+string(decision), bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testToken)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)

		_, decodeErr := decodeDecideBody(id, body, decision)
		if rec.Code >= 200 && rec.Code < 300 {
			if decodeErr != nil {
				t.Fatalf("status %d for a body the decoder refuses (%v)", rec.Code, decodeErr)
			}
			return
		}
		var er wire.ErrorReply
		if err := json.Unmarshal(rec.Body.Bytes(), &er); err != nil || er.Error == nil || er.Error.Code == "" {
			t.Fatalf("status %d with body %q: not a wire.ErrorReply with a code (%v)", rec.Code, rec.Body.Bytes(), err)
		}
		if er.Error.Code == wire.CodeInternal {
			t.Fatalf("internal error for %s body %q: %s", decision, body, er.Error.Message)
		}
		if decodeErr == nil {
			t.Fatalf("status %d (%s) for a body the decoder accepts", rec.Code, er.Error.Message)
		}
	})
}

// The payload the edge publishes decodes, strictly, to the turn it was
// made from, with its fingerprint, and is no longer than a compact form of
// it: U+2028 and U+2029 are written as they are, every other escape kept
// (a text that spells "\u2028" with a backslash stays that text).
func FuzzEncodeTurnRoundTrips(f *testing.F) {
	for _, s := range []string{"plain", "a\u2028b\u2029c", `\u2028`, `\\u2028`, "\\\u2028", `"\u2028"`, "\u2028\\", "<&>\n\t\x01"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		req := &wire.TurnSubmitRequest{WorkItemID: "w", Turn: 1, Email: &wire.Email{From: "a@b.example", Subject: text, Body: text + "\u2028" + text}}
		if !utf8.ValidString(text) || strings.ContainsRune(text, 0) {
			return // the decoder refuses these before anything is encoded
		}
		payload, err := encodeTurn(req)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(payload, []byte(`\u2028`)) && !bytes.Contains([]byte(text), []byte(`\u2028`)) {
			t.Fatalf("the payload escapes U+2028: %q", payload)
		}
		got, err := wire.DecodeTurnSubmitRequest(payload)
		if err != nil {
			t.Fatalf("the published payload does not decode: %v (%q)", err, payload)
		}
		if got.Email.Subject != text || got.Email.Body != req.Email.Body || wire.Fingerprint(got) != wire.Fingerprint(req) {
			t.Fatalf("round trip changed the turn: %+q → %+q", text, got.Email.Subject)
		}
		compact, _ := json.Marshal(req)
		if len(payload) > len(compact) {
			t.Fatalf("the payload (%d bytes) is longer than json.Marshal's (%d)", len(payload), len(compact))
		}
	})
}
