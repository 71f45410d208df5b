// Command devstack runs the whole system on one machine without Docker, and
// prepares the state of the Docker Compose stack.
//
//	devstack up       Postgres (initialised in .data/pg), embedded NATS in
//	                  operator mode, two brain replicas and client-zero's edge
//	devstack pg-env   start only Postgres and print the test environment
//	devstack init     compose's one-shot init step: NATS identities and
//	                  config, registry and client-zero in Postgres, .creds and
//	                  secrets in the state volume (see devstack.InitOptions)
//	devstack streams  compose's second one-shot step, once NATS runs: every
//	                  tenant's streams and consumer, with the provisioner's .creds
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"n8nbrain/deploy/devstack"
	"n8nbrain/deploy/localpg"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) < 2 {
		usage()
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var err error
	switch os.Args[1] {
	case "init", "streams":
		dir := fs.String("dir", "", "state folder (default $INIT_STATE_DIR, else /state)")
		_ = fs.Parse(os.Args[2:])
		if os.Args[1] == "init" {
			err = devstack.InitFromEnv(ctx, os.Getenv, *dir, os.Stdout, log)
		} else {
			err = devstack.InitStreamsFromEnv(ctx, os.Getenv, *dir, os.Stdout, log)
		}
	default:
		var opts devstack.UpOptions
		fs.StringVar(&opts.Dir, "dir", ".data", "state folder (Postgres data, NATS keys and store, secrets)")
		fs.IntVar(&opts.PGPort, "pg-port", 55432, "Postgres port on 127.0.0.1")
		fs.IntVar(&opts.NATSPort, "nats-port", 4222, "NATS port on 127.0.0.1 (one server)")
		fs.IntVar(&opts.NATSNodes, "nats-nodes", 1, "NATS servers: 1, or 3 for a routed cluster with every stream replicated (R3) on free ports")
		fs.StringVar(&opts.EdgeAddr, "edge-addr", "127.0.0.1:8480", "client-zero edge HTTP address")
		fs.StringVar(&opts.EdgeMetricsAddr, "edge-metrics-addr", "127.0.0.1:8481", "client-zero edge /metrics address (empty: off)")
		fs.StringVar(&opts.OpsAddr, "ops-addr", "127.0.0.1:8490", "brain replica 1 ops endpoints (/metrics)")
		fs.IntVar(&opts.Replicas, "replicas", 2, "brain replicas to run")
		_ = fs.Parse(os.Args[2:])
		if set := localpg.IgnoreLibpqEnv(); len(set) > 0 {
			log.Info("ignoring libpq variables of the environment: the dev stack's cluster and URLs are its own", "variables", set)
		}
		switch os.Args[1] {
		case "up":
			err = devstack.Up(ctx, opts, os.Stdout, log)
		case "pg-env":
			err = devstack.PGEnv(ctx, opts, os.Stdout)
		default:
			usage()
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "devstack:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: devstack up|pg-env [-dir .data] [-pg-port 55432] [-nats-port 4222] [-edge-addr 127.0.0.1:8480]\n"+
		"       [-edge-metrics-addr 127.0.0.1:8481] [-ops-addr 127.0.0.1:8490] [-replicas 2] [-nats-nodes 1|3]\n"+
		"       devstack init [-dir /state]   (configured by INIT_*, BRAIN_*, EDGE_*, REVIEWER_* variables)\n"+
		"       devstack streams [-dir /state]   (after NATS is up: INIT_NATS_URL, INIT_ADMIN_URL)")
	os.Exit(2)
}
