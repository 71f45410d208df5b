package edge

import (
	"bufio"
	"context"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strings"
	"sync/atomic"

	"golang.org/x/crypto/bcrypt"
)

// csrfInfo is the HKDF info of the review page's form key; a new version
// changes it.
const csrfInfo = "n8nbrain edge review csrf v1"

// reviewerName is the shape of a reviewer's name in EDGE_REVIEWERS_FILE.
var reviewerName = regexp.MustCompile(`^[a-z0-9._-]{1,64}$`)

// reviewers are the accounts of the review page.
type reviewers struct {
	hashes map[string][]byte
	// dummy is compared for an unknown name, at the highest cost in the
	// file, so that the time of a refusal does not tell which names exist.
	dummy []byte
	// slots bounds concurrent bcrypt comparisons: each is deliberately slow.
	slots chan struct{}
	// compared counts bcrypt comparisons (what throttling must spare).
	compared atomic.Int64
}

// loadReviewers reads and checks a reviewers file: "name:<bcrypt hash>" a
// line, blank lines and # comments ignored.
func loadReviewers(path string) (*reviewers, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("EDGE_REVIEWERS_FILE: %w", err)
	}
	defer f.Close()
	rv := &reviewers{hashes: map[string][]byte{}, slots: make(chan struct{}, runtime.GOMAXPROCS(0))}
	maxCost := bcrypt.MinCost
	var errs []error
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, hash, ok := strings.Cut(line, ":")
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("line %d: want name:<bcrypt hash>", n))
			continue
		case !reviewerName.MatchString(name):
			errs = append(errs, fmt.Errorf("line %d: reviewer name %q: want 1 to 64 of a-z 0-9 . _ -", n, name))
			continue
		case rv.hashes[name] != nil:
			errs = append(errs, fmt.Errorf("line %d: reviewer %q is listed twice", n, name))
			continue
		}
		cost, err := bcrypt.Cost([]byte(hash))
		if err != nil {
			// Never the hash itself in the message.
			errs = append(errs, fmt.Errorf("line %d: reviewer %q: the hash is not a bcrypt hash (%v)", n, name, err))
			continue
		}
		maxCost = max(maxCost, cost)
		rv.hashes[name] = []byte(hash)
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 && len(rv.hashes) == 0 {
		errs = append(errs, errors.New("it lists no reviewers"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("EDGE_REVIEWERS_FILE %s: %w", path, err)
	}
	rv.dummy, err = bcrypt.GenerateFromPassword([]byte(rand.Text()), maxCost)
	if err != nil {
		return nil, fmt.Errorf("reviewers: dummy hash: %w", err)
	}
	return rv, nil
}

// check reports whether name and password are a reviewer's. It always
// runs one bcrypt comparison, for unknown names too.
func (rv *reviewers) check(ctx context.Context, name, password string) bool {
	hash, known := rv.hashes[name]
	if !known {
		hash = rv.dummy
	}
	select {
	case rv.slots <- struct{}{}:
		defer func() { <-rv.slots }()
	case <-ctx.Done():
		return false
	}
	rv.compared.Add(1)
	ok := bcrypt.CompareHashAndPassword(hash, []byte(password)) == nil
	return ok && known
}

// csrfKey derives the review page's CSRF key from the bearer token.
func csrfKey(token string) []byte {
	key, err := hkdf.Key(sha256.New, []byte(token), nil, csrfInfo, sha256.Size)
	if err != nil { // cannot happen: the length is far below HKDF's limit
		panic(err)
	}
	return key
}
