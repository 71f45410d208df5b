package provision

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"n8nbrain/migrations"
	"n8nbrain/registry"
)

// Ops provisions one cluster. Its zero-valued fields take defaults; it holds
// no connections, so one Ops may be used from many goroutines.
type Ops struct {
	// AdminURL is the bootstrap role's URL: a superuser, or a role with
	// CREATEDB and CREATEROLE. Used at ops time only, never at run time.
	AdminURL string
	// Host is how runtime roles reach the cluster, written into registry
	// rows and returned URLs; default 127.0.0.1.
	Host string
	// Port goes with Host; default the port of AdminURL.
	Port int
	// RegistryDB names the registry database; default "brain_registry".
	RegistryDB string
	// Sealer seals tenant passwords for the registry.
	Sealer *registry.Sealer
	// Reserved are the public keys of the operator's BRAIN, STREAMS and
	// system accounts. CreateTenant requires them and refuses each as a
	// tenant's NATS account (ReservedAccounts says why).
	Reserved ReservedAccounts
	// Prefix is prepended to every role and database name this Ops creates:
	// "" in production; tests pass a short random one ("t1a2b_") so parallel
	// tests in one cluster never collide. Lowercase letters, digits and _.
	Prefix string
}

// DefaultRegistryDB is the registry database's name without a prefix.
const DefaultRegistryDB = "brain_registry"

var prefixRe = regexp.MustCompile(`^[a-z0-9_]{0,16}$`)

// cluster is an Ops with its defaults applied and its names worked out.
type cluster struct {
	admin          *pgx.ConnConfig
	host           string
	port           int
	prefix         string
	registryDB     string
	registryOwner  string
	registryReader string
	sealer         *registry.Sealer
	// tls is the TLS part of the runtime roles' URLs (runtimeTLS).
	tls string
}

// runtimeTLS is the query of the URLs written for runtime roles (the
// registry reader's BRAIN_REGISTRY_URL, a tenant's app URL): the admin
// connection's sslmode and sslrootcert, as the operator reaches that
// cluster, read as libpq reads them: from the URL or keyword/value string,
// else from PGSSLMODE and PGSSLROOTCERT; else libpq's default, prefer.
func runtimeTLS(adminURL string) string {
	settings := connSettings(adminURL)
	mode, root := settings["sslmode"], settings["sslrootcert"]
	if mode == "" {
		mode = os.Getenv("PGSSLMODE")
	}
	if root == "" {
		root = os.Getenv("PGSSLROOTCERT")
	}
	out := url.Values{"sslmode": {"prefer"}}
	if mode != "" {
		out.Set("sslmode", mode)
	}
	if root != "" {
		out.Set("sslrootcert", root)
	}
	return out.Encode()
}

// connSpace is what separates keyword/value pairs.
const connSpace = " \t\n\r\f\v"

// connSettings are the settings a libpq connection string names: the query
// of a postgres:// URL, or the pairs of a keyword/value string (values
// bare or in single quotes, backslash escaping the next character). A
// string that is neither names none.
func connSettings(conn string) map[string]string {
	if strings.HasPrefix(conn, "postgres://") || strings.HasPrefix(conn, "postgresql://") {
		out := map[string]string{}
		if u, err := url.Parse(conn); err == nil {
			for k, v := range u.Query() {
				out[k] = v[0]
			}
		}
		return out
	}
	out := map[string]string{}
	s := conn
	for {
		s = strings.TrimLeft(s, connSpace)
		if s == "" {
			return out
		}
		end := strings.IndexAny(s, "="+connSpace)
		if end <= 0 {
			return map[string]string{}
		}
		key := s[:end]
		s = strings.TrimLeft(s[end:], connSpace)
		if !strings.HasPrefix(s, "=") {
			return map[string]string{} // a name without "=": libpq refuses it
		}
		s = strings.TrimLeft(s[1:], connSpace)
		var val strings.Builder
		quoted := strings.HasPrefix(s, "'")
		if quoted {
			s = s[1:]
		}
		i := 0
		for ; i < len(s); i++ {
			c := s[i]
			if c == '\\' && i+1 < len(s) {
				i++
				val.WriteByte(s[i])
				continue
			}
			if quoted && c == '\'' {
				break
			}
			if !quoted && strings.IndexByte(connSpace, c) >= 0 {
				break
			}
			val.WriteByte(c)
		}
		if quoted {
			if i == len(s) {
				return map[string]string{} // unterminated quote: libpq refuses it too
			}
			i++
		}
		out[key] = val.String()
		s = s[i:]
	}
}

func (o *Ops) cluster() (*cluster, error) {
	if o.AdminURL == "" {
		return nil, errors.New("provision: Ops.AdminURL is required")
	}
	if !prefixRe.MatchString(o.Prefix) {
		return nil, fmt.Errorf("provision: prefix %q must be at most 16 lowercase letters, digits or _", o.Prefix)
	}
	admin, err := pgx.ParseConfig(o.AdminURL)
	if err != nil {
		// The parse error can quote the URL, password included.
		return nil, errors.New("provision: Ops.AdminURL is not a valid Postgres URL")
	}
	c := &cluster{admin: admin, host: o.Host, port: o.Port, prefix: o.Prefix, sealer: o.Sealer, tls: runtimeTLS(o.AdminURL)}
	if c.host == "" {
		c.host = "127.0.0.1"
	}
	if c.port == 0 {
		c.port = int(admin.Port)
	}
	db := o.RegistryDB
	if db == "" {
		db = DefaultRegistryDB
	}
	c.registryDB = o.Prefix + db
	c.registryOwner = o.Prefix + "brain_registry_owner"
	c.registryReader = o.Prefix + "brain_registry_reader"
	for _, n := range []struct{ kind, name string }{
		{"registry database", c.registryDB}, {"registry owner role", c.registryOwner}, {"registry reader role", c.registryReader},
	} {
		if err := checkIdentLen(n.kind, n.name); err != nil {
			return nil, fmt.Errorf("provision: %w", err)
		}
	}
	return c, nil
}

// connect opens an admin connection to a database ("" for the one in
// AdminURL, the maintenance database).
func (c *cluster) connect(ctx context.Context, db string) (*pgx.Conn, error) {
	cc := c.admin.Copy()
	if db != "" {
		cc.Database = db
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("connect to %s as %s: %w", cc.Database, cc.User, err)
	}
	return conn, nil
}

// url is a runtime role's URL.
func (c *cluster) url(user, password, db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(user, password),
		Host:     net.JoinHostPort(c.host, strconv.Itoa(c.port)),
		Path:     "/" + db,
		RawQuery: c.tls,
	}
	return u.String()
}

// lock takes a session advisory lock in conn's database, released when conn
// closes. All provisioning locks are taken in the maintenance database, so
// they serialise runs across processes for the whole cluster.
func lock(ctx context.Context, conn *pgx.Conn, name string) error {
	h := fnv.New64a()
	h.Write([]byte("n8nbrain/provision:" + name))
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(h.Sum64())); err != nil {
		return fmt.Errorf("lock %s: %w", name, err)
	}
	return nil
}

// BootstrapRegistry creates, or brings up to date, the registry database:
// owned by a NOLOGIN owner role, migrated as that owner, and readable (only)
// by the reader LOGIN role, whose password it sets. It returns the reader's
// URL. Running it again is safe and resets the reader's password.
func (o *Ops) BootstrapRegistry(ctx context.Context, readerPassword string) (readerURL string, err error) {
	return o.bootstrapRegistry(ctx, &readerPassword)
}

// bootstrapRegistry is BootstrapRegistry; a nil password leaves the reader's
// as it is (MigrateRegistry).
func (o *Ops) bootstrapRegistry(ctx context.Context, readerPassword *string) (readerURL string, err error) {
	c, err := o.cluster()
	if err != nil {
		return "", err
	}
	var pwClause string
	if readerPassword != nil {
		if pwClause, err = passwordClause(*readerPassword, chosenPasswordIterations); err != nil {
			return "", fmt.Errorf("provision: registry reader password: %w", err)
		}
	}
	admin, err := c.connect(ctx, "")
	if err != nil {
		return "", fmt.Errorf("bootstrap registry: %w", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if err := lock(ctx, admin, "registry:"+c.registryDB); err != nil {
		return "", fmt.Errorf("bootstrap registry: %w", err)
	}
	if err := ensureOwnerRole(ctx, admin, c.registryOwner); err != nil {
		return "", fmt.Errorf("bootstrap registry: %w", err)
	}
	if err := ensureLoginRole(ctx, admin, c.registryReader, pwClause, -1); err != nil {
		return "", fmt.Errorf("bootstrap registry: %w", err)
	}
	if err := ensureDatabase(ctx, admin, c.registryDB, c.registryOwner, c.registryReader); err != nil {
		return "", fmt.Errorf("bootstrap registry: %w", err)
	}

	db, err := c.connect(ctx, c.registryDB)
	if err != nil {
		return "", fmt.Errorf("bootstrap registry: %w", err)
	}
	defer db.Close(context.WithoutCancel(ctx))
	if _, err := hideCluster(ctx, db); err != nil {
		return "", fmt.Errorf("bootstrap registry: %w", err)
	}
	err = execAll(ctx, db,
		`ALTER ROLE `+ident(c.registryReader)+` RESET ALL`,
		`ALTER SCHEMA public OWNER TO `+ident(c.registryOwner),
		`REVOKE ALL ON SCHEMA public FROM PUBLIC`,
		`GRANT USAGE ON SCHEMA public TO `+ident(c.registryReader),
		`SET ROLE `+ident(c.registryOwner),
	)
	if err != nil {
		return "", fmt.Errorf("bootstrap registry: %w", err)
	}
	if err := migrations.Apply(ctx, db, migrations.Registry); err != nil {
		return "", fmt.Errorf("bootstrap registry: %w", err)
	}
	reader := ident(c.registryReader)
	err = execAll(ctx, db,
		`GRANT SELECT ON ALL TABLES IN SCHEMA public TO `+reader,
		`ALTER DEFAULT PRIVILEGES FOR ROLE `+ident(c.registryOwner)+` IN SCHEMA public GRANT SELECT ON TABLES TO `+reader,
	)
	if err != nil {
		return "", fmt.Errorf("bootstrap registry: grant reader: %w", err)
	}
	if readerPassword == nil {
		return "", nil
	}
	return c.url(c.registryReader, *readerPassword, c.registryDB), nil
}

// RegistryAdmin opens a connection to the registry database as the admin,
// acting as the registry's owner role so that writes are the owner's. The
// caller closes it.
func (o *Ops) RegistryAdmin(ctx context.Context) (*pgx.Conn, error) {
	c, err := o.cluster()
	if err != nil {
		return nil, err
	}
	return c.registryAdmin(ctx)
}

func (c *cluster) registryAdmin(ctx context.Context) (*pgx.Conn, error) {
	conn, err := c.connect(ctx, c.registryDB)
	if err != nil {
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "3D000" {
			return nil, fmt.Errorf("registry database %s does not exist: run BootstrapRegistry first", c.registryDB)
		}
		return nil, fmt.Errorf("open registry: %w", err)
	}
	if _, err := conn.Exec(ctx, `SET ROLE `+ident(c.registryOwner)); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("open registry: act as %s: %w", c.registryOwner, err)
	}
	return conn, nil
}

// DropPrefixed drops every database and role whose name starts with
// Prefix: the cleanup of tests that share a cluster. It refuses an empty
// Prefix, which would mean everything.
func (o *Ops) DropPrefixed(ctx context.Context) error {
	if o.Prefix == "" {
		return errors.New("provision: DropPrefixed needs a non-empty Prefix")
	}
	c, err := o.cluster()
	if err != nil {
		return err
	}
	admin, err := c.connect(ctx, "")
	if err != nil {
		return fmt.Errorf("drop prefixed: %w", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	rows, _ := admin.Query(ctx, `SELECT datname FROM pg_database WHERE starts_with(datname, $1) ORDER BY datname`, o.Prefix)
	dbs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("drop prefixed: list databases: %w", err)
	}
	for _, db := range dbs {
		if _, err := admin.Exec(ctx, `DROP DATABASE IF EXISTS `+ident(db)+` WITH (FORCE)`); err != nil {
			return fmt.Errorf("drop database %s: %w", db, err)
		}
	}
	rows, _ = admin.Query(ctx, `SELECT rolname FROM pg_roles WHERE starts_with(rolname, $1) ORDER BY rolname`, o.Prefix)
	roles, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("drop prefixed: list roles: %w", err)
	}
	for _, r := range roles {
		if _, err := admin.Exec(ctx, `DROP ROLE IF EXISTS `+ident(r)); err != nil {
			return fmt.Errorf("drop role %s: %w", r, err)
		}
	}
	return nil
}

func execAll(ctx context.Context, conn *pgx.Conn, stmts ...string) error {
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

func isCode(err error, code string) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Code == code
}

// ensureOwnerRole creates a NOLOGIN role that will own a database and its
// objects, and makes sure the admin may act as it (SET ROLE, CREATE
// DATABASE ... OWNER), which a non-superuser admin needs membership for.
func ensureOwnerRole(ctx context.Context, admin *pgx.Conn, role string) error {
	var exists, super bool
	err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1),
		(SELECT rolsuper FROM pg_roles WHERE rolname = current_user)`, role).Scan(&exists, &super)
	if err != nil {
		return fmt.Errorf("look up role %s: %w", role, err)
	}
	if !exists {
		_, err := admin.Exec(ctx, `CREATE ROLE `+ident(role)+` NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS`)
		if err != nil && !isCode(err, "42710") { // duplicate_object: made meanwhile
			return fmt.Errorf("create role %s: %w", role, err)
		}
	}
	if super {
		return nil
	}
	var member bool
	if err := admin.QueryRow(ctx, `SELECT pg_has_role(current_user, $1, 'MEMBER')`, role).Scan(&member); err != nil {
		return fmt.Errorf("check membership of %s: %w", role, err)
	}
	if !member {
		if _, err := admin.Exec(ctx, `GRANT `+ident(role)+` TO CURRENT_USER`); err != nil {
			return fmt.Errorf("grant %s to the admin: %w", role, err)
		}
	}
	return nil
}

// ensureLoginRole creates a runtime login role with no special powers, or
// sets the password and limit of an existing one and checks it has none.
// connLimit -1 means no limit.
//
// The role is looked up first rather than found by a failing CREATE ROLE:
// the server logs a failing statement whole (log_min_error_statement), and
// this one carries the password's verifier.
func ensureLoginRole(ctx context.Context, admin *pgx.Conn, role, pwClause string, connLimit int) error {
	limit := "CONNECTION LIMIT " + strconv.Itoa(connLimit)
	var exists bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, role).Scan(&exists); err != nil {
		return fmt.Errorf("look up role %s: %w", role, err)
	}
	if !exists {
		_, err := admin.Exec(ctx, `CREATE ROLE `+ident(role)+` LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS `+
			limit+` `+pwClause)
		if err == nil {
			return nil
		}
		if !isCode(err, "42710") { // duplicate_object: made meanwhile, set it below
			return fmt.Errorf("create role %s: %w", role, err)
		}
	}
	// Altering SUPERUSER, REPLICATION or BYPASSRLS, even to "no", needs a
	// superuser; so set what may be set and check the rest.
	if _, err := admin.Exec(ctx, `ALTER ROLE `+ident(role)+` LOGIN NOCREATEDB NOCREATEROLE NOINHERIT `+limit+` `+pwClause); err != nil {
		return fmt.Errorf("alter role %s: %w", role, err)
	}
	var powerful bool
	err := admin.QueryRow(ctx, `SELECT rolsuper OR rolreplication OR rolbypassrls FROM pg_roles WHERE rolname = $1`, role).Scan(&powerful)
	if err != nil {
		return fmt.Errorf("look up role %s: %w", role, err)
	}
	if powerful {
		return fmt.Errorf("role %s exists with SUPERUSER, REPLICATION or BYPASSRLS: a runtime role must have none", role)
	}
	return nil
}

// ensureDatabase creates a database owned by owner, closed to PUBLIC (no
// CONNECT, no TEMP) and open to the one runtime role.
func ensureDatabase(ctx context.Context, admin *pgx.Conn, db, owner, runtimeRole string) error {
	var exists bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, db).Scan(&exists); err != nil {
		return fmt.Errorf("look up database %s: %w", db, err)
	}
	if !exists {
		_, err := admin.Exec(ctx, `CREATE DATABASE `+ident(db)+` OWNER `+ident(owner)+` ENCODING 'UTF8'`)
		if err != nil && !isCode(err, "42P04") { // duplicate_database
			return fmt.Errorf("create database %s: %w", db, err)
		}
	}
	err := execAll(ctx, admin,
		`ALTER DATABASE `+ident(db)+` OWNER TO `+ident(owner),
		`REVOKE ALL ON DATABASE `+ident(db)+` FROM PUBLIC`,
		`GRANT CONNECT ON DATABASE `+ident(db)+` TO `+ident(runtimeRole),
	)
	if err != nil {
		return fmt.Errorf("database %s: %w", db, err)
	}
	return nil
}
