// Package embed runs an embedded nats-server in operator (JWT) mode with
// JetStream, for the development stack and the tests. It loads the same
// operator and account JWTs that package account generates; accounts added
// later (tenant onboarding) are pushed into its resolver at run time, as
// `nsc push` does against a production resolver.
package embed

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
)

// Config of an embedded server. The zero value of a field means its default.
type Config struct {
	Host     string // default 127.0.0.1
	Port     int    // default: a free port
	StoreDir string // JetStream storage; required
	// OperatorJWT is the trusted operator; SystemAccount its system account key.
	OperatorJWT   string
	SystemAccount string
	// Accounts maps account public keys to their JWTs, loaded at start.
	Accounts map[string]string
	// SyncAlways makes JetStream fsync before every PubAck (see DESIGN §3).
	SyncAlways bool
	// MaxStore is JetStream's file store limit; default 1 TiB (each stream's
	// MaxBytes is reserved against it: see nats/conf.DefaultMaxStore).
	MaxStore int64
	// Name names the server (unique in a cluster). Default brain-nats-embedded.
	Name string
	// Cluster, when its Name is set, makes the server a node of a cluster.
	Cluster ClusterConfig
	Logger  *slog.Logger
}

// ClusterConfig joins a server to a cluster: the route listener and the
// routes to the other nodes.
type ClusterConfig struct {
	Name   string
	Port   int      // route listener on Host; default: a free port
	Routes []string // nats-route://host:port of the other nodes
}

// Server is a running embedded server.
type Server struct {
	*server.Server
	resolver *server.MemAccResolver
}

// Start starts the server and waits until it accepts connections.
func Start(cfg Config) (*Server, error) {
	if cfg.StoreDir == "" {
		return nil, fmt.Errorf("embedded nats: StoreDir is required")
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.Port == 0 {
		cfg.Port = server.RANDOM_PORT
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxStore == 0 {
		cfg.MaxStore = 1 << 40
	}
	if cfg.Name == "" {
		cfg.Name = "brain-nats-embedded"
	}
	oc, err := jwt.DecodeOperatorClaims(cfg.OperatorJWT)
	if err != nil {
		return nil, fmt.Errorf("decode operator JWT: %w", err)
	}
	res := &server.MemAccResolver{}
	for pub, tok := range cfg.Accounts {
		if err := res.Store(pub, tok); err != nil {
			return nil, err
		}
	}
	opts := &server.Options{
		ServerName:        cfg.Name,
		Host:              cfg.Host,
		Port:              cfg.Port,
		NoSigs:            true,
		JetStream:         true,
		StoreDir:          cfg.StoreDir,
		TrustedOperators:  []*jwt.OperatorClaims{oc},
		SystemAccount:     cfg.SystemAccount,
		AccountResolver:   res,
		SyncAlways:        cfg.SyncAlways,
		MaxPayload:        1 << 20,
		JetStreamMaxStore: cfg.MaxStore,
	}
	if c := cfg.Cluster; c.Name != "" {
		opts.Cluster.Name = c.Name
		opts.Cluster.Host = cfg.Host
		opts.Cluster.Port = c.Port
		if opts.Cluster.Port == 0 {
			opts.Cluster.Port = server.RANDOM_PORT
		}
		opts.Routes = server.RoutesFromStr(strings.Join(c.Routes, ","))
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("new nats server: %w", err)
	}
	s.SetLoggerV2(&logAdapter{l: cfg.Logger}, false, false, false)
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded nats server not ready after 10s")
	}
	return &Server{Server: s, resolver: res}, nil
}

// PutAccount adds or replaces an account JWT at run time.
func (s *Server) PutAccount(pub, token string) error {
	ac, err := jwt.DecodeAccountClaims(token)
	if err != nil {
		return fmt.Errorf("decode account JWT: %w", err)
	}
	if ac.Subject != pub {
		return fmt.Errorf("account JWT is for %s, not %s", ac.Subject, pub)
	}
	if err := s.resolver.Store(pub, token); err != nil {
		return err
	}
	// An account the server has already loaded must be updated in place.
	if acc, err := s.LookupAccount(pub); err == nil {
		s.UpdateAccountClaims(acc, ac)
	}
	return nil
}

// Stop shuts the server down and waits for it.
func (s *Server) Stop() {
	s.Shutdown()
	s.WaitForShutdown()
}

// logAdapter sends the server's warnings and errors to slog; its notices
// are dropped (they are chatty and carry nothing an operator needs here).
type logAdapter struct{ l *slog.Logger }

func (a *logAdapter) Noticef(string, ...any) {}
func (a *logAdapter) Warnf(f string, v ...any) {
	a.l.Warn("nats server", "msg_text", fmt.Sprintf(f, v...))
}
func (a *logAdapter) Fatalf(f string, v ...any) {
	a.l.Error("nats server fatal", "msg_text", fmt.Sprintf(f, v...))
}
func (a *logAdapter) Errorf(f string, v ...any) {
	a.l.Error("nats server", "msg_text", fmt.Sprintf(f, v...))
}
func (a *logAdapter) Debugf(string, ...any) {}
func (a *logAdapter) Tracef(string, ...any) {}
