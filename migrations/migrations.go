// Package migrations holds the SQL of the registry database and of a tenant
// database, embedded in the binary, and applies it. Only the ops tooling
// (package provision) applies migrations; nothing at run time has DDL rights.
//
// Why our own runner and not github.com/jackc/tern: tern evaluates every
// migration as a text/template with sprig's functions (SQL containing "{{"
// changes meaning; sprig adds about ten modules), keeps one version number
// instead of a row per migration with its name and time, and supports down
// migrations we do not use; adopting it would mean converting the
// schema_migrations table of the registry and of every tenant database.
// What we need (embedded SQL, the owner role chosen by the caller, a lock
// per database, idempotency per database) is the sixty lines below.
package migrations

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed registry/*.sql tenant/*.sql
var files embed.FS

// Set is one database kind's ordered migrations.
type Set string

const (
	Registry Set = "registry"
	Tenant   Set = "tenant"
)

// Migration is one numbered SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// List returns a set's migrations in order.
func List(set Set) ([]Migration, error) {
	entries, err := fs.ReadDir(files, string(set))
	if err != nil {
		return nil, fmt.Errorf("read migration set %s: %w", set, err)
	}
	var out []Migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s/%s: name must be NNNN_name.sql", set, e.Name())
		}
		b, err := files.ReadFile(path.Join(string(set), e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: e.Name(), SQL: string(b)})
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("migration set %s: version %d used twice", set, out[i].Version)
		}
	}
	return out, nil
}

// Apply runs the migrations of set that conn's database has not had yet, each
// in its own transaction, recording them in schema_migrations. The caller
// picks the role the tables will belong to (SET ROLE) before calling.
func Apply(ctx context.Context, conn *pgx.Conn, set Set) error {
	return ApplyThrough(ctx, conn, set, 0)
}

// ApplyThrough is Apply stopping after version last (0: all). Tests build a
// database of an earlier schema version with it, to prove the upgrade.
func ApplyThrough(ctx context.Context, conn *pgx.Conn, set Set, last int) error {
	ms, err := List(set)
	if err != nil {
		return err
	}
	if last > 0 {
		ms = slices.DeleteFunc(ms, func(m Migration) bool { return m.Version > last })
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	for _, m := range ms {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			// The lock serialises concurrent provisioning runs on one database.
			if _, err := tx.Exec(ctx, `LOCK TABLE schema_migrations IN EXCLUSIVE MODE`); err != nil {
				return err
			}
			var done bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = $1)`, m.Version).Scan(&done); err != nil {
				return err
			}
			if done {
				return nil
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
			return err
		})
		if err != nil {
			return fmt.Errorf("apply %s migration %s: %w", set, m.Name, err)
		}
	}
	return nil
}

// Latest is the version of a set's last migration: the current schema.
func Latest(set Set) (int, error) {
	ms, err := List(set)
	if err != nil || len(ms) == 0 {
		return 0, err
	}
	return ms[len(ms)-1].Version, nil
}

// Applied is the last migration version a database has had (0: none, or no
// schema_migrations table yet).
func Applied(ctx context.Context, conn *pgx.Conn) (int, error) {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := conn.QueryRow(ctx, `SELECT COALESCE(max(version), 0) FROM schema_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}
