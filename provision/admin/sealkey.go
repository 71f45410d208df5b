package admin

import (
	"fmt"
	"io"

	"n8nbrain/provision"
	"n8nbrain/registry"
)

type sealKeyCmd struct {
	New    sealKeyNewCmd    `cmd:"" help:"Print a new random sealing key (64 hex characters)."`
	Rotate sealKeyRotateCmd `cmd:"" help:"Re-seal every tenant's password with BRAIN_SEALING_KEY; BRAIN_SEALING_KEY_PREVIOUS opens the old ones."`
	Check  sealKeyCheckCmd  `cmd:"" help:"Say which key opens each tenant's password; fails until every one opens with BRAIN_SEALING_KEY."`
}

type sealKeyNewCmd struct{}

func (c *sealKeyNewCmd) Run(a *app) error {
	k := registry.NewKey()
	return a.out.emit(struct {
		Key string `json:"key"`
	}{k}, func(w io.Writer) { fmt.Fprintln(w, k) })
}

type sealRow struct {
	Tenant string `json:"tenant"`
	Was    string `json:"was"`
	Now    string `json:"now"`
	Error  *Error `json:"error,omitempty"`
}

type sealKeyRotateCmd struct{}

func (c *sealKeyRotateCmd) Run(a *app) error { return sealing(a, true) }

type sealKeyCheckCmd struct{}

func (c *sealKeyCheckCmd) Run(a *app) error { return sealing(a, false) }

func sealing(a *app, rotate bool) error {
	ops, err := a.opsFor(true)
	if err != nil {
		return err
	}
	var rs []provision.Reseal
	if rotate {
		rs, err = ops.ResealPasswords(a.ctx)
	} else {
		rs, err = ops.Sealings(a.ctx)
	}
	if err != nil {
		return err
	}
	rows := make([]sealRow, 0, len(rs))
	failed := 0
	for _, r := range rs {
		row := sealRow{Tenant: string(r.Tenant), Was: string(r.Was), Now: string(r.Was)}
		if r.Resealed {
			row.Now = string(registry.SealedCurrent)
		}
		if r.Err != nil {
			row.Error = asError(tenantError(string(r.Tenant), r.Err))
			failed++
		} else if row.Now != string(registry.SealedCurrent) {
			row.Error = &Error{Tenant: row.Tenant, Field: "db_password_sealed", Message: "sealed with the previous key: run 'brainctl seal-key rotate'"}
			failed++
		}
		rows = append(rows, row)
	}
	if err := a.out.emit(struct {
		Tenants []sealRow `json:"tenants"`
		Failed  int       `json:"failed"`
	}{rows, failed}, func(w io.Writer) {
		tr := make([][]string, 0, len(rows))
		for _, r := range rows {
			result := "ok"
			if r.Error != nil {
				result = "FAILED: " + r.Error.Message
			}
			tr = append(tr, []string{r.Tenant, r.Was, r.Now, result})
		}
		table(w, []string{"TENANT", "SEALED WITH", "NOW", "RESULT"}, tr)
		if failed == 0 {
			if rotate {
				fmt.Fprintln(w, "every password is sealed with the current key: BRAIN_SEALING_KEY_PREVIOUS may now be removed from the brains")
			} else {
				fmt.Fprintln(w, "every password opens with the current key")
			}
		}
	}); err != nil {
		return err
	}
	if failed > 0 {
		return partialError{failed: failed, total: len(rows)}
	}
	return nil
}
