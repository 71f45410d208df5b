package registry

import (
	"bytes"
	"errors"
	"testing"
)

func mustKey(t *testing.T) []byte {
	t.Helper()
	k, err := ParseKey(NewKey())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestSealerRotation: during a rotation a sealer opens values sealed with
// its current or a previous key, seals with the current one only, and
// Reseal moves a value to the current key exactly once.
func TestSealerRotation(t *testing.T) {
	t.Parallel()
	oldKey, newKey, otherKey := mustKey(t), mustKey(t), mustKey(t)
	old, err := NewSealer(oldKey)
	if err != nil {
		t.Fatal(err)
	}
	rotating, err := NewSealer(newKey, oldKey)
	if err != nil {
		t.Fatal(err)
	}
	after, err := NewSealer(newKey)
	if err != nil {
		t.Fatal(err)
	}
	sealedOld := old.Seal("acme", []byte("pw"))

	if pt, err := rotating.Open("acme", sealedOld); err != nil || string(pt) != "pw" {
		t.Fatalf("rotating sealer opens an old value: %q %v", pt, err)
	}
	if _, err := after.Open("acme", sealedOld); !errors.Is(err, ErrUnseal) {
		t.Fatalf("new key alone opens an old value: %v", err)
	}
	if w := rotating.Which("acme", sealedOld); w != SealedPrevious {
		t.Fatalf("old value sealed with %s, want previous", w)
	}
	// The previous key opens only for the tenant it was sealed for.
	if _, err := rotating.Open("other", sealedOld); !errors.Is(err, ErrUnseal) {
		t.Fatalf("old value opened for another tenant: %v", err)
	}

	resealed, changed, err := rotating.Reseal("acme", sealedOld)
	if err != nil || !changed {
		t.Fatalf("reseal: changed %v, %v", changed, err)
	}
	if pt, err := after.Open("acme", resealed); err != nil || string(pt) != "pw" {
		t.Fatalf("new key alone opens the resealed value: %q %v", pt, err)
	}
	if _, err := old.Open("acme", resealed); !errors.Is(err, ErrUnseal) {
		t.Fatalf("old key opens the resealed value: %v", err)
	}
	again, changed, err := rotating.Reseal("acme", resealed)
	if err != nil || changed || !bytes.Equal(again, resealed) {
		t.Fatalf("resealing a current value: changed %v, same %v, %v", changed, bytes.Equal(again, resealed), err)
	}
	if w := rotating.Which("acme", resealed); w != SealedCurrent {
		t.Fatalf("resealed value sealed with %s, want current", w)
	}

	stranger, err := NewSealer(otherKey)
	if err != nil {
		t.Fatal(err)
	}
	foreign := stranger.Seal("acme", []byte("pw"))
	if _, _, err := rotating.Reseal("acme", foreign); !errors.Is(err, ErrUnseal) {
		t.Fatalf("reseal of a value no key opens: %v, want ErrUnseal", err)
	}
	if w := rotating.Which("acme", foreign); w != SealedUnknown {
		t.Fatalf("foreign value: %s, want unknown", w)
	}
	if _, err := NewSealer(newKey, []byte("short")); err == nil {
		t.Fatal("a previous key of the wrong size was accepted")
	}
}
