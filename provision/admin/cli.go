package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/nats/conf"
	"n8nbrain/nats/stream"
	"n8nbrain/provision"
	"n8nbrain/registry"
)

// Env is what brainctl takes from its process: tests pass their own.
type Env struct {
	Getenv func(string) string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// Exit codes.
const (
	ExitOK    = 0
	ExitError = 1 // the command failed (or, for migrate and seal-key, some tenant did)
	ExitUsage = 2 // the command line is wrong
)

// globals are the connection settings every command shares. Each has an
// environment variable (envvar), read through Env.Getenv.
type globals struct {
	AdminURL     string   `name:"admin-url" envvar:"BRAINCTL_ADMIN_URL" placeholder:"URL" help:"Postgres URL of the registry cluster's bootstrap role (CREATEDB and CREATEROLE, or a superuser)."`
	RegistryDB   string   `name:"registry-db" envvar:"BRAINCTL_REGISTRY_DB" default:"brain_registry" help:"Registry database name."`
	RegistryHost string   `name:"registry-host" envvar:"BRAINCTL_REGISTRY_HOST" placeholder:"HOST" help:"How brains reach the registry's cluster (written into registry rows of tenants on it). Default: the admin URL's host."`
	RegistryPort int      `name:"registry-port" envvar:"BRAINCTL_REGISTRY_PORT" placeholder:"PORT" help:"With --registry-host. Default: the admin URL's port."`
	Clusters     []string `name:"cluster" envvar:"BRAINCTL_CLUSTERS" sep:" " placeholder:"HOST:PORT=URL" help:"Admin URL of another cluster holding tenant databases, keyed by the host:port brains reach it at (as in the registry rows); repeat the flag, or separate entries by spaces in the variable."`

	SealingKey             string `name:"sealing-key" envvar:"BRAIN_SEALING_KEY" placeholder:"HEX" help:"Key sealing tenant passwords (64 hex characters): the brains' key. Prefer the variable or --sealing-key-file to a flag."`
	SealingKeyFile         string `name:"sealing-key-file" envvar:"BRAIN_SEALING_KEY_FILE" placeholder:"FILE" help:"File holding the sealing key."`
	PreviousSealingKey     string `name:"previous-sealing-key" envvar:"BRAIN_SEALING_KEY_PREVIOUS" placeholder:"HEX" help:"During a rotation: the key being retired (opens, never seals)."`
	PreviousSealingKeyFile string `name:"previous-sealing-key-file" envvar:"BRAIN_SEALING_KEY_PREVIOUS_FILE" placeholder:"FILE" help:"File holding the previous sealing key."`

	NATSURL        string        `name:"nats-url" envvar:"BRAINCTL_NATS_URL" placeholder:"URL" help:"NATS server for tenants' streams."`
	NATSCreds      string        `name:"nats-creds" envvar:"BRAINCTL_NATS_CREDS" placeholder:"FILE" help:"The STREAMS account provisioner's .creds (deploy/nsc-streams-account.sh)."`
	StreamReplicas int           `name:"stream-replicas" envvar:"BRAINCTL_STREAM_REPLICAS" default:"1" help:"Replicas of each tenant stream: 3 on a production cluster. Keep it the same on every run."`
	AckWait        time.Duration `name:"ack-wait" envvar:"BRAINCTL_ACK_WAIT" default:"5s" help:"How long a brain may hold a turn without a sign of life before another gets it."`

	BrainAccount   string `name:"brain-account" envvar:"BRAINCTL_BRAIN_ACCOUNT" placeholder:"KEY" help:"The BRAIN account's public key: never a tenant's (deploy/nsc-brain-account.sh prints it)."`
	StreamsAccount string `name:"streams-account" envvar:"BRAINCTL_STREAMS_ACCOUNT" placeholder:"KEY" help:"The STREAMS account's public key: never a tenant's."`
	SystemAccount  string `name:"system-account" envvar:"BRAINCTL_SYSTEM_ACCOUNT" placeholder:"KEY" help:"The system account's public key: never a tenant's."`

	// Prefix is for tests that share a cluster: it prefixes every database
	// and role name. Production leaves it empty.
	Prefix string `name:"prefix" envvar:"BRAINCTL_PREFIX" hidden:""`

	JSON bool `name:"json" help:"Print JSON for scripts instead of tables."`
}

// cli is the command tree.
type cli struct {
	globals
	Registry registryCmd `cmd:"" help:"Create the registry database and its reader role."`
	Migrate  migrateCmd  `cmd:"" help:"Bring the registry and every tenant's database, grants and streams to this version."`
	Tenant   tenantCmd   `cmd:"" help:"Create, change, disable, enable, delete, list and show tenants."`
	Rules    rulesCmd    `cmd:"" help:"A tenant's triage rules: import and export a reviewed file, test an e-mail against them."`
	SealKey  sealKeyCmd  `cmd:"" name:"seal-key" help:"Rotate the key that seals tenants' database passwords."`
}

// app is one run: settings, streams and what has been opened.
type app struct {
	ctx context.Context
	g   *globals
	env Env
	out *output

	ops *provision.Ops
	nc  *nats.Conn
}

// Main runs brainctl with args (without the program name) and returns the
// exit code.
func Main(ctx context.Context, args []string, env Env) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	if env.Stdin == nil {
		env.Stdin = strings.NewReader("")
	}
	var c cli
	exit := -1
	parser, err := kong.New(&c,
		kong.Name("brainctl"),
		kong.Description("Operate n8nbrain: the registry, tenants, their rules, migrations and sealing keys. "+
			"Connections and keys come from flags or the environment variables shown. NATS accounts and users are nsc's (deploy/README.md)."),
		kong.Writers(env.Stdout, env.Stderr),
		kong.Exit(func(code int) { exit = code; panic(exitPanic{}) }),
		kong.Resolvers(envResolver(env.Getenv)),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		kong.PostBuild(helpNamesEnv),
	)
	if err != nil {
		fmt.Fprintln(env.Stderr, "brainctl:", err)
		return ExitError
	}
	code := func() (code int) {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(exitPanic); !ok {
					panic(r)
				}
				code = exit
			}
		}()
		kctx, err := parser.Parse(args)
		if err != nil {
			fmt.Fprintf(env.Stderr, "brainctl: %v\n", err)
			if kctx != nil {
				fmt.Fprintln(env.Stderr, "run 'brainctl "+strings.TrimSpace(kctx.Command()+" --help")+"' for usage")
			}
			return ExitUsage
		}
		a := &app{ctx: ctx, g: &c.globals, env: env, out: &output{json: c.JSON, w: env.Stdout}}
		defer a.close()
		if err := kctx.Run(a); err != nil {
			var pe partialError
			if errors.As(err, &pe) {
				// The report, printed already, names each failure.
				if !a.out.json {
					fmt.Fprintln(env.Stderr, "brainctl: "+pe.Error())
				}
				return ExitError
			}
			a.out.fail(env.Stderr, err)
			var ue usageError
			if errors.As(err, &ue) {
				return ExitUsage
			}
			return ExitError
		}
		return ExitOK
	}()
	return code
}

type exitPanic struct{}

// envResolver gives each unset flag the value of its envvar tag.
func envResolver(getenv func(string) string) kong.Resolver {
	return kong.ResolverFunc(func(_ *kong.Context, _ *kong.Path, f *kong.Flag) (any, error) {
		name := f.Tag.Get("envvar")
		if name == "" {
			return nil, nil
		}
		if v := getenv(name); v != "" {
			return v, nil
		}
		return nil, nil
	})
}

// helpNamesEnv adds each flag's environment variable to its help.
func helpNamesEnv(k *kong.Kong) error {
	return kong.Visit(k.Model, func(n kong.Visitable, next kong.Next) error {
		if f, ok := n.(*kong.Flag); ok {
			if env := f.Tag.Get("envvar"); env != "" && !strings.Contains(f.Help, "$"+env) {
				f.Help += " ($" + env + ")"
			}
		}
		return next(nil)
	})
}

func (a *app) close() {
	if a.nc != nil {
		a.nc.Close()
	}
}

// opsFor returns the provisioning handle of the registry's cluster. The
// sealer is opened only when needSealer (creating a tenant, re-sealing).
func (a *app) opsFor(needSealer bool) (*provision.Ops, error) {
	if a.ops != nil && (!needSealer || a.ops.Sealer != nil) {
		return a.ops, nil
	}
	g := a.g
	if g.AdminURL == "" {
		return nil, &Error{Field: "--admin-url", Message: "the registry cluster's admin URL is required (--admin-url or BRAINCTL_ADMIN_URL)"}
	}
	reg, err := (provision.Cluster{AdminURL: g.AdminURL, Host: g.RegistryHost, Port: g.RegistryPort}).WithDefaults()
	if err != nil {
		return nil, &Error{Field: "--admin-url", Message: err.Error()}
	}
	ops := &provision.Ops{AdminURL: g.AdminURL, Host: reg.Host, Port: reg.Port, RegistryDB: g.RegistryDB, Prefix: g.Prefix}
	if needSealer {
		s, err := a.sealer()
		if err != nil {
			return nil, err
		}
		ops.Sealer = s
	}
	ops.Reserved = a.reserved()
	a.ops = ops
	return ops, nil
}

// sealer opens the sealing keys: the current one (required) and the
// previous one of a rotation (optional).
func (a *app) sealer() (*registry.Sealer, error) {
	cur, err := readKey(a.g.SealingKey, a.g.SealingKeyFile, "--sealing-key", "BRAIN_SEALING_KEY")
	if err != nil {
		return nil, err
	}
	if cur == nil {
		return nil, &Error{Field: "--sealing-key", Message: "the sealing key is required (BRAIN_SEALING_KEY, BRAIN_SEALING_KEY_FILE, " +
			"--sealing-key or --sealing-key-file): the brains' key, 64 hex characters"}
	}
	prev, err := readKey(a.g.PreviousSealingKey, a.g.PreviousSealingKeyFile, "--previous-sealing-key", "BRAIN_SEALING_KEY_PREVIOUS")
	if err != nil {
		return nil, err
	}
	return registry.NewSealer(cur, prev)
}

func readKey(value, file, flag, envName string) ([]byte, error) {
	k, err := registry.ReadKey(value, file)
	var pathErr *fs.PathError
	switch {
	case errors.Is(err, registry.ErrKeyGivenTwice):
		return nil, &Error{Field: flag, Message: fmt.Sprintf("both %s (%s) and %s-file (%s_FILE) are set: give the key one way",
			flag, envName, flag, envName)}
	case errors.As(err, &pathErr):
		return nil, &Error{Field: flag + "-file", Message: fmt.Sprintf("read the key file: %v", err)}
	case err != nil:
		return nil, &Error{Field: flag, Message: fmt.Sprintf("%v (%s)", err, envName)}
	}
	return k, nil
}

// streams connects to NATS as the STREAMS provisioner.
func (a *app) streams() (*provision.Streams, error) {
	g := a.g
	if g.NATSURL == "" || g.NATSCreds == "" {
		return nil, &Error{Field: "--nats-creds", Message: "tenants' streams are created with the STREAMS provisioner's credentials: " +
			"set --nats-url and --nats-creds (BRAINCTL_NATS_URL, BRAINCTL_NATS_CREDS), or pass --skip-streams and run " +
			"'brainctl migrate' with them later"}
	}
	if a.nc == nil {
		nc, err := nats.Connect(g.NATSURL, nats.UserCredentials(g.NATSCreds), nats.Name("brainctl"),
			nats.Timeout(10*time.Second), nats.MaxReconnects(3))
		if err != nil {
			return nil, &Error{Field: "--nats-url", Message: fmt.Sprintf("connect to NATS at %s with %s: %v", conf.RedactURLs(g.NATSURL), g.NATSCreds, err)}
		}
		a.nc = nc
	}
	js, err := jetstream.New(a.nc)
	if err != nil {
		return nil, err
	}
	if g.StreamReplicas < 1 || g.StreamReplicas > 5 {
		return nil, &Error{Field: "--stream-replicas", Message: fmt.Sprintf("must be between 1 and 5, got %d", g.StreamReplicas)}
	}
	s := &provision.Streams{JS: js, Config: stream.Config{Replicas: g.StreamReplicas, AckWait: g.AckWait}}
	// What every tenant shares (the brain's SCHEDULES stream) comes first:
	// a tenant's streams are no use to a brain without it.
	if err := s.EnsureShared(a.ctx); err != nil {
		return nil, &Error{Field: "streams", Message: err.Error()}
	}
	return s, nil
}

// clusters maps host:port (as brains reach a cluster, as registry rows name
// it) to that cluster, the registry's own included.
func (a *app) clusters() (map[string]provision.Cluster, error) {
	ops, err := a.opsFor(false)
	if err != nil {
		return nil, err
	}
	reg, err := ops.RegistryCluster()
	if err != nil {
		return nil, err
	}
	m := map[string]provision.Cluster{reg.Addr(): reg}
	for _, e := range a.g.Clusters {
		addr, u, ok := strings.Cut(e, "=")
		host, port, perr := splitAddr(addr)
		if !ok || perr != nil || u == "" {
			return nil, &Error{Field: "--cluster", Message: fmt.Sprintf("%q must be HOST:PORT=ADMIN_URL (host and port as brains reach the cluster)", redactEntry(e))}
		}
		cl, err := (provision.Cluster{AdminURL: u, Host: host, Port: port}).WithDefaults()
		if err != nil {
			return nil, &Error{Field: "--cluster", Message: fmt.Sprintf("%s: %v", addr, err)}
		}
		m[cl.Addr()] = cl
	}
	return m, nil
}

// clusterOf is the cluster of a tenant's database, by its registry row.
func (a *app) clusterOf(t registry.Tenant) (provision.Cluster, error) {
	m, err := a.clusters()
	if err != nil {
		return provision.Cluster{}, err
	}
	addr := provision.Cluster{Host: t.DB.Host, Port: t.DB.Port}.Addr()
	cl, ok := m[addr]
	if !ok {
		return cl, &Error{Tenant: string(t.ID), Field: "--cluster", Message: fmt.Sprintf(
			"its database is on cluster %s, whose admin URL was not given: pass --cluster %s=ADMIN_URL (or BRAINCTL_CLUSTERS)", addr, addr)}
	}
	return cl, nil
}

// reserved are the operator's accounts that must never be a tenant's.
func (a *app) reserved() provision.ReservedAccounts {
	return provision.ReservedAccounts{Brain: a.g.BrainAccount, Streams: a.g.StreamsAccount, System: a.g.SystemAccount}
}

// output prints results as tables for people or JSON for scripts.
type output struct {
	json bool
	w    io.Writer
}

// emit prints v as JSON, or calls human.
func (o *output) emit(v any, human func(w io.Writer)) error {
	if o.json {
		enc := json.NewEncoder(o.w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	human(o.w)
	return nil
}

// fail prints an error: to stderr for people, as {"error": …} on stdout
// for scripts (so a script reading stdout always gets JSON).
func (o *output) fail(stderr io.Writer, err error) {
	e := asError(err)
	if o.json {
		enc := json.NewEncoder(o.w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(struct {
			Error *Error `json:"error"`
		}{e})
		return
	}
	fmt.Fprintln(stderr, "brainctl: "+e.Error())
}
