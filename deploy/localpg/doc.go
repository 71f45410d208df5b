// Package localpg runs a local Postgres cluster in a data folder for the dev
// stack and for `make test`: it finds the server binaries, initialises the
// cluster once (scram-sha-256, a random bootstrap password kept in the
// folder), starts it if it is not running and waits until it accepts
// connections. Ensure is idempotent, so every test run and every dev-stack
// start calls it; it is never used in production.
package localpg
