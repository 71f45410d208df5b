package provision

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/nats/stream"
	"n8nbrain/registry"
)

// Streams provisions tenants' JetStream streams and consumers in the STREAMS
// account, with a provisioner user's connection (account.RoleProvisioner).
// Brain replicas cannot: their user has no stream administration rights.
type Streams struct {
	JS jetstream.JetStream
	// Config is what every tenant's streams share (replicas, storage, ack wait).
	Config stream.Config
}

// LimitsOf converts a tenant's registry quota into its streams' limits.
func LimitsOf(q registry.Quota) stream.Limits {
	q = q.WithDefaults()
	return stream.Limits{MaxMsgs: q.Turns, MaxBytes: q.Bytes, Window: q.Window, MaxInflight: q.MaxInflight}
}

// EnsureTenant creates, or brings in line with the registry row, the
// tenant's turn and result streams and its consumer. Safe to repeat.
func (s *Streams) EnsureTenant(ctx context.Context, t *registry.Tenant) error {
	if s == nil || s.JS == nil {
		return errors.New("provision: no NATS provisioner connection to create the tenant's streams with")
	}
	if err := stream.EnsureTenant(ctx, s.JS, s.Config, t.NATSAccount, LimitsOf(t.Quota)); err != nil {
		return fmt.Errorf("tenant %s: %w", t.ID, err)
	}
	return nil
}

// EnsureShared creates, or brings up to date, what every tenant shares in
// the STREAMS account: the brain's schedules stream and its consumer. Safe
// to repeat; provisioning runs it before the first tenant and on migrate.
func (s *Streams) EnsureShared(ctx context.Context) error {
	if s == nil || s.JS == nil {
		return errors.New("provision: no NATS provisioner connection to create the shared streams with")
	}
	return stream.EnsureShared(ctx, s.JS, s.Config)
}

// DeleteTenant deletes the tenant's streams, consumer and everything they
// hold (turns and replies of the last window; the database is the record).
func (s *Streams) DeleteTenant(ctx context.Context, t *registry.Tenant) error {
	if s == nil || s.JS == nil {
		return errors.New("provision: no NATS provisioner connection to delete the tenant's streams with")
	}
	if err := stream.DeleteTenant(ctx, s.JS, t.NATSAccount); err != nil {
		return fmt.Errorf("tenant %s: %w", t.ID, err)
	}
	return nil
}
