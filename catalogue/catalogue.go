// Package catalogue is the closed, versioned set of actions the brain may
// propose. Each action has a typed parameter schema and says whether it needs
// a human's approval; that is a property of the action type, never the
// model's judgement. Published versions are immutable: a changed meaning is a
// new action name in a new version (see published_test.go).
package catalogue

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Name is an action name: verb_object, lowercase snake case.
type Name string

// Version is a published catalogue version.
type Version int

// ParamType is the JSON type of a parameter.
type ParamType string

const (
	TypeString  ParamType = "string"
	TypeInteger ParamType = "integer"
	TypeBoolean ParamType = "boolean"
)

// Format narrows a string parameter.
type Format string

const (
	FormatNone     Format = ""
	FormatDateTime Format = "date-time" // RFC 3339
	FormatSHA256   Format = "sha256"    // 64 lowercase hex characters
	FormatUUID     Format = "uuid"
)

// Param is one parameter of an action.
type Param struct {
	Name        string    `json:"name"`
	Type        ParamType `json:"type"`
	Format      Format    `json:"format,omitempty"`
	Required    bool      `json:"required"`
	MaxLength   int       `json:"max_length,omitempty"`
	Enum        []string  `json:"enum,omitempty"`
	Description string    `json:"description"`
	// OneLine: a string that becomes one header line of a message (a
	// subject), so no line break (LineBreaks): a mailer would fold it away,
	// sending another text than the one approved, or take what follows for
	// a header. Not part of Canonical: it was added after version 1 was
	// published, and only holds a parameter to what its description already
	// says it is (a line), so it changes no published meaning or hash.
	OneLine bool `json:"-"`
	// FromItem: the brain sets the parameter from the work item
	// (WithItemParams), never a rule or a model: create_job's external_ref,
	// the reference that keeps n8n from creating a job twice, is one per
	// item. Written by a model it could name another item's job (an e-mail
	// asking for it, a model mistaken), and the job would never be made;
	// fixed in a rule, every item it decides would share one. Not part of
	// Canonical, like OneLine: its description already said "the reference
	// a job for this item carries".
	FromItem bool `json:"-"`
}

// LineBreaks are what a one-line string may not hold: CR, LF and the other
// characters that end a line somewhere (VT, FF, NEL, U+2028, U+2029).
const LineBreaks = "\r\n\v\f\u0085\u2028\u2029"

// Action is one entry of the catalogue.
type Action struct {
	Name Name `json:"name"`
	// Product is the kind of system that carries the action out ("email",
	// "job_management"), empty for actions on the work item itself.
	Product     string `json:"product,omitempty"`
	Description string `json:"description"`
	// RequiresApproval: the brain stops for a human before this action runs.
	RequiresApproval bool `json:"requires_approval"`
	// ChangesWorld: the action has an effect outside the brain, so its
	// parameters carry a reconciliation precondition n8n checks before acting.
	ChangesWorld bool `json:"changes_world"`
	// FollowUp: the action only continues an earlier decision (send what a
	// human approved, read back an unknown outcome). The brain proposes it
	// from the item's state; triage (rules or a model) never may.
	FollowUp bool    `json:"follow_up"`
	Params   []Param `json:"params"`
}

// Catalogue is one published version.
type Catalogue struct {
	Version Version  `json:"version"`
	Actions []Action `json:"actions"`
}

// Current is the version new work items are pinned to unless the tenant's
// registry entry pins another.
const Current Version = 1

// published holds every published version. It is built once, never changed,
// and only reachable through functions that return copies.
var published = map[Version]Catalogue{
	1: v1(),
}

// Get returns a copy of a published version.
func Get(v Version) (Catalogue, error) {
	c, ok := published[v]
	if !ok {
		return Catalogue{}, fmt.Errorf("catalogue version %d is not published", v)
	}
	return clone(c), nil
}

// Versions lists the published versions in order.
func Versions() []Version {
	vs := make([]Version, 0, len(published))
	for v := range published {
		vs = append(vs, v)
	}
	slices.Sort(vs)
	return vs
}

// Lookup returns an action of a published version.
func Lookup(v Version, name Name) (Action, bool) {
	c, ok := published[v]
	if !ok {
		return Action{}, false
	}
	for _, a := range c.Actions {
		if a.Name == name {
			return cloneAction(a), true
		}
	}
	return Action{}, false
}

// Canonical is the stable JSON encoding of a version, the input of the
// immutability check.
func Canonical(c Catalogue) []byte {
	b, err := json.Marshal(c)
	if err != nil {
		panic(err)
	}
	return b
}

func clone(c Catalogue) Catalogue {
	out := Catalogue{Version: c.Version, Actions: make([]Action, len(c.Actions))}
	for i, a := range c.Actions {
		out.Actions[i] = cloneAction(a)
	}
	return out
}

func cloneAction(a Action) Action {
	a.Params = slices.Clone(a.Params)
	for i := range a.Params {
		a.Params[i].Enum = slices.Clone(a.Params[i].Enum)
	}
	return a
}

// ItemRef is the reference of work item workItemID's effect: the same for
// every turn of the item, another for every other item, and short and plain
// whatever the item's id (an e-mail's Message-ID) holds.
func ItemRef(workItemID string) string {
	sum := sha256.Sum256([]byte(workItemID))
	return "n8nbrain-" + hex.EncodeToString(sum[:16])
}

// WithItemParams sets the action's FromItem parameters of raw, a JSON
// object, to workItemID's ItemRef, whatever they held; an action without
// any gets raw back as it is.
func (a Action) WithItemParams(raw json.RawMessage, workItemID string) (json.RawMessage, error) {
	fromItem := a.fromItem()
	if len(fromItem) == 0 {
		return raw, nil
	}
	fields, err := a.fields(raw)
	if err != nil {
		return nil, err
	}
	ref, _ := json.Marshal(ItemRef(workItemID))
	for _, name := range fromItem {
		fields[name] = ref
	}
	return json.Marshal(fields)
}

// ValidateRuleParams checks a rule's parameters as ValidateParams does,
// except those the brain sets from the work item (FromItem), which a rule
// may not give; it returns them in canonical form, without those.
func (a Action) ValidateRuleParams(raw json.RawMessage) (json.RawMessage, error) {
	fromItem := a.fromItem()
	if len(fromItem) == 0 {
		return a.ValidateParams(raw)
	}
	fields, err := a.fields(raw)
	if err != nil {
		return nil, err
	}
	for _, name := range fromItem {
		if _, given := fields[name]; given {
			return nil, &ParamError{Action: a.Name, Param: name,
				Problem: "is set by the brain, one for each work item; leave it out of the rule"}
		}
	}
	withRef, err := a.WithItemParams(raw, "")
	if err != nil {
		return nil, err
	}
	canon, err := a.ValidateParams(withRef)
	if err != nil {
		return nil, err
	}
	var out map[string]json.RawMessage
	if err := json.Unmarshal(canon, &out); err != nil {
		return nil, err
	}
	for _, name := range fromItem {
		delete(out, name)
	}
	return json.Marshal(out)
}

// fromItem names the action's FromItem parameters.
func (a Action) fromItem() []string {
	var names []string
	for _, p := range a.Params {
		if p.FromItem {
			names = append(names, p.Name)
		}
	}
	return names
}

// fields decodes raw parameters, a JSON object (absent or null: none), into
// its members, refusing duplicates and trailing data.
func (a Action) fields(raw json.RawMessage) (map[string]json.RawMessage, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		raw = json.RawMessage(`{}`)
	}
	fields, err := decodeObject(raw)
	if err != nil {
		return nil, &ParamError{Action: a.Name, Problem: err.Error()}
	}
	return fields, nil
}

// ParamError says which parameter of which action is wrong.
type ParamError struct {
	Action  Name
	Param   string
	Problem string
}

func (e *ParamError) Error() string {
	if e.Param == "" {
		return fmt.Sprintf("action %s: parameters %s", e.Action, e.Problem)
	}
	return fmt.Sprintf("action %s: parameter %q %s", e.Action, e.Param, e.Problem)
}

var sha256Re = regexp.MustCompile(`^[0-9a-f]{64}$`)
var uuidRe = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// ValidateParams checks raw parameters against the action's schema: no
// unknown or duplicate parameters, every required one present, each of the
// declared type, length, format and enum. It returns the parameters in
// canonical form (keys sorted, no insignificant space).
func (a Action) ValidateParams(raw json.RawMessage) (json.RawMessage, error) {
	fields, err := a.fields(raw)
	if err != nil {
		return nil, err
	}
	out := make(map[string]any, len(fields))
	for _, p := range a.Params {
		v, ok := fields[p.Name]
		if !ok {
			if p.Required {
				return nil, &ParamError{Action: a.Name, Param: p.Name, Problem: "is required"}
			}
			continue
		}
		delete(fields, p.Name)
		val, err := p.check(v)
		if err != nil {
			return nil, &ParamError{Action: a.Name, Param: p.Name, Problem: err.Error()}
		}
		out[p.Name] = val
	}
	for name := range fields {
		return nil, &ParamError{Action: a.Name, Param: name, Problem: "is not a parameter of this action"}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("encode params of %s: %w", a.Name, err)
	}
	return b, nil
}

func (p Param) check(raw json.RawMessage) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("is not valid JSON")
	}
	switch p.Type {
	case TypeBoolean:
		b, ok := v.(bool)
		if !ok {
			return nil, fmt.Errorf("must be true or false")
		}
		return b, nil
	case TypeInteger:
		n, ok := v.(json.Number)
		if !ok {
			return nil, fmt.Errorf("must be an integer")
		}
		i, err := n.Int64()
		if err != nil {
			return nil, fmt.Errorf("must be an integer")
		}
		return i, nil
	case TypeString:
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("must be a string")
		}
		if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
			return nil, fmt.Errorf("must be valid UTF-8 without NUL characters")
		}
		if p.Required && strings.TrimSpace(s) == "" {
			return nil, fmt.Errorf("must not be empty")
		}
		if p.MaxLength > 0 && utf8.RuneCountInString(s) > p.MaxLength {
			return nil, fmt.Errorf("is longer than %d characters", p.MaxLength)
		}
		if p.OneLine && strings.ContainsAny(s, LineBreaks) {
			return nil, fmt.Errorf("must be one line (no line breaks)")
		}
		if len(p.Enum) > 0 && !slices.Contains(p.Enum, s) {
			return nil, fmt.Errorf("must be one of %s", strings.Join(p.Enum, ", "))
		}
		switch p.Format {
		case FormatDateTime:
			if _, err := time.Parse(time.RFC3339, s); err != nil {
				return nil, fmt.Errorf("must be an RFC 3339 date-time")
			}
		case FormatSHA256:
			if !sha256Re.MatchString(s) {
				return nil, fmt.Errorf("must be 64 lowercase hex characters")
			}
		case FormatUUID:
			if !uuidRe.MatchString(s) {
				return nil, fmt.Errorf("must be a lowercase UUID")
			}
		}
		return s, nil
	}
	return nil, fmt.Errorf("has unsupported type %s", p.Type)
}

// decodeObject decodes a JSON object into its members, rejecting duplicates
// and trailing data.
func decodeObject(raw json.RawMessage) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("must be a JSON object")
	}
	out := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("are not valid JSON")
		}
		key := tok.(string)
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("repeat %q", key)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("are not valid JSON")
		}
		out[key] = v
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("are not valid JSON")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("have trailing data")
	}
	return out, nil
}

// ParamsSchema is the JSON Schema of the action's parameters, for a model's
// structured output.
func (a Action) ParamsSchema() map[string]any {
	props := map[string]any{}
	required := []string{}
	for _, p := range a.Params {
		s := map[string]any{"type": string(p.Type), "description": p.Description}
		if p.MaxLength > 0 {
			s["maxLength"] = p.MaxLength
		}
		if len(p.Enum) > 0 {
			s["enum"] = p.Enum
		}
		if p.Format != FormatNone {
			s["format"] = string(p.Format)
		}
		props[p.Name] = s
		if p.Required {
			required = append(required, p.Name)
		}
	}
	return map[string]any{
		"type":                 "object",
		"properties":           props,
		"required":             required,
		"additionalProperties": false,
	}
}
