package edge

import (
	"context"
	"fmt"

	"n8nbrain/nats/connwatch"
	"n8nbrain/wire"
)

// refusalAware is the brain client of an edge whose NATS credential the
// server may refuse (a revoked or expired user or account). Such a refusal
// is not transient: answering it as unavailable (503, Retry-After) would
// have n8n retry for ever. While the server refuses the credential, every
// call answers 403 credential_refused instead, and a call that failed as
// unavailable because of it is answered the same way. The edge stops soon
// after (nats.go gives up after the second refusal; see connwatch).
type refusalAware struct {
	brainClient
	// refused returns the server's refusal since the last (re)connect, or nil.
	refused func() error
}

func (c refusalAware) Submit(ctx context.Context, key string, payload []byte, fp string) (turnOutcome, error) {
	if err := c.refused(); err != nil {
		return turnOutcome{}, credentialRefused(err)
	}
	out, err := c.brainClient.Submit(ctx, key, payload, fp)
	return out, c.check(err)
}

func (c refusalAware) Result(ctx context.Context, key, fp string) (turnOutcome, error) {
	if err := c.refused(); err != nil {
		return turnOutcome{}, credentialRefused(err)
	}
	out, err := c.brainClient.Result(ctx, key, fp)
	return out, c.check(err)
}

func (c refusalAware) Call(ctx context.Context, method string, req any) ([]byte, error) {
	if err := c.refused(); err != nil {
		return nil, credentialRefused(err)
	}
	b, err := c.brainClient.Call(ctx, method, req)
	return b, c.check(err)
}

// check turns an unavailable error into credential_refused when the server
// refused the credential while the call was in flight.
func (c refusalAware) check(err error) error {
	if err == nil || wire.ErrorOf(err).Code != wire.CodeUnavailable {
		return err
	}
	if r := c.refused(); r != nil {
		return credentialRefused(r)
	}
	return err
}

func credentialRefused(cause error) error {
	return &causeError{public: &wire.Error{Code: wire.CodeForbidden, Reason: wire.ReasonCredentialRefused,
		Message: "the NATS server refuses this edge's credential (revoked or expired); retrying will not help: " +
			"an operator must issue the edge new credentials and restart it"}, cause: cause}
}

// natsUnhealthy is the probes' answer when the NATS connection is closed for
// good or its credential refused.
func natsUnhealthy(err error) error {
	reason := wire.ReasonNATSClosed
	if connwatch.IsRefusal(err) {
		reason = wire.ReasonCredentialRefused
	}
	return &wire.Error{Code: wire.CodeUnavailable, Reason: reason, Message: fmt.Sprintf("the edge is not healthy: %v", err)}
}
