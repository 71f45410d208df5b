// Package devstack wires a whole system on one machine without Docker: an
// embedded NATS server in operator mode with generated accounts, a Postgres
// cluster reached through provisioning, and the real brain and edge. The
// development stack (deploy/cmd/devstack) and the whole-system tests both
// build on it, so what the tests prove is what a developer runs.
package devstack

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"n8nbrain/brain"
	"n8nbrain/edge"
	"n8nbrain/nats/account"
	"n8nbrain/nats/embed"
	"n8nbrain/provision"
	"n8nbrain/registry"
)

// Config of a stack. Dir keeps its state: the NATS identities (seeds), the
// .creds files, the JetStream store and dev secrets. Reusing a Dir reuses
// all of them, as the development stack does between runs.
type Config struct {
	Dir      string
	AdminURL string // Postgres bootstrap role; used for provisioning only
	// Prefix is prepended to provisioned role and database names (tests).
	Prefix     string
	NATSHost   string // default 127.0.0.1
	NATSPort   int    // default: a free port
	SyncAlways bool
	Logger     *slog.Logger
}

// Stack is a running NATS server plus provisioning.
type Stack struct {
	cfg         Config
	log         *slog.Logger
	NATS        *embed.Server
	Operator    *account.Operator
	Brain       *account.Account
	BrainCreds  string
	Ops         *provision.Ops
	RegistryURL string
	SealingKey  []byte

	mu   sync.Mutex
	keys *keyFile
}

// keyFile holds the stack's secrets: development only, mode 0600.
type keyFile struct {
	Operator         string            `json:"operator"`
	System           string            `json:"system"`
	Brain            string            `json:"brain"`
	Tenants          map[string]string `json:"tenants"`
	EdgeTokens       map[string]string `json:"edge_tokens"`
	SealingKey       string            `json:"sealing_key"`
	ReviewerPassword string            `json:"reviewer_password"`
	RegistryPassword string            `json:"registry_reader_password"`
}

// Start loads or creates the stack's identities, starts NATS with every
// known account, and bootstraps the registry.
func Start(ctx context.Context, cfg Config) (*Stack, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "creds"), 0o700); err != nil {
		return nil, err
	}
	s := &Stack{cfg: cfg, log: cfg.Logger}
	if err := s.loadKeys(); err != nil {
		return nil, err
	}
	if err := s.startNATS(); err != nil {
		return nil, err
	}
	key, err := registry.ParseKey(s.keys.SealingKey)
	if err != nil {
		s.Close()
		return nil, err
	}
	sealer, err := registry.NewSealer(key)
	if err != nil {
		s.Close()
		return nil, err
	}
	s.SealingKey = key
	s.Ops = &provision.Ops{AdminURL: cfg.AdminURL, Sealer: sealer, Prefix: cfg.Prefix}
	s.RegistryURL, err = s.Ops.BootstrapRegistry(ctx, s.keys.RegistryPassword)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("bootstrap registry: %w", err)
	}
	return s, nil
}

func (s *Stack) keyPath() string { return filepath.Join(s.cfg.Dir, "keys.json") }

func (s *Stack) loadKeys() error {
	k := &keyFile{}
	b, err := os.ReadFile(s.keyPath())
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return err
	default:
		if err := json.Unmarshal(b, k); err != nil {
			return fmt.Errorf("read %s: %w", s.keyPath(), err)
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
	s.keys = k
	return nil
}

func (s *Stack) saveKeysLocked() error {
	b, err := json.MarshalIndent(s.keys, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(s.keyPath(), b, 0o600)
}

func (s *Stack) startNATS() error {
	sysKP, sysPub, err := account.NewAccountKey([]byte(s.keys.System))
	if err != nil {
		return err
	}
	op, err := account.NewOperator("brain-dev", []byte(s.keys.Operator), sysPub)
	if err != nil {
		return err
	}
	sys, err := op.SystemAccount(sysKP)
	if err != nil {
		return err
	}
	br, err := op.BrainAccount([]byte(s.keys.Brain))
	if err != nil {
		return err
	}
	accounts := map[string]string{sys.Public: sys.JWT, br.Public: br.JWT}
	for name, seed := range s.keys.Tenants {
		ta, err := op.TenantAccount(name, []byte(seed), br.Public)
		if err != nil {
			return fmt.Errorf("tenant account %s: %w", name, err)
		}
		accounts[ta.Public] = ta.JWT
	}
	s.mu.Lock()
	for dst, seeder := range map[*string]interface{ Seed() ([]byte, error) }{&s.keys.Operator: op, &s.keys.System: sys, &s.keys.Brain: br} {
		seed, err := seeder.Seed()
		if err != nil {
			s.mu.Unlock()
			return err
		}
		*dst = string(seed)
	}
	err = s.saveKeysLocked()
	s.mu.Unlock()
	if err != nil {
		return err
	}
	srv, err := embed.Start(embed.Config{
		Host:          s.cfg.NATSHost,
		Port:          s.cfg.NATSPort,
		StoreDir:      filepath.Join(s.cfg.Dir, "jetstream"),
		OperatorJWT:   op.JWT,
		SystemAccount: sys.Public,
		Accounts:      accounts,
		SyncAlways:    s.cfg.SyncAlways,
		Logger:        s.log,
	})
	if err != nil {
		return err
	}
	s.NATS, s.Operator, s.Brain = srv, op, br
	creds, err := account.UserCreds(br, "brain", account.RoleBrain)
	if err != nil {
		return err
	}
	s.BrainCreds = filepath.Join(s.cfg.Dir, "creds", "brain.creds")
	return os.WriteFile(s.BrainCreds, creds, 0o600)
}

// Tenant is a tenant of the stack with what its edge needs.
type Tenant struct {
	ID        registry.TenantID
	Account   *account.Account
	EdgeCreds string // path of the edge user's .creds file
	Token     string // the bearer token n8n presents to the edge
	// DB is set when the tenant was created by this process (nil when loaded).
	DB *provision.Tenant
}

// AddTenant creates a tenant end to end: NATS account (pushed to the
// running server), database, roles, grants, migrations, registry row, edge
// creds and edge token. spec.NATSAccount is filled in.
func (s *Stack) AddTenant(ctx context.Context, spec provision.TenantSpec) (*Tenant, error) {
	name := string(spec.ID)
	acc, err := s.Operator.TenantAccount(name, nil, s.Brain.Public)
	if err != nil {
		return nil, err
	}
	spec.NATSAccount = acc.Public
	db, err := s.Ops.CreateTenant(ctx, spec)
	if err != nil {
		return nil, err
	}
	if err := s.NATS.PutAccount(acc.Public, acc.JWT); err != nil {
		return nil, err
	}
	seed, err := acc.Seed()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.keys.Tenants[name] = string(seed)
	s.keys.EdgeTokens[name] = randomToken()
	err = s.saveKeysLocked()
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	t, err := s.LoadTenant(spec.ID)
	if err != nil {
		return nil, err
	}
	t.DB = db
	return t, nil
}

// LoadTenant returns a tenant this stack created earlier (same Dir),
// writing a fresh edge user .creds file.
func (s *Stack) LoadTenant(id registry.TenantID) (*Tenant, error) {
	s.mu.Lock()
	seed, ok := s.keys.Tenants[string(id)]
	token := s.keys.EdgeTokens[string(id)]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("tenant %s has no NATS identity in %s", id, s.keyPath())
	}
	acc, err := s.Operator.TenantAccount(string(id), []byte(seed), s.Brain.Public)
	if err != nil {
		return nil, err
	}
	creds, err := account.UserCreds(acc, "edge", account.RoleEdge)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(s.cfg.Dir, "creds", string(id)+"-edge.creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		return nil, err
	}
	return &Tenant{ID: id, Account: acc, EdgeCreds: path, Token: token}, nil
}

// BrainConfig is a brain replica's configuration for this stack.
func (s *Stack) BrainConfig(replica string) brain.Config {
	return brain.Config{
		NATSURL:     s.NATS.ClientURL(),
		CredsFile:   s.BrainCreds,
		RegistryURL: s.RegistryURL,
		SealingKey:  s.SealingKey,
		Replica:     replica,
	}
}

// EdgeConfig is the configuration of a tenant's edge for this stack.
func (s *Stack) EdgeConfig(t *Tenant) edge.Config {
	return edge.Config{
		TenantID:  string(t.ID),
		NATSURL:   s.NATS.ClientURL(),
		CredsFile: t.EdgeCreds,
		Token:     t.Token,
	}
}

// Close stops NATS. Databases stay (the dev stack reuses them; tests drop
// theirs with provision.Ops.DropPrefixed).
func (s *Stack) Close() {
	if s.NATS != nil {
		s.NATS.Stop()
	}
}

func randomToken() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}
