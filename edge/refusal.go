package edge

import (
	"context"
	"fmt"
	"time"

	"n8nbrain/nats/connwatch"
	"n8nbrain/wire"
)

// refusalAware is the brain client of an edge whose NATS credential the
// server may refuse (a revoked or expired user or account). A refusal is
// final once nats.go gives up (it tries again at once, and gives up at the
// second refusal, about two seconds later; see connwatch): answering it as
// unavailable (503, Retry-After) would have n8n retry for ever, so a call
// made while the server refuses the credential waits for that, then
// answers 403 credential_refused; the edge stops soon after. But the
// refusal is also how a rotation starts (the old user revoked, the new
// one's .creds already in place): then the reconnect is accepted, and the
// waiting call goes on as the new user instead of failing.
type refusalAware struct {
	brainClient
	// settled waits, at most its second argument, while the server's
	// refusal may still end in a reconnect, and returns the refusal that
	// stands, or nil.
	settled func(context.Context, time.Duration) error
}

// refusalWait bounds the wait for a refusal to settle: nats.go settles it
// in about one ReconnectWait (2s).
const refusalWait = 10 * time.Second

func (c refusalAware) refused(ctx context.Context) error { return c.settled(ctx, refusalWait) }

func (c refusalAware) Submit(ctx context.Context, key string, payload []byte, fp string) (turnOutcome, error) {
	if err := c.refused(ctx); err != nil {
		return turnOutcome{}, credentialRefused(err)
	}
	out, err := c.brainClient.Submit(ctx, key, payload, fp)
	return out, c.check(ctx, err)
}

func (c refusalAware) Result(ctx context.Context, key, fp string) (turnOutcome, error) {
	if err := c.refused(ctx); err != nil {
		return turnOutcome{}, credentialRefused(err)
	}
	out, err := c.brainClient.Result(ctx, key, fp)
	return out, c.check(ctx, err)
}

func (c refusalAware) Call(ctx context.Context, method string, req any) ([]byte, error) {
	if err := c.refused(ctx); err != nil {
		return nil, credentialRefused(err)
	}
	b, err := c.brainClient.Call(ctx, method, req)
	return b, c.check(ctx, err)
}

// check turns an unavailable error into credential_refused when the server
// refused the credential while the call was in flight, for good.
func (c refusalAware) check(ctx context.Context, err error) error {
	if err == nil || wire.ErrorOf(err).Code != wire.CodeUnavailable {
		return err
	}
	if r := c.refused(context.WithoutCancel(ctx)); r != nil {
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
