// Package evaltest holds the eval's model double for tests: an Ollama
// script (internal/ollamafake) that answers every e-mail of a labelled set
// with its labels, so a run over the whole set exercises the real decision
// path with known answers. Test code only.
package evaltest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/ollama/ollama/api"

	"n8nbrain/brain/eval"
	"n8nbrain/catalogue"
	"n8nbrain/internal/ollamafake"
)

// Prompt bounds of the model stage (capture): the e-mail as the model sees it.
const (
	maxBody    = 8000
	maxSubject = 300
	maxFrom    = 320
)

// PromptEmail is the e-mail as a chat request shows it to the model.
type PromptEmail struct {
	From    string `json:"from"`
	Subject string `json:"subject"`
	Body    string `json:"body"`
}

// EmailOf extracts the e-mail from a chat request's last <email> block.
func EmailOf(req *api.ChatRequest) (PromptEmail, bool) {
	var e PromptEmail
	for _, m := range req.Messages {
		if m.Role != "user" {
			continue
		}
		i := strings.Index(m.Content, "<email>\n")
		j := strings.LastIndex(m.Content, "\n</email>")
		if i < 0 || j < i {
			continue
		}
		dec := json.NewDecoder(strings.NewReader(m.Content[i+len("<email>\n") : j]))
		var full map[string]json.RawMessage
		if dec.Decode(&full) != nil {
			return e, false
		}
		_ = json.Unmarshal(full["from"], &e.From)
		_ = json.Unmarshal(full["subject"], &e.Subject)
		_ = json.Unmarshal(full["body"], &e.Body)
		return e, true
	}
	return e, false
}

// IsClassify tells the classification request (its schema has a category)
// from the drafting one.
func IsClassify(req *api.ChatRequest) bool { return bytes.Contains(req.Format, []byte(`"category"`)) }

// IsRepair tells a repair (a second user message) from a first question.
func IsRepair(req *api.ChatRequest) bool {
	n := 0
	for _, m := range req.Messages {
		if m.Role == "user" {
			n++
		}
	}
	return n > 1
}

func cut(s string, n int) string {
	r := []rune(s)
	if len(r) > n {
		return string(r[:n])
	}
	return s
}

// Key identifies an e-mail by what the prompt shows of it.
func Key(from, subject, body string) string {
	return cut(from, maxFrom) + "\x00" + cut(subject, maxSubject) + "\x00" + cut(body, maxBody)
}

// Double answers each e-mail of the items with its labels: the labelled
// category, priority and action (escalate as escalate_item), and a draft
// that states every required fact as its first alternative says it.
type Double struct {
	byKey   map[string]*eval.Item
	mu      sync.Mutex
	unknown []string
}

// NewDouble indexes the items by their prompt key.
func NewDouble(items []eval.Item) (*Double, error) {
	d := &Double{byKey: map[string]*eval.Item{}}
	for i := range items {
		it := &items[i]
		k := Key(it.Email.From, it.Email.Subject, it.Email.Body)
		if other, ok := d.byKey[k]; ok {
			return nil, fmt.Errorf("items %s and %s look the same to the model", other.ID, it.ID)
		}
		d.byKey[k] = it
	}
	return d, nil
}

// Unknown lists the subjects of e-mails the double was asked about and
// does not know.
func (d *Double) Unknown() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.unknown...)
}

// Item returns the item a request is about.
func (d *Double) Item(req *api.ChatRequest) *eval.Item {
	e, ok := EmailOf(req)
	if !ok {
		return nil
	}
	return d.byKey[Key(e.From, e.Subject, e.Body)]
}

// Chat is the ollamafake script.
func (d *Double) Chat(req *api.ChatRequest) ollamafake.Reply {
	it := d.Item(req)
	if it == nil {
		e, _ := EmailOf(req)
		d.mu.Lock()
		d.unknown = append(d.unknown, e.Subject)
		d.mu.Unlock()
		return ollamafake.Reply{Status: http.StatusBadRequest, Error: "unknown e-mail"}
	}
	if IsClassify(req) {
		return ollamafake.Reply{Content: Classification(it.Labels)}
	}
	return ollamafake.Reply{Content: DraftFor(it.Labels)}
}

// Classification is the answer that classifies an item as its labels say.
func Classification(l eval.Labels) string {
	action, params := l.Action, any(map[string]any{})
	switch catalogue.Name(l.Action) {
	case catalogue.CreateJob:
		params = map[string]string{"title": "Job from e-mail", "description": "As described in the e-mail."}
	case catalogue.CloseItem:
		params = map[string]string{"resolution": "nothing to do"}
	}
	if l.Action == eval.ActionEscalate {
		action, params = string(catalogue.EscalateItem), map[string]string{"reason": "a person decides"}
	}
	b, _ := json.Marshal(map[string]any{"category": l.Category, "priority": l.Priority, "confidence": 0.9,
		"action": action, "params": params})
	return string(b)
}

// DraftFor is a draft stating every required fact of the labels.
func DraftFor(l eval.Labels) string {
	var facts []string
	for _, f := range l.RequiredFacts {
		first, _, _ := strings.Cut(f, " | ")
		facts = append(facts, first)
	}
	body := "Hello,\n\nThank you for your email. We have noted: " + strings.Join(facts, "; ") + ".\n\nKind regards,\nThe office"
	b, _ := json.Marshal(map[string]string{"subject": "Re: your email", "body": body, "tone": "neutral"})
	return string(b)
}
