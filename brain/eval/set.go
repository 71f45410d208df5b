package eval

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"n8nbrain/catalogue"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// ActionEscalate is the label of an e-mail a human must decide: the brain
// should escalate it (escalate_item, or no action with the item escalated).
const ActionEscalate = "escalate"

// ActionNone is what the brain did when it assessed an item and proposed no
// action (an assess-only rule, or a tenant that offers the model none).
const ActionNone = "none"

// Item is one labelled e-mail: one line of a set file (JSON Lines).
type Item struct {
	// ID is unique in the set: lowercase letters, digits, '.', '_' and '-'.
	ID string `json:"id"`
	// Language is the e-mail's main language (BCP 47: "en", "de", "zh").
	Language string `json:"language"`
	// Tags describe the e-mail for slicing a report ("thread", "short",
	// "long", "spam", "out-of-office", "supplier", "multilingual").
	Tags []string `json:"tags,omitempty"`
	// Email is exactly what n8n would send in a turn. Quoted history of a
	// thread is in the body, as in a real message.
	Email  wire.Email `json:"email"`
	Labels Labels     `json:"labels"`
	// Note says why the labels are what they are (for the people editing
	// the set; never shown to the model).
	Note string `json:"note,omitempty"`
}

// Labels are what a good decision on the e-mail is.
type Labels struct {
	Category string `json:"category"`
	Priority string `json:"priority"`
	// Action is the action a good triage proposes: one of the catalogue's
	// triage actions (draft_reply, create_job, close_item), or "escalate"
	// when a human must decide.
	Action string `json:"action"`
	// RequiredFacts must appear in a good draft (action draft_reply only).
	// Each is one or more alternatives separated by " | "; an alternative
	// is plain text, matched ignoring case and runs of white space, or
	// "re:" and a Go regular expression matched against the draft as
	// written. The first alternative of a required fact is plain text: how
	// a good draft would say it.
	RequiredFacts []string `json:"required_facts,omitempty"`
	// Forbidden are facts and claims a draft must not make up (prices,
	// dates, promises, bank details), written like required facts.
	Forbidden []string `json:"forbidden,omitempty"`
}

var (
	idRe   = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	langRe = regexp.MustCompile(`^[a-z]{2,3}(-[A-Za-z0-9]{2,8})*$`)
)

// maxLine bounds one item's line in a set file.
const maxLine = 1 << 20

// Set is a loaded, checked labelled set, sorted by id.
type Set struct {
	Items []Item
	// Hash is the SHA-256 of the set's canonical encoding (SetHash).
	Hash string
	// Files lists the files it was read from.
	Files []string
}

// SetError lists every problem found in a set; nothing is run.
type SetError struct {
	Problems []string
}

func (e *SetError) Error() string {
	const show = 20
	ps := e.Problems
	more := ""
	if len(ps) > show {
		more = fmt.Sprintf("; and %d more", len(ps)-show)
		ps = ps[:show]
	}
	return "labelled set: " + strings.Join(ps, "; ") + more
}

// LoadSet reads a set: one .jsonl file, or every .jsonl file of a
// directory (in name order). Each non-blank line is one Item, decoded
// strictly (wire.Decode: unknown fields, duplicate keys, wrong types and
// trailing data are errors). Every problem of every line is reported.
func LoadSet(path string) (*Set, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("labelled set: %w", err)
	}
	files := []string{path}
	if st.IsDir() {
		files, err = filepath.Glob(filepath.Join(path, "*.jsonl"))
		if err != nil {
			return nil, err
		}
		slices.Sort(files)
		if len(files) == 0 {
			return nil, fmt.Errorf("labelled set: no .jsonl file in %s", path)
		}
	}
	var items []Item
	var problems []string
	for _, f := range files {
		its, ps, err := readSetFile(f)
		if err != nil {
			return nil, err
		}
		items = append(items, its...)
		problems = append(problems, ps...)
	}
	if len(problems) > 0 {
		return nil, &SetError{Problems: problems}
	}
	return NewSet(items, files)
}

func readSetFile(path string) ([]Item, []string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("labelled set: %w", err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 64<<10)
	var items []Item
	var problems []string
	for n := 1; ; n++ {
		line, err := readLine(r)
		if errors.Is(err, io.EOF) && line == nil {
			break
		}
		if errors.Is(err, errLineTooLong) {
			problems = append(problems, fmt.Sprintf("%s:%d: line is longer than %d bytes", path, n, maxLine))
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, nil, fmt.Errorf("labelled set %s: %w", path, err)
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var it Item
		if derr := wire.Decode(line, &it); derr != nil {
			problems = append(problems, fmt.Sprintf("%s:%d: %v", path, n, derr))
			continue
		}
		for _, p := range it.problems() {
			problems = append(problems, fmt.Sprintf("%s:%d: item %q: %s", path, n, it.ID, p))
		}
		items = append(items, it)
		if errors.Is(err, io.EOF) {
			break
		}
	}
	return items, problems, nil
}

var errLineTooLong = errors.New("line too long")

// readLine reads one line (without its newline), at most maxLine bytes.
func readLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxLine {
			// Skip to the end of the line.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = r.ReadSlice('\n')
			}
			return nil, errLineTooLong
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			if len(line) == 0 {
				return nil, err
			}
			return line, err
		}
		return bytes.TrimSuffix(line, []byte("\n")), nil
	}
}

// NewSet checks items as a whole (unique ids) and sorts them by id.
func NewSet(items []Item, files []string) (*Set, error) {
	items = slices.Clone(items)
	slices.SortStableFunc(items, func(a, b Item) int { return strings.Compare(a.ID, b.ID) })
	var problems []string
	for i, it := range items {
		problems = append(problems, it.problems()...)
		if i > 0 && items[i-1].ID == it.ID {
			problems = append(problems, fmt.Sprintf("id %q is used twice", it.ID))
		}
	}
	if len(items) == 0 {
		problems = append(problems, "the set has no items")
	}
	if len(problems) > 0 {
		return nil, &SetError{Problems: slices.Compact(problems)}
	}
	return &Set{Items: items, Hash: SetHash(items), Files: files}, nil
}

// SetHash is the SHA-256 (hex) of the items' canonical encoding: sorted by
// id, each re-encoded from its decoded value (so spacing and member order
// in the files do not matter) and followed by a newline.
func SetHash(items []Item) string {
	sorted := slices.Clone(items)
	slices.SortStableFunc(sorted, func(a, b Item) int { return strings.Compare(a.ID, b.ID) })
	h := sha256.New()
	for _, it := range sorted {
		b, err := json.Marshal(it)
		if err != nil {
			panic(fmt.Sprintf("encode item %s: %v", it.ID, err)) // strings only
		}
		h.Write(b)
		h.Write([]byte("\n"))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// problems are the item's own problems, whatever the tenant.
func (it *Item) problems() []string {
	var ps []string
	bad := func(format string, args ...any) { ps = append(ps, fmt.Sprintf(format, args...)) }
	if !idRe.MatchString(it.ID) {
		bad("id must match %s", idRe)
	}
	if !langRe.MatchString(it.Language) {
		bad("language %q is not a BCP 47 tag such as en or pt-BR", it.Language)
	}
	e := it.Email
	if strings.TrimSpace(e.From) == "" {
		bad("email.from is empty")
	}
	if strings.TrimSpace(e.Subject) == "" && strings.TrimSpace(e.Body) == "" {
		bad("email has neither subject nor body")
	}
	l := it.Labels
	if strings.TrimSpace(l.Category) == "" {
		bad("labels.category is empty")
	}
	if l.Category == wire.CategoryUnclassified {
		bad("labels.category %q is reserved for items nothing assessed", l.Category)
	}
	if !slices.Contains(catalogue.Priorities(), l.Priority) {
		bad("labels.priority %q must be one of %s", l.Priority, strings.Join(catalogue.Priorities(), ", "))
	}
	if l.Action == string(catalogue.EscalateItem) {
		bad("labels.action: write %q for an e-mail a human must decide", ActionEscalate)
	} else if l.Action != ActionEscalate && !triageAction(catalogue.Name(l.Action)) {
		bad("labels.action %q must be %s or one of the catalogue's triage actions (%s)", l.Action, ActionEscalate,
			strings.Join(triageActions(), ", "))
	}
	if l.Action != string(catalogue.DraftReply) && (len(l.RequiredFacts) > 0 || len(l.Forbidden) > 0) {
		bad("labels.required_facts and labels.forbidden apply to draft_reply only")
	}
	for i, f := range l.RequiredFacts {
		ft, err := parseFact(f)
		switch {
		case err != nil:
			bad("labels.required_facts[%d]: %v", i, err)
		case ft.alts[0].re != nil:
			bad("labels.required_facts[%d]: the first alternative must be plain text (how a good draft says it)", i)
		}
	}
	for i, f := range l.Forbidden {
		if _, err := parseFact(f); err != nil {
			bad("labels.forbidden[%d]: %v", i, err)
		}
	}
	return ps
}

// triageActions are the actions of the current catalogue a triage may
// propose (no follow-ups), without escalate_item (labelled "escalate").
func triageActions() []string {
	c, _ := catalogue.Get(catalogue.Current)
	var out []string
	for _, a := range c.Actions {
		if !a.FollowUp && a.Name != catalogue.EscalateItem {
			out = append(out, string(a.Name))
		}
	}
	return out
}

func triageAction(n catalogue.Name) bool { return slices.Contains(triageActions(), string(n)) }

// CheckTenant lists the items whose labels the tenant cannot produce: a
// category it does not have, an action it does not enable.
func (s *Set) CheckTenant(t *registry.Tenant) error {
	var ps []string
	for _, it := range s.Items {
		l := it.Labels
		if !slices.Contains(t.Categories, l.Category) {
			ps = append(ps, fmt.Sprintf("item %q: category %q is not one of tenant %s's categories (%s)", it.ID, l.Category, t.ID,
				strings.Join(t.Categories, ", ")))
		}
		if l.Action != ActionEscalate && !t.ActionEnabled(catalogue.Name(l.Action)) {
			ps = append(ps, fmt.Sprintf("item %q: action %s is not enabled for tenant %s", it.ID, l.Action, t.ID))
		}
	}
	if len(ps) > 0 {
		return &SetError{Problems: ps}
	}
	return nil
}
