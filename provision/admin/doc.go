// Package admin is brainctl, the operators' command for the whole tenant
// lifecycle: the registry, tenants (create, update, disable, enable,
// delete, list, show), their triage rules as reviewed files, schema
// migrations of every database, and sealing-key rotation. It is the
// production program that runs with DDL and role rights (through package
// provision; the dev stack's devstack init/up and brain-eval store use the
// same package with the admin URL) and with the STREAMS provisioner's NATS
// credentials; NATS accounts and users are nsc's (deploy/nsc-*.sh).
//
// The command tree lives here, not in package main, so tests run it
// in-process (Main); provision/cmd/brainctl only hands it the process's
// arguments, environment and standard streams.
package admin
