//go:build nsc

package deploy_test

// realNSC: with -tags nsc the runbook's nsc blocks run the real nsc.
const realNSC = true
