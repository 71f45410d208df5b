// Package connwatch is what the brain and the edge do alike with their NATS
// connection: reconnect for as long as the server takes to come back, notice
// when the server refuses the credential, and say when the connection is
// closed for good, so the process can stop and be restarted instead of
// living on as a zombie that answers 503 for ever.
//
// nats.go closes a connection for good, whatever MaxReconnects says, when it
// gets the same authorization error twice in a row from a server (a revoked
// or expired user or account, a credential the server does not know) unless
// IgnoreAuthErrorAbort is set, and when the server sends an error that ends
// the connection (a maximum payload or control line violation, an unknown
// protocol error). A revoked user sees "user authentication revoked" when the
// server kicks it, then "authorization violation" on each reconnect: the
// connection closes after the second reconnect attempt, about one
// ReconnectWait (2s by default) after the revocation: the first attempt
// after a disconnect is made at once (see Options).
//
// A rotation (deploy/README.md, section 7) puts a second user's .creds in
// place of the file, then revokes the old user: the server kicks the
// connection and the first reconnect, which reads the file again, is
// accepted as the new user. A refusal is final only when nats.go closes the
// connection; Settled waits for that or for the reconnect.
package connwatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Watch follows one NATS connection. Give Options to nats.Connect.
type Watch struct {
	log    *slog.Logger
	closed chan struct{}

	mu        sync.Mutex
	refused   error         // the server's last refusal of the credential since the last (re)connect
	back      chan struct{} // closed at the reconnect that ends the refusal; nil while none
	closedErr error         // the connection's last error when it closed
}

// New returns a watch that logs to log.
func New(log *slog.Logger) *Watch {
	return &Watch{log: log, closed: make(chan struct{})}
}

// reconnectDelay is the wait before a reconnect attempt: none before the
// first after a disconnect, so a user kicked by its revocation comes back
// at once with the rotated credential (the wait before it would answer
// every request of that window with a refusal); nats.go's default wait and
// jitter before the others, so a server that is down is not hammered.
func reconnectDelay(attempt int) time.Duration {
	if attempt <= 1 {
		return 0
	}
	return nats.DefaultReconnectWait + rand.N(nats.DefaultReconnectJitter)
}

// Options are the connection's reconnect policy and handlers: unlimited
// reconnects (a server that is down is transient), and handlers that log
// disconnects, reconnects and asynchronous errors and record refusals and
// the final close. They set every handler nats.go has for these events, so
// they must not be combined with other handlers of the same kind.
func (w *Watch) Options() []nats.Option {
	return []nats.Option{
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(reconnectDelay),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil is the process's own close or drain
				w.log.Warn("nats disconnected", "error", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			w.mu.Lock()
			w.refused = nil
			if w.back != nil {
				close(w.back)
				w.back = nil
			}
			w.mu.Unlock()
			w.log.Info("nats reconnected", "url", c.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if IsRefusal(err) {
				w.mu.Lock()
				w.refused = err
				if w.back == nil {
					w.back = make(chan struct{})
				}
				w.mu.Unlock()
				w.log.Error("nats refused this process's credential; it will stop unless the server accepts it on the next reconnect",
					"error", err)
				return
			}
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			var netErr net.Error
			if sub == nil && (errors.As(err, &netErr) || errors.Is(err, io.EOF)) {
				// The server went away (a restart): the disconnect is logged
				// too, and the client reconnects by itself.
				w.log.Warn("nats connection lost", "error", err)
				return
			}
			w.log.Error("nats async error", "subject", subject, "error", err)
		}),
		nats.ClosedHandler(func(c *nats.Conn) {
			w.mu.Lock()
			if err := c.LastError(); err != nil {
				w.closedErr = err
			}
			w.mu.Unlock()
			close(w.closed)
		}),
	}
}

// IsRefusal reports whether err is the server refusing the credential:
// authorization violation, user or account authentication expired, user
// authentication revoked. None of them mends by itself: only a credential
// file rewritten before the next reconnect does.
func IsRefusal(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired)
}

// Closed is closed when the connection is closed, for good or by the process.
func (w *Watch) Closed() <-chan struct{} { return w.closed }

// Refused returns the server's refusal of the credential, if the server
// refused it since the last successful (re)connect; nil otherwise.
func (w *Watch) Refused() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.refused
}

// Settled waits, at most limit, while the server refuses the credential and
// nats.go is still trying again. It returns nil at once when there is no
// refusal (without a timer: it is on every request's path), or once the
// connection is back (a rotated credential); the closed-for-good error once
// nats.go gives up; the refusal if ctx ends or limit passes first.
func (w *Watch) Settled(ctx context.Context, limit time.Duration) error {
	w.mu.Lock()
	refused, back := w.refused, w.back
	w.mu.Unlock()
	if refused == nil {
		return nil
	}
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case <-back:
		return w.Refused()
	case <-w.closed:
		return w.ClosedError()
	case <-ctx.Done():
	case <-timer.C:
	}
	return w.Refused()
}

// Err says what is wrong with the connection for a health check: closed
// (for good, since the process only closes it when it stops), or its
// credential refused. nil while it is connected or reconnecting normally.
func (w *Watch) Err() error {
	select {
	case <-w.closed:
		return w.ClosedError()
	default:
	}
	if err := w.Refused(); err != nil {
		return fmt.Errorf("nats refused the credential: %w", err)
	}
	return nil
}

// ClosedError is the error of a connection that closed for good while the
// process still needed it: what the process stops with.
func (w *Watch) ClosedError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	cause := w.refused
	if cause == nil {
		cause = w.closedErr
	}
	switch {
	case IsRefusal(cause):
		return fmt.Errorf("nats connection closed for good: the server refused the credential (revoked, expired or unknown: issue new credentials): %w", cause)
	case cause != nil:
		return fmt.Errorf("nats connection closed for good: %w", cause)
	}
	return errors.New("nats connection closed for good")
}
