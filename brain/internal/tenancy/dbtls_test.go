package tenancy

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"n8nbrain/internal/testdb"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// Every attempt a tenant pool makes is to the tenant's own server, in the
// order its sslmode says. The pools once parsed "sslmode=prefer" alone and
// then set the host: the parser had resolved the default host, a local
// socket folder, so no attempt used TLS; and where no such folder exists,
// the plain fallback went to localhost:5432 with the tenant's credentials.
func TestTenantPoolsConnectOnlyToTheTenantServer(t *testing.T) {
	t.Parallel()
	type attempt struct {
		host string
		port uint16
		tls  bool
	}
	const host, port = "db.tenant.example", 6543
	for mode, want := range map[string][]bool{
		"disable":     {false},
		"allow":       {false, true},
		"prefer":      {true, false},
		"require":     {true},
		"verify-ca":   {true},
		"verify-full": {true},
	} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			d, _ := newTestDirectory(t, Config{SSLMode: mode})
			tn := &registry.Tenant{ID: "acme", DB: registry.DBConfig{Host: host, Port: port, Name: "acme", User: "acme",
				PasswordSealed: d.cfg.Sealer.Seal("acme", []byte("pw"))}}
			pool, err := d.newPool(context.Background(), tn)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			cc := pool.Config().ConnConfig
			got := []attempt{{cc.Host, cc.Port, cc.TLSConfig != nil}}
			for _, f := range cc.Fallbacks {
				got = append(got, attempt{f.Host, f.Port, f.TLSConfig != nil})
			}
			if len(got) != len(want) {
				t.Fatalf("attempts %+v, want %d, TLS %v", got, len(want), want)
			}
			for i, a := range got {
				if a != (attempt{host, port, want[i]}) {
					t.Errorf("attempt %d is %+v, want %s:%d with TLS %v", i+1, a, host, port, want[i])
				}
			}
			if mode == "verify-full" && cc.TLSConfig != nil && (cc.TLSConfig.InsecureSkipVerify || cc.TLSConfig.ServerName != host) {
				t.Errorf("verify-full checks the certificate of %q (skip verification %v), want %q",
					cc.TLSConfig.ServerName, cc.TLSConfig.InsecureSkipVerify, host)
			}
		})
	}
}

// A setting the pools could not use is refused when the directory opens,
// with what was wrong, not at every tenant's first turn.
func TestTLSSettingsAreCheckedAtOpen(t *testing.T) {
	t.Parallel()
	garbage := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ mode, rootCert, want string }{
		{"on", "", `sslmode "on" is not one of disable, allow, prefer, require, verify-ca, verify-full`},
		{"verify-full", "/nonexistent/ca.crt", "root certificates: open /nonexistent/ca.crt: no such file or directory"},
		{"verify-full", garbage, "root certificates " + garbage + ": no PEM certificate in it"},
	} {
		err := checkTLS(tc.mode, tc.rootCert)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("sslmode %s, root %q: %v; want an error saying %q", tc.mode, tc.rootCert, err, tc.want)
		}
	}
	if err := checkTLS(DefaultSSLMode, ""); err != nil {
		t.Errorf("the default: %v", err)
	}
}

// The TLS a tenant's session really has, read from the server
// (pg_stat_ssl), for each sslmode against a server with TLS and one
// without, and a server whose certificate the replica must not trust.
func TestTenantConnectionsUseTLSAsConfigured(t *testing.T) {
	t.Parallel()
	tlsServer, caFile := testdb.TLSCluster(t)
	withTLS := tenantOn(t, tlsServer.AdminURL())
	plain := tenantOn(t, testdb.AdminURL(t))
	otherCA := testdb.NewCAFile(t)

	for _, tc := range []struct {
		name     string
		cfg      Config
		server   func(d *Directory) *registry.Tenant
		wantTLS  bool
		wantFail string // part of the error, when the connection must fail
	}{
		{"prefer, server with TLS", Config{}, withTLS, true, ""},
		{"prefer, server without TLS: plain, to the same server", Config{}, plain, false, ""},
		{"disable", Config{SSLMode: "disable"}, withTLS, false, ""},
		{"require, server with TLS", Config{SSLMode: "require"}, withTLS, true, ""},
		{"require, server without TLS", Config{SSLMode: "require"}, plain, false, "server refused TLS connection"},
		{"verify-full, the server's CA", Config{SSLMode: "verify-full", SSLRootCert: caFile}, withTLS, true, ""},
		{"verify-full, another CA", Config{SSLMode: "verify-full", SSLRootCert: otherCA}, withTLS, false, "certificate signed by unknown authority"},
		{"verify-ca, another CA", Config{SSLMode: "verify-ca", SSLRootCert: otherCA}, withTLS, false, "certificate signed by unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := newTestDirectory(t, tc.cfg)
			ctx := context.Background()
			tn := tc.server(d)
			pool, release, err := d.Lease(ctx, tn)
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			var ssl bool
			err = pool.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl)
			if tc.wantFail != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantFail) {
					t.Fatalf("connected (TLS %v, error %v); want a refusal saying %q", ssl, err, tc.wantFail)
				}
				// A refusal retrying does not mend: answered at once, and
				// the tenant named as a problem.
				var le *LoginError
				if !errors.As(d.Check(tn, err), &le) || !le.TLS {
					t.Fatalf("Check(%v) = %v, want a TLS LoginError", err, d.Check(tn, err))
				}
				if e := wire.ErrorOf(le); e.Reason != wire.ReasonTenantDatabaseTLS {
					t.Errorf("its wire error is %+v", e)
				}
				if p := d.LoginProblems(); len(p) != 1 || p[0].Tenant != tn.ID || !p[0].TLS {
					t.Errorf("login problems %+v, want the tenant, for TLS", p)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ssl != tc.wantTLS {
				t.Fatalf("the session's TLS is %v, want %v", ssl, tc.wantTLS)
			}
		})
	}
}

// tenantOn creates a tenant database and login role on the cluster of
// adminURL and returns, for a directory, the tenant with that database
// (its password sealed with the directory's sealer).
func tenantOn(t *testing.T, adminURL string) func(d *Directory) *registry.Tenant {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatal(err)
	}
	name := "tls_" + uniqueName(t)
	const password = "tenant-tls-password"
	for _, q := range []string{
		`CREATE ROLE ` + name + ` LOGIN PASSWORD '` + password + `'`,
		`CREATE DATABASE ` + name + ` OWNER ` + name,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		for _, q := range []string{`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`, `DROP ROLE IF EXISTS ` + name} {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
		admin.Close(ctx)
	})
	cc := admin.Config()
	return func(d *Directory) *registry.Tenant {
		id := registry.TenantID(name)
		return &registry.Tenant{ID: id, DB: registry.DBConfig{Host: cc.Host, Port: int(cc.Port), Name: name, User: name,
			PasswordSealed: d.cfg.Sealer.Seal(id, []byte(password))}}
	}
}

// uniqueName is unique to this run: the databases and roles a test creates
// on the shared cluster must not meet another run's.
func uniqueName(t *testing.T) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", b)
}

// A server that answers the TLS request with "no" refuses for good when
// TLS is required; under prefer the plain attempt that follows decides (cut
// here, so retried). One that cuts the connection during the request may be
// restarting, and is retried. None is Postgres: each is a socket that reads
// the request and does one thing.
func TestTLSRefusalIsToldFromACutConnection(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		answer  []byte // nil: close the connection
		mode    string
		refusal bool
	}{
		{"refused, require", []byte("N"), "require", true},
		{"refused, prefer, then the plain attempt cut", []byte("N"), "prefer", false},
		{"cut, require", nil, "require", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					req := make([]byte, 8) // length and the SSLRequest code
					if _, err := io.ReadFull(c, req); err == nil && tc.answer != nil {
						c.Write(tc.answer)
					}
					c.Close()
				}
			}()
			d, _ := newTestDirectory(t, Config{SSLMode: tc.mode})
			port := ln.Addr().(*net.TCPAddr).Port
			tn := &registry.Tenant{ID: "acme", DB: registry.DBConfig{Host: "127.0.0.1", Port: port, Name: "acme", User: "acme",
				PasswordSealed: d.cfg.Sealer.Seal("acme", []byte("pw"))}}
			pool, release, err := d.Lease(context.Background(), tn)
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			err = pool.Ping(context.Background())
			if err == nil {
				t.Fatal("connected to a socket that is not Postgres")
			}
			var le *LoginError
			if got := errors.As(d.Check(tn, err), &le); got != tc.refusal {
				t.Fatalf("%v: taken for a refusal %v, want %v", err, got, tc.refusal)
			}
		})
	}
}

// A tenant's connection is what the brain's settings say, whatever the
// libpq variables of the brain's own environment say: they are for the
// operator's tools (psql, brainctl's admin URL), and the parser reads them
// into every connection string it parses. Not parallel: it sets them.
func TestTenantConnectionsIgnoreTheEnvironment(t *testing.T) {
	tenant := tenantOn(t, testdb.AdminURL(t))
	for k, v := range map[string]string{
		"PGSSLROOTCERT":        "/nonexistent/root.crt",
		"PGSSLCERT":            "/nonexistent/client.crt",
		"PGSSLKEY":             "/nonexistent/client.key",
		"PGSSLNEGOTIATION":     "direct",
		"PGTARGETSESSIONATTRS": "standby",
		"PGCHANNELBINDING":     "require",
		"PGREQUIREAUTH":        "md5",
		"PGMINPROTOCOLVERSION": "3.2",
		"PGOPTIONS":            "-c statement_timeout=1",
		"PGTZ":                 "Pacific/Chatham",
		"PGAPPNAME":            "not-the-brain",
	} {
		t.Setenv(k, v)
	}
	if err := checkTLS(DefaultSSLMode, ""); err != nil {
		t.Fatalf("the default settings are refused: %v", err)
	}
	d, _ := newTestDirectory(t, Config{})
	ctx := context.Background()
	pool, release, err := d.Lease(ctx, tenant(d))
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	var timeout, zone, app string
	if err := pool.QueryRow(ctx, `SELECT current_setting('statement_timeout'), current_setting('TimeZone'),
		current_setting('application_name')`).Scan(&timeout, &zone, &app); err != nil {
		t.Fatalf("a tenant connection under the operator's libpq variables: %v", err)
	}
	if timeout != "10s" || zone == "Pacific/Chatham" || app != "brain" {
		t.Errorf("session statement_timeout %s, TimeZone %s, application_name %s; want 10s, the server's zone, brain",
			timeout, zone, app)
	}

	// A service no file holds cannot be pinned away; it is refused when
	// the directory opens, saying so.
	t.Setenv("PGSERVICE", "no-such-service")
	if err := checkTLS(DefaultSSLMode, ""); err == nil || !strings.Contains(err.Error(), "service") {
		t.Errorf("PGSERVICE naming no service: %v, want a refusal naming the service", err)
	}
}
