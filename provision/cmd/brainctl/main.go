// Command brainctl operates n8nbrain: the registry, tenants, their rules,
// migrations and sealing-key rotation. It is package admin's command tree
// run with this process's arguments, environment and streams; see
// deploy/README.md for the runbook.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"n8nbrain/provision/admin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := admin.Main(ctx, os.Args[1:], admin.Env{Getenv: os.Getenv, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr})
	stop()
	os.Exit(code)
}
