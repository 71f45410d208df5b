package provision_test

import (
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"n8nbrain/internal/testdb"
	"n8nbrain/provision"
)

func TestScramVerifierFormat(t *testing.T) {
	for _, iterations := range []int{provision.GeneratedPasswordIterations, provision.ChosenPasswordIterations} {
		v, err := provision.ScramVerifier("correct horse battery staple", iterations)
		if err != nil {
			t.Fatal(err)
		}
		head, _, _ := strings.Cut(v, ":")
		if want := "SCRAM-SHA-256$" + strconv.Itoa(iterations); head != want {
			t.Errorf("verifier %q starts %q, want %q", v, head, want)
		}
	}
	for _, bad := range []struct {
		password   string
		iterations int
	}{{"", 1}, {"pässword", 1}, {"password", 0}} {
		if _, err := provision.ScramVerifier(bad.password, bad.iterations); err == nil {
			t.Errorf("ScramVerifier(%q, %d): no error", bad.password, bad.iterations)
		}
	}
}

// A tenant's generated password is written with one SCRAM iteration: the
// role logs in with it, and refuses a password one character off and the
// password of another tenant.
func TestTenantLoginWithItsGeneratedPasswordOnly(t *testing.T) {
	t.Parallel()
	ops, _ := newOps(t)
	a := createTenant(t, ops, "tenant-a")
	b := createTenant(t, ops, "tenant-b")
	if n := len(a.AppPassword); n != 43 { // 32 bytes, base64url unpadded
		t.Fatalf("generated password is %d characters, want 43 (32 random bytes)", n)
	}
	conn := mustConnect(t, a.AppURL, "")
	conn.Close(t.Context())
	if got := announcedIterations(t, a.AppURL); got != 1 {
		t.Fatalf("the server announces %d SCRAM iterations for %s, want 1", got, a.AppRole)
	}

	off := []byte(a.AppPassword)
	off[len(off)-1] ^= 1 // another printable character
	for name, pw := range map[string]string{"one character off": string(off), "tenant b's": b.AppPassword} {
		_, err := connect(t, withPassword(t, a.AppURL, pw), "")
		if err == nil {
			t.Fatalf("%s logged in with %s password", a.AppRole, name)
		}
		if got := sqlState(err); got != "28P01" { // invalid_password
			t.Fatalf("%s with %s password: %v (SQLSTATE %s), want 28P01", a.AppRole, name, err, got)
		}
	}
}

// announcedIterations starts a SCRAM-SHA-256 login as rawURL's user and
// returns the iteration count the server's first message announces: what
// the role's stored verifier holds, read without any privilege.
func announcedIterations(t *testing.T, rawURL string) int {
	t.Helper()
	cc, err := pgx.ParseConfig(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.DialTimeout("tcp", net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	fe := pgproto3.NewFrontend(nc, nc)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters: map[string]string{"user": cc.User, "database": cc.Database}})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	msg, err := fe.Receive()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := msg.(*pgproto3.AuthenticationSASL); !ok {
		t.Fatalf("server asked for %T, want SASL (SCRAM-SHA-256)", msg)
	}
	fe.Send(&pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256", Data: []byte("n,,n=,r=announcedIterationsProbe")})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	if msg, err = fe.Receive(); err != nil {
		t.Fatal(err)
	}
	cont, ok := msg.(*pgproto3.AuthenticationSASLContinue)
	if !ok {
		t.Fatalf("server answered %T, want its SCRAM first message", msg)
	}
	for field := range strings.SplitSeq(string(cont.Data), ",") {
		if v, ok := strings.CutPrefix(field, "i="); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("server-first-message %q: %v", cont.Data, err)
			}
			return n
		}
	}
	t.Fatalf("server-first-message %q has no iteration count", cont.Data)
	return 0
}

func withPassword(t *testing.T, rawURL, password string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String()
}

// BenchmarkTenantLogin: what a new connection to a tenant's database costs
// the client (the brain) with the verifier written at Postgres' default
// 4096 SCRAM iterations against the one a generated password gets, in one
// run: the time of a connect and close (ns/op), and the client process's
// CPU.
//
//	go test -run '^$' -bench TenantLogin ./provision/
func BenchmarkTenantLogin(b *testing.B) {
	ops, _ := newOps(b)
	tn, err := ops.CreateTenant(b.Context(), validSpec(b, "tenant-login"))
	if err != nil {
		b.Fatal(err)
	}
	admin, err := pgx.Connect(b.Context(), testdb.AdminURL(b))
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(b.Context())
	cc, err := pgx.ParseConfig(tn.AppURL)
	if err != nil {
		b.Fatal(err)
	}
	for _, iterations := range []int{provision.ChosenPasswordIterations, provision.GeneratedPasswordIterations} {
		b.Run("scram_"+strconv.Itoa(iterations), func(b *testing.B) {
			v, err := provision.ScramVerifier(tn.AppPassword, iterations)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := admin.Exec(b.Context(), "ALTER ROLE "+pgx.Identifier{tn.AppRole}.Sanitize()+" PASSWORD '"+v+"'"); err != nil {
				b.Fatal(err)
			}
			cpu0 := cpuSelf()
			for b.Loop() {
				conn, err := pgx.ConnectConfig(b.Context(), cc)
				if err != nil {
					b.Fatal(err)
				}
				conn.Close(b.Context())
			}
			b.ReportMetric(float64((cpuSelf()-cpu0).Microseconds())/float64(b.N), "client_cpu_us")
		})
	}
}

func cpuSelf() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The URLs written for runtime roles reach the cluster with the TLS the
// operator's admin connection asks for, not a fixed sslmode=disable, read
// as libpq reads it. Not parallel: it sets PGSSLMODE and PGSSLROOTCERT.
func TestRuntimeURLsKeepTheAdminTLS(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	t.Setenv("PGSSLROOTCERT", "")
	for _, tc := range []struct{ env, admin, want string }{
		{"", "postgres://ops:pw@db.example:5432/postgres?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
			"sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem"},
		{"", "postgresql://ops:pw@127.0.0.1/postgres?sslmode=disable", "sslmode=disable"},
		{"", "postgres://ops:pw@db.example/postgres", "sslmode=prefer"},
		{"", "host=db.example user=ops sslmode=require", "sslmode=require"},
		{"", "host=db.example sslmode = verify-full  sslrootcert='/etc/my ca\\'s.pem' user=ops",
			"sslmode=verify-full&sslrootcert=%2Fetc%2Fmy+ca%27s.pem"},
		{"", `host=db.example password='it''s' sslmode=disable`, "sslmode=prefer"}, // libpq refuses it: names nothing
		{"", "host=db.example password='unterminated sslmode=disable", "sslmode=prefer"},
		{"", "host=db.example user=ops", "sslmode=prefer"},
		// What the string does not name, libpq takes from the environment.
		{"verify-full", "host=db.example user=ops", "sslmode=verify-full&sslrootcert=%2Fenv%2Fca.pem"},
		{"verify-full", "postgres://ops@db.example/postgres", "sslmode=verify-full&sslrootcert=%2Fenv%2Fca.pem"},
		{"verify-full", "postgres://ops@db.example/postgres?sslmode=disable", "sslmode=disable&sslrootcert=%2Fenv%2Fca.pem"},
	} {
		if tc.env != "" {
			t.Setenv("PGSSLMODE", tc.env)
			t.Setenv("PGSSLROOTCERT", "/env/ca.pem")
		} else {
			t.Setenv("PGSSLMODE", "")
			t.Setenv("PGSSLROOTCERT", "")
		}
		if got := provision.RuntimeTLS(tc.admin); got != tc.want {
			t.Errorf("admin %s: runtime URLs get %q, want %q", tc.admin, got, tc.want)
		}
	}
}
