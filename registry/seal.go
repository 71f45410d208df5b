package registry

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Sealer seals tenant database passwords for the registry with AES-256-GCM.
// The tenant id is the additional data, so a sealed password copied to
// another tenant's row does not open. The key is held by the brain and the
// ops tool only, never stored in the registry.
type Sealer struct {
	aead cipher.AEAD
}

// KeySize is the sealing key's length in bytes.
const KeySize = 32

// NewSealer returns a sealer for a 32-byte key.
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("sealing key must be %d bytes, got %d", KeySize, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: aead}, nil
}

// ParseKey decodes a key written as 64 hex characters.
func ParseKey(s string) ([]byte, error) {
	b, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil || len(b) != KeySize {
		return nil, fmt.Errorf("sealing key must be %d hex characters", 2*KeySize)
	}
	return b, nil
}

// NewKey returns a random key as hex, for the ops tool and the dev stack.
func NewKey() string {
	b := make([]byte, KeySize)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// Seal encrypts a password for a tenant: nonce || ciphertext.
func (s *Sealer) Seal(id TenantID, plaintext []byte) []byte {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plaintext)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		panic(err)
	}
	return s.aead.Seal(nonce, nonce, plaintext, []byte(id))
}

// ErrUnseal means a sealed value does not open with this key for this tenant.
var ErrUnseal = errors.New("sealed credential does not open with this key for this tenant")

// Open decrypts a sealed password of a tenant.
func (s *Sealer) Open(id TenantID, sealed []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n+s.aead.Overhead() {
		return nil, ErrUnseal
	}
	pt, err := s.aead.Open(nil, sealed[:n], sealed[n:], []byte(id))
	if err != nil {
		return nil, ErrUnseal
	}
	return pt, nil
}
