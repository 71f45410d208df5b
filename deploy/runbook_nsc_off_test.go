//go:build !nsc

package deploy_test

// realNSC: without -tags nsc the runbook's nsc blocks are stood in for.
const realNSC = false
