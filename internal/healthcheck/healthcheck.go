// Package healthcheck is the `healthcheck` subcommand of the service
// binaries. Their images have no shell and no wget, so a container's health
// check runs the binary itself, which asks its own HTTP listener whether the
// process is ready (GET /readyz) and exits 0 or 1.
package healthcheck

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

// Path is the route probed: readiness, not mere liveness, because compose
// starts dependants on "healthy" (service_healthy), and a replica that lost
// NATS cannot serve.
const Path = "/readyz"

// Timeout bounds one probe; compose's own timeout is the outer bound.
const Timeout = 3 * time.Second

// Probe GETs http://addr/readyz, where addr is the address the service
// listens on (a host:port as in BRAIN_OPS_ADDR or EDGE_ADDR); a listener on
// every interface (":8490", "0.0.0.0:8480", "[::]:8480") is asked on
// loopback. It returns nil on 200 and says what was wrong otherwise.
func Probe(ctx context.Context, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	url := "http://" + net.JoinHostPort(host, port) + Path
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s %s", url, resp.Status, body)
	}
	return nil
}

// Main runs the subcommand for a service whose configuration gave addr (or
// failed with cfgErr) and returns the process exit code: 0 ready, 1 not,
// with the reason on stderr, where `docker inspect` shows it.
func Main(addr string, cfgErr error) int {
	err := cfgErr
	if err == nil && addr == "" {
		err = fmt.Errorf("no listen address configured: nothing to probe")
	}
	if err == nil {
		err = Probe(context.Background(), addr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "healthcheck:", err)
		return 1
	}
	return 0
}
