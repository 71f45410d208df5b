package admin

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nkeys"

	"n8nbrain/provision"
	"n8nbrain/registry"
	"n8nbrain/subjects"
)

type tenantCmd struct {
	Create  tenantCreateCmd  `cmd:"" help:"Create a tenant: database, roles, grants, migrations, registry row, streams and consumer (its NATS account comes from nsc)."`
	Update  tenantUpdateCmd  `cmd:"" help:"Change a tenant's settings; its streams follow a quota change."`
	Disable tenantDisableCmd `cmd:"" help:"Stop serving a tenant: brains refuse its turns within moments. Nothing is deleted."`
	Enable  tenantEnableCmd  `cmd:"" help:"Serve a disabled tenant again."`
	Delete  tenantDeleteCmd  `cmd:"" help:"Delete a tenant's streams, registry row, database and roles (refused while work items are open, unless --force)."`
	List    tenantListCmd    `cmd:"" help:"List tenants."`
	Show    tenantShowCmd    `cmd:"" help:"Show one tenant's settings, rules and sealing."`
	Repair  tenantRepairCmd  `cmd:"" help:"Put a tenant's database login back as provisioning left it: its sealed password, no role settings, its grants (when brains report tenant_database_login_failed)."`
}

// tenantView is a tenant as brainctl prints it.
type tenantView struct {
	ID                 string         `json:"id"`
	Status             string         `json:"status"`
	NATSAccount        string         `json:"nats_account"`
	Cluster            string         `json:"cluster"`
	Database           string         `json:"database"`
	DBUser             string         `json:"db_user"`
	TurnCeiling        int            `json:"turn_ceiling"`
	ApprovalMode       string         `json:"approval_mode"`
	ApprovalTTLSeconds int64          `json:"approval_ttl_seconds"`
	CatalogueVersion   int            `json:"catalogue_version"`
	EnabledActions     []string       `json:"enabled_actions"`
	Categories         []string       `json:"categories"`
	Model              string         `json:"model"`
	ModelOptions       map[string]any `json:"model_options"`
	DailyTokenBudget   int64          `json:"daily_token_budget"`
	Quota              quotaView      `json:"quota"`
	Rules              int            `json:"rules"`
	Streams            []string       `json:"streams"`
	UpdatedAt          time.Time      `json:"updated_at"`
}

type quotaView struct {
	Turns         int64 `json:"turns"`
	Bytes         int64 `json:"bytes"`
	WindowSeconds int64 `json:"window_seconds"`
	MaxInflight   int   `json:"max_inflight"`
}

func viewOf(t registry.Tenant) tenantView {
	v := tenantView{
		ID: string(t.ID), Status: string(t.Status), NATSAccount: t.NATSAccount,
		Cluster:  provision.Cluster{Host: t.DB.Host, Port: t.DB.Port}.Addr(),
		Database: t.DB.Name, DBUser: t.DB.User, TurnCeiling: t.TurnCeiling, ApprovalMode: string(t.ApprovalMode),
		ApprovalTTLSeconds: int64(t.ApprovalTTL / time.Second), CatalogueVersion: int(t.CatalogueVersion),
		EnabledActions: []string{}, Categories: t.Categories, Model: t.ModelName, ModelOptions: t.ModelOptions,
		DailyTokenBudget: t.DailyTokenBudget,
		Quota: quotaView{Turns: t.Quota.Turns, Bytes: t.Quota.Bytes, WindowSeconds: int64(t.Quota.Window / time.Second),
			MaxInflight: t.Quota.MaxInflight},
		Rules:     len(t.Rules),
		Streams:   []string{subjects.TurnsStream(t.NATSAccount), subjects.ResultsStream(t.NATSAccount)},
		UpdatedAt: t.UpdatedAt.UTC(),
	}
	for _, a := range t.EnabledActions {
		v.EnabledActions = append(v.EnabledActions, string(a))
	}
	if v.ModelOptions == nil {
		v.ModelOptions = map[string]any{}
	}
	return v
}

func table(w io.Writer, header []string, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	tw.Flush()
}

func printTenant(w io.Writer, v tenantView) {
	model := v.Model
	if model == "" {
		model = "(the brain's BRAIN_MODEL)"
	}
	budget := strconv.FormatInt(v.DailyTokenBudget, 10)
	if v.DailyTokenBudget == 0 {
		budget = "unlimited"
	}
	table(w, []string{"FIELD", "VALUE"}, [][]string{
		{"tenant", v.ID},
		{"status", v.Status},
		{"nats account", v.NATSAccount},
		{"database", v.Database + " on " + v.Cluster + " (role " + v.DBUser + ")"},
		{"streams", strings.Join(v.Streams, ", ")},
		{"approval mode", v.ApprovalMode},
		{"approval ttl", (time.Duration(v.ApprovalTTLSeconds) * time.Second).String()},
		{"turn ceiling", strconv.Itoa(v.TurnCeiling)},
		{"catalogue version", strconv.Itoa(v.CatalogueVersion)},
		{"enabled actions", strings.Join(v.EnabledActions, ", ")},
		{"categories", strings.Join(v.Categories, ", ")},
		{"model", model},
		{"daily token budget", budget},
		{"quota", fmt.Sprintf("%d turns, %d bytes within %s; %d in flight", v.Quota.Turns, v.Quota.Bytes,
			time.Duration(v.Quota.WindowSeconds)*time.Second, v.Quota.MaxInflight)},
		{"rules", strconv.Itoa(v.Rules)},
		{"updated", v.UpdatedAt.Format(time.RFC3339)},
	})
}

// tenantCreateCmd: brainctl tenant create TENANT --account KEY [settings].
type tenantCreateCmd struct {
	ID      string `arg:"" name:"tenant" help:"Tenant id: lowercase letters, digits and -, as given to nsc-onboard-tenant.sh."`
	Account string `name:"account" placeholder:"KEY" help:"The tenant's NATS account public key (deploy/nsc-onboard-tenant.sh prints it)."`
	settings
	Rules       string `name:"rules" placeholder:"FILE" help:"Triage rules file (YAML or JSON, as 'brainctl rules export' writes)."`
	DBAdminURL  string `name:"db-admin-url" placeholder:"URL" help:"Admin URL of the cluster for the tenant's database, when not the registry's."`
	DBHost      string `name:"db-host" placeholder:"HOST" help:"How brains reach the tenant's cluster. Default: the registry's (or --db-admin-url's host)."`
	DBPort      int    `name:"db-port" placeholder:"PORT" help:"With --db-host."`
	SkipStreams bool   `name:"skip-streams" help:"Do not create the tenant's streams now; the next 'brainctl migrate' creates them (turns are refused until then)."`
}

type createResult struct {
	Tenant   tenantView `json:"tenant"`
	Created  bool       `json:"created"`
	Database string     `json:"database"`
	Roles    []string   `json:"roles,omitempty"`
	Streams  string     `json:"streams"`
}

func (c *tenantCreateCmd) Run(a *app) error {
	id := registry.TenantID(c.ID)
	if !nkeys.IsValidPublicAccountKey(c.Account) {
		return usageError{&Error{Tenant: c.ID, Field: "--account", Message: fmt.Sprintf(
			"%q is not an account public key (A followed by 55 characters): the key nsc-onboard-tenant.sh printed", c.Account)}}
	}
	res := a.reserved()
	if err := res.Known(); err != nil {
		return &Error{Tenant: c.ID, Field: "--brain-account", Message: "set --brain-account, --streams-account and --system-account " +
			"(BRAINCTL_BRAIN_ACCOUNT, BRAINCTL_STREAMS_ACCOUNT, BRAINCTL_SYSTEM_ACCOUNT) so that none is registered as a tenant's: " + err.Error()}
	}
	if err := res.CheckTenantAccount(id, c.Account); err != nil {
		return err
	}
	spec := provision.TenantSpec{ID: id, NATSAccount: c.Account}
	if err := c.settings.apply(&spec); err != nil {
		return err
	}
	var parsed *parsedRules
	if c.Rules != "" {
		f, err := os.Open(c.Rules)
		if err != nil {
			return &Error{Tenant: c.ID, Field: "--rules", Message: err.Error()}
		}
		defer f.Close()
		if parsed, err = readRules(c.Rules, f, id); err != nil {
			return err
		}
	}
	ops, err := a.opsFor(true)
	if err != nil {
		return err
	}
	cl, err := c.cluster(a)
	if err != nil {
		return err
	}
	var streams *provision.Streams
	if !c.SkipStreams {
		// Before anything is created: a missing or wrong NATS setting fails
		// here, not after the database exists.
		if streams, err = a.streams(); err != nil {
			return tenantError(c.ID, err)
		}
	}
	if parsed != nil {
		checked, err := provision.ValidateSpec(spec)
		if err != nil {
			return err
		}
		if spec.Rules, err = parsed.check(checked); err != nil {
			return err
		}
	}

	out := createResult{Streams: "skipped (--skip-streams): the next 'brainctl migrate' creates them"}
	existing, err := ops.Tenant(a.ctx, id)
	switch {
	case err == nil:
		// Re-running the step is safe: the tenant stays as it is. Settings
		// given that differ from it are refused rather than ignored, so a
		// create is never mistaken for an update.
		if existing.NATSAccount != c.Account {
			return &Error{Tenant: c.ID, Field: "--account", Message: fmt.Sprintf(
				"the tenant exists with NATS account %s, not %s: nothing was changed", existing.NATSAccount, c.Account)}
		}
		want := provision.SpecOf(existing)
		if err := c.settings.apply(&want); err != nil {
			return err
		}
		if want, err = provision.ValidateSpec(want); err != nil {
			return tenantError(c.ID, err)
		}
		if diff := changes(asSets(viewOf(existing)), asSets(viewOf(provision.WithSettings(existing, want)))); len(diff) > 0 {
			return &Error{Tenant: c.ID, Message: fmt.Sprintf("the tenant exists with other %s than given: nothing was changed; "+
				"'brainctl tenant update' changes settings", strings.Join(diff, ", "))}
		}
		if parsed != nil {
			rules, err := parsed.check(want)
			if err != nil {
				return err
			}
			if !provision.SameRules(existing.Rules, rules) {
				return &Error{Tenant: c.ID, Field: "--rules", Message: fmt.Sprintf("the tenant exists with other rules than %s "+
					"(%d there, %d in the file): nothing was changed; 'brainctl rules import' replaces them", c.Rules, len(existing.Rules), len(rules))}
			}
		}
		out.Tenant, out.Database = viewOf(existing), existing.DB.Name
	case errors.Is(err, provision.ErrTenantNotFound):
		t, err := ops.CreateTenantOn(a.ctx, spec, cl)
		if err != nil {
			return tenantError(c.ID, err)
		}
		out.Created, out.Database, out.Roles = true, t.DBName, []string{t.OwnerRole, t.AppRole}
		if existing, err = ops.Tenant(a.ctx, id); err != nil {
			return tenantError(c.ID, err)
		}
		out.Tenant = viewOf(existing)
	default:
		return tenantError(c.ID, err)
	}
	if streams != nil {
		if err := streams.EnsureTenant(a.ctx, &existing); err != nil {
			return &Error{Tenant: c.ID, Field: "streams", Message: fmt.Sprintf(
				"the tenant is in the registry but its streams are not made (%v): run 'brainctl migrate' once NATS answers", err)}
		}
		out.Streams = strings.Join(out.Tenant.Streams, ", ") + " and consumer " + subjects.TurnsConsumer
	}
	return a.out.emit(out, func(w io.Writer) {
		if out.Created {
			fmt.Fprintf(w, "tenant %s created: database %s, roles %s\n", c.ID, out.Database, strings.Join(out.Roles, ", "))
		} else {
			fmt.Fprintf(w, "tenant %s exists: its settings are unchanged ('brainctl tenant update' changes them)\n", c.ID)
		}
		fmt.Fprintf(w, "streams: %s\n\n", out.Streams)
		printTenant(w, out.Tenant)
	})
}

// cluster is the tenant database's cluster: --db-admin-url, else the
// --cluster entry of --db-host:--db-port, else the registry's.
func (c *tenantCreateCmd) cluster(a *app) (provision.Cluster, error) {
	if c.DBAdminURL != "" {
		cl, err := (provision.Cluster{AdminURL: c.DBAdminURL, Host: c.DBHost, Port: c.DBPort}).WithDefaults()
		if err != nil {
			return cl, &Error{Tenant: c.ID, Field: "--db-admin-url", Message: err.Error()}
		}
		return cl, nil
	}
	m, err := a.clusters()
	if err != nil {
		return provision.Cluster{}, err
	}
	reg, err := a.ops.RegistryCluster()
	if err != nil {
		return reg, err
	}
	if c.DBHost == "" && c.DBPort == 0 {
		return reg, nil
	}
	want := provision.Cluster{Host: c.DBHost, Port: c.DBPort}
	if want.Host == "" {
		want.Host = reg.Host
	}
	if want.Port == 0 {
		want.Port = 5432
	}
	cl, ok := m[want.Addr()]
	if !ok {
		return cl, &Error{Tenant: c.ID, Field: "--db-host", Message: fmt.Sprintf(
			"no admin URL for cluster %s: pass --db-admin-url (or --cluster %s=ADMIN_URL)", want.Addr(), want.Addr())}
	}
	return cl, nil
}

// tenantUpdateCmd: brainctl tenant update TENANT [settings].
type tenantUpdateCmd struct {
	ID string `arg:"" name:"tenant" help:"Tenant id."`
	settings
	SkipStreams bool `name:"skip-streams" help:"With a quota change: leave the streams as they are; the next 'brainctl migrate' updates them."`
}

type updateResult struct {
	Tenant  tenantView `json:"tenant"`
	Changed []string   `json:"changed"`
	Streams string     `json:"streams"`
}

func (c *tenantUpdateCmd) Run(a *app) error {
	id := registry.TenantID(c.ID)
	ops, err := a.opsFor(false)
	if err != nil {
		return err
	}
	var streams *provision.Streams
	if c.settings.quota() && !c.SkipStreams {
		if streams, err = a.streams(); err != nil {
			return tenantError(c.ID, err)
		}
	}
	before, after, err := ops.UpdateTenant(a.ctx, id, func(s *provision.TenantSpec) error { return c.settings.apply(s) })
	if err != nil {
		return tenantError(c.ID, err)
	}
	out := updateResult{Tenant: viewOf(after), Changed: changes(viewOf(before), viewOf(after)), Streams: "unchanged"}
	if before.Quota != after.Quota {
		out.Streams = "not updated (--skip-streams): the next 'brainctl migrate' updates them"
		if streams != nil {
			if err := streams.EnsureTenant(a.ctx, &after); err != nil {
				return &Error{Tenant: c.ID, Field: "streams", Message: fmt.Sprintf(
					"the registry has the new quota but the streams do not (%v): run 'brainctl migrate'", err)}
			}
			out.Streams = "updated to the new quota"
		}
	}
	return a.out.emit(out, func(w io.Writer) {
		if len(out.Changed) == 0 {
			fmt.Fprintf(w, "tenant %s: nothing changed\n", c.ID)
		} else {
			fmt.Fprintf(w, "tenant %s updated: %s\nstreams: %s\n\n", c.ID, strings.Join(out.Changed, ", "), out.Streams)
		}
		printTenant(w, out.Tenant)
	})
}

// asSets is v with its lists sorted: the same actions or categories in
// another order are the same settings.
func asSets(v tenantView) tenantView {
	v.EnabledActions, v.Categories = slices.Sorted(slices.Values(v.EnabledActions)), slices.Sorted(slices.Values(v.Categories))
	return v
}

// changes names the fields that differ between two views.
func changes(a, b tenantView) []string {
	var out []string
	add := func(name string, x, y any) {
		if fmt.Sprint(x) != fmt.Sprint(y) {
			out = append(out, name)
		}
	}
	add("approval_mode", a.ApprovalMode, b.ApprovalMode)
	add("approval_ttl", a.ApprovalTTLSeconds, b.ApprovalTTLSeconds)
	add("turn_ceiling", a.TurnCeiling, b.TurnCeiling)
	add("catalogue_version", a.CatalogueVersion, b.CatalogueVersion)
	add("enabled_actions", a.EnabledActions, b.EnabledActions)
	add("categories", a.Categories, b.Categories)
	add("model", a.Model, b.Model)
	add("model_options", a.ModelOptions, b.ModelOptions)
	add("daily_token_budget", a.DailyTokenBudget, b.DailyTokenBudget)
	add("quota", a.Quota, b.Quota)
	if out == nil {
		out = []string{}
	}
	return out
}

// tenantDisableCmd and tenantEnableCmd: brainctl tenant disable|enable TENANT.
type tenantDisableCmd struct {
	ID string `arg:"" name:"tenant" help:"Tenant id."`
}

type tenantEnableCmd struct {
	ID string `arg:"" name:"tenant" help:"Tenant id."`
}

func (c *tenantDisableCmd) Run(a *app) error {
	return setStatus(a, c.ID, registry.TenantStatusDisabled)
}
func (c *tenantEnableCmd) Run(a *app) error { return setStatus(a, c.ID, registry.TenantStatusActive) }

type statusResult struct {
	Tenant  string `json:"tenant"`
	Status  string `json:"status"`
	Changed bool   `json:"changed"`
}

func setStatus(a *app, id string, status registry.TenantStatus) error {
	ops, err := a.opsFor(false)
	if err != nil {
		return err
	}
	changed, err := ops.SetTenantStatus(a.ctx, registry.TenantID(id), status)
	if err != nil {
		return tenantError(id, err)
	}
	out := statusResult{Tenant: id, Status: string(status), Changed: changed}
	return a.out.emit(out, func(w io.Writer) {
		switch {
		case !changed:
			fmt.Fprintf(w, "tenant %s was already %s\n", id, status)
		case status == registry.TenantStatusDisabled:
			fmt.Fprintf(w, "tenant %s disabled: brains refuse its turns and API calls within moments; its data, streams and NATS users stay\n", id)
		default:
			fmt.Fprintf(w, "tenant %s enabled: brains serve it again within moments\n", id)
		}
	})
}

// tenantDeleteCmd: brainctl tenant delete TENANT [--force].
type tenantDeleteCmd struct {
	ID          string `arg:"" name:"tenant" help:"Tenant id."`
	Force       bool   `name:"force" help:"Delete even with open work items, pending approvals or undelivered events (they are lost)."`
	Account     string `name:"account" placeholder:"KEY" help:"Only to finish a delete whose registry row is already gone: the account whose streams to delete."`
	SkipStreams bool   `name:"skip-streams" help:"Leave the tenant's streams (delete them later with --account)."`
}

type deleteResult struct {
	provision.DeleteReport
	Work           *provision.Work `json:"work,omitempty"`
	StreamsDeleted []string        `json:"streams_deleted"`
	StreamsLeft    []string        `json:"streams_left,omitempty"`
}

func (c *tenantDeleteCmd) Run(a *app) error {
	id := registry.TenantID(c.ID)
	ops, err := a.opsFor(false)
	if err != nil {
		return err
	}
	var streams *provision.Streams
	if !c.SkipStreams {
		if streams, err = a.streams(); err != nil {
			return tenantError(c.ID, err)
		}
	}
	out := deleteResult{StreamsDeleted: []string{}}
	t, err := ops.Tenant(a.ctx, id)
	gone := errors.Is(err, provision.ErrTenantNotFound)
	if err != nil && !gone {
		return tenantError(c.ID, err)
	}
	var cl provision.Cluster
	account := c.Account
	if gone {
		if cl, err = c.leftoverCluster(a); err != nil {
			return err
		}
	} else {
		if account != "" && account != t.NATSAccount {
			return &Error{Tenant: c.ID, Field: "--account", Message: fmt.Sprintf("the tenant's account is %s, not %s", t.NATSAccount, account)}
		}
		account = t.NATSAccount
		if cl, err = a.clusterOf(t); err != nil {
			return err
		}
		// Disable first, so no new work starts while this looks at what
		// the database holds; restored if the delete is refused.
		wasActive, err := ops.SetTenantStatus(a.ctx, id, registry.TenantStatusDisabled)
		if err != nil {
			return tenantError(c.ID, err)
		}
		w, werr := ops.TenantWork(a.ctx, t, cl)
		if werr == nil {
			out.Work = &w
		}
		open := werr == nil && (w.Open > 0 || w.PendingApprovals > 0 || w.UndeliveredEvents > 0)
		if (open || werr != nil) && !c.Force {
			msg := fmt.Sprintf("refused: %d open work items, %d pending approvals, %d undelivered events would be lost; "+
				"close them first or pass --force", w.Open, w.PendingApprovals, w.UndeliveredEvents)
			if werr != nil {
				msg = fmt.Sprintf("refused: what its database holds cannot be read (%v); pass --force to delete it anyway", werr)
			}
			if wasActive {
				if _, err := ops.SetTenantStatus(a.ctx, id, registry.TenantStatusActive); err != nil {
					msg += fmt.Sprintf(" (and it could not be enabled again: %v; run 'brainctl tenant enable %s')", err, c.ID)
				}
			} else {
				msg += " (it stays disabled, as it was)"
			}
			return &Error{Tenant: c.ID, Field: "--force", Message: msg}
		}
	}
	if account != "" {
		names := []string{subjects.TurnsStream(account), subjects.ResultsStream(account)}
		if streams == nil {
			out.StreamsLeft = names
		} else {
			if err := streams.DeleteTenant(a.ctx, &registry.Tenant{ID: id, NATSAccount: account}); err != nil {
				return &Error{Tenant: c.ID, Field: "streams", Message: fmt.Sprintf("delete the streams: %v (the tenant is disabled; run the delete again)", err)}
			}
			out.StreamsDeleted = names
		}
	}
	rep, err := ops.DeleteTenant(a.ctx, id, cl)
	if err != nil {
		return tenantError(c.ID, err)
	}
	out.DeleteReport = rep
	nothing := gone && len(out.StreamsDeleted) == 0 && !rep.RegistryRow && !rep.DroppedDB && len(rep.Roles) == 0
	return a.out.emit(out, func(w io.Writer) {
		if nothing {
			// Deleting again is not an error (a delete that was interrupted
			// finishes this way), but a mistyped name must not read as done.
			fmt.Fprintf(w, "tenant %s: nothing of it was found (no registry row, database %s on %s, or roles), so nothing was deleted; check the name (brainctl tenant list)\n",
				c.ID, rep.Database, rep.Cluster)
			return
		}
		fmt.Fprintf(w, "tenant %s deleted:\n", c.ID)
		var rows [][]string
		yes := func(b bool) string {
			if b {
				return "removed"
			}
			return "not there"
		}
		if out.Work != nil {
			rows = append(rows, []string{"work at deletion", fmt.Sprintf("%d open items, %d pending approvals, %d undelivered events, %d decisions",
				out.Work.Open, out.Work.PendingApprovals, out.Work.UndeliveredEvents, out.Work.Decisions)})
		}
		rows = append(rows, []string{"streams", listOr(out.StreamsDeleted, "none")})
		if len(out.StreamsLeft) > 0 {
			rows = append(rows, []string{"streams left", strings.Join(out.StreamsLeft, ", ") + " (--skip-streams)"})
		}
		rows = append(rows,
			[]string{"registry row", fmt.Sprintf("%s (%d rules)", yes(rep.RegistryRow), rep.Rules)},
			[]string{"database", rep.Database + " on " + rep.Cluster + ": " + yes(rep.DroppedDB)},
			[]string{"roles", listOr(rep.Roles, "none")},
		)
		table(w, []string{"WHAT", "REMOVED"}, rows)
		fmt.Fprintf(w, "Its NATS account and users are nsc's: revoke and delete them (deploy/README.md, Offboarding).\n")
	})
}

// leftoverCluster is where a half-deleted tenant's database is: the
// registry's cluster unless --cluster names one for --db-host… (the row
// that said so is gone), so only the registry's is assumed.
func (c *tenantDeleteCmd) leftoverCluster(a *app) (provision.Cluster, error) {
	if _, err := a.opsFor(false); err != nil {
		return provision.Cluster{}, err
	}
	return a.ops.RegistryCluster()
}

func listOr(xs []string, none string) string {
	if len(xs) == 0 {
		return none
	}
	return strings.Join(xs, ", ")
}

// tenantListCmd: brainctl tenant list.
type tenantListCmd struct{}

func (c *tenantListCmd) Run(a *app) error {
	ops, err := a.opsFor(false)
	if err != nil {
		return err
	}
	ts, err := ops.Tenants(a.ctx)
	if err != nil {
		return err
	}
	views := make([]tenantView, 0, len(ts))
	for _, t := range ts {
		views = append(views, viewOf(t))
	}
	return a.out.emit(struct {
		Tenants []tenantView `json:"tenants"`
	}{views}, func(w io.Writer) {
		rows := make([][]string, 0, len(views))
		for _, v := range views {
			rows = append(rows, []string{v.ID, v.Status, v.NATSAccount, v.Database + "@" + v.Cluster, strconv.Itoa(v.Rules),
				fmt.Sprintf("%d/%s", v.Quota.Turns, time.Duration(v.Quota.WindowSeconds)*time.Second)})
		}
		table(w, []string{"TENANT", "STATUS", "NATS ACCOUNT", "DATABASE", "RULES", "QUOTA"}, rows)
	})
}

// tenantShowCmd: brainctl tenant show TENANT.
type tenantShowCmd struct {
	ID string `arg:"" name:"tenant" help:"Tenant id."`
}

type showResult struct {
	Tenant tenantView `json:"tenant"`
	// SealedWith says which sealing key opens the tenant's database
	// password (current, previous, unknown), when the key is given.
	SealedWith string    `json:"password_sealed_with,omitempty"`
	Rules      []ruleDoc `json:"rule_list"`
}

func (c *tenantShowCmd) Run(a *app) error {
	ops, err := a.opsFor(false)
	if err != nil {
		return err
	}
	t, err := ops.Tenant(a.ctx, registry.TenantID(c.ID))
	if err != nil {
		return tenantError(c.ID, err)
	}
	out := showResult{Tenant: viewOf(t), Rules: []ruleDoc{}}
	if s, err := a.sealer(); err == nil {
		out.SealedWith = string(s.Which(t.ID, t.DB.PasswordSealed))
	}
	for _, r := range t.Rules {
		conf := r.Confidence
		out.Rules = append(out.Rules, ruleDoc{Name: r.Name, Category: r.Category, Priority: r.Priority, Action: string(r.Action), Confidence: &conf})
	}
	return a.out.emit(out, func(w io.Writer) {
		printTenant(w, out.Tenant)
		if out.SealedWith != "" {
			fmt.Fprintf(w, "password sealed with the %s key\n", out.SealedWith)
		} else {
			fmt.Fprintln(w, "password sealing not checked: give --sealing-key (BRAIN_SEALING_KEY) to see which key opens it")
		}
		if len(t.Rules) > 0 {
			fmt.Fprintln(w)
			rows := make([][]string, 0, len(t.Rules))
			for i, r := range t.Rules {
				rows = append(rows, []string{strconv.Itoa(i + 1), r.Name, r.Category, r.Priority, orDash(string(r.Action)),
					strconv.FormatFloat(r.Confidence, 'f', -1, 64)})
			}
			table(w, []string{"#", "RULE", "CATEGORY", "PRIORITY", "ACTION", "CONFIDENCE"}, rows)
		}
	})
}

type tenantRepairCmd struct {
	ID string `arg:"" name:"tenant" help:"Tenant id."`
}

type repairResult struct {
	Tenant  string `json:"tenant"`
	Cluster string `json:"cluster"`
	Role    string `json:"role"`
}

// Run resets the tenant's app role from the registry (provision
// RepairTenantRoleOn), on the cluster its row names.
func (c *tenantRepairCmd) Run(a *app) error {
	ops, err := a.opsFor(true)
	if err != nil {
		return err
	}
	t, err := ops.Tenant(a.ctx, registry.TenantID(c.ID))
	if err != nil {
		return tenantError(c.ID, err)
	}
	cl, err := a.clusterOf(t)
	if err != nil {
		return err
	}
	if err := ops.RepairTenantRoleOn(a.ctx, t.ID, cl); err != nil {
		return tenantError(c.ID, err)
	}
	out := repairResult{Tenant: c.ID, Cluster: cl.Addr(), Role: t.DB.User}
	return a.out.emit(out, func(w io.Writer) {
		fmt.Fprintf(w, "tenant %s: role %s on %s has its sealed password again, no role settings and its grants; brains log in at their next connection\n",
			out.Tenant, out.Role, out.Cluster)
	})
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
