// Package account generates the NATS operator-mode identities of the system
// with nats-io/jwt and nkeys, writing the same claims `nsc` would: an
// operator, the system account, the STREAMS account holding every tenant's
// streams, the BRAIN account importing the consumer API from it, tenant
// accounts importing both pinned to their own key (account token positions,
// DESIGN §3), and least-privilege users with .creds files.
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

// StreamsAccount signs the STREAMS account: JetStream enabled, holding
// every tenant's turn and result streams, with the exports of
// subjects.StreamsExports. Public exports carry an account token position;
// private ones (the consumer API, acks and reply storage) are imported by
// the BRAIN account only, with activation tokens (BrainAccount).
func (o *Operator) StreamsAccount(seed []byte) (*Account, error) {
	kp, err := keyPair(seed, nkeys.CreateAccount)
	if err != nil {
		return nil, err
	}
	return o.sign(subjects.AccountStreams, kp, func(ac *jwt.AccountClaims) {
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		for _, e := range subjects.StreamsExports() {
			ac.Exports.Add(export(e))
		}
	})
}

// BrainAccount signs the BRAIN account: no JetStream of its own, the
// exports of subjects.BrainExports (tenant API and events), and the imports
// of subjects.BrainImports from STREAMS, each with an activation token
// signed by STREAMS.
func (o *Operator) BrainAccount(seed []byte, streams *Account) (*Account, error) {
	kp, err := keyPair(seed, nkeys.CreateAccount)
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	var imps jwt.Imports
	for _, im := range subjects.BrainImports() {
		tok, err := streams.Activation(pub, im.Subject)
		if err != nil {
			return nil, err
		}
		imps.Add(&jwt.Import{Name: im.Name, Account: streams.Public, Subject: jwt.Subject(im.Subject),
			LocalSubject: jwt.RenamingSubject(im.Local), Type: jwt.Service, Token: tok})
	}
	return o.sign(subjects.AccountBrain, kp, func(ac *jwt.AccountClaims) {
		for _, e := range subjects.BrainExports() {
			ac.Exports.Add(export(e))
		}
		ac.Imports = imps
	})
}

// StreamedResponseThreshold is how long the server keeps the way back of
// a streamed response (a pull request's messages and heartbeats) without
// traffic: longer than the brain's pull heartbeat. The nsc script sets the
// same (RESPONSE_THRESHOLD in deploy/nsc-streams-account.sh).
const StreamedResponseThreshold = 2 * time.Minute

func export(e subjects.Export) *jwt.Export {
	x := &jwt.Export{Name: e.Name, Subject: jwt.Subject(e.Subject), Type: jwt.Stream, AccountTokenPosition: e.TokenPosition, TokenReq: e.Private}
	if e.IsService {
		x.Type = jwt.Service
	}
	if e.Streamed {
		x.ResponseType = jwt.ResponseTypeStream
		x.ResponseThreshold = StreamedResponseThreshold
	}
	return x
}

// Activation returns an activation token by which this account lets
// importer import one of its private exports.
func (a *Account) Activation(importer, subject string) (string, error) {
	act := jwt.NewActivationClaims(importer)
	act.Name = subject
	act.ImportSubject = jwt.Subject(subject)
	act.ImportType = jwt.Service
	tok, err := act.Encode(a.kp)
	if err != nil {
		return "", fmt.Errorf("activation of %s for %s: %w", subject, importer, err)
	}
	return tok, nil
}

// TenantLimits are the server-side bounds of every tenant account.
const (
	// TenantMaxPayload is the largest message a tenant's user may publish:
	// a turn (wire.MaxTurnBytes) with its headers. The server refuses
	// anything larger, whatever the edge does.
	TenantMaxPayload = 256 << 10
	// TenantMaxConns bounds a tenant's connections.
	TenantMaxConns = 32
	// TenantMaxSubs bounds a tenant's subscriptions.
	TenantMaxSubs = 1000
)

// TenantAccount signs a tenant account importing the brain's and the
// streams' exports, each pinned to the tenant's own public key, with no
// JetStream of its own and the bounds of TenantLimits.
func (o *Operator) TenantAccount(name string, seed []byte, brainAccount, streamsAccount string) (*Account, error) {
	kp, err := keyPair(seed, nkeys.CreateAccount)
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	return o.sign(name, kp, func(ac *jwt.AccountClaims) {
		ac.Imports = ImportsFor(pub, brainAccount, streamsAccount)
		ac.Limits.Conn = TenantMaxConns
		ac.Limits.Payload = TenantMaxPayload
		ac.Limits.Subs = TenantMaxSubs
	})
}

// ImportsFor returns the imports of a tenant account, as listed in
// subjects.TenantImports. Tests use it to build forged variants.
func ImportsFor(tenantAccount, brainAccount, streamsAccount string) jwt.Imports {
	var imps jwt.Imports
	for _, im := range subjects.TenantImports(tenantAccount) {
		typ := jwt.Stream
		if im.IsService {
			typ = jwt.Service
		}
		from := brainAccount
		if im.From == subjects.AccountStreams {
			from = streamsAccount
		}
		imps.Add(&jwt.Import{Name: im.Name, Account: from, Subject: jwt.Subject(im.Subject), LocalSubject: jwt.RenamingSubject(im.Local), Type: typ})
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
	// RoleBrain (BRAIN account) may pull, read and acknowledge turns through
	// its imports, publish replies and events, and answer tenant API
	// requests. It holds no JetStream administration rights at all (its
	// account has no JetStream, and its imports cover no create, update or
	// delete), and may never publish a turn or a live reply.
	RoleBrain Role = iota + 1
	// RoleEdge may publish turns, request results and API calls, and
	// subscribe to replies, events and its inboxes. Nothing else.
	RoleEdge
	// RoleProvisioner (STREAMS account) administers the tenants' streams and
	// consumers: the ops tooling's NATS identity, never a runtime one.
	RoleProvisioner
	// RoleUnrestricted has no permission limits: the system account's
	// operator user, and in tests an attacker who controls its own account.
	RoleUnrestricted
)

// Permissions returns the permissions of a role.
func Permissions(r Role) jwt.Permissions {
	var p jwt.Permissions
	switch r {
	case RoleBrain:
		p.Pub.Allow.Add(subjects.ConsumerNextLocal, subjects.ConsumerInfoLocal, subjects.ConsumerAck, subjects.ReplyAll,
			subjects.EventExport, subjects.ScheduleAll)
		// Only imports produce turns; only the results streams produce live
		// replies. (Neither is in the allow list; the denials say so twice.)
		p.Pub.Deny.Add(subjects.TurnExport, subjects.LiveExport)
		p.Sub.Allow.Add("_INBOX.>", subjects.APIExport)
		// Answer API requests arriving through the service import on their
		// _R_ reply subjects, one response each.
		p.Resp = &jwt.ResponsePermission{MaxMsgs: 1}
	case RoleEdge:
		p.Pub.Allow.Add(subjects.LocalTurn+">", subjects.LocalResult+">", subjects.LocalAPI+">")
		p.Sub.Allow.Add(subjects.LocalReply+">", subjects.LocalEvent+">", "_INBOX.>")
	case RoleProvisioner:
		p.Pub.Allow.Add("$JS.API.>")
		p.Sub.Allow.Add("_INBOX.>")
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
