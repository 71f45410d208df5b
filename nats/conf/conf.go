// Package conf writes the configuration file of a standalone nats-server in
// operator (JWT) mode, from the same identities package account generates:
// the trusted operator, the system account, a MEMORY resolver preloaded with
// every account JWT (SYS, STREAMS, BRAIN, tenants), JetStream with a deliberate fsync
// policy, the client listener, the monitoring port and a 1 MiB payload limit.
//
// `docker compose up` runs the official nats image on a file written by this
// package (deploy/devstack Init); conf_test.go loads such a file with
// nats-server's own parser, starts it and relays a turn through a tenant's
// import into TURNS, so the file compose runs is the one the tests prove.
//
// A MEMORY resolver is right for one development server whose accounts are
// all known when the file is written. Production uses the NATS-based
// resolver (`resolver { type: full }`) and `nsc push` (deploy/nsc-*.sh), so
// tenants can be added without a restart.
package conf

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// SyncAlways is the Sync value that fsyncs before every PubAck.
const SyncAlways = "always"

// DefaultMaxPayload is the largest message the server accepts: a turn is at
// most 256 KiB (wire.MaxTurnBytes), a reply far less.
const DefaultMaxPayload = 1 << 20

// Config of a server. The zero value of a field means its default.
type Config struct {
	// ServerName names the server in monitoring and logs. Default "brain-nats".
	ServerName string
	// Listen is the client listener, host:port. Default "0.0.0.0:4222";
	// port -1 picks a free port (tests).
	Listen string
	// HTTP is the monitoring listener (/healthz, /varz, /jsz), host:port.
	// Default "0.0.0.0:8222"; port -1 picks a free port.
	HTTP string
	// StoreDir is JetStream's storage directory (required).
	StoreDir string
	// Sync is JetStream's sync_interval: SyncAlways (the default) or a
	// duration such as "1s" or "2m".
	//
	// "always" fsyncs every write before the PubAck is sent, so a turn the
	// edge was told is accepted survives a power failure of the host, not
	// only a crash of the process. nats-server's own default is a periodic
	// fsync every two minutes; Jepsen's 2025 analysis of NATS 2.12.1 showed
	// acknowledged writes lost on power failure with it (DESIGN §3). The
	// edge answers n8n only after the PubAck, and a lost turn after a 200 or
	// 202 would break the promise that a submitted turn is never lost, so
	// the default here is the safe one. Its cost is one fsync per stored
	// message, which bounds throughput by the disk's fsync latency: measure
	// on the target disk (BENCHMARKS.md). A replicated (R3) production
	// cluster that accepts losing only what all replicas had not yet synced
	// may choose an interval instead; say so where it is configured.
	Sync string
	// OperatorJWT is the trusted operator's JWT, written inline.
	OperatorJWT string
	// SystemAccount is the system account's public key.
	SystemAccount string
	// Accounts maps account public keys to their JWTs, all preloaded into
	// the MEMORY resolver. It must include the system account.
	Accounts map[string]string
	// MaxPayload in bytes. Default DefaultMaxPayload.
	MaxPayload int
	// MaxStore is JetStream's max_file_store in bytes. Default DefaultMaxStore.
	MaxStore int64
	// Cluster, when its Name is set, makes the server a node of a routed
	// cluster (ServerName must then be unique among the nodes).
	Cluster Cluster
}

// Cluster is a node's cluster block: its route listener and the routes to
// the other nodes (nats-route://host:port).
type Cluster struct {
	Name   string
	Listen string // default 0.0.0.0:6222
	Routes []string
}

// DefaultMaxStore is JetStream's file store limit. Every stream's MaxBytes
// is reserved against it when the stream is created (tenants × their
// quota), so it is set high; what the disk really holds is what is stored,
// bounded by each tenant's quota and window. Size the disk for that.
const DefaultMaxStore = 1 << 40

func (c Config) withDefaults() Config {
	if c.ServerName == "" {
		c.ServerName = "brain-nats"
	}
	if c.Listen == "" {
		c.Listen = "0.0.0.0:4222"
	}
	if c.HTTP == "" {
		c.HTTP = "0.0.0.0:8222"
	}
	if c.Sync == "" {
		c.Sync = SyncAlways
	}
	if c.MaxPayload == 0 {
		c.MaxPayload = DefaultMaxPayload
	}
	if c.MaxStore == 0 {
		c.MaxStore = DefaultMaxStore
	}
	if c.Cluster.Name != "" && c.Cluster.Listen == "" {
		c.Cluster.Listen = "0.0.0.0:6222"
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.StoreDir == "" {
		errs = append(errs, errors.New("nats conf: StoreDir is required"))
	} else if !plain(c.StoreDir) {
		errs = append(errs, fmt.Errorf("nats conf: store dir %q must not contain quotes, backslashes or control characters", c.StoreDir))
	}
	if !plain(c.ServerName) || strings.ContainsAny(c.ServerName, " \t") {
		errs = append(errs, fmt.Errorf("nats conf: server name %q must be one word", c.ServerName))
	}
	for name, hp := range map[string]string{"listen": c.Listen, "http": c.HTTP} {
		host, port, err := net.SplitHostPort(hp)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil || n < -1 || n > 65535 || !plain(host) {
			errs = append(errs, fmt.Errorf("nats conf: %s address %q must be host:port", name, hp))
		}
	}
	if c.Sync != SyncAlways {
		if d, err := time.ParseDuration(c.Sync); err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("nats conf: sync interval %q must be %q or a positive duration such as 1s", c.Sync, SyncAlways))
		}
	}
	if cl := c.Cluster; cl.Name != "" {
		if !plain(cl.Name) || strings.ContainsAny(cl.Name, " \t") {
			errs = append(errs, fmt.Errorf("nats conf: cluster name %q must be one word", cl.Name))
		}
		for _, r := range cl.Routes {
			if !plain(r) || !strings.HasPrefix(r, "nats-route://") {
				errs = append(errs, fmt.Errorf("nats conf: route %q must be nats-route://host:port", r))
			}
		}
	}
	if c.MaxPayload < 1 {
		errs = append(errs, fmt.Errorf("nats conf: max payload %d must be positive", c.MaxPayload))
	}
	if _, err := jwt.DecodeOperatorClaims(c.OperatorJWT); err != nil {
		errs = append(errs, fmt.Errorf("nats conf: operator JWT: %w", err))
	}
	if !nkeys.IsValidPublicAccountKey(c.SystemAccount) {
		errs = append(errs, fmt.Errorf("nats conf: system account %q is not an account public key", c.SystemAccount))
	} else if _, ok := c.Accounts[c.SystemAccount]; !ok {
		errs = append(errs, errors.New("nats conf: the system account's JWT is not among the accounts"))
	}
	for pub, tok := range c.Accounts {
		ac, err := jwt.DecodeAccountClaims(tok)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("nats conf: account %s: %w", pub, err))
		case ac.Subject != pub:
			errs = append(errs, fmt.Errorf("nats conf: the JWT given for account %s is account %s's", pub, ac.Subject))
		}
	}
	return errors.Join(errs...)
}

// plain reports whether s can be written inside double quotes as it is.
func plain(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return r == '"' || r == '\\' || r < 0x20 || r == 0x7f })
}

// Render returns the configuration file's text.
func Render(c Config) ([]byte, error) {
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# nats-server configuration in operator mode, written by n8nbrain (nats/conf).\n")
	w("# Generated: edit the inputs (environment of the init step), not this file.\n\n")
	w("server_name: %q\n", c.ServerName)
	w("listen: %q\n", c.Listen)
	w("# Monitoring: /healthz?js-enabled-only=true is the container's health check.\n")
	w("http: %q\n", c.HTTP)
	w("max_payload: %d\n\n", c.MaxPayload)
	if cl := c.Cluster; cl.Name != "" {
		w("# A node of a routed cluster: streams are replicated across the nodes (R3).\n")
		w("cluster {\n")
		w("  name: %q\n", cl.Name)
		w("  listen: %q\n", cl.Listen)
		w("  routes: [\n")
		for _, r := range cl.Routes {
			w("    %q\n", r)
		}
		w("  ]\n")
		w("}\n\n")
	}
	w("jetstream {\n")
	w("  store_dir: %q\n", c.StoreDir)
	w("  # Reserved up front by each stream's MaxBytes (every tenant's quota); not the disk's size.\n")
	w("  max_file_store: %d\n", c.MaxStore)
	if c.Sync == SyncAlways {
		w("  # fsync before every PubAck: an accepted turn survives a power failure (DESIGN §3).\n")
	} else {
		w("  # Periodic fsync: acknowledged writes of the last interval can be lost on power failure.\n")
	}
	w("  sync_interval: %q\n", c.Sync)
	w("}\n\n")
	w("operator: %q\n", c.OperatorJWT)
	w("system_account: %q\n\n", c.SystemAccount)
	w("# Every account is preloaded; the server resolves no account at run time.\n")
	w("resolver: MEMORY\n")
	w("resolver_preload: {\n")
	keys := make([]string, 0, len(c.Accounts))
	for pub := range c.Accounts {
		keys = append(keys, pub)
	}
	slices.Sort(keys)
	for _, pub := range keys {
		if ac, err := jwt.DecodeAccountClaims(c.Accounts[pub]); err == nil && ac.Name != "" && plain(ac.Name) {
			w("  # %s\n", ac.Name)
		}
		w("  %s: %q\n", pub, c.Accounts[pub])
	}
	w("}\n")
	return b.Bytes(), nil
}

// Write renders the configuration to w.
func Write(w io.Writer, c Config) error {
	b, err := Render(c)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// WriteFile renders the configuration to path, replacing it atomically. The
// file holds only public material (signed JWTs and public keys), so it is
// world-readable: the nats container may run as another user.
func WriteFile(path string, c Config) error {
	b, err := Render(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".nats.conf-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// RedactURLs is a client's NATS server list (comma-separated URLs, as
// nats.Connect takes it) fit for an error message: a password or token in
// any URL is hidden.
func RedactURLs(servers string) string {
	parts := strings.Split(servers, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		switch {
		case err != nil:
			parts[i] = "(a URL that does not parse)"
		case u.User != nil:
			if _, has := u.User.Password(); has {
				parts[i] = u.Redacted()
			} else {
				// nats://TOKEN@host: the user part is the token.
				u.User = url.User("xxxxx")
				parts[i] = u.String()
			}
		}
	}
	return strings.Join(parts, ",")
}
