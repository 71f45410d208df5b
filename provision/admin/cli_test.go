package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"n8nbrain/registry"
)

type registryRule = registry.Rule

func run(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Main(context.Background(), args, Env{Getenv: func(k string) string { return env[k] }, Stdout: &out, Stderr: &errOut})
	return code, out.String(), errOut.String()
}

// TestMainReportsWhatIsMissing: without a database these fail before
// connecting, each naming the flag (and its variable) to set.
func TestMainReportsWhatIsMissing(t *testing.T) {
	t.Parallel()
	acc := "ABJ2J4QH2RZ32ZH56AIKDPHGF5WWYR3LNWWDC2AK2Y7KDR3IP7BA3AMZ"
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		want string
	}{
		{"UnknownCommand", nil, []string{"tenant", "frobnicate"}, ExitUsage, "unexpected argument frobnicate"},
		{"BadDuration", nil, []string{"tenant", "update", "acme", "--approval-ttl", "soon"}, ExitUsage, "--approval-ttl"},
		{"BadSize", nil, []string{"tenant", "update", "acme", "--quota-bytes", "lots"}, ExitUsage, "not a size"},
		{"BadSizeFromEnv", map[string]string{"BRAINCTL_STREAM_REPLICAS": "three"}, []string{"tenant", "list"}, ExitUsage, "--stream-replicas"},
		{"NoAdminURL", nil, []string{"tenant", "list"}, ExitError, "--admin-url: the registry cluster's admin URL is required (--admin-url or BRAINCTL_ADMIN_URL)"},
		{"NotAnAccount", nil, []string{"tenant", "create", "acme", "--account", "nope"}, ExitUsage, "tenant acme: --account: \"nope\" is not an account public key"},
		{"NoOperatorKeys", nil, []string{"tenant", "create", "acme", "--account", acc}, ExitError, "tenant acme: --brain-account"},
		{"NoSealingKey", map[string]string{"BRAINCTL_ADMIN_URL": "postgres://x@127.0.0.1:1/postgres"}, []string{"seal-key", "check"}, ExitError, "--sealing-key: the sealing key is required"},
		{"BadSealingKey", map[string]string{"BRAINCTL_ADMIN_URL": "postgres://x@127.0.0.1:1/postgres", "BRAIN_SEALING_KEY": "abc"},
			[]string{"seal-key", "check"}, ExitError, "--sealing-key: sealing key must be 64 hex characters (BRAIN_SEALING_KEY)"},
		{"SealingKeyAndFile", map[string]string{"BRAINCTL_ADMIN_URL": "postgres://x@127.0.0.1:1/postgres",
			"BRAIN_SEALING_KEY": strings.Repeat("ab", 32), "BRAIN_SEALING_KEY_FILE": "/nonexistent/new.key"},
			[]string{"seal-key", "check"}, ExitError, "both --sealing-key (BRAIN_SEALING_KEY) and --sealing-key-file (BRAIN_SEALING_KEY_FILE) are set"},
		{"BadCluster", map[string]string{"BRAINCTL_ADMIN_URL": "postgres://x@127.0.0.1:1/postgres", "BRAINCTL_CLUSTERS": "db2=postgres://a:secret@db2/postgres"},
			[]string{"migrate", "--skip-streams"}, ExitError, "--cluster: \"db2=postgres://a:xxxxx@db2/postgres\" must be HOST:PORT=ADMIN_URL"},
		{"NoEmail", nil, []string{"rules", "test", "acme"}, ExitUsage, "tenant acme: --email"},
		{"NoReaderPassword", nil, []string{"registry", "init"}, ExitUsage, "--reader-password"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out, errOut := run(t, tc.env, tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d (want %d)\nstderr: %s\nstdout: %s\nwant %q", code, tc.code, errOut, out, tc.want)
			}
			if strings.Contains(errOut, "secret") {
				t.Fatalf("a password reached the output: %s", errOut)
			}
		})
	}
}

// TestJSONErrors: with --json a failure is one JSON object on stdout.
func TestJSONErrors(t *testing.T) {
	t.Parallel()
	code, out, errOut := run(t, nil, "tenant", "create", "acme", "--account", "ABJ2J4QH2RZ32ZH56AIKDPHGF5WWYR3LNWWDC2AK2Y7KDR3IP7BA3AMZ", "--json")
	var got struct{ Error *Error }
	if code != ExitError || errOut != "" || json.Unmarshal([]byte(out), &got) != nil || got.Error == nil ||
		got.Error.Tenant != "acme" || got.Error.Field != "--brain-account" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestSealKeyNew prints a key the brain accepts.
func TestSealKeyNew(t *testing.T) {
	t.Parallel()
	code, out, _ := run(t, nil, "seal-key", "new")
	if _, err := registry.ParseKey(out); code != ExitOK || err != nil {
		t.Fatalf("exit %d, %q: %v", code, out, err)
	}
}

func TestByteSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{"1048576": 1 << 20, "64MiB": 64 << 20, "2 GiB": 2 << 30, "1TiB": 1 << 40, "512KiB": 512 << 10} {
		var b byteSize
		if err := b.UnmarshalText([]byte(in)); err != nil || int64(b) != want {
			t.Errorf("%q: %d %v, want %d", in, b, err, want)
		}
	}
	for _, bad := range []string{"", "MiB", "-1", "1.5GiB", "64MB", "99999999999TiB"} {
		var b byteSize
		if err := b.UnmarshalText([]byte(bad)); err == nil {
			t.Errorf("%q accepted as %d", bad, b)
		}
	}
}

// TestRedactPassword: registry init's printed URL never carries the
// reader's password, whatever characters it has (the URL escapes some).
func TestRedactPassword(t *testing.T) {
	t.Parallel()
	for _, pw := range []string{"reader-password-0123", "A/b+c==", "p@ss:w#rd?%", "with space"} {
		raw := (&url.URL{Scheme: "postgres", User: url.UserPassword("brain_registry_reader", pw), Host: "db:5432",
			Path: "/brain_registry", RawQuery: "sslmode=verify-full"}).String()
		got := redactPassword(raw)
		if strings.Contains(got, pw) || strings.Contains(got, url.QueryEscape(pw)) || strings.Contains(got, url.PathEscape(pw)) ||
			strings.Contains(got, strings.TrimPrefix(strings.TrimSuffix(raw, "@db:5432/brain_registry?sslmode=verify-full"), "postgres://brain_registry_reader:")) {
			t.Errorf("password %q: printed %s", pw, got)
		}
		if want := "postgres://brain_registry_reader:REDACTED@db:5432/brain_registry?sslmode=verify-full"; got != want {
			t.Errorf("password %q: printed %s, want %s", pw, got, want)
		}
	}
	// Nothing to hide: the URL as it is.
	if got := redactPassword("postgres://db:5432/brain_registry"); got != "postgres://db:5432/brain_registry" {
		t.Errorf("a URL without a password: printed %s", got)
	}
}
