package catalogue

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Form is how a human reviews an action: its name in plain words, a label
// and help for each parameter, and which parameters are shown but never
// edited. It is presentation and edit policy, kept apart from the published
// catalogue: it is not part of Canonical, so it can be worded better without
// touching a published version's hash. The parameters' types, limits and
// meaning stay the catalogue's.
type Form struct {
	// Title names the action for a person ("Reply by e-mail").
	Title string
	// Fields follow the action's Params, one each, in the same order.
	Fields []Field
}

// Field is one parameter on a review form.
type Field struct {
	Param Param
	// Label and Help are what a reviewer reads.
	Label string
	Help  string
	// Input is how the value is entered.
	Input Input
	// ReadOnly parameters are shown but never changed by an edit: the brain
	// refuses an edit that changes one (external_ref is what keeps n8n from
	// creating the same job twice).
	ReadOnly bool
}

// Input is the kind of control a field is edited with.
type Input string

const (
	InputLine   Input = "line"   // one line of text
	InputText   Input = "text"   // several lines of text
	InputChoice Input = "choice" // one of the parameter's Enum
	InputNumber Input = "number" // an integer
	InputCheck  Input = "check"  // true or false
)

// fieldText is the wording of one parameter; Input and ReadOnly refine
// what the parameter's type implies.
type fieldText struct {
	label, help string
	multiline   bool
	readOnly    bool
}

type formText struct {
	title  string
	fields map[string]fieldText
}

// forms holds the wording of every published version's actions.
var forms = map[Version]map[Name]formText{
	1: {
		DraftReply: {title: "Reply by e-mail", fields: map[string]fieldText{
			"subject": {label: "Subject", help: "The subject line of the reply."},
			"body":    {label: "Reply", help: "The text of the reply, exactly as it will be sent.", multiline: true},
			"tone":    {label: "Tone", help: "How the reply is written. Choosing another does not rewrite the text."},
		}},
		SendReply: {title: "Send the approved reply", fields: map[string]fieldText{
			"approval_id":            {label: "Approval", readOnly: true},
			"content_sha256":         {label: "Fingerprint of the approved text", readOnly: true},
			"abort_if_replied_since": {label: "Do not send if someone replied after", readOnly: true},
		}},
		CreateJob: {title: "Create a job", fields: map[string]fieldText{
			"title":        {label: "Job title", help: "A short name for the job."},
			"description":  {label: "What has to be done", multiline: true},
			"site_address": {label: "Site address", help: "Where the work is, if known. Leave empty if not."},
			"external_ref": {label: "Reference", help: "Set by the brain for this e-mail: the job system stores it so that the same job is never created twice. It cannot be changed.", readOnly: true},
		}},
		EscalateItem: {title: "Hand to a person", fields: map[string]fieldText{
			"reason": {label: "Why a person must decide", multiline: true},
		}},
		CloseItem: {title: "Close without action", fields: map[string]fieldText{
			"resolution": {label: "Why it is closed"},
		}},
		VerifyReplySent: {title: "Check whether the reply was sent", fields: map[string]fieldText{
			"approval_id":    {label: "Approval", readOnly: true},
			"content_sha256": {label: "Fingerprint of the text", readOnly: true},
		}},
		VerifyJob: {title: "Check whether the job was created", fields: map[string]fieldText{
			"external_ref": {label: "Reference", readOnly: true},
		}},
	},
}

// FormOf returns the review form of an action of a published version.
func FormOf(v Version, name Name) (Form, bool) {
	a, ok := Lookup(v, name)
	if !ok {
		return Form{}, false
	}
	ft, ok := forms[v][name]
	if !ok {
		return Form{}, false
	}
	f := Form{Title: ft.title, Fields: make([]Field, 0, len(a.Params))}
	for _, p := range a.Params {
		t := ft.fields[p.Name]
		fd := Field{Param: p, Label: t.label, Help: t.help, ReadOnly: t.readOnly, Input: InputLine}
		if fd.Label == "" {
			fd.Label = p.Name
		}
		switch {
		case p.Type == TypeInteger:
			fd.Input = InputNumber
		case p.Type == TypeBoolean:
			fd.Input = InputCheck
		case len(p.Enum) > 0:
			fd.Input = InputChoice
		case t.multiline:
			fd.Input = InputText
		}
		f.Fields = append(f.Fields, fd)
	}
	return f, true
}

// ReadOnlyChange names the first read-only parameter whose value differs
// between proposed and edited parameters (both JSON objects), or "" when
// every read-only parameter is kept exactly.
func (f Form) ReadOnlyChange(proposed, edited json.RawMessage) (string, error) {
	var p, e map[string]json.RawMessage
	if err := json.Unmarshal(proposed, &p); err != nil {
		return "", fmt.Errorf("proposed parameters: %w", err)
	}
	if err := json.Unmarshal(edited, &e); err != nil {
		return "", fmt.Errorf("edited parameters: %w", err)
	}
	for _, fd := range f.Fields {
		if !fd.ReadOnly {
			continue
		}
		pv, inP := p[fd.Param.Name]
		ev, inE := e[fd.Param.Name]
		if inP != inE || (inP && !sameJSON(pv, ev)) {
			return fd.Param.Name, nil
		}
	}
	return "", nil
}

// sameJSON compares two JSON values by meaning (spacing and escapes aside).
func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}
