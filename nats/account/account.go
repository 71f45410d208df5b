// Package account generates the NATS operator-mode identities of the system
// with nats-io/jwt and nkeys, writing the same claims `nsc` would: an
// operator, the system account, the BRAIN account with its exports (account
// token positions, DESIGN §3), tenant accounts importing them pinned to their
// own key, and least-privilege users with .creds files.
//
// The dev stack and the tests use it directly; in production ops run the
// equivalent nsc commands and this package is
// the reference for the claims those commands must produce.
package account

import (
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"n8nbrain/subjects"
)

// Operator signs accounts.
type Operator struct {
	kp     nkeys.KeyPair
	Name   string
	Public string
	// JWT is the operator's self-signed JWT, what the server trusts.
	JWT string
}

// Account is a signed account with its key pair.
type Account struct {
	kp     nkeys.KeyPair
	Name   string
	Public string
	JWT    string
}

// Seed returns the account's private seed, for persisting dev identities.
func (a *Account) Seed() ([]byte, error) { return a.kp.Seed() }

// Seed returns the operator's private seed, for persisting dev identities.
func (o *Operator) Seed() ([]byte, error) { return o.kp.Seed() }

// NewOperator creates an operator. With a nil seed a new key is generated.
// systemAccount is the public key of the system account.
func NewOperator(name string, seed []byte, systemAccount string) (*Operator, error) {
	kp, err := keyPair(seed, nkeys.CreateOperator)
	if err != nil {
		return nil, fmt.Errorf("operator key: %w", err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	oc := jwt.NewOperatorClaims(pub)
	oc.Name = name
	oc.SystemAccount = systemAccount
	tok, err := oc.Encode(kp)
	if err != nil {
		return nil, fmt.Errorf("encode operator: %w", err)
	}
	return &Operator{kp: kp, Name: name, Public: pub, JWT: tok}, nil
}

// Claims decodes the operator JWT, for server.Options.TrustedOperators.
func (o *Operator) Claims() (*jwt.OperatorClaims, error) {
	return jwt.DecodeOperatorClaims(o.JWT)
}

// NewAccountKey creates or loads an account key pair without signing claims,
// so the system account's key can exist before the operator that names it.
func NewAccountKey(seed []byte) (nkeys.KeyPair, string, error) {
	kp, err := keyPair(seed, nkeys.CreateAccount)
	if err != nil {
		return nil, "", err
	}
	pub, err := kp.PublicKey()
	return kp, pub, err
}

// SystemAccount signs the system account.
func (o *Operator) SystemAccount(kp nkeys.KeyPair) (*Account, error) {
	return o.sign("SYS", kp, func(*jwt.AccountClaims) {})
}

// BrainAccount signs the BRAIN account: JetStream enabled, with every export
// of subjects.BrainExports and its account token position.
func (o *Operator) BrainAccount(seed []byte) (*Account, error) {
	kp, err := keyPair(seed, nkeys.CreateAccount)
	if err != nil {
		return nil, err
	}
	return o.sign("BRAIN", kp, func(ac *jwt.AccountClaims) {
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		for _, e := range subjects.BrainExports() {
			typ := jwt.Stream
			if e.IsService {
				typ = jwt.Service
			}
			ac.Exports.Add(&jwt.Export{Name: e.Name, Subject: jwt.Subject(e.Subject), Type: typ, AccountTokenPosition: e.TokenPosition})
		}
	})
}

// TenantAccount signs a tenant account importing the brain's exports, each
// pinned to the tenant's own public key. The account has no JetStream of its
// own and a bounded number of connections.
func (o *Operator) TenantAccount(name string, seed []byte, brainAccount string) (*Account, error) {
	kp, err := keyPair(seed, nkeys.CreateAccount)
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	return o.sign(name, kp, func(ac *jwt.AccountClaims) {
		ac.Imports = ImportsFor(pub, brainAccount)
		ac.Limits.Conn = 32
	})
}

// ImportsFor returns the imports of a tenant account, as listed in
// subjects.TenantImports. Tests use it to build forged variants.
func ImportsFor(tenantAccount, brainAccount string) jwt.Imports {
	var imps jwt.Imports
	for _, im := range subjects.TenantImports(tenantAccount) {
		typ := jwt.Stream
		if im.IsService {
			typ = jwt.Service
		}
		imps.Add(&jwt.Import{Name: im.Name, Account: brainAccount, Subject: jwt.Subject(im.Subject), LocalSubject: jwt.RenamingSubject(im.Local), Type: typ})
	}
	return imps
}

// SignTenantClaims signs arbitrary claims for an existing tenant account
// key; tests use it to publish a JWT with forged imports.
func (o *Operator) SignTenantClaims(name string, seed []byte, edit func(*jwt.AccountClaims)) (*Account, error) {
	kp, err := keyPair(seed, nkeys.CreateAccount)
	if err != nil {
		return nil, err
	}
	return o.sign(name, kp, edit)
}

func (o *Operator) sign(name string, kp nkeys.KeyPair, edit func(*jwt.AccountClaims)) (*Account, error) {
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	ac := jwt.NewAccountClaims(pub)
	ac.Name = name
	edit(ac)
	vr := jwt.CreateValidationResults()
	ac.Validate(vr)
	if errs := vr.Errors(); len(errs) > 0 {
		return nil, fmt.Errorf("account %s claims are invalid: %v", name, errs)
	}
	tok, err := ac.Encode(o.kp)
	if err != nil {
		return nil, fmt.Errorf("encode account %s: %w", name, err)
	}
	return &Account{kp: kp, Name: name, Public: pub, JWT: tok}, nil
}

// RevokeUser re-signs acc with the user userPub revoked: every JWT of that
// user issued at or before at is refused (what `nsc revocations add-user`
// writes). Once the server has the new account JWT it closes the user's
// connections and refuses them from then on; a user with another key is
// unaffected.
func (o *Operator) RevokeUser(acc *Account, userPub string, at time.Time) (*Account, error) {
	ac, err := jwt.DecodeAccountClaims(acc.JWT)
	if err != nil {
		return nil, fmt.Errorf("decode account %s: %w", acc.Name, err)
	}
	ac.RevokeAt(userPub, at)
	tok, err := ac.Encode(o.kp)
	if err != nil {
		return nil, fmt.Errorf("encode account %s: %w", acc.Name, err)
	}
	return &Account{kp: acc.kp, Name: acc.Name, Public: acc.Public, JWT: tok}, nil
}

// CredsUser returns the public key of the user of a .creds file.
func CredsUser(creds []byte) (string, error) {
	tok, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return "", fmt.Errorf("read creds: %w", err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return "", fmt.Errorf("decode user JWT: %w", err)
	}
	return uc.Subject, nil
}

// Role selects a user's permissions.
type Role int

const (
	// RoleBrain may run JetStream, publish replies and events, and answer
	// tenant API requests, but never publish a turn: only imports produce turns.
	RoleBrain Role = iota + 1
	// RoleEdge may publish turns, request results and API calls, and
	// subscribe to replies, events and its inboxes. Nothing else.
	RoleEdge
	// RoleUnrestricted has no permission limits: the system account's
	// operator user, and in tests an attacker who controls its own account.
	RoleUnrestricted
)

// Permissions returns the permissions of a role.
func Permissions(r Role) jwt.Permissions {
	var p jwt.Permissions
	switch r {
	case RoleBrain:
		p.Pub.Allow.Add("$JS.API.>", "$JS.ACK.>", "brain.reply.>", "brain.event.>", "_INBOX.>")
		// Only imports produce turns; only the RESULTS stream produces live replies.
		p.Pub.Deny.Add("brain.turn.>", subjects.LiveExport)
		p.Sub.Allow.Add("_INBOX.>", subjects.APIExport)
		// Answer API requests arriving through the service import on their
		// _R_ reply subjects, one response each.
		p.Resp = &jwt.ResponsePermission{MaxMsgs: 1}
	case RoleEdge:
		p.Pub.Allow.Add(subjects.LocalTurn+">", subjects.LocalResult+">", subjects.LocalAPI+">")
		p.Sub.Allow.Add(subjects.LocalReply+">", subjects.LocalEvent+">", "_INBOX.>")
	}
	return p
}

// UserCreds creates a user of acc with the role's permissions and returns a
// standard .creds file (what `nsc generate creds` writes).
func UserCreds(acc *Account, userName string, r Role) ([]byte, error) {
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	upub, err := ukp.PublicKey()
	if err != nil {
		return nil, err
	}
	uc := jwt.NewUserClaims(upub)
	uc.Name = userName
	uc.Permissions = Permissions(r)
	ujwt, err := uc.Encode(acc.kp)
	if err != nil {
		return nil, fmt.Errorf("encode user %s: %w", userName, err)
	}
	seed, err := ukp.Seed()
	if err != nil {
		return nil, err
	}
	return jwt.FormatUserConfig(ujwt, seed)
}

func keyPair(seed []byte, create func() (nkeys.KeyPair, error)) (nkeys.KeyPair, error) {
	if len(seed) == 0 {
		return create()
	}
	return nkeys.FromSeed(seed)
}
