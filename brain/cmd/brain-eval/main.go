// Command brain-eval scores the brain's triage on a labelled set of
// e-mails against an Ollama server, compares reports, and stores a report
// as autonomy evidence. See package n8nbrain/brain/eval.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"n8nbrain/brain/eval"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := eval.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
