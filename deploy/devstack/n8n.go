package devstack

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// What the n8n import reads (deploy/n8n/import.sh): the credentials file for
// `n8n import:credentials` and the settings workflow for `n8n
// import:workflow`. The shipped workflows (deploy/n8n/workflows) are never
// edited at import: everything that differs between installations (the
// edge's address, the mailbox, who is notified) is in these two files.
const (
	N8NCredentialsFile = "credentials.json"
	N8NSettingsFile    = "settings.json"
	// N8NSettingsWorkflowID is the workflow the shipped ones call for their
	// settings.
	N8NSettingsWorkflowID = "n8nbrainSettings"
)

// The credentials the shipped workflows use, by id (and name, as n8n shows it).
const (
	N8NEdgeCredentialID     = "n8nbrainEdgeAuth"
	N8NEdgeCredentialName   = "n8nbrain edge"
	N8NEventCredentialID    = "n8nbrainEventAuth"
	N8NEventCredentialName  = "n8nbrain events (X-Brain-Webhook-Token)"
	N8NIntakeCredentialID   = "n8nbrainIntakeAuth"
	N8NIntakeCredentialName = "n8nbrain intake (X-N8nbrain-Intake-Token)"
	N8NIMAPCredentialID     = "n8nbrainImap"
	N8NIMAPCredentialName   = "n8nbrain mailbox (IMAP)"
	N8NSMTPCredentialID     = "n8nbrainSmtp"
	N8NSMTPCredentialName   = "n8nbrain mailbox (SMTP)"
	// N8NIntakeHeader carries the intake secret; the events secret travels
	// as edge.HeaderWebhookToken.
	N8NIntakeHeader = "X-N8nbrain-Intake-Token"
)

// MailServer is an IMAP or SMTP server as n8n's credential holds it.
type MailServer struct {
	Host     string
	Port     int
	User     string
	Password string
	// TLS: implicit TLS (IMAPS 993, SMTPS 465). Without it, plain text on
	// the port (STARTTLS when the server offers it, for SMTP).
	TLS bool
}

// N8NOptions are what differs between installations of the shipped
// workflows.
type N8NOptions struct {
	// EdgeURL is how n8n reaches the tenant's edge, without a trailing
	// slash (compose: http://edge:8480; make dev: http://127.0.0.1:8480).
	EdgeURL string
	// ReviewURL is how reviewers reach the edge in a browser, for the links
	// in notifications (default EdgeURL).
	ReviewURL string
	// EdgeToken is the bearer token n8n presents to the edge.
	EdgeToken string
	// EventSecret is what the edge sends as X-Brain-Webhook-Token; n8n's
	// events webhook checks it.
	EventSecret string
	// IntakeSecret protects the intake webhooks (new-email, human-reply);
	// a different secret from EventSecret.
	IntakeSecret string
	// MailFrom is the assistant's address: replies and notifications come
	// from it [N8NBRAIN_MAIL_FROM, default assistant@localhost].
	MailFrom string
	// NotifyTo receives reviewer and escalation notifications, one address
	// or several separated by commas [N8NBRAIN_NOTIFY_TO, default MailFrom].
	// The default is the assistant's own mailbox, so the notifications land
	// in the INBOX the IMAP intake reads: each carries the subject tag
	// "[n8nbrain]" and the intake skips tagged mail from MailFrom or NotifyTo
	// (a notice, or a reviewer's reply to one), so none becomes work.
	NotifyTo string
	// IMAP and SMTP are the mailbox [N8NBRAIN_IMAP_HOST, _PORT, _USER,
	// _PASSWORD, _TLS; N8NBRAIN_SMTP_… the same].
	IMAP, SMTP MailServer
	// VerifyWait is how long verify_reply_sent waits for the sent copy to
	// appear in the Sent folder [N8NBRAIN_VERIFY_WAIT, default 60s].
	VerifyWait time.Duration
}

// N8NMailFromEnv fills the mailbox settings of o from the environment
// (N8NBRAIN_*); unset ones keep o's values.
func N8NMailFromEnv(o *N8NOptions, getenv func(string) string) error {
	var errs []error
	str := func(name string, dst *string) {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			*dst = v
		}
	}
	num := func(name string, dst *int) {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 || n > 65535 {
				errs = append(errs, fmt.Errorf("%s must be a port number, got %q", name, v))
			}
			*dst = n
		}
	}
	boolean := func(name string, dst *bool) {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s must be true or false, got %q", name, v))
			}
			*dst = b
		}
	}
	str("N8NBRAIN_MAIL_FROM", &o.MailFrom)
	str("N8NBRAIN_NOTIFY_TO", &o.NotifyTo)
	str("N8NBRAIN_REVIEW_URL", &o.ReviewURL)
	for _, s := range []struct {
		prefix string
		m      *MailServer
	}{{"N8NBRAIN_IMAP_", &o.IMAP}, {"N8NBRAIN_SMTP_", &o.SMTP}} {
		str(s.prefix+"HOST", &s.m.Host)
		num(s.prefix+"PORT", &s.m.Port)
		str(s.prefix+"USER", &s.m.User)
		s.m.Password = firstNonEmpty(getenv(s.prefix+"PASSWORD"), s.m.Password)
		boolean(s.prefix+"TLS", &s.m.TLS)
	}
	if v := strings.TrimSpace(getenv("N8NBRAIN_VERIFY_WAIT")); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("N8NBRAIN_VERIFY_WAIT must be a positive duration such as 60s, got %q", v))
		}
		o.VerifyWait = d
	}
	return errors.Join(errs...)
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (o N8NOptions) withDefaults() N8NOptions {
	o.EdgeURL = strings.TrimRight(o.EdgeURL, "/")
	if o.ReviewURL == "" {
		o.ReviewURL = o.EdgeURL
	}
	o.ReviewURL = strings.TrimRight(o.ReviewURL, "/")
	if o.MailFrom == "" {
		o.MailFrom = "assistant@localhost"
	}
	if o.NotifyTo == "" {
		o.NotifyTo = o.MailFrom
	}
	if o.IMAP.Host == "" {
		o.IMAP.Host = "127.0.0.1"
	}
	if o.IMAP.Port == 0 {
		o.IMAP.Port = 143
		if o.IMAP.TLS {
			o.IMAP.Port = 993
		}
	}
	if o.SMTP.Host == "" {
		o.SMTP.Host = "127.0.0.1"
	}
	if o.SMTP.Port == 0 {
		o.SMTP.Port = 587
		if o.SMTP.TLS {
			o.SMTP.Port = 465
		}
	}
	if o.VerifyWait == 0 {
		o.VerifyWait = time.Minute
	}
	return o
}

func (o N8NOptions) validate() error {
	var errs []error
	for name, u := range map[string]string{"edge URL": o.EdgeURL, "review URL": o.ReviewURL} {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || (p.Path != "" && p.Path != "/") {
			errs = append(errs, fmt.Errorf("n8n settings: the %s must be http(s)://host[:port], got %q", name, u))
		}
	}
	for name, v := range map[string]string{"edge token": o.EdgeToken, "events secret": o.EventSecret, "intake secret": o.IntakeSecret} {
		if !headerSafeRe.MatchString(v) {
			errs = append(errs, fmt.Errorf("n8n settings: the %s must be at least 16 printable characters without spaces", name))
		}
	}
	if o.EventSecret == o.IntakeSecret {
		errs = append(errs, errors.New("n8n settings: the intake secret must differ from the events secret"))
	}
	if !strings.Contains(o.MailFrom, "@") || !strings.Contains(o.NotifyTo, "@") {
		errs = append(errs, fmt.Errorf("n8n settings: N8NBRAIN_MAIL_FROM (%q) and N8NBRAIN_NOTIFY_TO (%q) must be e-mail addresses", o.MailFrom, o.NotifyTo))
	}
	return errors.Join(errs...)
}

// N8NFiles are the files WriteN8N wrote.
type N8NFiles struct {
	Credentials string
	Settings    string
}

// WriteN8N writes n8n's credentials and the settings workflow into dir
// (0600 files; with gid ≥ 0 the group gets read access, for n8n's user in
// compose). The credentials file holds secrets; the settings hold none.
func WriteN8N(dir string, o N8NOptions, gid int) (N8NFiles, error) {
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return N8NFiles{}, err
	}
	files := N8NFiles{Credentials: filepath.Join(dir, N8NCredentialsFile), Settings: filepath.Join(dir, N8NSettingsFile)}
	creds, err := json.MarshalIndent(n8nCredentials(o), "", "  ")
	if err != nil {
		return files, err
	}
	settings, err := json.MarshalIndent(n8nSettingsWorkflow(o), "", "  ")
	if err != nil {
		return files, err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return files, err
	}
	mode := os.FileMode(0o600)
	if gid >= 0 {
		mode = 0o640
	}
	for path, b := range map[string][]byte{files.Credentials: creds, files.Settings: settings} {
		if err := writeFileAtomic(path, append(b, '\n'), mode); err != nil {
			return files, err
		}
	}
	if gid >= 0 {
		for _, p := range []string{dir, files.Credentials, files.Settings} {
			if err := os.Chown(p, -1, gid); err != nil {
				return files, fmt.Errorf("give group %d to %s (is the init container's group_add set?): %w", gid, p, err)
			}
		}
		if err := os.Chmod(dir, 0o750); err != nil {
			return files, err
		}
	}
	return files, nil
}

// n8nCredential is one entry of `n8n import:credentials`' input; a plain
// data object is encrypted with n8n's key on import.
type n8nCredential struct {
	ID   string         `json:"id"`
	Name string         `json:"name"`
	Type string         `json:"type"`
	Data map[string]any `json:"data"`
}

func n8nCredentials(o N8NOptions) []n8nCredential {
	header := func(id, name, header, value string) n8nCredential {
		return n8nCredential{ID: id, Name: name, Type: "httpHeaderAuth", Data: map[string]any{"name": header, "value": value}}
	}
	return []n8nCredential{
		header(N8NEdgeCredentialID, N8NEdgeCredentialName, "Authorization", "Bearer "+o.EdgeToken),
		header(N8NEventCredentialID, N8NEventCredentialName, "X-Brain-Webhook-Token", o.EventSecret),
		header(N8NIntakeCredentialID, N8NIntakeCredentialName, N8NIntakeHeader, o.IntakeSecret),
		{ID: N8NIMAPCredentialID, Name: N8NIMAPCredentialName, Type: "imap", Data: map[string]any{
			"user": o.IMAP.User, "password": o.IMAP.Password, "host": o.IMAP.Host, "port": o.IMAP.Port,
			"secure": o.IMAP.TLS, "allowUnauthorizedCerts": false}},
		{ID: N8NSMTPCredentialID, Name: N8NSMTPCredentialName, Type: "smtp", Data: map[string]any{
			"user": o.SMTP.User, "password": o.SMTP.Password, "host": o.SMTP.Host, "port": o.SMTP.Port,
			"secure": o.SMTP.TLS, "disableStartTls": false}},
	}
}

// n8nSettingsWorkflow is the workflow the shipped ones call for their
// settings: an Execute Workflow Trigger and one Set node.
func n8nSettingsWorkflow(o N8NOptions) map[string]any {
	values, _ := json.Marshal(map[string]any{
		"edge_url":            o.EdgeURL,
		"review_url":          o.ReviewURL,
		"mail_from":           o.MailFrom,
		"notify_to":           o.NotifyTo,
		"verify_wait_seconds": int(o.VerifyWait.Seconds()),
	})
	node := func(id, name, typ string, version float64, params map[string]any, x int) map[string]any {
		return map[string]any{"id": id, "name": name, "type": typ, "typeVersion": version, "parameters": params, "position": []int{x, 0}}
	}
	return map[string]any{
		"id":     N8NSettingsWorkflowID,
		"name":   "n8nbrain: settings",
		"active": false,
		"nodes": []any{
			node("3f0d6c52-3b1e-4a55-9d1c-8c54e0b7a101", "Called", "n8n-nodes-base.executeWorkflowTrigger", 1.1,
				map[string]any{"inputSource": "passthrough"}, 0),
			node("3f0d6c52-3b1e-4a55-9d1c-8c54e0b7a102", "Settings", "n8n-nodes-base.set", 3.4,
				map[string]any{"mode": "raw", "jsonOutput": string(values), "options": map[string]any{}}, 220),
		},
		"connections": map[string]any{"Called": map[string]any{"main": [][]map[string]any{{{"node": "Settings", "type": "main", "index": 0}}}}},
		"settings": map[string]any{"executionOrder": "v1", "callerPolicy": "workflowsFromSameOwner",
			// Called on every run: keep no record of its successes.
			"saveDataSuccessExecution": "none"},
		"pinData": map[string]any{},
		"tags":    []any{},
	}
}
