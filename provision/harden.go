package provision

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// What Postgres lets a login role see and do beyond its grants, and what
// provisioning does about it:
//
//   - Every role may CONNECT to, and create TEMPORARY objects in, the
//     maintenance databases postgres and template1 (PUBLIC holds those
//     privileges by default). RestrictMaintenanceDatabases revokes them from
//     PUBLIC. That changes the cluster's defaults for every role, so it is a
//     step of its own: the compose stack's init runs it on the cluster it
//     owns; in production run it once on a dedicated cluster, after granting
//     CONNECT explicitly to any other role that needs those databases
//     (monitoring, a non-superuser ops role).
//   - Every role may read the catalogs that list the cluster's roles and
//     databases (pg_roles, pg_database, …): tenant ids are in the names.
//     hideCluster revokes PUBLIC's SELECT on those relations in each database
//     provisioning creates (tenant and registry), which only a superuser may
//     (the bootstrap superuser owns the catalogs); with another admin the
//     listings stay visible. What cannot be hidden: functions that answer for
//     a name the caller guesses (has_database_privilege('x', 'CONNECT'),
//     'x'::regrole, pg_stat_get_activity), and the shared catalogs read from
//     a database provisioning did not create.
//   - A role may change its own password and its own role-level settings
//     (ALTER ROLE CURRENT_USER PASSWORD …, … SET …); no privilege governs it
//     and event triggers do not fire for roles. Only the brain logs in as a
//     tenant's role, so only code running in the brain could; if it happens,
//     the brain reports the tenant's login failure by name (its /readyz,
//     brain_tenant_db_login_failing), pins the settings it relies on in the
//     connection's startup parameters (which win over role-level defaults),
//     and RepairTenantRole (brainctl tenant repair) puts the sealed password
//     back and clears the role's settings. Certificate authentication
//     (pg_hba "cert") would make a changed password irrelevant; it is the
//     production recommendation.

// clusterListings are the catalog relations that list every role and
// database of the cluster, or every session in it.
var clusterListings = []string{
	"pg_catalog.pg_database", "pg_catalog.pg_roles", "pg_catalog.pg_user", "pg_catalog.pg_auth_members",
	"pg_catalog.pg_db_role_setting", "pg_catalog.pg_shdescription", "pg_catalog.pg_stat_activity",
	"pg_catalog.pg_stat_database",
}

// isSuperuser reports whether the admin connection's role is a superuser.
func isSuperuser(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var super bool
	err := conn.QueryRow(ctx, `SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user`).Scan(&super)
	if err != nil {
		return false, fmt.Errorf("look up the admin role: %w", err)
	}
	return super, nil
}

// hideCluster revokes PUBLIC's SELECT on clusterListings in the database conn
// is connected to, when the admin is a superuser (see above); it reports
// whether it did.
func hideCluster(ctx context.Context, conn *pgx.Conn) (bool, error) {
	super, err := isSuperuser(ctx, conn)
	if err != nil || !super {
		return false, err
	}
	for _, rel := range clusterListings {
		if _, err := conn.Exec(ctx, `REVOKE SELECT ON `+rel+` FROM PUBLIC`); err != nil {
			return false, fmt.Errorf("hide %s: %w", rel, err)
		}
	}
	return true, nil
}

// MaintenanceDatabases are the databases every role may connect to by
// default; template0 already refuses connections.
var MaintenanceDatabases = []string{"postgres", "template1"}

// RestrictMaintenanceDatabases revokes CONNECT and TEMPORARY on postgres and
// template1 from PUBLIC, so that tenant and registry roles can reach only
// their own database. It changes the cluster's defaults for every role (see
// the top of this file): run it on a cluster provisioning owns. The admin
// must be a superuser or own those databases; a non-superuser admin keeps
// CONNECT on them through an explicit grant.
func (o *Ops) RestrictMaintenanceDatabases(ctx context.Context) error {
	c, err := o.cluster()
	if err != nil {
		return err
	}
	admin, err := c.connect(ctx, "")
	if err != nil {
		return fmt.Errorf("restrict maintenance databases: %w", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	super, err := isSuperuser(ctx, admin)
	if err != nil {
		return err
	}
	for _, db := range MaintenanceDatabases {
		if !super {
			var owns bool
			if err := admin.QueryRow(ctx, `SELECT pg_catalog.pg_get_userbyid(datdba) = current_user FROM pg_catalog.pg_database WHERE datname = $1`,
				db).Scan(&owns); err != nil {
				return fmt.Errorf("restrict %s: %w", db, err)
			}
			if !owns {
				return errors.New("restrict maintenance databases: the admin role is neither a superuser nor the owner of " + db +
					": revoke CONNECT and TEMPORARY on it from PUBLIC as its owner")
			}
			if _, err := admin.Exec(ctx, `GRANT CONNECT ON DATABASE `+ident(db)+` TO CURRENT_USER`); err != nil {
				return fmt.Errorf("restrict %s: keep the admin's CONNECT: %w", db, err)
			}
		}
		if _, err := admin.Exec(ctx, `REVOKE CONNECT, TEMPORARY ON DATABASE `+ident(db)+` FROM PUBLIC`); err != nil {
			return fmt.Errorf("restrict %s: %w", db, err)
		}
	}
	return nil
}
