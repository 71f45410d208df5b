// Package eval is the scored evaluation harness of the brain's triage: it
// runs a labelled set of e-mails (set.go; format in README "Evaluating
// the model stage") through the real decision path, the Capture engine
// with the tenant's rules first and then the model stage against an
// Ollama server, and scores what was decided: accuracy per category and
// priority, confusion matrices, action agreement, escalations, the share
// of model answers valid first time, repairs, draft checks (required facts
// present, forbidden facts absent; an optional judge model), tokens,
// latency and cost. Reports are text, JSON and a self-contained HTML page;
// each names the configuration and set it measured, so runs compare
// (Compare) and a stored report is the evidence the autonomy gate
// (registry.Tenant.AutonomyFor, provision.Ops.SetAutonomy) requires.
// brain/cmd/brain-eval is its command.
package eval
