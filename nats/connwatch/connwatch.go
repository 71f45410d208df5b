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
// connection closes after the second reconnect attempt, about two
// ReconnectWaits (2s each by default) after the revocation.
package connwatch

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"
)

// Watch follows one NATS connection. Give Options to nats.Connect.
type Watch struct {
	log    *slog.Logger
	closed chan struct{}

	mu        sync.Mutex
	refused   error // the server's last refusal of the credential since the last (re)connect
	closedErr error // the connection's last error when it closed
}

// New returns a watch that logs to log.
func New(log *slog.Logger) *Watch {
	return &Watch{log: log, closed: make(chan struct{})}
}

// Options are the connection's reconnect policy and handlers: unlimited
// reconnects (a server that is down is transient), and handlers that log
// disconnects, reconnects and asynchronous errors and record refusals and
// the final close. They set every handler nats.go has for these events, so
// they must not be combined with other handlers of the same kind.
func (w *Watch) Options() []nats.Option {
	return []nats.Option{
		nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil is the process's own close or drain
				w.log.Warn("nats disconnected", "error", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			w.mu.Lock()
			w.refused = nil
			w.mu.Unlock()
			w.log.Info("nats reconnected", "url", c.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if IsRefusal(err) {
				w.mu.Lock()
				w.refused = err
				w.mu.Unlock()
				w.log.Error("nats refused this process's credential; it will stop unless the server accepts it on the next reconnect",
					"error", err)
				return
			}
			subject := ""
			if sub != nil {
				subject = sub.Subject
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
// authentication revoked. None of them is transient.
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
