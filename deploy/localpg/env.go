package localpg

import "os"

// LibpqEnv are the environment variables libpq, and pgx after it, read
// into every connection string that does not name the setting itself.
var LibpqEnv = []string{
	"PGHOST", "PGPORT", "PGDATABASE", "PGUSER", "PGPASSWORD", "PGPASSFILE", "PGAPPNAME",
	"PGCONNECT_TIMEOUT", "PGSSLMODE", "PGSSLKEY", "PGSSLCERT", "PGSSLCERTMODE", "PGSSLSNI",
	"PGSSLROOTCERT", "PGSSLPASSWORD", "PGSSLNEGOTIATION", "PGTARGETSESSIONATTRS", "PGSERVICE",
	"PGSERVICEFILE", "PGTZ", "PGOPTIONS", "PGMINPROTOCOLVERSION", "PGMAXPROTOCOLVERSION",
	"PGCHANNELBINDING", "PGREQUIREAUTH",
}

// IgnoreLibpqEnv unsets LibpqEnv in this process and returns the names of
// those that were set. The dev stack's cluster is its own and so are the
// URLs it builds: a PGSSLROOTCERT or PGSERVICE the operator keeps for psql
// must not reach them.
func IgnoreLibpqEnv() []string {
	var set []string
	for _, k := range LibpqEnv {
		if _, ok := os.LookupEnv(k); ok {
			set = append(set, k)
			os.Unsetenv(k)
		}
	}
	return set
}
