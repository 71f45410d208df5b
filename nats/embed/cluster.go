package embed

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Cluster is one embedded server or several routed into a NATS cluster, all
// in operator mode with the same accounts: the development stack and the
// tests run either. A node can be killed and restarted on its own ports and
// store, as an operator would restart a failed server.
type Cluster struct {
	mu    sync.Mutex
	cfgs  []Config
	nodes []*Server // nil while a node is down
}

// StartCluster starts n servers (n = 1: a single server, no cluster) from
// base, each with its own store under base.StoreDir, and waits until every
// one accepts connections. With n > 1 every node routes to every other.
func StartCluster(base Config, n int) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("embedded nats: %d nodes", n)
	}
	if n == 1 {
		srv, err := Start(base)
		if err != nil {
			return nil, err
		}
		// Restart on the same port.
		base.Port = srv.Addr().(*net.TCPAddr).Port
		return &Cluster{cfgs: []Config{base}, nodes: []*Server{srv}}, nil
	}
	host := base.Host
	if host == "" {
		host = "127.0.0.1"
	}
	ports, err := freePorts(host, 2*n)
	if err != nil {
		return nil, err
	}
	c := &Cluster{cfgs: make([]Config, n), nodes: make([]*Server, n)}
	for i := range n {
		cfg := base
		cfg.Host = host
		cfg.Port = ports[i]
		cfg.Name = fmt.Sprintf("brain-nats-%d", i+1)
		cfg.StoreDir = filepath.Join(base.StoreDir, cfg.Name)
		cfg.Cluster = ClusterConfig{Name: "brain-nats", Port: ports[n+i]}
		for j := range n {
			if j != i {
				cfg.Cluster.Routes = append(cfg.Cluster.Routes, "nats-route://"+net.JoinHostPort(host, strconv.Itoa(ports[n+j])))
			}
		}
		c.cfgs[i] = cfg
	}
	// Every node at once: a clustered JetStream waits for its peers.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { c.nodes[i], errs[i] = Start(c.cfgs[i]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func freePorts(host string, n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// ClientURL lists every node's client URL, comma-separated (as nats.Connect
// takes them): a client reconnects to another node when its own goes.
func (c *Cluster) ClientURL() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	urls := make([]string, len(c.cfgs))
	for i, cfg := range c.cfgs {
		urls[i] = "nats://" + net.JoinHostPort(hostOr(cfg.Host), strconv.Itoa(cfg.Port))
	}
	return strings.Join(urls, ",")
}

func hostOr(h string) string {
	if h == "" {
		return "127.0.0.1"
	}
	return h
}

// Size is the number of nodes.
func (c *Cluster) Size() int { return len(c.cfgs) }

// Node returns node i (from 0), nil while it is down.
func (c *Cluster) Node(i int) *Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// PutAccount adds or replaces an account JWT on every running node (and in
// the configuration a restarted node loads).
func (c *Cluster) PutAccount(pub, token string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.cfgs {
		accs := make(map[string]string, len(c.cfgs[i].Accounts)+1)
		for k, v := range c.cfgs[i].Accounts {
			accs[k] = v
		}
		accs[pub] = token
		c.cfgs[i].Accounts = accs
		if srv := c.nodes[i]; srv != nil {
			if err := srv.PutAccount(pub, token); err != nil {
				return fmt.Errorf("node %d: %w", i+1, err)
			}
		}
	}
	return nil
}

// Kill stops node i at once (its store stays). It is the server's Shutdown,
// what nats-server does on SIGTERM: the node's file stores flush and write
// their state first, so it is not a crash; none can be had in-process.
func (c *Cluster) Kill(i int) {
	c.mu.Lock()
	srv := c.nodes[i]
	c.nodes[i] = nil
	c.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

// Restart starts node i again on its ports and store.
func (c *Cluster) Restart(i int) error {
	c.mu.Lock()
	cfg := c.cfgs[i]
	running := c.nodes[i] != nil
	c.mu.Unlock()
	if running {
		return fmt.Errorf("node %d is running", i+1)
	}
	srv, err := Start(cfg)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.nodes[i] = srv
	c.mu.Unlock()
	return nil
}

// Stop stops every node.
func (c *Cluster) Stop() {
	for i := range c.cfgs {
		c.Kill(i)
	}
}

// WaitReady waits until every running node accepts connections.
func (c *Cluster) WaitReady(d time.Duration) bool {
	for i := range c.cfgs {
		if srv := c.Node(i); srv != nil && !srv.ReadyForConnections(d) {
			return false
		}
	}
	return true
}
