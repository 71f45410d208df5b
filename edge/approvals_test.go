package edge

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"n8nbrain/subjects"
	"n8nbrain/wire"
)

// Approval ids the fake brain answers with an error.
var (
	idNotFound      = testUUID(404)
	idResolved      = testUUID(409)
	idUnprocessable = testUUID(422)
	// Approvals that can no longer be decided.
	idDecided    = testUUID(200)
	idPastExpiry = testUUID(201)
	// An approval alice approved, for the page that confirms her decision.
	idAliceApproved = testUUID(202)
)

// answerAPI is a fake brain that knows every approval but idNotFound, and
// refuses decisions on idResolved and idUnprocessable.
func answerAPI(c apiCall) apiAnswer {
	id, decide := c.approvalID(), c.Method == subjects.APIApprovalDecide
	switch {
	case id == idNotFound:
		return apiAnswer{Error: &wire.Error{Code: wire.CodeNotFound, Message: "no such approval"}}
	case id == idResolved && decide:
		return apiAnswer{Error: &wire.Error{Code: wire.CodeConflict, Reason: wire.ReasonAlreadyResolved, Message: "the approval is already approved"}}
	case id == idUnprocessable && decide:
		return apiAnswer{Error: &wire.Error{Code: wire.CodeUnprocessable, Field: "edited.subject", Message: "edited parameters: subject is required"}}
	}
	switch c.Method {
	case subjects.APIApprovalList:
		return apiAnswer{Reply: wire.ApprovalListReply{Approvals: []wire.Approval{sampleApproval(testUUID(1)), sampleApproval(testUUID(2))}, Total: 2}}
	case subjects.APIApprovalGet:
		a := sampleApproval(id)
		switch id {
		case idDecided:
			edited := []byte(`{"body":"Edited by Bob","subject":"Re: Quote","tone":"friendly"}`)
			at := a.CreatedAt.Add(30 * time.Minute)
			a.Status, a.DecidedBy, a.DecidedAt = wire.ApprovalStatusApproved, "reviewer:bob", &at
			a.Edited, a.EditedSHA256, a.ApprovedSHA256 = edited, wire.ContentSHA256(edited), wire.ContentSHA256(edited)
		case idPastExpiry:
			a.ExpiresAt = a.CreatedAt.Add(time.Second)
		case idAliceApproved:
			at := a.CreatedAt.Add(time.Minute)
			a.Status, a.DecidedBy, a.DecidedAt, a.ApprovedSHA256 = wire.ApprovalStatusApproved, "reviewer:alice", &at, a.ProposedSHA256
		}
		return apiAnswer{Reply: wire.ApprovalGetReply{Approval: a, Email: sampleEmail()}}
	case subjects.APIApprovalDecide:
		var req wire.ApprovalDecideRequest
		if err := wire.DecodeAPI(c.Body, &req); err != nil {
			return apiAnswer{Error: wire.ErrorOf(err)}
		}
		a := sampleApproval(req.ApprovalID)
		a.Status, a.DecidedBy = wire.ApprovalStatusApproved, req.By
		if req.Decision == wire.DecisionReject {
			a.Status, a.RejectReason = wire.ApprovalStatusRejected, req.Reason
		}
		return apiAnswer{Reply: wire.ApprovalDecideReply{Approval: a, EventID: testUUID(9000)}}
	case subjects.APIReport:
		var rep wire.OutcomeReport
		rep.Items, rep.Succeeded, rep.SucceededRate = 4, 3, 0.75
		return apiAnswer{Reply: rep}
	case subjects.APIEventAck:
		return apiAnswer{Reply: wire.EventAckReply{Delivered: true}}
	}
	return apiAnswer{Error: &wire.Error{Code: wire.CodeNotFound, Message: "unknown API method " + c.Method}}
}

func TestApprovalAPIRelays(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	fa := startFakeAPI(t, n, answerAPI)
	e := startEdge(t, n, nil)
	id := testUUID(7)

	t.Run("List", func(t *testing.T) {
		r := e.do(t, http.MethodGet, "/v1/approvals", nil, nil)
		var rep wire.ApprovalListReply
		if r.status != 200 || json.Unmarshal(r.body, &rep) != nil || len(rep.Approvals) != 2 {
			t.Fatalf("status %d body %s; want 200 and two approvals", r.status, r.body)
		}
		c := next(t, fa.calls, "approval.list")
		var req wire.ApprovalListRequest
		must(t, wire.DecodeAPI(c.Body, &req))
		if c.Method != subjects.APIApprovalList || req.Status != wire.ApprovalStatusPending || req.Limit != 50 {
			t.Errorf("the brain got %s %+v, want approval.list pending 50", c.Method, req)
		}

		r = e.do(t, http.MethodGet, "/v1/approvals?status=expired&limit=200", nil, nil)
		if r.status != 200 {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
		must(t, wire.DecodeAPI(next(t, fa.calls, "approval.list").Body, &req))
		if req.Status != wire.ApprovalStatusExpired || req.Limit != 200 {
			t.Errorf("the brain got %+v, want expired 200", req)
		}

		r = e.do(t, http.MethodGet, "/v1/approvals?q=Smith+%26+Sons&cursor=abc&brief=true", nil, nil)
		if r.status != 200 {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
		req = wire.ApprovalListRequest{}
		must(t, wire.DecodeAPI(next(t, fa.calls, "approval.list").Body, &req))
		if req.Query != "Smith & Sons" || req.Cursor != "abc" || !req.Brief {
			t.Errorf("the brain got %+v, want the query, cursor and brief passed on", req)
		}

		// The README's form of the route, every optional parameter empty,
		// as n8n sends fields left blank: the first page of the defaults.
		r = e.do(t, http.MethodGet, "/v1/approvals?status=&limit=&q=&cursor=&brief=", nil, nil)
		if r.status != 200 {
			t.Fatalf("empty parameters: status %d body %s", r.status, r.body)
		}
		req = wire.ApprovalListRequest{}
		must(t, wire.DecodeAPI(next(t, fa.calls, "approval.list").Body, &req))
		if req != (wire.ApprovalListRequest{Status: wire.ApprovalStatusPending, Limit: 50}) {
			t.Errorf("empty parameters: the brain got %+v, want the defaults", req)
		}
	})

	t.Run("Get", func(t *testing.T) {
		r := e.do(t, http.MethodGet, "/v1/approvals/"+id, nil, nil)
		var rep wire.ApprovalGetReply
		if r.status != 200 || json.Unmarshal(r.body, &rep) != nil || rep.Approval.ID != id || rep.Email == nil {
			t.Fatalf("status %d body %s; want 200 and the approval with its e-mail", r.status, r.body)
		}
		if c := next(t, fa.calls, "approval.get"); c.Method != subjects.APIApprovalGet || c.approvalID() != id {
			t.Errorf("the brain got %s %s", c.Method, c.Body)
		}
	})

	t.Run("Approve", func(t *testing.T) {
		r := e.do(t, http.MethodPost, "/v1/approvals/"+id+"/approve", []byte(`{"by":"alice"}`), nil)
		var rep wire.ApprovalDecideReply
		if r.status != 200 || json.Unmarshal(r.body, &rep) != nil || rep.Approval.DecidedBy != "n8n:alice" || rep.EventID == "" {
			t.Fatalf("status %d body %s; want 200 and the decided approval", r.status, r.body)
		}
		req := next(t, fa.calls, "approval.decide").decide(t)
		if req.ApprovalID != id || req.Decision != wire.DecisionApprove || req.By != "n8n:alice" || req.Edited != nil || req.Reason != "" {
			t.Errorf("the brain got %+v", req)
		}
	})

	t.Run("Edit", func(t *testing.T) {
		params := `{"subject":"Re: Quote","body":"We can come on Tuesday.","tone":"formal"}`
		r := e.do(t, http.MethodPost, "/v1/approvals/"+id+"/edit", []byte(`{"by":"alice","params":`+params+`}`), nil)
		if r.status != 200 {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
		req := next(t, fa.calls, "approval.decide").decide(t)
		if req.Decision != wire.DecisionEdit || req.By != "n8n:alice" || string(req.Edited) != params {
			t.Errorf("the brain got %+v edited %s, want edit by n8n:alice with the params", req, req.Edited)
		}
	})

	t.Run("Reject", func(t *testing.T) {
		r := e.do(t, http.MethodPost, "/v1/approvals/"+id+"/reject", []byte(`{"by":"alice","reason":"the customer phoned instead"}`), nil)
		if r.status != 200 {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
		req := next(t, fa.calls, "approval.decide").decide(t)
		if req.Decision != wire.DecisionReject || req.By != "n8n:alice" || req.Reason != "the customer phoned instead" {
			t.Errorf("the brain got %+v", req)
		}
	})

	t.Run("Report", func(t *testing.T) {
		r := e.do(t, http.MethodGet, "/v1/report?since=2026-01-31T00:00:00Z", nil, nil)
		var rep wire.OutcomeReport
		if r.status != 200 || json.Unmarshal(r.body, &rep) != nil || rep.Items != 4 || rep.SucceededRate != 0.75 {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
		var req wire.ReportRequest
		c := next(t, fa.calls, "report.outcomes")
		must(t, wire.DecodeAPI(c.Body, &req))
		if c.Method != subjects.APIReport || req.Since == nil || !req.Since.Equal(time.Date(2026, 1, 31, 0, 0, 0, 0, time.UTC)) {
			t.Errorf("the brain got %s %s", c.Method, c.Body)
		}
		r = e.do(t, http.MethodGet, "/v1/report", nil, nil)
		var all wire.ReportRequest
		must(t, wire.DecodeAPI(next(t, fa.calls, "report.outcomes").Body, &all))
		if r.status != 200 || all.Since != nil {
			t.Errorf("without since: status %d, the brain got since %v", r.status, all.Since)
		}
	})

	if logs := e.logs.String(); !strings.Contains(logs, `"route":"POST /v1/approvals/{id}/approve"`) ||
		!strings.Contains(logs, `"approval_id":"`+id+`"`) || strings.Contains(logs, "We can come on Tuesday") {
		t.Errorf("the log lacks the route and approval id, or holds content:\n%s", logs)
	}
}

func TestApprovalAPIRejects(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	fa := startFakeAPI(t, n, answerAPI)
	e := startEdge(t, n, nil)
	id := testUUID(8)
	decide := func(decision string) string { return "/v1/approvals/" + id + "/" + decision }
	huge := append([]byte(`{"by":"alice","reason":"`), bytes.Repeat([]byte("x"), wire.MaxAPIBytes)...)
	huge = append(huge, `"}`...)

	for _, tc := range []struct {
		name   string
		method string
		path   string
		body   []byte
		header map[string]string
		status int
		field  string
	}{
		{name: "NoToken", method: "GET", path: "/v1/approvals", header: map[string]string{"Authorization": ""}, status: 401},
		{name: "BadStatus", method: "GET", path: "/v1/approvals?status=open", status: 400, field: "status"},
		{name: "LimitZero", method: "GET", path: "/v1/approvals?limit=0", status: 400, field: "limit"},
		{name: "LimitTooBig", method: "GET", path: "/v1/approvals?limit=201", status: 400, field: "limit"},
		{name: "LimitNotANumber", method: "GET", path: "/v1/approvals?limit=ten", status: 400, field: "limit"},
		{name: "UnknownQuery", method: "GET", path: "/v1/approvals?state=pending", status: 400, field: "state"},
		{name: "SearchTooLong", method: "GET", path: "/v1/approvals?q=" + strings.Repeat("x", 201), status: 400, field: "q"},
		{name: "SearchControl", method: "GET", path: "/v1/approvals?q=a%07b", status: 400, field: "q"},
		{name: "BriefNotBool", method: "GET", path: "/v1/approvals?brief=yes", status: 400, field: "brief"},
		{name: "RepeatedQuery", method: "GET", path: "/v1/approvals?status=pending&status=expired", status: 400, field: "status"},
		{name: "GetBadID", method: "GET", path: "/v1/approvals/not-a-uuid", status: 400, field: "id"},
		{name: "GetUppercaseID", method: "GET", path: "/v1/approvals/" + strings.ToUpper("0000000a-0000-4000-8000-00000000000a"), status: 400, field: "id"},
		{name: "DecideBadID", method: "POST", path: "/v1/approvals/12345/approve", body: []byte(`{"by":"alice"}`), status: 400, field: "id"},
		{name: "ApproveNoBy", method: "POST", path: decide("approve"), body: []byte(`{}`), status: 400, field: "by"},
		{name: "ApproveEmptyBody", method: "POST", path: decide("approve"), body: []byte{}, status: 400, field: "by"},
		{name: "ApproveControlInBy", method: "POST", path: decide("approve"), body: []byte(`{"by":"al\u0000ice"}`), status: 400, field: "by"},
		{name: "ApproveUnknownField", method: "POST", path: decide("approve"), body: []byte(`{"by":"alice","params":{}}`), status: 400, field: "params"},
		{name: "ApproveDuplicateKey", method: "POST", path: decide("approve"), body: []byte(`{"by":"alice","by":"mallory"}`), status: 400, field: "by"},
		{name: "ApproveTrailing", method: "POST", path: decide("approve"), body: []byte(`{"by":"alice"} {}`), status: 400, field: wire.DocumentField},
		{name: "ApproveNotJSON", method: "POST", path: decide("approve"), body: []byte(`{"by":"alice"}`), header: map[string]string{"Content-Type": "text/plain"}, status: 415, field: "Content-Type"},
		{name: "EditNoParams", method: "POST", path: decide("edit"), body: []byte(`{"by":"alice"}`), status: 400, field: "params"},
		{name: "EditNullParams", method: "POST", path: decide("edit"), body: []byte(`{"by":"alice","params":null}`), status: 400, field: "params"},
		{name: "EditArrayParams", method: "POST", path: decide("edit"), body: []byte(`{"by":"alice","params":[1]}`), status: 400, field: "params"},
		{name: "EditNoBy", method: "POST", path: decide("edit"), body: []byte(`{"params":{"subject":"s","body":"b"}}`), status: 400, field: "by"},
		{name: "EditDuplicateInParams", method: "POST", path: decide("edit"), body: []byte(`{"by":"a","params":{"body":"b","body":"c"}}`), status: 400, field: "params.body"},
		{name: "RejectNoReason", method: "POST", path: decide("reject"), body: []byte(`{"by":"alice"}`), status: 400, field: "reason"},
		{name: "RejectReasonTooLong", method: "POST", path: decide("reject"), body: []byte(`{"by":"alice","reason":"` + strings.Repeat("x", 1001) + `"}`), status: 400, field: "reason"},
		{name: "RejectTooLarge", method: "POST", path: decide("reject"), body: huge, status: 413},
		{name: "UnknownDecision", method: "POST", path: decide("publish"), body: []byte(`{"by":"alice"}`), status: 404},
		{name: "ReportBadSince", method: "GET", path: "/v1/report?since=yesterday", status: 400, field: "since"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := e.do(t, tc.method, tc.path, tc.body, tc.header)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d; body %s", r.status, tc.status, r.body)
			}
			if we := r.wireError(t); we.Field != tc.field {
				t.Errorf("error %+v, want field %q", we, tc.field)
			}
		})
	}
	t.Cleanup(func() { fa.none(t, "a rejected request") })
}

func TestApprovalAPIBrainErrors(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	startFakeAPI(t, n, answerAPI)
	e := startEdge(t, n, nil)

	for _, tc := range []struct {
		name   string
		method string
		path   string
		body   string
		status int
		code   wire.Code
		reason string
	}{
		{"GetNotFound", "GET", "/v1/approvals/" + idNotFound, "", 404, wire.CodeNotFound, ""},
		{"ApproveNotFound", "POST", "/v1/approvals/" + idNotFound + "/approve", `{"by":"alice"}`, 404, wire.CodeNotFound, ""},
		{"ApproveResolved", "POST", "/v1/approvals/" + idResolved + "/approve", `{"by":"alice"}`, 409, wire.CodeConflict, wire.ReasonAlreadyResolved},
		{"RejectResolved", "POST", "/v1/approvals/" + idResolved + "/reject", `{"by":"alice","reason":"no"}`, 409, wire.CodeConflict, wire.ReasonAlreadyResolved},
		{"EditUnprocessable", "POST", "/v1/approvals/" + idUnprocessable + "/edit", `{"by":"alice","params":{"body":"b"}}`, 422, wire.CodeUnprocessable, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var body []byte
			if tc.body != "" {
				body = []byte(tc.body)
			}
			r := e.do(t, tc.method, tc.path, body, nil)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d; body %s", r.status, tc.status, r.body)
			}
			if we := r.wireError(t); we.Code != tc.code || we.Reason != tc.reason || we.Message == "" {
				t.Errorf("error %+v, want code %s reason %q and the brain's message", we, tc.code, tc.reason)
			}
		})
	}
}

func TestApprovalAPIUnavailable(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	e := startEdge(t, n, nil)

	for _, path := range []string{"/v1/approvals", "/v1/approvals/" + testUUID(3), "/v1/report"} {
		r := e.do(t, http.MethodGet, path, nil, nil)
		if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
			t.Fatalf("GET %s without a brain: status %d Retry-After %q body %s; want 503 with Retry-After",
				path, r.status, r.header.Get("Retry-After"), r.body)
		}
		if we := r.wireError(t); we.Code != wire.CodeUnavailable {
			t.Errorf("GET %s: %+v, want unavailable", path, we)
		}
	}
	r := e.do(t, http.MethodPost, "/v1/approvals/"+testUUID(3)+"/approve", []byte(`{"by":"alice"}`), nil)
	if r.status != http.StatusServiceUnavailable {
		t.Errorf("approve without a brain: status %d body %s, want 503", r.status, r.body)
	}
}

func TestApprovalAPIMalformedReply(t *testing.T) {
	t.Parallel()
	n := startNATS(t, false)
	sub, err := n.brainNC.QueueSubscribe(subjects.APIQueueSubject(), subjects.APIQueue, func(m *nats.Msg) {
		out := nats.NewMsg(m.Reply)
		out.Data = []byte(`{"approvals":[]}`) // no Brain-Status header
		_ = m.RespondMsg(out)
	})
	must(t, err)
	must(t, n.brainNC.Flush())
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	e := startEdge(t, n, nil)

	r := e.do(t, http.MethodGet, "/v1/approvals", nil, nil)
	if r.status != http.StatusInternalServerError {
		t.Fatalf("status %d body %s, want 500 for a reply without %s", r.status, r.body, wire.HeaderStatus)
	}
}
