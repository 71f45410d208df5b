package devstack

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"n8nbrain/nats/account"
	"n8nbrain/registry"
)

// Identities are a stack's NATS identities and development secrets, kept in
// Dir/keys.json (mode 0600) so that a stack started again on the same Dir
// is the same system: the operator, system, BRAIN and tenant account seeds,
// the edge tokens, the sealing key and the passwords. The embedded stack
// (Start) and the compose init step (Init) both use them; .creds files go
// to Dir/creds.
type Identities struct {
	dir string

	mu   sync.Mutex
	keys *keyFile

	Operator *account.Operator
	System   *account.Account
	Streams  *account.Account
	Brain    *account.Account
}

// keyFile holds the stack's secrets: development only, mode 0600.
type keyFile struct {
	Operator         string            `json:"operator"`
	System           string            `json:"system"`
	Streams          string            `json:"streams"`
	Brain            string            `json:"brain"`
	Tenants          map[string]string `json:"tenants"`
	EdgeTokens       map[string]string `json:"edge_tokens"`
	SealingKey       string            `json:"sealing_key"`
	ReviewerPassword string            `json:"reviewer_password"`
	RegistryPassword string            `json:"registry_reader_password"`
	WebhookSecret    string            `json:"webhook_secret,omitempty"`
	// IntakeSecret protects n8n's intake webhook; never the events secret.
	IntakeSecret string `json:"intake_secret,omitempty"`
}

// operatorName names the development operator in its JWT.
const operatorName = "brain-dev"

// LoadIdentities loads the identities kept in dir, creating what is missing
// (all of them on the first run), and saves them.
func LoadIdentities(dir string) (*Identities, error) {
	if err := os.MkdirAll(filepath.Join(dir, "creds"), 0o700); err != nil {
		return nil, err
	}
	id := &Identities{dir: dir}
	if err := id.load(); err != nil {
		return nil, err
	}
	sysKP, sysPub, err := account.NewAccountKey([]byte(id.keys.System))
	if err != nil {
		return nil, fmt.Errorf("system account key: %w", err)
	}
	op, err := account.NewOperator(operatorName, []byte(id.keys.Operator), sysPub)
	if err != nil {
		return nil, err
	}
	sys, err := op.SystemAccount(sysKP)
	if err != nil {
		return nil, err
	}
	st, err := op.StreamsAccount([]byte(id.keys.Streams))
	if err != nil {
		return nil, err
	}
	br, err := op.BrainAccount([]byte(id.keys.Brain), st)
	if err != nil {
		return nil, err
	}
	id.Operator, id.System, id.Streams, id.Brain = op, sys, st, br
	id.mu.Lock()
	defer id.mu.Unlock()
	for dst, seeder := range map[*string]interface{ Seed() ([]byte, error) }{&id.keys.Operator: op, &id.keys.System: sys,
		&id.keys.Streams: st, &id.keys.Brain: br} {
		seed, err := seeder.Seed()
		if err != nil {
			return nil, err
		}
		*dst = string(seed)
	}
	return id, id.saveLocked()
}

// Dir is where the identities are kept.
func (id *Identities) Dir() string { return id.dir }

func (id *Identities) keyPath() string { return filepath.Join(id.dir, "keys.json") }

func (id *Identities) load() error {
	k := &keyFile{}
	b, err := os.ReadFile(id.keyPath())
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return err
	default:
		if err := json.Unmarshal(b, k); err != nil {
			return fmt.Errorf("read %s: %w", id.keyPath(), err)
		}
	}
	if k.Tenants == nil {
		k.Tenants = map[string]string{}
	}
	if k.EdgeTokens == nil {
		k.EdgeTokens = map[string]string{}
	}
	if k.SealingKey == "" {
		k.SealingKey = registry.NewKey()
	}
	if k.RegistryPassword == "" {
		k.RegistryPassword = randomToken()
	}
	if k.ReviewerPassword == "" {
		k.ReviewerPassword = randomToken()[:16]
	}
	if k.WebhookSecret == "" {
		k.WebhookSecret = randomToken()
	}
	if k.IntakeSecret == "" {
		k.IntakeSecret = randomToken()
	}
	id.keys = k
	return nil
}

func (id *Identities) saveLocked() error {
	b, err := json.MarshalIndent(id.keys, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(id.keyPath(), b, 0o600)
}

// update changes the kept secrets under the lock and saves them.
func (id *Identities) update(edit func(k *keyFile)) error {
	id.mu.Lock()
	defer id.mu.Unlock()
	edit(id.keys)
	return id.saveLocked()
}

// secrets returns a copy of the kept secrets.
func (id *Identities) secrets() keyFile {
	id.mu.Lock()
	defer id.mu.Unlock()
	k := *id.keys
	k.Tenants = maps.Clone(k.Tenants)
	k.EdgeTokens = maps.Clone(k.EdgeTokens)
	return k
}

// TenantAccount returns the account of a tenant whose seed is kept, signed
// with its imports of the STREAMS and BRAIN accounts; ok is false when none
// is kept.
func (id *Identities) TenantAccount(name string) (acc *account.Account, ok bool, err error) {
	id.mu.Lock()
	seed, ok := id.keys.Tenants[name]
	id.mu.Unlock()
	if !ok {
		return nil, false, nil
	}
	acc, err = id.Operator.TenantAccount(name, []byte(seed), id.Brain.Public, id.Streams.Public)
	if err != nil {
		return nil, true, fmt.Errorf("tenant account %s: %w", name, err)
	}
	return acc, true, nil
}

// keepTenant saves a tenant's account seed and edge token.
func (id *Identities) keepTenant(name string, acc *account.Account, token string) error {
	seed, err := acc.Seed()
	if err != nil {
		return err
	}
	return id.update(func(k *keyFile) {
		k.Tenants[name] = string(seed)
		k.EdgeTokens[name] = token
	})
}

// Accounts returns every account JWT by public key: SYS, STREAMS, BRAIN and
// each kept tenant, what a server's resolver must know.
func (id *Identities) Accounts() (map[string]string, error) {
	accounts := map[string]string{id.System.Public: id.System.JWT, id.Streams.Public: id.Streams.JWT, id.Brain.Public: id.Brain.JWT}
	id.mu.Lock()
	names := slices.Sorted(maps.Keys(id.keys.Tenants))
	id.mu.Unlock()
	for _, name := range names {
		ta, _, err := id.TenantAccount(name)
		if err != nil {
			return nil, err
		}
		accounts[ta.Public] = ta.JWT
	}
	return accounts, nil
}

// WriteBrainCreds writes a BRAIN account user's .creds file
// (Dir/creds/brain.creds) and returns its path.
func (id *Identities) WriteBrainCreds() (string, error) {
	creds, err := account.UserCreds(id.Brain, "brain", account.RoleBrain)
	if err != nil {
		return "", err
	}
	path := filepath.Join(id.dir, "creds", "brain.creds")
	return path, writeFileAtomic(path, creds, 0o600)
}

// WriteProvisionerCreds writes a STREAMS account provisioner's .creds file
// (Dir/creds/provisioner.creds), the ops tooling's identity for creating
// and deleting tenants' streams, and returns its path.
func (id *Identities) WriteProvisionerCreds() (string, error) {
	creds, err := account.UserCreds(id.Streams, "provisioner", account.RoleProvisioner)
	if err != nil {
		return "", err
	}
	path := filepath.Join(id.dir, "creds", "provisioner.creds")
	return path, writeFileAtomic(path, creds, 0o600)
}

// WriteEdgeCreds writes a tenant's edge user .creds file
// (Dir/creds/<tenant>-edge.creds) and returns its path.
func (id *Identities) WriteEdgeCreds(acc *account.Account) (string, error) {
	creds, err := account.UserCreds(acc, "edge", account.RoleEdge)
	if err != nil {
		return "", err
	}
	path := filepath.Join(id.dir, "creds", acc.Name+"-edge.creds")
	return path, writeFileAtomic(path, creds, 0o600)
}

// writeFileAtomic replaces path with data, so a reader never sees half a file.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
