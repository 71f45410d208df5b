package devstack_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"n8nbrain/registry"
)

// keptSealingKey is the sealing key init keeps in the state volume.
func keptSealingKey(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		SealingKey string `json:"sealing_key"`
	}
	if err := json.Unmarshal(b, &k); err != nil {
		t.Fatal(err)
	}
	return k.SealingKey
}

// TestInitKeepsTheSealingKeyItRefuses: when init generated the sealing key
// (no BRAIN_SEALING_KEY on the first run), the copy in the state volume is
// the only one. A later run with a BRAIN_SEALING_KEY that does not open the
// tenant's password is refused and must leave that copy untouched, so the
// next run without the wrong key still opens every sealed password.
func TestInitKeepsTheSealingKeyItRefuses(t *testing.T) {
	e := newInitEnv(t)
	o := e.opts
	o.SealingKey = "" // init generates it
	if _, err := e.run(o); err != nil {
		t.Fatalf("first init: %v", err)
	}
	generated := keptSealingKey(t, e.dir)
	if _, err := registry.ParseKey(generated); err != nil {
		t.Fatalf("init kept no valid sealing key: %v", err)
	}

	wrong := o
	wrong.SealingKey = registry.NewKey()
	if _, err := e.run(wrong); err == nil || !strings.Contains(err.Error(), "BRAIN_SEALING_KEY") {
		t.Fatalf("init with a sealing key that does not open the tenant's password: %v", err)
	}
	if got := keptSealingKey(t, e.dir); got != generated {
		t.Fatal("init replaced the kept sealing key with the one it refused: every sealed tenant password is lost")
	}
	if _, err := e.run(o); err != nil {
		t.Fatalf("init without the wrong key, after it was refused: %v", err)
	}

	// A key that does open the password is kept, as before.
	right := o
	right.SealingKey = generated
	if _, err := e.run(right); err != nil {
		t.Fatalf("init with the right key given explicitly: %v", err)
	}
	if got := keptSealingKey(t, e.dir); got != generated {
		t.Fatal("the kept sealing key changed after a run with the same key")
	}
}
