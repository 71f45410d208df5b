package provision

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// maxIdentLen is the longest name Postgres keeps (NAMEDATALEN-1); longer
// names are silently truncated, which could make two tenants' names meet.
const maxIdentLen = 63

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// quoteLiteral quotes s as an SQL string literal for the few statements that
// take no bind parameters (CREATE ROLE ... PASSWORD).
func quoteLiteral(s string) (string, error) {
	if strings.ContainsRune(s, 0) {
		return "", errors.New("string literal contains NUL")
	}
	q := "'" + strings.ReplaceAll(s, "'", "''") + "'"
	if strings.Contains(s, `\`) {
		// Escape-string syntax means the same whatever
		// standard_conforming_strings says.
		q = "E" + strings.ReplaceAll(q, `\`, `\\`)
	}
	return q, nil
}

// passwordClause returns `PASSWORD '<SCRAM-SHA-256 verifier>'`. The verifier
// is computed here, as psql's \password does, so the password itself never
// reaches the server, its statement log or pg_stat_activity.
func passwordClause(password string, iterations int) (string, error) {
	v, err := scramVerifier(password, iterations)
	if err != nil {
		return "", err
	}
	lit, err := quoteLiteral(v)
	if err != nil {
		return "", err
	}
	return "PASSWORD " + lit, nil
}

// The PBKDF2 iterations of the SCRAM verifiers written here. Iterations
// slow down guessing a password from a stolen verifier, which protects a
// password a person chose: the registry reader's gets Postgres' default. A
// tenant's login password is 32 random bytes no one chooses or types
// (newPassword): guessing it takes 2^256 tries at any count, while every
// iteration is paid again by the brain on each new connection to the tenant
// (the client side of SCRAM). At 4096 that was 39% of a replica's CPU under
// a load that reopens evicted pools (BENCHMARKS.md, BenchmarkTenantLogin),
// so a generated password gets one.
const (
	chosenPasswordIterations    = 4096 // Postgres' default scram_iterations
	generatedPasswordIterations = 1
)

func scramVerifier(password string, iterations int) (string, error) {
	if password == "" {
		return "", errors.New("password is empty")
	}
	if iterations < 1 {
		return "", fmt.Errorf("SCRAM iterations must be at least 1, got %d", iterations)
	}
	// SASLprep leaves printable ASCII unchanged; anything else would need a
	// full implementation to match what the server computes at login.
	for _, c := range password {
		if c < 0x20 || c > 0x7e {
			return "", errors.New("password must be printable ASCII")
		}
	}
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return "", err
	}
	mac := func(key []byte, msg string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(msg))
		return h.Sum(nil)
	}
	stored := sha256.Sum256(mac(salted, "Client Key"))
	server := mac(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return "SCRAM-SHA-256$" + strconv.Itoa(iterations) + ":" + b64(salt) + "$" + b64(stored[:]) + ":" + b64(server), nil
}

// newPassword returns 32 random bytes, base64url: safe in URLs and literals.
func newPassword() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func checkIdentLen(kind, name string) error {
	if len(name) > maxIdentLen {
		return fmt.Errorf("%s name %q is longer than %d bytes: use a shorter tenant id or prefix", kind, name, maxIdentLen)
	}
	return nil
}
