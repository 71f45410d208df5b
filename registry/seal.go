package registry

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Sealer seals tenant database passwords for the registry with AES-256-GCM.
// The tenant id is the additional data, so a sealed password copied to
// another tenant's row does not open. The key is held by the brain and the
// ops tool only, never stored in the registry.
//
// A sealer has one current key, which seals, and may have previous keys,
// which only open: during a rotation of the sealing key the brains hold
// both, so a password opens whether it has been re-sealed yet or not
// (GCM's tag tells a wrong key from the right one; nothing else marks which
// key sealed a value). Reseal moves a value to the current key.
type Sealer struct {
	aead     cipher.AEAD
	previous []cipher.AEAD
}

// KeySize is the sealing key's length in bytes.
const KeySize = 32

// NewSealer returns a sealer that seals with key and opens values sealed
// with key or with any of the previous keys (a rotation in progress).
func NewSealer(key []byte, previous ...[]byte) (*Sealer, error) {
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	s := &Sealer{aead: aead}
	for i, p := range previous {
		if len(p) == 0 {
			continue
		}
		a, err := newAEAD(p)
		if err != nil {
			return nil, fmt.Errorf("previous sealing key %d: %w", i+1, err)
		}
		s.previous = append(s.previous, a)
	}
	return s, nil
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("sealing key must be %d bytes, got %d", KeySize, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// ParseKey decodes a key written as 64 hex characters.
func ParseKey(s string) ([]byte, error) {
	b, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil || len(b) != KeySize {
		return nil, fmt.Errorf("sealing key must be %d hex characters", 2*KeySize)
	}
	return b, nil
}

// ErrKeyGivenTwice is ReadKey given both a key and a key file.
var ErrKeyGivenTwice = errors.New("both the key and a key file are given: give the key one way")

// ReadKey is a key given as its value or as the path of a file holding it
// (VAR or VAR_FILE, --flag or --flag-file): a nil key when neither is
// given, and ErrKeyGivenTwice when both are, since one would silently win
// (a rotation run with the new key in the file and the old one still
// exported would re-seal with the old). A file that cannot be read is an
// *fs.PathError.
func ReadKey(value, file string) ([]byte, error) {
	if value != "" && file != "" {
		return nil, ErrKeyGivenTwice
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		value = string(b)
	}
	if value == "" {
		return nil, nil
	}
	return ParseKey(value)
}

// NewKey returns a random key as hex, for the ops tool and the dev stack.
func NewKey() string {
	b := make([]byte, KeySize)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// Seal encrypts a password for a tenant with the current key: nonce || ciphertext.
func (s *Sealer) Seal(id TenantID, plaintext []byte) []byte {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plaintext)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		panic(err)
	}
	return s.aead.Seal(nonce, nonce, plaintext, []byte(id))
}

// ErrUnseal means a sealed value does not open with this key for this tenant.
var ErrUnseal = errors.New("sealed credential does not open with this key for this tenant")

// Open decrypts a sealed password of a tenant, with the current key or a
// previous one.
func (s *Sealer) Open(id TenantID, sealed []byte) ([]byte, error) {
	pt, _, err := s.open(id, sealed)
	return pt, err
}

// Sealing says which of a sealer's keys opens a sealed value.
type Sealing string

const (
	SealedCurrent  Sealing = "current"
	SealedPrevious Sealing = "previous"
	// SealedUnknown: neither key opens it (another key, or another tenant's value).
	SealedUnknown Sealing = "unknown"
)

// Which reports which key opens a tenant's sealed value.
func (s *Sealer) Which(id TenantID, sealed []byte) Sealing {
	_, w, _ := s.open(id, sealed)
	return w
}

// Reseal returns the value sealed with the current key: sealed itself when
// the current key already opens it (changed false), else the password
// opened with a previous key and sealed again. A value no key opens is
// ErrUnseal.
func (s *Sealer) Reseal(id TenantID, sealed []byte) (resealed []byte, changed bool, err error) {
	pt, w, err := s.open(id, sealed)
	if err != nil {
		return nil, false, err
	}
	if w == SealedCurrent {
		return sealed, false, nil
	}
	return s.Seal(id, pt), true, nil
}

func (s *Sealer) open(id TenantID, sealed []byte) ([]byte, Sealing, error) {
	if pt, err := openWith(s.aead, id, sealed); err == nil {
		return pt, SealedCurrent, nil
	}
	for _, a := range s.previous {
		if pt, err := openWith(a, id, sealed); err == nil {
			return pt, SealedPrevious, nil
		}
	}
	return nil, SealedUnknown, ErrUnseal
}

func openWith(a cipher.AEAD, id TenantID, sealed []byte) ([]byte, error) {
	n := a.NonceSize()
	if len(sealed) < n+a.Overhead() {
		return nil, ErrUnseal
	}
	pt, err := a.Open(nil, sealed[:n], sealed[n:], []byte(id))
	if err != nil {
		return nil, ErrUnseal
	}
	return pt, nil
}
