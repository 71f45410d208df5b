package devstack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"

	"n8nbrain/brain"
	"n8nbrain/deploy/localpg"
	"n8nbrain/edge"
	"n8nbrain/internal/testdb"
	"n8nbrain/provision"
	"n8nbrain/registry"
)

// UpOptions configure the development stack.
type UpOptions struct {
	Dir      string // state folder, default .data
	PGPort   int
	NATSPort int
	// NATSNodes is 1 for one server or 3 for a cluster with R3 streams.
	NATSNodes int
	EdgeAddr  string
	// EdgeMetricsAddr serves the edge's /metrics (EDGE_METRICS_ADDR); empty: off.
	EdgeMetricsAddr string
	OpsAddr         string
	Replicas        int
	// Getenv supplies brain settings not owned by the stack (model, workers).
	Getenv func(string) string
}

// portsFree fails at once, naming the flag, when an address the stack
// listens on is taken (most often by another make dev). Otherwise the NATS
// server would give up after its start timeout with an indirect message, and
// the edge only after everything else had started.
func portsFree(o UpOptions) error {
	type listener struct{ addr, what string }
	ls := []listener{{o.EdgeAddr, "the edge (-edge-addr)"}, {o.EdgeMetricsAddr, "the edge's metrics (-edge-metrics-addr)"},
		{o.OpsAddr, "the brain's metrics (-ops-addr)"}}
	if o.NATSNodes <= 1 && o.NATSPort != 0 { // a cluster's nodes take free ports
		ls = append(ls, listener{net.JoinHostPort("127.0.0.1", strconv.Itoa(o.NATSPort)), "NATS (-nats-port)"})
	}
	for i, l := range ls {
		if l.addr == "" {
			continue
		}
		// Port 0 takes a free port each time; the same fixed address twice
		// would fail only once the rest had started.
		if _, port, _ := net.SplitHostPort(l.addr); port != "0" {
			for _, earlier := range ls[:i] {
				if earlier.addr == l.addr {
					return fmt.Errorf("%s and %s are both given %s: give each its own address", earlier.what, l.what, l.addr)
				}
			}
		}
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			return fmt.Errorf("%s cannot listen on %s: %w; is another make dev running?", l.what, l.addr, err)
		}
		ln.Close()
	}
	return nil
}

// withStack is a replica's configuration: the environment's (base), with
// the stack's own NATS, credentials, registry, sealing key and replica
// name, and its TLS setting for tenant databases (none: its cluster serves
// no TLS) unless BRAIN_DB_SSLMODE says otherwise.
func withStack(base, own brain.Config) brain.Config {
	cfg := base
	cfg.NATSURL, cfg.CredsFile, cfg.RegistryURL, cfg.SealingKey, cfg.Replica = own.NATSURL, own.CredsFile, own.RegistryURL, own.SealingKey, own.Replica
	if cfg.DBSSLMode == "" {
		cfg.DBSSLMode = own.DBSSLMode
	}
	return cfg
}

// Up runs the development stack until ctx is done: Postgres initialised in
// Dir/pg, embedded NATS with generated accounts, the registry, tenant
// client-zero, brain replicas and client-zero's edge. It prints a curl that
// submits a turn.
func Up(ctx context.Context, o UpOptions, out io.Writer, log *slog.Logger) error {
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if err := portsFree(o); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pg, err := ensurePG(ctx, o, log)
	if err != nil {
		return err
	}
	pgAtExit := "Postgres too"
	if pg.Started {
		// Runs last: after the brains and the edge have stopped using it.
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := pg.Stop(sctx); err != nil {
				log.Error("stop postgres", "error", err)
			}
		}()
	} else {
		pgAtExit = "except Postgres, which was running before (make test starts it and leaves it running)"
	}
	st, err := Start(ctx, Config{Dir: filepath.Join(o.Dir, "stack"), AdminURL: pg.AdminURL(), NATSPort: o.NATSPort,
		NATSNodes: o.NATSNodes, Logger: log.With("component", "nats")})
	if err != nil {
		return err
	}
	defer st.Close()
	tn, err := st.EnsureTenant(ctx, ClientZeroSpec())
	if err != nil {
		return err
	}

	base, err := brain.ConfigFromEnv(o.Getenv)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, o.Replicas+1)
	for i := 1; i <= o.Replicas; i++ {
		cfg := withStack(base, st.BrainConfig(fmt.Sprintf("dev-%d", i)))
		if i == 1 {
			cfg.OpsAddr = o.OpsAddr
		}
		wg.Go(func() { errs <- brain.Run(ctx, cfg, log.With("component", "brain")) })
	}
	ln, err := net.Listen("tcp", o.EdgeAddr)
	if err != nil {
		return fmt.Errorf("edge listen: %w", err)
	}
	ecfg := st.EdgeConfig(tn)
	ecfg.MetricsAddr = o.EdgeMetricsAddr
	if ecfg.ReviewersFile, err = st.writeReviewers(); err != nil {
		return err
	}
	// n8n's Webhook node, when the developer runs one; the secret is the
	// one written into n8n's credentials below unless EDGE_WEBHOOK_SECRET
	// overrides it.
	sec := st.IDs.secrets()
	ecfg.WebhookURL = o.Getenv("EDGE_WEBHOOK_URL")
	ecfg.WebhookSecret = firstNonEmpty(strings.TrimSpace(o.Getenv("EDGE_WEBHOOK_SECRET")), sec.WebhookSecret)
	if err := edgeTimingFromEnv(&ecfg, o.Getenv); err != nil {
		return err
	}
	n8nOpts := N8NOptions{EdgeURL: "http://" + ln.Addr().String(), EdgeToken: tn.Token, EventSecret: ecfg.WebhookSecret,
		IntakeSecret: sec.IntakeSecret}
	if err := N8NMailFromEnv(&n8nOpts, o.Getenv); err != nil {
		return err
	}
	n8nFiles, err := WriteN8N(filepath.Join(o.Dir, "n8n"), n8nOpts, -1)
	if err != nil {
		return err
	}
	wg.Go(func() { errs <- edge.Serve(ctx, ln, ecfg, log.With("component", "edge")) })

	fmt.Fprintf(out, `
The development stack is up.
  NATS        %s (operator mode; creds in %s)
  Postgres    %s (admin URL in %s)
  brain       %d replicas; metrics of replica dev-1 at http://%s/metrics
  edge        http://%s for tenant %s; %s

Review page (approve, edit or reject drafts): http://%s/review  user dev, password %s
Events go to EDGE_WEBHOOK_URL when set (with EDGE_WEBHOOK_SECRET); otherwise they wait in the outbox.
Edge settings from the environment: EDGE_TURN_WAIT=%s EDGE_PUBLISH_TIMEOUT=%s EDGE_WEBHOOK_TIMEOUT=%s.

n8n (README, "n8n"): credentials %s and settings %s are written;
import them with the shipped workflows (add imap when N8NBRAIN_IMAP_*/N8NBRAIN_SMTP_* name a
mailbox: this stack runs no mail server, README "n8n"):

  deploy/n8n/import.sh %s webhook

then run n8n with N8N_CUSTOM_EXTENSIONS="$PWD/deploy/n8n/nodes" (the Send Reply node, which
threads the approved reply), and start this stack with EDGE_WEBHOOK_URL=http://127.0.0.1:5678/webhook/brain-events.

Submit a turn as n8n would:

  curl -sS -X POST http://%s/v1/turns \
    -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' \
    -d '{"work_item_id":"<demo-1@customer.example>","turn":1,"email":{"from":"Jo <jo@customer.example>","subject":"Quote for a new deck","body":"Hi, could you quote for a 20m2 deck?"}}'

Ctrl-C stops everything, %s; state stays in %s.
`, st.NATS.ClientURL(), filepath.Join(o.Dir, "stack", "creds"), "127.0.0.1:"+fmt.Sprint(pg.Port), pg.AdminURLFile(),
		o.Replicas, o.OpsAddr, ln.Addr(), tn.ID, edgeMetricsLine(o.EdgeMetricsAddr), ln.Addr(), st.IDs.secrets().ReviewerPassword,
		displayDuration(ecfg.TurnWait, edge.DefaultTurnWait), displayDuration(ecfg.PublishTimeout, edge.DefaultPublishTimeout),
		displayDuration(ecfg.WebhookTimeout, edge.DefaultWebhookTimeout),
		n8nFiles.Credentials, n8nFiles.Settings, filepath.Dir(n8nFiles.Credentials), ln.Addr(), tn.Token, pgAtExit, o.Dir)

	var first error
	select {
	case <-ctx.Done():
	case first = <-errs: // a component stopped on its own: stop the rest
		cancel()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		first = errors.Join(first, err)
	}
	return first
}

// EnsureTenant loads a tenant this stack created before, or creates it.
func (s *Stack) EnsureTenant(ctx context.Context, spec provision.TenantSpec) (*Tenant, error) {
	conn, err := s.Ops.RegistryAdmin(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	row, getErr := registry.TenantGet(ctx, conn, spec.ID)
	if getErr == nil {
		if t, err := s.LoadTenant(spec.ID); err == nil {
			// A stack from an earlier version: its database gets this
			// version's migrations and grants, and its streams follow the
			// registry row (also when the NATS store was removed).
			if err := s.Ops.MigrateTenant(ctx, spec.ID); err != nil {
				return nil, err
			}
			if err := s.Streams.EnsureTenant(ctx, &row); err != nil {
				return nil, err
			}
			return t, nil
		}
	}
	return s.AddTenant(ctx, spec)
}

// edgeMetricsLine says where the edge's metrics are, for the banner.
func edgeMetricsLine(addr string) string {
	if addr == "" {
		return "its metrics are off (-edge-metrics-addr)"
	}
	return "its metrics at http://" + addr + "/metrics"
}

// ensurePG starts (or reuses) the stack's Postgres in Dir/pg. A port held
// by another server is an error that says how to choose another.
func ensurePG(ctx context.Context, o UpOptions, log *slog.Logger) (*localpg.Instance, error) {
	pg, err := localpg.Ensure(ctx, localpg.Config{Dir: filepath.Join(o.Dir, "pg"), Port: o.PGPort, Logger: log})
	if errors.Is(err, localpg.ErrPortInUse) {
		return nil, fmt.Errorf("%w, such as make dev PG_PORT=%d (make test, e2e and bench take PG_PORT too; devstack -pg-port)",
			err, cmp.Or(o.PGPort, localpg.DefaultPort)+1)
	}
	return pg, err
}

// PGEnv starts (or reuses) the local Postgres and prints the variable the
// tests read, for `eval "$(devstack pg-env)"`.
func PGEnv(ctx context.Context, o UpOptions, out io.Writer) error {
	pg, err := ensurePG(ctx, o, nil)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "export %s='%s'\n", testdb.EnvAdminURL, pg.AdminURL())
	return err
}

// writeReviewers writes the edge's reviewers file: one development
// reviewer, "dev", with the password kept in the stack's keys.
func (s *Stack) writeReviewers() (string, error) {
	path := filepath.Join(s.cfg.Dir, "reviewers")
	return path, writeReviewersFile(path, "dev", s.IDs.secrets().ReviewerPassword,
		"# development reviewer (make dev prints the password)")
}

// writeReviewersFile writes an edge reviewers file with one reviewer.
func writeReviewersFile(path, name, password, comment string) error {
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	if err != nil {
		return err
	}
	return writeFileAtomic(path, []byte(comment+"\n"+name+":"+string(hash)+"\n"), 0o600)
}

// edgeTimingFromEnv reads the edge's timing settings the dev stack
// documents: EDGE_TURN_WAIT, EDGE_PUBLISH_TIMEOUT, EDGE_WEBHOOK_TIMEOUT.
func edgeTimingFromEnv(c *edge.Config, getenv func(string) string) error {
	var errs []error
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{{"EDGE_TURN_WAIT", &c.TurnWait}, {"EDGE_PUBLISH_TIMEOUT", &c.PublishTimeout}, {"EDGE_WEBHOOK_TIMEOUT", &c.WebhookTimeout}} {
		v := strings.TrimSpace(getenv(d.name))
		if v == "" {
			continue
		}
		dur, err := time.ParseDuration(v)
		if err != nil || dur <= 0 {
			errs = append(errs, fmt.Errorf("%s is %q; want a positive duration such as 10s", d.name, v))
			continue
		}
		*d.dst = dur
	}
	return errors.Join(errs...)
}

func displayDuration(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
