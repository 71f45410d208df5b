package edge

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// Client-chosen names (JSON keys, query parameter names, the method of an
// unknown route) reach the error body and the request's log line: both are
// capped and escaped, whatever the client sent.
func TestClientChosenNamesAreCappedInAnswersAndLogs(t *testing.T) {
	t.Parallel()
	n := startNATS(t, true)
	e := startEdge(t, n, nil)

	longKey := strings.Repeat("k", 10_000) // the request line must fit the 16 KiB header limit
	r := e.do(t, http.MethodGet, "/v1/approvals?"+longKey+"=1", nil, nil)
	if we := r.wireError(t); r.status != http.StatusBadRequest || len(we.Field) > maxQueryNameBytes || len(we.Message) > 2*maxQueryNameBytes {
		t.Errorf("unknown 10 KB query name: %d, field %d bytes, message %d bytes", r.status, len(we.Field), len(we.Message))
	}
	r = e.do(t, http.MethodGet, "/v1/approvals?%1b%5b2J%e2%80%ae=1", nil, nil)
	if we := r.wireError(t); we.Field != `\u001b[2J\u202e` {
		t.Errorf("query name with a terminal escape and a bidi control: field %q", we.Field)
	}

	body := []byte(`{"work_item_id":"w","turn":1,"email":{"from":"a@b","subject":"s","body":"b"},"` + strings.Repeat("x", 60_000) + `":1}`)
	r = e.submit(t, body)
	if we := r.wireError(t); r.status != http.StatusBadRequest || len(we.Field) > 64 || len(r.body) > 1024 {
		t.Errorf("unknown 60 KB JSON key: %d, field %d bytes, body %d bytes", r.status, len(we.Field), len(r.body))
	}

	req, err := http.NewRequest(strings.Repeat("M", 8_000), e.url+"/nowhere", nil)
	must(t, err)
	res, err := e.client.Do(req)
	must(t, err)
	res.Body.Close()

	e.logs.waitFor(t, `"status":404`)
	for _, line := range bytes.Split([]byte(e.logs.String()), []byte("\n")) {
		if len(line) > 2048 {
			t.Errorf("a log line of %d bytes: %.300s…", len(line), line)
		}
	}
	if strings.Contains(e.logs.String(), strings.Repeat("x", 100)) || strings.Contains(e.logs.String(), strings.Repeat("M", 600)) {
		t.Error("the log carries a client-chosen name uncut")
	}
}
