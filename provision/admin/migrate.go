package admin

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	"n8nbrain/provision"
	"n8nbrain/subjects"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

type registryCmd struct {
	Init registryInitCmd `cmd:"" help:"Create (or bring up to date) the registry database, its owner and its reader role, and set the reader's password."`
}

type registryInitCmd struct {
	ReaderPassword     string `name:"reader-password" envvar:"BRAINCTL_REGISTRY_READER_PASSWORD" placeholder:"PASSWORD" help:"The brains' registry reader role's password (printable ASCII; it goes into BRAIN_REGISTRY_URL, so URL-safe characters are simplest)."`
	ReaderPasswordFile string `name:"reader-password-file" envvar:"BRAINCTL_REGISTRY_READER_PASSWORD_FILE" placeholder:"FILE" help:"File holding it."`
	ReaderURLFile      string `name:"reader-url-file" placeholder:"FILE" help:"Write the brains' BRAIN_REGISTRY_URL (password included) to FILE, readable by its owner only."`
}

func (c *registryInitCmd) Run(a *app) error {
	pw := c.ReaderPassword
	if pw == "" && c.ReaderPasswordFile != "" {
		b, err := os.ReadFile(c.ReaderPasswordFile)
		if err != nil {
			return &Error{Field: "--reader-password-file", Message: err.Error()}
		}
		pw = strings.TrimRight(string(b), "\r\n")
	}
	if pw == "" {
		return usageError{&Error{Field: "--reader-password", Message: "the registry reader's password is required " +
			"(--reader-password-file or BRAINCTL_REGISTRY_READER_PASSWORD[_FILE])"}}
	}
	ops, err := a.opsFor(false)
	if err != nil {
		return err
	}
	readerURL, err := ops.BootstrapRegistry(a.ctx, pw)
	if err != nil {
		return err
	}
	res, err := ops.MigrateRegistry(a.ctx)
	if err != nil {
		return err
	}
	redacted := redactPassword(readerURL)
	if c.ReaderURLFile != "" {
		if err := os.WriteFile(c.ReaderURLFile, []byte(readerURL+"\n"), 0o600); err != nil {
			return &Error{Field: "--reader-url-file", Message: err.Error()}
		}
		if err := os.Chmod(c.ReaderURLFile, 0o600); err != nil {
			return &Error{Field: "--reader-url-file", Message: err.Error()}
		}
	}
	out := struct {
		Database      string `json:"database"`
		Schema        int    `json:"schema"`
		ReaderURL     string `json:"reader_url_redacted"`
		ReaderURLFile string `json:"reader_url_file,omitempty"`
	}{a.g.RegistryDB, res.To, redacted, c.ReaderURLFile}
	return a.out.emit(out, func(w io.Writer) {
		fmt.Fprintf(w, "registry %s ready (schema %d)\n", out.Database, out.Schema)
		fmt.Fprintf(w, "brains read it with BRAIN_REGISTRY_URL=%s (REDACTED: the reader password you gave)\n", redacted)
		if c.ReaderURLFile != "" {
			fmt.Fprintf(w, "written, password included, to %s\n", c.ReaderURLFile)
		}
	})
}

type migrateCmd struct {
	SkipStreams bool `name:"skip-streams" help:"Leave tenants' streams as they are (no NATS needed)."`
}

// migrateRow is one database's migration in the report.
type migrateRow struct {
	Tenant     string `json:"tenant"` // "" for the registry
	Cluster    string `json:"cluster,omitempty"`
	SchemaFrom int    `json:"schema_from"`
	SchemaTo   int    `json:"schema_to"`
	Streams    string `json:"streams,omitempty"`
	OK         bool   `json:"ok"`
	Error      *Error `json:"error,omitempty"`
}

// Run migrates the registry, then each tenant in turn: its database (on its
// own cluster), grants and streams. A tenant that fails is reported and the
// others go on; the exit code is 1 when any failed.
func (c *migrateCmd) Run(a *app) error {
	ops, err := a.opsFor(false)
	if err != nil {
		return err
	}
	if _, err := a.clusters(); err != nil {
		return err
	}
	var streams *provision.Streams
	if !c.SkipStreams {
		if streams, err = a.streams(); err != nil {
			return err
		}
	}
	reg, err := ops.MigrateRegistry(a.ctx)
	if err != nil {
		return &Error{Field: "registry", Message: err.Error()}
	}
	rows := []migrateRow{{Cluster: a.g.RegistryDB, SchemaFrom: reg.From, SchemaTo: reg.To, OK: true}}
	ts, err := ops.Tenants(a.ctx)
	if err != nil {
		return err
	}
	failed := 0
	for _, t := range ts {
		row := migrateRow{Tenant: string(t.ID), Cluster: provision.Cluster{Host: t.DB.Host, Port: t.DB.Port}.Addr(), Streams: "skipped"}
		err := func() error {
			cl, err := a.clusterOf(t)
			if err != nil {
				return err
			}
			res, err := ops.MigrateTenantOn(a.ctx, t.ID, cl)
			row.SchemaFrom, row.SchemaTo = res.From, res.To
			if err != nil {
				return err
			}
			if streams != nil {
				if err := streams.EnsureTenant(a.ctx, &t); err != nil {
					row.Streams = "failed"
					return &Error{Tenant: string(t.ID), Field: "streams", Message: err.Error()}
				}
				row.Streams = "ensured (" + subjects.TurnsStream(t.NATSAccount)[:14] + "…)"
			}
			return nil
		}()
		if err != nil {
			row.Error = asError(tenantError(string(t.ID), err))
			failed++
		} else {
			row.OK = true
		}
		rows = append(rows, row)
		if a.ctx.Err() != nil {
			break
		}
	}
	if err := a.out.emit(struct {
		Databases []migrateRow `json:"databases"`
		Failed    int          `json:"failed"`
	}{rows, failed}, func(w io.Writer) {
		tr := make([][]string, 0, len(rows))
		for _, r := range rows {
			name, result := r.Tenant, "ok"
			if name == "" {
				name = "(registry)"
			}
			if r.Error != nil {
				result = "FAILED: " + strings.TrimPrefix(r.Error.Error(), "tenant "+r.Tenant+": ")
			}
			tr = append(tr, []string{name, r.Cluster, fmt.Sprintf("%d → %d", r.SchemaFrom, r.SchemaTo), orDash(r.Streams), result})
		}
		table(w, []string{"DATABASE", "CLUSTER", "SCHEMA", "STREAMS", "RESULT"}, tr)
	}); err != nil {
		return err
	}
	if failed > 0 {
		return partialError{failed: failed, total: len(ts)}
	}
	return nil
}

// redactPassword is rawURL with its password, however the URL escapes it,
// replaced by REDACTED (url.URL.Redacted's "xxxxx" would read as the
// password itself in a line that tells the operator to put theirs there).
func redactPassword(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(a URL that does not parse; not shown)"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "REDACTED")
	}
	return u.String()
}
