package testdb

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"n8nbrain/deploy/localpg"
)

// PrivateCluster starts a Postgres cluster of the test's own on a free
// port, and stops and removes it when the test ends. It initialises a new
// cluster (seconds), so only tests about a second server use it.
func PrivateCluster(t testing.TB) *localpg.Instance {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: skipping a test that initialises a Postgres cluster of its own")
	}
	root := ServerDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	inst, err := localpg.Ensure(ctx, localpg.Config{Dir: filepath.Join(root, "pg"), Port: FreePort(t)})
	if err != nil {
		t.Fatalf("start a private Postgres cluster: %v", err)
	}
	t.Cleanup(func() { // before ServerDir's removal: cleanups run last first
		if err := inst.Stop(context.Background()); err != nil {
			t.Errorf("stop the private Postgres cluster: %v", err)
		}
	})
	return inst
}

// ServerDir is a temporary folder the Postgres server's OS user can reach
// (t.TempDir's are the test user's alone), removed when the test ends: the
// root of a cluster a test starts itself.
func ServerDir(t testing.TB) string {
	t.Helper()
	root, err := os.MkdirTemp("", "brain-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

// FreePort is a TCP port on 127.0.0.1 that was free when asked.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TLSCluster is PrivateCluster serving TLS (ssl = on) with a certificate
// for 127.0.0.1 and localhost, signed by a CA made for the test; CAFile is
// that CA's certificate (PEM). Plain connections are still accepted.
func TLSCluster(t testing.TB) (inst *localpg.Instance, caFile string) {
	t.Helper()
	inst = PrivateCluster(t)
	ca, caKey := newCA(t, "brain test CA")
	dir := t.TempDir()
	caFile = filepath.Join(dir, "ca.crt")
	writePEM(t, caFile, "CERTIFICATE", ca.Raw, 0o644)

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	// The server reads its key only when it is its own OS user's, 0600.
	data := filepath.Join(inst.Dir, "data")
	st, err := os.Stat(data)
	if err != nil {
		t.Fatal(err)
	}
	owner := st.Sys().(*syscall.Stat_t)
	for name, b := range map[string][]byte{
		"server.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"server.key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	} {
		p := filepath.Join(data, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, int(owner.Uid), int(owner.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, inst.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, q := range []string{`ALTER SYSTEM SET ssl = on`, `SELECT pg_reload_conf()`} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("turn TLS on: %s: %v", q, err)
		}
	}
	// The reload is asynchronous: wait until a TLS connection is accepted.
	cfg, err := pgx.ParseConfig(inst.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	tlsURL := "host=127.0.0.1 port=" + strconv.Itoa(inst.Port) + " sslmode=verify-full sslrootcert=" + caFile
	tc, err := pgx.ParseConfig(tlsURL)
	if err != nil {
		t.Fatal(err)
	}
	tc.User, tc.Password, tc.Database = cfg.User, cfg.Password, "postgres"
	for deadline := time.Now().Add(15 * time.Second); ; {
		c, err := pgx.ConnectConfig(ctx, tc)
		if err == nil {
			c.Close(ctx)
			return inst, caFile
		}
		if time.Now().After(deadline) {
			t.Fatalf("the private cluster does not accept TLS connections after ssl = on: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// NewCAFile writes the certificate of a CA made for the test, which signed
// nothing: a client that trusts only it must refuse every server.
func NewCAFile(t testing.TB) string {
	t.Helper()
	ca, _ := newCA(t, "unrelated test CA")
	p := filepath.Join(t.TempDir(), "other-ca.crt")
	writePEM(t, p, "CERTIFICATE", ca.Raw, 0o644)
	return p
}

func newCA(t testing.TB, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return ca, key
}

func writePEM(t testing.TB, path, typ string, der []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
		t.Fatal(err)
	}
}
