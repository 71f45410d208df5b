package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"n8nbrain/internal/telemetry"
	"n8nbrain/nats/conf"
	"n8nbrain/nats/connwatch"
)

// Config of an edge. The zero value of a field means its default; NATSURL,
// CredsFile and Token are required. Only ConfigFromEnv reads the environment;
// the variable of each field is in brackets.
type Config struct {
	// TenantID labels logs and the NATS connection name [EDGE_TENANT_ID]. It
	// grants nothing: the tenant's identity is the NATS account of the
	// credential.
	TenantID string
	// Addr is where cmd/edge listens [EDGE_ADDR]. Default 127.0.0.1:8480.
	Addr string
	// MetricsAddr serves GET /metrics (Prometheus) on a listener of its own,
	// never the API's [EDGE_METRICS_ADDR], e.g. 127.0.0.1:9480, or :9480 in
	// a container for Prometheus to reach. Default off: several tenants'
	// edges may share a host, and each would want the same port.
	MetricsAddr string
	// MetricsListener, when set, is used instead of listening on
	// MetricsAddr (tests).
	MetricsListener net.Listener
	// TracerProvider traces requests and turns (OpenTelemetry); nil means
	// tracing off. cmd/edge builds it from the standard
	// OTEL_EXPORTER_OTLP_* variables (telemetry.FromEnv).
	TracerProvider trace.TracerProvider
	// NATSURL is the NATS server to connect to [EDGE_NATS_URL].
	NATSURL string
	// CredsFile is the tenant's .creds file: user JWT and NKey seed
	// [EDGE_NATS_CREDS].
	CredsFile string
	// Token is the bearer token n8n presents, at least 16 bytes
	// [EDGE_TOKEN, or a file named by EDGE_TOKEN_FILE].
	Token string
	// TurnWait is how long POST /v1/turns waits for the decision before
	// answering 202 with a URL to fetch it [EDGE_TURN_WAIT]. Default 10s.
	TurnWait time.Duration
	// PublishTimeout is the total time spent publishing a turn, retries
	// included, before answering 503 [EDGE_PUBLISH_TIMEOUT]. Default 5s.
	PublishTimeout time.Duration

	// ReviewersFile lists the accounts of the review page, one
	// "name:<bcrypt hash>" a line, # for comments [EDGE_REVIEWERS_FILE].
	// Empty: the review page is off (its routes answer 404).
	ReviewersFile string
	// ReviewSecureCookie marks the review page's session cookie Secure
	// [EDGE_REVIEW_SECURE_COOKIE=true]. Set it when reviewers reach the page
	// over HTTPS through a proxy that terminates TLS; a request that reaches
	// the edge itself over TLS always gets a Secure cookie.
	ReviewSecureCookie bool
	// ReviewSessionIdle ends a reviewer's session after this long without
	// a request [EDGE_REVIEW_SESSION_IDLE]. Default 1h; a session never
	// lasts more than 12h.
	ReviewSessionIdle time.Duration
	// ReviewTimeZone is the IANA time zone the review page writes times in,
	// the office's [EDGE_REVIEW_TIMEZONE], e.g. Australia/Sydney. Default
	// the edge's local zone. Browsers then show them in their own zone.
	ReviewTimeZone string
	// ReviewClientIPHeader names a header that carries the client's address
	// when the edge sits behind a reverse proxy that sets it, e.g.
	// X-Forwarded-For (its last entry is used) [EDGE_REVIEW_CLIENT_IP_HEADER].
	// Failed sign-ins are throttled per address; without it, behind a
	// proxy every reviewer would share the proxy's. Only set it behind
	// such a proxy: a client could otherwise choose its own address.
	ReviewClientIPHeader string

	// WebhookURL is n8n's Webhook node, where the brain's events are
	// delivered [EDGE_WEBHOOK_URL]. Empty: events are not delivered and the
	// edge does not subscribe to them (the brain keeps them).
	WebhookURL string
	// WebhookSecret is sent as X-Brain-Webhook-Token and signs each body
	// (X-Brain-Signature); at least 16 bytes, required with a WebhookURL
	// [EDGE_WEBHOOK_SECRET, or a file named by EDGE_WEBHOOK_SECRET_FILE].
	WebhookSecret string
	// WebhookTimeout bounds one POST to the webhook [EDGE_WEBHOOK_TIMEOUT].
	// Default 60s: n8n's events workflow answers once the turn it submits
	// is accepted, which can take the whole TurnWait and a 202's polling;
	// a POST cut short is delivered again, and n8n runs the workflow again.
	WebhookTimeout time.Duration
	// WebhookRetries is how many times a failed delivery is retried before
	// the event is parked until the brain publishes it again. Default 8.
	WebhookRetries int
	// WebhookInitialInterval is the first wait between delivery attempts;
	// it doubles up to WebhookMaxInterval. Defaults 500ms and 30s.
	WebhookInitialInterval time.Duration
	WebhookMaxInterval     time.Duration
}

// Defaults.
const (
	DefaultAddr              = "127.0.0.1:8480"
	DefaultReviewSessionIdle = time.Hour
	DefaultTurnWait          = 10 * time.Second
	DefaultPublishTimeout    = 5 * time.Second

	DefaultWebhookTimeout         = 60 * time.Second
	DefaultWebhookRetries         = 8
	DefaultWebhookInitialInterval = 500 * time.Millisecond
	DefaultWebhookMaxInterval     = 30 * time.Second

	minTokenBytes = 16
	drainTimeout  = 5 * time.Second
	// readTimeout bounds reading a whole request, its body included.
	readTimeout = 30 * time.Second
)

func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.TurnWait == 0 {
		c.TurnWait = DefaultTurnWait
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.ReviewSessionIdle == 0 {
		c.ReviewSessionIdle = DefaultReviewSessionIdle
	}
	if c.WebhookTimeout == 0 {
		c.WebhookTimeout = DefaultWebhookTimeout
	}
	if c.WebhookRetries == 0 {
		c.WebhookRetries = DefaultWebhookRetries
	}
	if c.WebhookInitialInterval == 0 {
		c.WebhookInitialInterval = DefaultWebhookInitialInterval
	}
	if c.WebhookMaxInterval == 0 {
		c.WebhookMaxInterval = DefaultWebhookMaxInterval
	}
	return c
}

// validate names the environment variable of each problem, since that is
// what an operator has to fix.
func (c Config) validate() error {
	var errs []error
	if c.NATSURL == "" {
		errs = append(errs, errors.New("EDGE_NATS_URL is required"))
	}
	if c.CredsFile == "" {
		errs = append(errs, errors.New("EDGE_NATS_CREDS is required: the tenant's .creds file"))
	}
	switch {
	case c.Token == "":
		errs = append(errs, errors.New("EDGE_TOKEN or EDGE_TOKEN_FILE is required: the bearer token n8n presents"))
	case len(c.Token) < minTokenBytes:
		errs = append(errs, fmt.Errorf("EDGE_TOKEN is %d bytes, at least %d are required", len(c.Token), minTokenBytes))
	case !headerSafe(c.Token):
		errs = append(errs, errors.New("EDGE_TOKEN must not contain spaces or control characters: it travels in an HTTP header"))
	}
	if c.WebhookURL != "" {
		if u, err := url.Parse(c.WebhookURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, errors.New("EDGE_WEBHOOK_URL must be an absolute http or https URL: n8n's Webhook node"))
		}
		switch {
		case c.WebhookSecret == "":
			errs = append(errs, errors.New("EDGE_WEBHOOK_SECRET or EDGE_WEBHOOK_SECRET_FILE is required with EDGE_WEBHOOK_URL"))
		case len(c.WebhookSecret) < minTokenBytes:
			errs = append(errs, fmt.Errorf("EDGE_WEBHOOK_SECRET is %d bytes, at least %d are required", len(c.WebhookSecret), minTokenBytes))
		case !headerSafe(c.WebhookSecret):
			errs = append(errs, errors.New("EDGE_WEBHOOK_SECRET must not contain spaces or control characters: it travels in an HTTP header"))
		}
	}
	if c.WebhookTimeout < 0 {
		errs = append(errs, fmt.Errorf("EDGE_WEBHOOK_TIMEOUT is %s; it must be positive", c.WebhookTimeout))
	}
	if c.WebhookRetries < 0 || c.WebhookInitialInterval < 0 || c.WebhookMaxInterval < c.WebhookInitialInterval {
		errs = append(errs, fmt.Errorf("webhook retries %d, initial interval %s, max interval %s: want retries and intervals positive, max at least initial",
			c.WebhookRetries, c.WebhookInitialInterval, c.WebhookMaxInterval))
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			errs = append(errs, fmt.Errorf("EDGE_METRICS_ADDR %q is not host:port: %v", c.MetricsAddr, err))
		} else if c.MetricsAddr == c.Addr {
			errs = append(errs, errors.New("EDGE_METRICS_ADDR must differ from EDGE_ADDR: /metrics is never served on n8n's API listener"))
		}
	}
	if c.TurnWait < 0 {
		errs = append(errs, fmt.Errorf("EDGE_TURN_WAIT is %s; it must be positive", c.TurnWait))
	}
	if c.PublishTimeout < 0 {
		errs = append(errs, fmt.Errorf("EDGE_PUBLISH_TIMEOUT is %s; it must be positive", c.PublishTimeout))
	}
	if c.ReviewSessionIdle < 0 || c.ReviewSessionIdle > sessionMaxAge {
		errs = append(errs, fmt.Errorf("EDGE_REVIEW_SESSION_IDLE is %s; it must be positive and at most %s", c.ReviewSessionIdle, sessionMaxAge))
	}
	if c.ReviewTimeZone != "" {
		if _, err := time.LoadLocation(c.ReviewTimeZone); err != nil {
			errs = append(errs, fmt.Errorf("EDGE_REVIEW_TIMEZONE %q is not an IANA time zone such as Europe/London", c.ReviewTimeZone))
		}
	}
	if h := c.ReviewClientIPHeader; h != "" && (!headerSafe(h) || strings.ContainsAny(h, ":")) {
		errs = append(errs, fmt.Errorf("EDGE_REVIEW_CLIENT_IP_HEADER %q is not a header name", h))
	}
	return errors.Join(errs...)
}

// headerSafe reports whether a secret can travel in an HTTP header as is.
func headerSafe(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) < 0
}

// ConfigFromEnv builds a Config from environment variables: EDGE_TENANT_ID,
// EDGE_ADDR, EDGE_NATS_URL, EDGE_NATS_CREDS, EDGE_TOKEN or EDGE_TOKEN_FILE,
// EDGE_TURN_WAIT and EDGE_PUBLISH_TIMEOUT (Go durations, "10s"),
// EDGE_REVIEWERS_FILE, EDGE_WEBHOOK_URL, EDGE_WEBHOOK_SECRET or
// EDGE_WEBHOOK_SECRET_FILE and EDGE_WEBHOOK_TIMEOUT. It returns the
// defaulted, validated Config.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		TenantID:             getenv("EDGE_TENANT_ID"),
		Addr:                 getenv("EDGE_ADDR"),
		MetricsAddr:          getenv("EDGE_METRICS_ADDR"),
		NATSURL:              getenv("EDGE_NATS_URL"),
		CredsFile:            getenv("EDGE_NATS_CREDS"),
		Token:                getenv("EDGE_TOKEN"),
		ReviewersFile:        getenv("EDGE_REVIEWERS_FILE"),
		ReviewTimeZone:       getenv("EDGE_REVIEW_TIMEZONE"),
		ReviewClientIPHeader: getenv("EDGE_REVIEW_CLIENT_IP_HEADER"),
		WebhookURL:           getenv("EDGE_WEBHOOK_URL"),
		WebhookSecret:        getenv("EDGE_WEBHOOK_SECRET"),
	}
	var errs []error
	for _, f := range []struct {
		name, fileName string
		dst            *string
	}{{"EDGE_TOKEN", "EDGE_TOKEN_FILE", &c.Token}, {"EDGE_WEBHOOK_SECRET", "EDGE_WEBHOOK_SECRET_FILE", &c.WebhookSecret}} {
		path := getenv(f.fileName)
		if path == "" {
			continue
		}
		if *f.dst != "" {
			errs = append(errs, fmt.Errorf("%s and %s are both set; set one", f.name, f.fileName))
		} else if b, err := os.ReadFile(path); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.fileName, err))
		} else {
			// A trailing newline from `echo > file` is not part of the secret.
			*f.dst = strings.TrimSpace(string(b))
		}
	}
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{{"EDGE_TURN_WAIT", &c.TurnWait}, {"EDGE_PUBLISH_TIMEOUT", &c.PublishTimeout}, {"EDGE_WEBHOOK_TIMEOUT", &c.WebhookTimeout},
		{"EDGE_REVIEW_SESSION_IDLE", &c.ReviewSessionIdle}} {
		v := getenv(d.name)
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
	if v := getenv("EDGE_REVIEW_SECURE_COOKIE"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("EDGE_REVIEW_SECURE_COOKIE is %q; want true or false", v))
		}
		c.ReviewSecureCookie = b
	}
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		errs = append(errs, err)
	}
	return c, errors.Join(errs...)
}

// Serve connects to NATS with the tenant's credential, then serves the
// edge's HTTP API on ln until ctx is done. It then stops taking requests,
// lets the ones in flight finish (bounded), drains the NATS connection and
// returns nil. It returns an error if it cannot start, if the listener
// fails, or if the NATS connection is closed for good (the server refused
// the credential, see connwatch): then it stops taking requests, lets the
// ones in flight finish and returns why.
// Serve owns ln and closes it in every case.
func Serve(ctx context.Context, ln net.Listener, cfg Config, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		ln.Close()
		return fmt.Errorf("edge config: %w", err)
	}
	if cfg.TenantID != "" {
		logger = logger.With("tenant_id", cfg.TenantID)
	}
	var rv *reviewers
	if cfg.ReviewersFile != "" {
		var err error
		if rv, err = loadReviewers(cfg.ReviewersFile); err != nil {
			ln.Close()
			return fmt.Errorf("edge config: %w", err)
		}
	}

	name := "edge"
	if cfg.TenantID != "" {
		name += "-" + cfg.TenantID
	}
	// Reconnects are unlimited, but nats.go still closes the connection for
	// good when the server refuses the credential twice (revoked, expired)
	// or sends an error that ends it: Serve then stops with an error (the
	// command exits 1) for the supervisor to restart the edge, rather than
	// answering 503 for ever (see connwatch).
	watch := connwatch.New(logger)
	nc, err := nats.Connect(cfg.NATSURL, append(watch.Options(),
		nats.UserCredentials(cfg.CredsFile),
		nats.Name(name),
		nats.DrainTimeout(drainTimeout),
	)...)
	if err != nil {
		ln.Close()
		return fmt.Errorf("connect to NATS at %s: %w", conf.RedactURLs(cfg.NATSURL), err)
	}
	m := newMetrics(cfg.TenantID, nc)
	rl, err := newRelay(nc, cfg, m, logger)
	if err != nil {
		ln.Close()
		nc.Close()
		return err
	}
	if mln := cfg.MetricsListener; mln != nil || cfg.MetricsAddr != "" {
		if mln == nil {
			if mln, err = net.Listen("tcp", cfg.MetricsAddr); err != nil {
				ln.Close()
				nc.Close()
				return fmt.Errorf("listen on EDGE_METRICS_ADDR: %w", err)
			}
		}
		defer serveMetrics(mln, m, logger)()
	}
	var tracer trace.TracerProvider
	if telemetry.IsOn(cfg.TracerProvider) {
		tracer = cfg.TracerProvider
	}
	var auth *reviewAuth
	if rv == nil {
		logger.Info("review page off: EDGE_REVIEWERS_FILE is not set")
	} else {
		auth = &reviewAuth{reviewers: rv, sessions: newSessions(cfg.ReviewSessionIdle, time.Now),
			throttle: newLoginThrottle(time.Now), secureCookie: cfg.ReviewSecureCookie, ipHeader: cfg.ReviewClientIPHeader}
		logger.Info("review page on", "reviewers", len(rv.hashes), "secure_cookie", cfg.ReviewSecureCookie)
	}
	loc := time.Local
	if cfg.ReviewTimeZone != "" {
		loc, _ = time.LoadLocation(cfg.ReviewTimeZone) // checked by validate
	}
	var ev *events
	if cfg.WebhookURL == "" {
		logger.Info("events are not delivered: EDGE_WEBHOOK_URL is not set; the brain keeps them until an edge delivers them")
	} else {
		if cfg.WebhookTimeout <= cfg.TurnWait {
			logger.Warn("EDGE_WEBHOOK_TIMEOUT is not longer than EDGE_TURN_WAIT: n8n answers an event once the turn it submits is accepted, "+
				"so deliveries may be cut short and delivered again", "webhook_timeout", cfg.WebhookTimeout.String(), "turn_wait", cfg.TurnWait.String())
		}
		if ev, err = startEvents(nc, cfg, rl, m, logger); err != nil {
			ln.Close()
			nc.Close()
			return err
		}
	}

	srv := &http.Server{
		Handler: newHandler(deps{
			brain:      refusalAware{brainClient: rl, settled: watch.Settled},
			token:      cfg.Token,
			connected:  func() bool { return nc.Status() == nats.CONNECTED },
			natsErr:    watch.Err,
			logger:     logger,
			auth:       auth,
			csrfKey:    csrfKey(cfg.Token),
			clock:      &reviewClock{loc: loc, now: time.Now},
			delivering: ev != nil,
			metrics:    m,
			tracer:     tracer,
		}),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       readTimeout,
		// Counted from the end of the headers, so it holds the whole
		// read too: a body that took its 30s still gets its answer.
		WriteTimeout:   readTimeout + cfg.TurnWait + 15*time.Second,
		IdleTimeout:    60 * time.Second,
		MaxHeaderBytes: 16 << 10,
		ErrorLog:       slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	logger.Info("edge serving", "addr", ln.Addr().String(), "nats_url", nc.ConnectedUrlRedacted(), "gomaxprocs", runtime.GOMAXPROCS(0))

	var serveErr, natsErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	case <-watch.Closed():
		natsErr = watch.ClosedError()
		logger.Error("edge stopping: its NATS connection is closed for good", "error", natsErr)
	}

	// Deliveries in progress stop at once: none is acknowledged, so the
	// brain publishes them again, to this edge's successor.
	if ev != nil {
		ev.stop(logger)
	}

	// A turn in flight waits at most TurnWait for its decision; give it that
	// long to answer before the connection underneath it goes.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.TurnWait+5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		logger.Warn("http shutdown", "error", err)
	}
	if serveErr == nil {
		serveErr = <-served
	}
	if natsErr == nil {
		if err := nc.Drain(); err != nil {
			logger.Warn("nats drain", "error", err)
			nc.Close()
		}
	}
	drainWait := time.NewTimer(drainTimeout)
	defer drainWait.Stop()
	select {
	case <-watch.Closed():
	case <-drainWait.C:
		nc.Close()
		<-watch.Closed()
	}
	logger.Info("edge stopped")
	if natsErr != nil {
		return natsErr
	}
	if errors.Is(serveErr, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serve http: %w", serveErr)
}
