package provision

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// Cluster is a Postgres cluster that holds tenant databases, when it is not
// the registry's own: tenants may live on several clusters, each reached by
// the brain at the host and port written into the tenant's registry row.
// The zero Cluster means the registry's cluster (Ops' AdminURL, Host, Port).
type Cluster struct {
	// AdminURL is the bootstrap role's URL there, as the ops tool reaches
	// the cluster (CREATEDB and CREATEROLE, or a superuser).
	AdminURL string
	// Host and Port are how the brain reaches the cluster, written into the
	// registry rows of its tenants. Default: AdminURL's host and port.
	Host string
	Port int
}

// Addr is the cluster's host:port as the brain reaches it, which is how the
// registry rows name it.
func (cl Cluster) Addr() string { return net.JoinHostPort(cl.Host, strconv.Itoa(cl.Port)) }

// WithDefaults fills Host and Port from AdminURL.
func (cl Cluster) WithDefaults() (Cluster, error) {
	if cl.AdminURL == "" {
		return cl, errors.New("provision: Cluster.AdminURL is required")
	}
	cc, err := pgx.ParseConfig(cl.AdminURL)
	if err != nil {
		// The parse error can quote the URL, password included.
		return cl, errors.New("provision: a cluster's admin URL is not a valid Postgres URL")
	}
	if cl.Host == "" {
		cl.Host = cc.Host
	}
	if cl.Port == 0 {
		cl.Port = int(cc.Port)
	}
	return cl, nil
}

// tenantCluster is the cluster a tenant's database is on: cl, or the
// registry's when cl is zero. Names (prefix) and the sealer are Ops'.
func (o *Ops) tenantCluster(cl Cluster) (*cluster, error) {
	if cl.AdminURL == "" {
		return o.cluster()
	}
	cl, err := cl.WithDefaults()
	if err != nil {
		return nil, err
	}
	other := *o
	other.AdminURL, other.Host, other.Port = cl.AdminURL, cl.Host, cl.Port
	c, err := other.cluster()
	if err != nil {
		return nil, fmt.Errorf("tenant cluster %s: %w", cl.Addr(), err)
	}
	return c, nil
}

// RegistryCluster is the registry's own cluster as a Cluster (with Ops'
// defaults applied): where tenants go unless told otherwise.
func (o *Ops) RegistryCluster() (Cluster, error) {
	c, err := o.cluster()
	if err != nil {
		return Cluster{}, err
	}
	return Cluster{AdminURL: o.AdminURL, Host: c.host, Port: c.port}, nil
}
