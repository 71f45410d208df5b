package tenancy

import (
	"crypto/x509"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// SSLModes are the values of Config.SSLMode: libpq's sslmode, with its
// meaning. prefer tries TLS and falls back to a plain connection to the
// same server; require refuses a server without TLS; verify-ca and
// verify-full also check the server's certificate against SSLRootCert (the
// system's roots without it), and verify-full its name (the registry's
// db_host).
var SSLModes = []string{"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}

// DefaultSSLMode is libpq's default.
const DefaultSSLMode = "prefer"

// checkTLS reports a TLS setting the pools could not use, before any
// tenant connects (an unreadable root certificate would otherwise fail
// every tenant's first turn).
func checkTLS(mode, rootCert string) error {
	if !slices.Contains(SSLModes, mode) {
		return fmt.Errorf("tenant database sslmode %q is not one of %s", mode, strings.Join(SSLModes, ", "))
	}
	if rootCert != "" {
		pem, err := os.ReadFile(rootCert)
		if err != nil {
			return fmt.Errorf("tenant database root certificates: %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return fmt.Errorf("tenant database root certificates %s: no PEM certificate in it", rootCert)
		}
	}
	// What the environment can still break (PGSERVICE naming a service no
	// file holds) breaks here, not at every tenant's first turn.
	_, err := poolConfig("localhost", 5432, mode, rootCert)
	return err
}

// poolConfig is the pool configuration of a tenant's server: its host and
// port go through the connection string, with the TLS settings, so that
// every attempt pgx makes (prefer: TLS, then plain) is to that server.
// Setting Host and Port on a parsed configuration afterwards would leave
// the fallback attempts at the parser's default host, a local socket or
// localhost:5432, and without TLS.
//
// Every other setting the parser would take from the brain's environment
// (PGSSLROOTCERT, PGSSLCERT, PGTARGETSESSIONATTRS, PGOPTIONS, …) or its
// home folder (~/.postgresql/root.crt) is pinned too, so that tenant
// connections are what the brain's own settings say: no client
// certificate, the system's roots unless rootCert, any server that takes
// the login. The session parameters are the brain's alone (newPool).
func poolConfig(host string, port int, mode, rootCert string) (*pgxpool.Config, error) {
	conn := "host=" + connValue(host) + " port=" + strconv.Itoa(port) + " sslmode=" + connValue(mode) +
		" sslrootcert=" + connValue(rootCert) + pinnedSettings
	pc, err := pgxpool.ParseConfig(conn)
	if err != nil {
		return nil, fmt.Errorf("tenant database connection settings (sslmode %s): %w", mode, err)
	}
	pc.ConnConfig.RuntimeParams = map[string]string{}
	return pc, nil
}

// pinnedSettings are libpq's defaults for the connection settings the
// brain has none of its own for.
const pinnedSettings = " sslcertmode=disable sslcert='' sslkey='' sslpassword='' sslsni=1 sslnegotiation=postgres" +
	" target_session_attrs=any channel_binding=prefer require_auth='' min_protocol_version=3.0 max_protocol_version=3.0"

// connValue quotes a keyword/value connection string value.
func connValue(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}
