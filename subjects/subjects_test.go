package subjects

import (
	"errors"
	"strings"
	"testing"
)

func TestTurnKey(t *testing.T) {
	t.Parallel()
	ids := []string{"<CAF1.2@mail.example.com>", "a b.c*>", "", "x", strings.Repeat("é", 300)}
	seen := map[string]bool{}
	for _, id := range ids {
		for turn := 1; turn <= 3; turn++ {
			k := TurnKey(id, turn)
			if !ValidTurnKey(k) {
				t.Fatalf("TurnKey(%q, %d) = %q is not a safe token", id, turn, k)
			}
			if k != TurnKey(id, turn) {
				t.Fatal("TurnKey is not deterministic")
			}
			if seen[k] {
				t.Fatalf("TurnKey(%q, %d) collides", id, turn)
			}
			seen[k] = true
		}
	}
	// Length-prefixing keeps ("a", 12) and ("a1", 2)-style shifts apart.
	if TurnKey("a", 12) == TurnKey("a1", 2) {
		t.Fatal("ambiguous encoding")
	}
}

func TestParseTurn(t *testing.T) {
	t.Parallel()
	acc := "A" + strings.Repeat("B", 55)
	key := TurnKey("w", 1)
	a, k, err := ParseTurn(Turn(acc, key))
	if err != nil || a != acc || k != key {
		t.Fatalf("round trip: %q %q %v", a, k, err)
	}
	for _, bad := range []string{"brain.turn", "brain.turn." + acc, "brain.turn." + acc + ".short", "brain.reply." + acc + "." + key, "brain.turn.." + key, "brain.turn." + acc + "." + key + ".x"} {
		if _, _, err := ParseTurn(bad); !errors.Is(err, ErrSubject) {
			t.Errorf("ParseTurn(%q) = %v, want ErrSubject", bad, err)
		}
	}
	if a, m, err := ParseAPI("brain.api." + acc + ".approval.get"); err != nil || a != acc || m != APIApprovalGet {
		t.Fatalf("ParseAPI: %q %q %v", a, m, err)
	}
	if k, err := ParseReplyLocal(ReplyLocal(key)); err != nil || k != key {
		t.Fatalf("ParseReplyLocal: %q %v", k, err)
	}
}

// Every import a tenant gets is pinned to its own key in the export's
// token position, every public export has a tenant import, and every
// private export is imported by the brain.
func TestImportsMatchExports(t *testing.T) {
	t.Parallel()
	acc := "A" + strings.Repeat("C", 55)
	public := map[string]Export{}
	for _, from := range []string{AccountStreams, AccountBrain} {
		for _, e := range ExportsOf(from) {
			if !e.Private {
				public[from+"/"+e.Name] = e
			}
		}
	}
	for _, im := range TenantImports(acc) {
		e, ok := public[im.From+"/"+im.Name]
		if !ok {
			t.Fatalf("import %s has no public export in %s", im.Name, im.From)
		}
		delete(public, im.From+"/"+im.Name)
		toks := strings.Split(im.Subject, ".")
		if int(e.TokenPosition) > len(toks) || toks[e.TokenPosition-1] != acc {
			t.Errorf("import %s: token %d of %q is not the tenant's key", im.Name, e.TokenPosition, im.Subject)
		}
		if im.IsService != e.IsService {
			t.Errorf("import %s: service/stream mismatch", im.Name)
		}
	}
	if len(public) != 0 {
		t.Errorf("public exports without tenant imports: %v", public)
	}
	private := map[string]Export{}
	for _, e := range StreamsExports() {
		if e.Private {
			private[e.Subject] = e
		}
	}
	for _, im := range BrainImports() {
		if _, ok := private[im.Subject]; !ok || im.From != AccountStreams {
			t.Errorf("brain import %s (%s) is not a private export of STREAMS", im.Name, im.Subject)
		}
		delete(private, im.Subject)
	}
	if len(private) != 0 {
		t.Errorf("private exports the brain does not import: %v", private)
	}
}
