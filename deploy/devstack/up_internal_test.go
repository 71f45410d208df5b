package devstack

import (
	"strings"
	"testing"
	"time"

	"n8nbrain/edge"
)

// make dev passes the edge timing settings it documents; a bad value is an
// error naming the variable, not a silent default.
func TestEdgeTimingFromEnv(t *testing.T) {
	env := map[string]string{"EDGE_TURN_WAIT": "25s", "EDGE_PUBLISH_TIMEOUT": "7s", "EDGE_WEBHOOK_TIMEOUT": "1m"}
	var c edge.Config
	if err := edgeTimingFromEnv(&c, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if c.TurnWait != 25*time.Second || c.PublishTimeout != 7*time.Second || c.WebhookTimeout != time.Minute {
		t.Fatalf("edge config %+v", c)
	}
	env["EDGE_TURN_WAIT"] = "soon"
	err := edgeTimingFromEnv(&edge.Config{}, func(k string) string { return env[k] })
	if err == nil || !strings.Contains(err.Error(), "EDGE_TURN_WAIT") {
		t.Fatalf("bad EDGE_TURN_WAIT: %v", err)
	}
}

// The n8n files refuse what would break the shipped workflows.
func TestWriteN8NRefusesBadSettings(t *testing.T) {
	ok := N8NOptions{EdgeURL: "http://127.0.0.1:8480", EdgeToken: strings.Repeat("t", 16),
		EventSecret: strings.Repeat("e", 16), IntakeSecret: strings.Repeat("i", 16)}
	for name, mutate := range map[string]func(*N8NOptions){
		"EdgeURLWithPath":   func(o *N8NOptions) { o.EdgeURL = "http://edge:8480/v1" },
		"NoEdgeURL":         func(o *N8NOptions) { o.EdgeURL = "" },
		"SameSecrets":       func(o *N8NOptions) { o.IntakeSecret = o.EventSecret },
		"ShortToken":        func(o *N8NOptions) { o.EdgeToken = "short" },
		"NotAnAddressFrom":  func(o *N8NOptions) { o.MailFrom = "assistant" },
		"NotAnAddressNotif": func(o *N8NOptions) { o.NotifyTo = "reviewers" },
	} {
		t.Run(name, func(t *testing.T) {
			o := ok
			mutate(&o)
			if _, err := WriteN8N(t.TempDir(), o, -1); err == nil {
				t.Fatalf("accepted %+v", o)
			}
		})
	}
	if _, err := WriteN8N(t.TempDir(), ok, -1); err != nil {
		t.Fatalf("valid settings refused: %v", err)
	}
}
