// Package devstack wires a whole system on one machine without Docker: an
// embedded NATS server in operator mode with generated accounts, a Postgres
// cluster reached through provisioning, and the real brain and edge. The
// development stack (deploy/cmd/devstack) and the whole-system tests both
// build on it, so what the tests prove is what a developer runs.
//
// Init is the Docker Compose stack's init step: the same identities
// (Identities), written as a nats-server configuration and .creds files for
// containers instead of an embedded server.
package devstack

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/brain"
	"n8nbrain/edge"
	"n8nbrain/nats/account"
	"n8nbrain/nats/embed"
	"n8nbrain/nats/stream"
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
	Prefix   string
	NATSHost string // default 127.0.0.1
	NATSPort int    // default: a free port (single node only)
	// NATSNodes is 1 (default) for one server, or 3 for a routed cluster
	// whose streams are replicated on every node (R3).
	NATSNodes  int
	SyncAlways bool
	// Streams is what every tenant's streams share (ack wait, storage); with
	// a cluster its Replicas default to the number of nodes.
	Streams stream.Config
	Logger  *slog.Logger
}

// Stack is a running NATS server plus provisioning.
type Stack struct {
	cfg        Config
	log        *slog.Logger
	NATS       *embed.Cluster
	Operator   *account.Operator
	Brain      *account.Account
	BrainCreds string
	// StreamsAccount holds every tenant's streams (subjects.AccountStreams).
	StreamsAccount *account.Account
	// ProvisionerCreds is the STREAMS account provisioner's .creds; Streams
	// creates tenants' streams with it.
	ProvisionerCreds string
	Streams          *provision.Streams
	provisioner      *nats.Conn
	Ops              *provision.Ops
	RegistryURL      string
	SealingKey       []byte
	// IDs are the stack's NATS identities and secrets, kept in Dir.
	IDs *Identities
}

// Start loads or creates the stack's identities, starts NATS with every
// known account, and bootstraps the registry.
func Start(ctx context.Context, cfg Config) (*Stack, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ids, err := LoadIdentities(cfg.Dir)
	if err != nil {
		return nil, err
	}
	s := &Stack{cfg: cfg, log: cfg.Logger, IDs: ids, Operator: ids.Operator, Brain: ids.Brain, StreamsAccount: ids.Streams}
	if err := s.startNATS(); err != nil {
		return nil, err
	}
	sec := ids.secrets()
	key, err := registry.ParseKey(sec.SealingKey)
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
	s.Ops = &provision.Ops{AdminURL: cfg.AdminURL, Sealer: sealer, Prefix: cfg.Prefix,
		Reserved: provision.ReservedAccounts{Brain: ids.Brain.Public, Streams: ids.Streams.Public, System: ids.System.Public}}
	s.RegistryURL, err = s.Ops.BootstrapRegistry(ctx, sec.RegistryPassword)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("bootstrap registry: %w", err)
	}
	return s, nil
}

func (s *Stack) startNATS() error {
	accounts, err := s.IDs.Accounts()
	if err != nil {
		return err
	}
	nodes := max(s.cfg.NATSNodes, 1)
	srv, err := embed.StartCluster(embed.Config{
		Host:          s.cfg.NATSHost,
		Port:          s.cfg.NATSPort,
		StoreDir:      filepath.Join(s.cfg.Dir, "jetstream"),
		OperatorJWT:   s.Operator.JWT,
		SystemAccount: s.IDs.System.Public,
		Accounts:      accounts,
		SyncAlways:    s.cfg.SyncAlways,
		Logger:        s.log,
	}, nodes)
	if err != nil {
		return err
	}
	s.NATS = srv
	if s.cfg.Streams.Replicas == 0 {
		s.cfg.Streams.Replicas = nodes
	}
	if s.BrainCreds, err = s.IDs.WriteBrainCreds(); err != nil {
		return err
	}
	if s.ProvisionerCreds, err = s.IDs.WriteProvisionerCreds(); err != nil {
		return err
	}
	s.provisioner, err = nats.Connect(srv.ClientURL(), nats.UserCredentials(s.ProvisionerCreds), nats.Name("provisioner"),
		nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("connect the stream provisioner: %w", err)
	}
	js, err := jetstream.New(s.provisioner)
	if err != nil {
		return err
	}
	s.Streams = &provision.Streams{JS: js, Config: s.cfg.Streams}
	// A cluster elects its JetStream leaders after the nodes meet: retry.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		err = s.Streams.EnsureShared(actx)
		acancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
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
// running server), database, roles, grants, migrations, registry row, its
// streams and consumer, edge creds and edge token. spec.NATSAccount is
// filled in.
func (s *Stack) AddTenant(ctx context.Context, spec provision.TenantSpec) (*Tenant, error) {
	name := string(spec.ID)
	acc, err := s.Operator.TenantAccount(name, nil, s.Brain.Public, s.StreamsAccount.Public)
	if err != nil {
		return nil, err
	}
	spec.NATSAccount = acc.Public
	db, err := s.Ops.CreateTenant(ctx, spec)
	if err != nil {
		return nil, err
	}
	if err := s.Streams.EnsureTenant(ctx, &registry.Tenant{ID: spec.ID, NATSAccount: acc.Public, Quota: db.Spec.Quota}); err != nil {
		return nil, err
	}
	if err := s.NATS.PutAccount(acc.Public, acc.JWT); err != nil {
		return nil, err
	}
	if err := s.IDs.keepTenant(name, acc, randomToken()); err != nil {
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
	acc, ok, err := s.IDs.TenantAccount(string(id))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("tenant %s has no NATS identity in %s", id, s.IDs.keyPath())
	}
	path, err := s.IDs.WriteEdgeCreds(acc)
	if err != nil {
		return nil, err
	}
	return &Tenant{ID: id, Account: acc, EdgeCreds: path, Token: s.IDs.secrets().EdgeTokens[string(id)]}, nil
}

// BrainConfig is a brain replica's configuration for this stack.
func (s *Stack) BrainConfig(replica string) brain.Config {
	return brain.Config{
		NATSURL:     s.NATS.ClientURL(),
		CredsFile:   s.BrainCreds,
		RegistryURL: s.RegistryURL,
		SealingKey:  s.SealingKey,
		Replica:     replica,
		// The stack's own cluster serves no TLS (deploy/localpg): say so,
		// rather than have every new tenant connection try TLS first.
		DBSSLMode: "disable",
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
	if s.provisioner != nil {
		s.provisioner.Close()
	}
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
