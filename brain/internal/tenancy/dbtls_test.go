package tenancy

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"n8nbrain/internal/testdb"
	"n8nbrain/registry"
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
	for _, tc := range []struct{ mode, rootCert, want string }{
		{"on", "", `sslmode "on" is not one of disable, allow, prefer, require, verify-ca, verify-full`},
		{"verify-full", "/nonexistent/ca.crt", "/nonexistent/ca.crt"},
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := newTestDirectory(t, tc.cfg)
			ctx := context.Background()
			pool, release, err := d.Lease(ctx, tc.server(d))
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
