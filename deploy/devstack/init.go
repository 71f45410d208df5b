package devstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/nats/account"
	"n8nbrain/nats/conf"
	"n8nbrain/nats/stream"
	"n8nbrain/provision"
	"n8nbrain/registry"
)

// InitOptions configure the compose init step (`devstack init`). Every field
// has an environment variable; InitOptionsFromEnv reads them, with defaults
// that match compose.yaml. Secrets left empty are generated once and kept
// in Dir/keys.json, so an init without .env still yields a working stack.
type InitOptions struct {
	// Dir is the shared state volume [INIT_STATE_DIR, default /state].
	Dir string
	// AdminURL is the Postgres bootstrap role, used to provision only
	// [INIT_ADMIN_URL, required].
	AdminURL string
	// DBHost and DBPort are how the brain reaches Postgres, written into the
	// registry [INIT_DB_HOST, default postgres; INIT_DB_PORT, default 5432].
	DBHost string
	DBPort int
	// DBWait bounds the wait for Postgres to accept the bootstrap
	// [INIT_DB_WAIT, default 60s].
	DBWait time.Duration
	// RegistryPassword is the registry reader role's password; the brain's
	// BRAIN_REGISTRY_URL carries it, so it is URL-safe [BRAIN_REGISTRY_PASSWORD].
	RegistryPassword string
	// SealingKey seals tenant passwords (64 hex characters); the brain opens
	// them with the same key [BRAIN_SEALING_KEY or BRAIN_SEALING_KEY_FILE].
	SealingKey string
	// EdgeToken is the bearer token n8n presents to client-zero's edge [EDGE_TOKEN].
	EdgeToken string
	// WebhookSecret is what the edge sends to n8n's webhook as
	// X-Brain-Webhook-Token and signs events with [EDGE_WEBHOOK_SECRET].
	WebhookSecret string
	// ReviewerName and ReviewerPassword log in to the review page
	// [REVIEWER_NAME, default dev; REVIEWER_PASSWORD].
	ReviewerName     string
	ReviewerPassword string
	// NATS is the server's configuration; its identities are filled in
	// [INIT_NATS_LISTEN 0.0.0.0:4222, INIT_NATS_HTTP 0.0.0.0:8222,
	// INIT_NATS_STORE_DIR /data/jetstream, NATS_SYNC_INTERVAL always].
	NATS conf.Config
	// NATSNodes is 1 (nats/nats.conf) or 3: a routed cluster, each node's
	// file nats/nats-<n>.conf, for the compose services nats, nats-2 and
	// nats-3 (deploy/compose.nats-cluster.yaml); the streams step then
	// replicates every stream on the three [INIT_NATS_NODES, default 1].
	NATSNodes int
	// N8N is what the n8n import writes besides the secrets above: the
	// edge's address as n8n sees it [INIT_N8N_EDGE_URL, default
	// http://edge:8480], the review page's for links [N8NBRAIN_REVIEW_URL,
	// default http://127.0.0.1:8480], the mailbox (N8NBRAIN_*, see
	// N8NMailFromEnv) and the intake secret [N8NBRAIN_INTAKE_SECRET].
	N8N N8NOptions
	// N8NGroup, when not -1, is the group given the n8n credentials file so
	// n8n's user can read it (the init container runs with that group added)
	// [INIT_N8N_GID, default -1].
	N8NGroup int
	// Prefix is prepended to provisioned role and database names (tests).
	Prefix string
	// RestrictMaintenanceDatabases revokes CONNECT and TEMPORARY on postgres
	// and template1 from PUBLIC (provision.Ops.RestrictMaintenanceDatabases):
	// right for the cluster compose runs for the stack alone, since it
	// changes the defaults of every role in the cluster
	// [INIT_RESTRICT_MAINTENANCE_DBS: on unless 0 or false].
	RestrictMaintenanceDatabases bool
}

// Paths in the state volume, relative to its root. compose.yaml names them.
const (
	InitNATSConf         = "nats/nats.conf"
	InitNATSNodeConf     = "nats/nats-%d.conf" // a cluster node's (INIT_NATS_NODES)
	InitBrainCreds       = "creds/brain.creds"
	InitProvisionerCreds = "creds/provisioner.creds"
	InitEdgeToken        = "edge/client-zero.token"
	InitWebhookSecret    = "edge/webhook_secret"
	InitReviewers        = "edge/reviewers"
	InitN8NCredentials   = "n8n/" + N8NCredentialsFile
	InitN8NSettings      = "n8n/" + N8NSettingsFile
	InitEdgeCreds        = "creds/client-zero-edge.creds"
)

// InitOptionsFromEnv reads InitOptions from the environment.
func InitOptionsFromEnv(getenv func(string) string) (InitOptions, error) {
	o := InitOptions{
		Dir:              getenv("INIT_STATE_DIR"),
		AdminURL:         getenv("INIT_ADMIN_URL"),
		DBHost:           getenv("INIT_DB_HOST"),
		RegistryPassword: getenv("BRAIN_REGISTRY_PASSWORD"),
		SealingKey:       strings.TrimSpace(getenv("BRAIN_SEALING_KEY")),
		EdgeToken:        strings.TrimSpace(getenv("EDGE_TOKEN")),
		WebhookSecret:    strings.TrimSpace(getenv("EDGE_WEBHOOK_SECRET")),
		ReviewerName:     getenv("REVIEWER_NAME"),
		ReviewerPassword: getenv("REVIEWER_PASSWORD"),
		NATS: conf.Config{
			Listen:   getenv("INIT_NATS_LISTEN"),
			HTTP:     getenv("INIT_NATS_HTTP"),
			StoreDir: getenv("INIT_NATS_STORE_DIR"),
			Sync:     strings.TrimSpace(getenv("NATS_SYNC_INTERVAL")),
		},
		N8N: N8NOptions{
			EdgeURL:      strings.TrimSpace(getenv("INIT_N8N_EDGE_URL")),
			IntakeSecret: strings.TrimSpace(getenv("N8NBRAIN_INTAKE_SECRET")),
		},
		DBPort:   5432,
		DBWait:   time.Minute,
		N8NGroup: -1,
		RestrictMaintenanceDatabases: !slices.Contains([]string{"0", "false"},
			strings.ToLower(strings.TrimSpace(getenv("INIT_RESTRICT_MAINTENANCE_DBS")))),
	}
	var errs []error
	if err := N8NMailFromEnv(&o.N8N, getenv); err != nil {
		errs = append(errs, err)
	}
	if f := getenv("BRAIN_SEALING_KEY_FILE"); f != "" && o.SealingKey != "" {
		errs = append(errs, errors.New("both BRAIN_SEALING_KEY and BRAIN_SEALING_KEY_FILE are set: give the key one way"))
	} else if f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("BRAIN_SEALING_KEY_FILE: %w", err))
		}
		o.SealingKey = strings.TrimSpace(string(b))
	}
	for _, v := range []struct {
		name string
		dst  *int
	}{{"INIT_DB_PORT", &o.DBPort}, {"INIT_N8N_GID", &o.N8NGroup}, {"INIT_NATS_NODES", &o.NATSNodes}} {
		if s := strings.TrimSpace(getenv(v.name)); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s must be an integer, got %q", v.name, s))
			}
			*v.dst = n
		}
	}
	if s := strings.TrimSpace(getenv("INIT_DB_WAIT")); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("INIT_DB_WAIT must be a positive duration such as 60s, got %q", s))
		}
		o.DBWait = d
	}
	return o, errors.Join(errs...)
}

func (o InitOptions) withDefaults() InitOptions {
	if o.Dir == "" {
		o.Dir = "/state"
	}
	if o.DBHost == "" {
		o.DBHost = "postgres"
	}
	if o.DBPort == 0 {
		o.DBPort = 5432
	}
	if o.DBWait == 0 {
		o.DBWait = time.Minute
	}
	if o.ReviewerName == "" {
		o.ReviewerName = "dev"
	}
	if o.N8N.EdgeURL == "" {
		o.N8N.EdgeURL = "http://edge:8480"
	}
	if o.N8N.ReviewURL == "" {
		o.N8N.ReviewURL = "http://127.0.0.1:8480" // compose publishes the edge there
	}
	if o.NATS.StoreDir == "" {
		o.NATS.StoreDir = "/data/jetstream"
	}
	return o
}

var (
	urlSafeRe      = regexp.MustCompile(`^[A-Za-z0-9._~-]{16,}$`)
	headerSafeRe   = regexp.MustCompile(`^[\x21-\x7e]{16,}$`)
	reviewerNameRe = regexp.MustCompile(`^[A-Za-z0-9._@-]{1,64}$`)
)

// Validate checks the options (with their defaults applied) without
// touching anything.
func (o InitOptions) Validate() error { return o.withDefaults().validate() }

func (o InitOptions) validate() error {
	var errs []error
	if o.AdminURL == "" {
		errs = append(errs, errors.New("INIT_ADMIN_URL is required: the Postgres bootstrap role's URL"))
	}
	if n := o.NATSNodes; n != 0 && n != 1 && n != 3 && n != 5 {
		errs = append(errs, fmt.Errorf("INIT_NATS_NODES must be 1, 3 or 5 (a cluster needs an odd number of nodes), got %d", n))
	}
	if o.RegistryPassword != "" && !urlSafeRe.MatchString(o.RegistryPassword) {
		errs = append(errs, errors.New("BRAIN_REGISTRY_PASSWORD must be at least 16 characters of A-Z a-z 0-9 . _ ~ - (it is written into BRAIN_REGISTRY_URL)"))
	}
	if o.SealingKey != "" {
		if _, err := registry.ParseKey(o.SealingKey); err != nil {
			errs = append(errs, fmt.Errorf("BRAIN_SEALING_KEY: %w", err))
		}
	}
	for name, v := range map[string]string{"EDGE_TOKEN": o.EdgeToken, "EDGE_WEBHOOK_SECRET": o.WebhookSecret} {
		if v != "" && !headerSafeRe.MatchString(v) {
			errs = append(errs, fmt.Errorf("%s must be at least 16 printable characters without spaces: it travels in an HTTP header", name))
		}
	}
	if o.ReviewerPassword != "" && len(o.ReviewerPassword) < 8 {
		errs = append(errs, errors.New("REVIEWER_PASSWORD must be at least 8 characters"))
	}
	if len(o.ReviewerPassword) > 72 {
		errs = append(errs, errors.New("REVIEWER_PASSWORD must be at most 72 bytes (bcrypt)"))
	}
	if !reviewerNameRe.MatchString(o.ReviewerName) {
		errs = append(errs, fmt.Errorf("REVIEWER_NAME %q must be 1 to 64 of A-Z a-z 0-9 . _ @ -", o.ReviewerName))
	}
	return errors.Join(errs...)
}

// InitResult is what Init wrote.
type InitResult struct {
	Tenant      registry.TenantID
	TenantNATS  string // the tenant's NATS account public key
	BrainNATS   string // the BRAIN account's public key
	CreatedNow  bool   // the tenant was provisioned by this run
	RegistryURL string // the registry reader's URL (password included)
	NATSConf    string
	BrainCreds  string
	// ProvisionerCreds is the STREAMS provisioner's .creds, with which
	// `devstack streams` creates the tenants' streams once NATS runs.
	ProvisionerCreds string
	EdgeCreds        string
	EdgeToken        string
	Reviewers        string
	Webhook          string
	N8NCredsFile     string
	N8NSettings      string
}

// Init prepares the state the compose services share, idempotently: it
// loads or creates the NATS identities in Dir, bootstraps the registry and
// provisions tenant client-zero in Postgres when missing, then writes the
// nats-server configuration (every account preloaded, so NATS need not be
// running yet), the brain's and the edge's .creds, the edge token, the
// webhook secret, the reviewers file and n8n's credentials.
func Init(ctx context.Context, o InitOptions, log *slog.Logger) (*InitResult, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	ids, err := LoadIdentities(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("identities in %s: %w", o.Dir, err)
	}
	// Secrets given in the environment win over, and replace, kept ones;
	// all but the sealing key at once. The sealing key is kept only once it
	// has opened the tenant's sealed password (or sealed it, on the first
	// run): a key the registry refuses must never overwrite the kept one,
	// which may be the only copy of the key that opens every sealed tenant
	// password (init generated it).
	err = ids.update(func(k *keyFile) {
		for _, s := range []struct{ from, to *string }{
			{&o.RegistryPassword, &k.RegistryPassword},
			{&o.WebhookSecret, &k.WebhookSecret}, {&o.ReviewerPassword, &k.ReviewerPassword},
			{&o.N8N.IntakeSecret, &k.IntakeSecret},
		} {
			if *s.from != "" {
				*s.to = *s.from
			}
		}
	})
	if err != nil {
		return nil, err
	}
	sec := ids.secrets()
	sealingKey := sec.SealingKey
	if o.SealingKey != "" {
		sealingKey = o.SealingKey
	}
	key, err := registry.ParseKey(sealingKey)
	if err != nil {
		return nil, fmt.Errorf("sealing key in %s: %w", ids.keyPath(), err)
	}
	sealer, err := registry.NewSealer(key)
	if err != nil {
		return nil, err
	}
	ops := &provision.Ops{AdminURL: o.AdminURL, Host: o.DBHost, Port: o.DBPort, Sealer: sealer, Prefix: o.Prefix,
		Reserved: provision.ReservedAccounts{Brain: ids.Brain.Public, Streams: ids.Streams.Public, System: ids.System.Public}}
	res := &InitResult{BrainNATS: ids.Brain.Public}

	res.RegistryURL, err = bootstrapWithRetry(ctx, ops, sec.RegistryPassword, o.DBWait, log)
	if err != nil {
		return nil, err
	}
	if o.RestrictMaintenanceDatabases {
		if err := ops.RestrictMaintenanceDatabases(ctx); err != nil {
			return nil, err
		}
	}
	spec := ClientZeroSpec()
	acc, created, err := ensureTenant(ctx, ops, sealer, ids, spec)
	if err != nil {
		return nil, err
	}
	res.Tenant, res.TenantNATS, res.CreatedNow = spec.ID, acc.Public, created
	if sealingKey != sec.SealingKey {
		if err := ids.update(func(k *keyFile) { k.SealingKey = sealingKey }); err != nil {
			return nil, err
		}
	}
	token := o.EdgeToken
	if token == "" {
		token = ids.secrets().EdgeTokens[string(spec.ID)]
	}
	if token == "" {
		token = randomToken()
	}
	if err := ids.keepTenant(string(spec.ID), acc, token); err != nil {
		return nil, err
	}
	sec = ids.secrets()

	// NATS: every account is preloaded into the server's configuration.
	accounts, err := ids.Accounts()
	if err != nil {
		return nil, err
	}
	nc := o.NATS
	nc.OperatorJWT, nc.SystemAccount, nc.Accounts = ids.Operator.JWT, ids.System.Public, accounts
	res.NATSConf = filepath.Join(o.Dir, InitNATSConf)
	if err := conf.WriteFile(res.NATSConf, nc); err != nil {
		return nil, fmt.Errorf("nats config: %w", err)
	}
	if o.NATSNodes > 1 {
		for i := 1; i <= o.NATSNodes; i++ {
			node := nc
			node.ServerName = ClusterNodeHost(i)
			node.Cluster = conf.Cluster{Name: "brain-nats"}
			for j := 1; j <= o.NATSNodes; j++ {
				if j != i {
					node.Cluster.Routes = append(node.Cluster.Routes, "nats-route://"+ClusterNodeHost(j)+":6222")
				}
			}
			if err := conf.WriteFile(filepath.Join(o.Dir, fmt.Sprintf(InitNATSNodeConf, i)), node); err != nil {
				return nil, fmt.Errorf("nats config of node %d: %w", i, err)
			}
		}
	}
	if res.BrainCreds, err = ids.WriteBrainCreds(); err != nil {
		return nil, err
	}
	if res.ProvisionerCreds, err = ids.WriteProvisionerCreds(); err != nil {
		return nil, err
	}
	if res.EdgeCreds, err = ids.WriteEdgeCreds(acc); err != nil {
		return nil, err
	}

	// The edge's secrets.
	if err := os.MkdirAll(filepath.Join(o.Dir, "edge"), 0o700); err != nil {
		return nil, err
	}
	res.EdgeToken = filepath.Join(o.Dir, InitEdgeToken)
	res.Webhook = filepath.Join(o.Dir, InitWebhookSecret)
	res.Reviewers = filepath.Join(o.Dir, InitReviewers)
	for path, data := range map[string]string{res.EdgeToken: token + "\n", res.Webhook: sec.WebhookSecret + "\n"} {
		if err := writeFileAtomic(path, []byte(data), 0o600); err != nil {
			return nil, err
		}
	}
	if err := writeReviewersFile(res.Reviewers, o.ReviewerName, sec.ReviewerPassword,
		"# review page login, written by devstack init (password: REVIEWER_PASSWORD)"); err != nil {
		return nil, err
	}

	// What the n8n import reads (deploy/n8n/import.sh).
	n := o.N8N
	n.EdgeToken, n.EventSecret, n.IntakeSecret = token, sec.WebhookSecret, sec.IntakeSecret
	files, err := WriteN8N(filepath.Join(o.Dir, "n8n"), n, o.N8NGroup)
	if err != nil {
		return nil, fmt.Errorf("n8n credentials and settings: %w", err)
	}
	res.N8NCredsFile, res.N8NSettings = files.Credentials, files.Settings
	return res, nil
}

// bootstrapWithRetry bootstraps the registry, retrying while Postgres is not
// yet accepting connections (its image restarts once after initdb).
func bootstrapWithRetry(ctx context.Context, ops *provision.Ops, password string, wait time.Duration, log *slog.Logger) (string, error) {
	deadline := time.Now().Add(wait)
	for attempt := 1; ; attempt++ {
		url, err := ops.BootstrapRegistry(ctx, password)
		if err == nil {
			return url, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", fmt.Errorf("bootstrap registry: %w", err)
		}
		log.Warn("registry bootstrap failed; retrying", "attempt", attempt, "error", err)
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// ensureTenant provisions the tenant unless the registry has it, and checks
// that a registered tenant is the one the kept identities and sealing key
// belong to. It returns the tenant's NATS account.
func ensureTenant(ctx context.Context, ops *provision.Ops, sealer *registry.Sealer, ids *Identities, spec provision.TenantSpec) (*account.Account, bool, error) {
	name := string(spec.ID)
	acc, kept, err := ids.TenantAccount(name)
	if err != nil {
		return nil, false, err
	}
	conn, err := ops.RegistryAdmin(ctx)
	if err != nil {
		return nil, false, err
	}
	row, getErr := registry.TenantGet(ctx, conn, spec.ID)
	conn.Close(context.WithoutCancel(ctx))
	switch {
	case getErr == nil:
		if !kept {
			return nil, false, fmt.Errorf("tenant %s is in the registry (NATS account %s) but %s keeps no NATS identity for it: "+
				"the state volume was recreated while Postgres kept its data; remove both to start afresh (docker compose down -v)",
				name, row.NATSAccount, ids.keyPath())
		}
		if row.NATSAccount != acc.Public {
			return nil, false, fmt.Errorf("tenant %s is registered with NATS account %s, but the kept identity is %s: "+
				"the state volume and the database are from different installations (docker compose down -v starts afresh)",
				name, row.NATSAccount, acc.Public)
		}
		if _, err := sealer.Open(row.ID, row.DB.PasswordSealed); err != nil {
			return nil, false, fmt.Errorf("tenant %s: the sealing key does not open its database password: "+
				"BRAIN_SEALING_KEY changed since the tenant was provisioned; restore the old key (or docker compose down -v)", name)
		}
		// A state from an earlier version: this version's migrations and grants.
		if err := ops.MigrateTenant(ctx, spec.ID); err != nil {
			return nil, false, err
		}
		return acc, false, nil
	case !errors.Is(getErr, pgx.ErrNoRows):
		return nil, false, getErr
	}
	if !kept {
		// Keep the seed before provisioning, so a run interrupted after the
		// registry row is written finds the same account next time.
		if acc, err = ids.Operator.TenantAccount(name, nil, ids.Brain.Public, ids.Streams.Public); err != nil {
			return nil, false, err
		}
		if err := ids.keepTenant(name, acc, ids.secrets().EdgeTokens[name]); err != nil {
			return nil, false, err
		}
	}
	spec.NATSAccount = acc.Public
	if _, err := ops.CreateTenant(ctx, spec); err != nil {
		return nil, false, err
	}
	return acc, true, nil
}

// InitFromEnv runs Init configured from the environment (dir, when not
// empty, overrides INIT_STATE_DIR) and prints what it did. It prints no
// secret: they are in .env or in the state volume.
func InitFromEnv(ctx context.Context, getenv func(string) string, dir string, out io.Writer, log *slog.Logger) error {
	o, err := InitOptionsFromEnv(getenv)
	if err != nil {
		return err
	}
	if dir != "" {
		o.Dir = dir
	}
	res, err := Init(ctx, o, log)
	if err != nil {
		return err
	}
	state := "already provisioned"
	if res.CreatedNow {
		state = "provisioned now"
	}
	_, err = fmt.Fprintf(out, `init: the stack's state is ready in %s
  tenant        %s (%s), NATS account %s
  BRAIN account %s
  nats config   %s
  brain creds   %s
  edge creds    %s
  edge token    %s
  reviewers     %s
  n8n creds     %s
  n8n settings  %s
`, o.withDefaults().Dir, res.Tenant, state, res.TenantNATS, res.BrainNATS, res.NATSConf, res.BrainCreds,
		res.EdgeCreds, res.EdgeToken, res.Reviewers, res.N8NCredsFile, res.N8NSettings)
	return err
}

// ClusterNodeHost is the compose service (and server name) of cluster node
// i (from 1): nats, nats-2, nats-3.
func ClusterNodeHost(i int) string {
	if i == 1 {
		return "nats"
	}
	return fmt.Sprintf("nats-%d", i)
}

// InitStreamsFromEnv is compose's second one-shot step, once NATS is up:
// it creates (or brings in line with the registry) every tenant's streams
// and consumer with the STREAMS provisioner's .creds that Init wrote. The
// brain's own NATS user cannot: it has no stream administration rights.
// INIT_NATS_URL names the server (default nats://nats:4222).
func InitStreamsFromEnv(ctx context.Context, getenv func(string) string, dir string, out io.Writer, log *slog.Logger) error {
	o, err := InitOptionsFromEnv(getenv)
	if err != nil {
		return err
	}
	if dir != "" {
		o.Dir = dir
	}
	o = o.withDefaults()
	natsURL := getenv("INIT_NATS_URL")
	if natsURL == "" {
		natsURL = "nats://nats:4222"
	}
	n, err := InitStreams(ctx, o, natsURL, log)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "streams: every tenant's streams and consumer are in place (%d tenants)\n", n)
	return err
}

// InitStreams ensures the streams of every tenant in the registry and
// returns how many tenants there are.
func InitStreams(ctx context.Context, o InitOptions, natsURL string, log *slog.Logger) (int, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.AdminURL == "" {
		return 0, errors.New("INIT_ADMIN_URL is required: the Postgres bootstrap role's URL")
	}
	ops := &provision.Ops{AdminURL: o.AdminURL, Prefix: o.Prefix}
	conn, err := ops.RegistryAdmin(ctx)
	if err != nil {
		return 0, err
	}
	tenants, err := registry.TenantList(ctx, conn)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return 0, err
	}
	creds := filepath.Join(o.Dir, InitProvisionerCreds)
	nc, err := nats.Connect(natsURL, nats.UserCredentials(creds), nats.Name("provisioner"),
		nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1))
	if err != nil {
		return 0, fmt.Errorf("connect to NATS at %s with %s: %w", conf.RedactURLs(natsURL), creds, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	streams := &provision.Streams{JS: js, Config: stream.Config{Replicas: max(o.NATSNodes, 1)}}
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = streams.EnsureShared(actx)
		cancel()
		if err == nil || attempt == 30 || ctx.Err() != nil {
			break
		}
		log.Warn("create the shared streams; retrying", "attempt", attempt, "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	if err != nil {
		return 0, err
	}
	for i := range tenants {
		t := &tenants[i]
		for attempt := 1; ; attempt++ {
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err = streams.EnsureTenant(actx, t)
			cancel()
			if err == nil || attempt == 30 || ctx.Err() != nil {
				break
			}
			log.Warn("create tenant streams; retrying", "tenant_id", t.ID, "attempt", attempt, "error", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
		if err != nil {
			return 0, err
		}
	}
	return len(tenants), nil
}
