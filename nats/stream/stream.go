// Package stream defines the JetStream streams and the consumer of each
// tenant's durable turn path (DESIGN §3) and creates them idempotently.
//
// Every tenant has its own pair of streams in the STREAMS account, named
// after its NATS account key: TURNS_<account> captures the turns its edge
// publishes through its import, RESULTS_<account> keeps the last reply of
// each turn and republishes it live. A tenant's limits, dedupe window and
// sequence numbers are its own: one tenant filling its stream is refused
// (503/10077 to it alone), and nothing another tenant sees counts or names
// its messages. One durable pull consumer per turn stream is shared by
// every brain replica; its MaxAckPending caps the tenant's turns in flight.
//
// Only provisioning calls EnsureTenant and DeleteTenant, with the STREAMS
// account's provisioner credentials; brain replicas only bind to the
// consumers (their NATS user has no stream or consumer administration).
package stream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/subjects"
)

// Config is what every tenant's streams share. The zero value of a field
// means its default.
type Config struct {
	// Duplicates is the Nats-Msg-Id dedupe window. Default 2m.
	Duplicates time.Duration
	// Replicas of each stream: 1 in development, 3 in production.
	Replicas int
	// Storage: file (default) or memory.
	Memory bool
	// AckWait is how long a replica may hold a turn without a sign of life
	// before JetStream redelivers it to another: the time a turn waits after
	// its replica died. The brain signals progress every third of it while it
	// works and while the turn waits in its queue. Default 5s.
	AckWait time.Duration
	// ResultsMaxBytes bounds each tenant's results stream. Default 16 MiB.
	ResultsMaxBytes int64
}

// Limits are one tenant's bounds (from its registry row).
type Limits struct {
	// MaxMsgs and MaxBytes bound the turns in the tenant's stream, answered
	// or not, within Window: with limits retention a stored turn counts
	// until it is Window old. A publish over either is refused to that
	// tenant only (10077). Defaults 10,000 and 64 MiB.
	MaxMsgs  int64
	MaxBytes int64
	// Window is how long turns and replies are kept (MaxAge): as short as
	// the retry horizon allows, since they hold e-mail content; the tenant
	// database is the durable record. Default 1h.
	Window time.Duration
	// MaxInflight caps the tenant's turns handed to brain replicas and not
	// yet answered, across all replicas (the consumer's MaxAckPending).
	// Default 16.
	MaxInflight int
}

// Defaults of Limits.
const (
	DefaultMaxMsgs     = 10_000
	DefaultMaxBytes    = 64 << 20
	DefaultWindow      = time.Hour
	DefaultMaxInflight = 16
	// MaxTurnMsgSize is the largest stored turn: the tenant account's payload
	// limit (headers included) already refuses more; this is the backstop.
	MaxTurnMsgSize = 256 << 10
)

func (c Config) withDefaults() Config {
	if c.Duplicates == 0 {
		c.Duplicates = 2 * time.Minute
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.AckWait == 0 {
		c.AckWait = 5 * time.Second
	}
	if c.ResultsMaxBytes == 0 {
		c.ResultsMaxBytes = 16 << 20
	}
	return c
}

// WithDefaults returns the limits with zero fields set to their defaults.
func (l Limits) WithDefaults() Limits {
	if l.MaxMsgs == 0 {
		l.MaxMsgs = DefaultMaxMsgs
	}
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.Window == 0 {
		l.Window = DefaultWindow
	}
	if l.MaxInflight == 0 {
		l.MaxInflight = DefaultMaxInflight
	}
	return l
}

func (c Config) storage() jetstream.StorageType {
	if c.Memory {
		return jetstream.MemoryStorage
	}
	return jetstream.FileStorage
}

// Turns is a tenant's turn stream. Limits retention, not WorkQueue: with
// WorkQueue an acked turn is deleted and its dedupe state is gone after a
// server restart (proven in shared/reference/nats-topology), and the
// edge's subject-scoped expectation needs the answered turn's sequence.
// DiscardNew: a full stream refuses new turns (a visible 429 at the edge),
// never drops accepted ones.
func Turns(c Config, account string, l Limits) jetstream.StreamConfig {
	c, l = c.withDefaults(), l.WithDefaults()
	dup := min(c.Duplicates, l.Window)
	return jetstream.StreamConfig{
		Name:        subjects.TurnsStream(account),
		Description: "Turns of one tenant, from its edge through its import.",
		Subjects:    []string{subjects.TurnsStreamSubject(account)},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardNew,
		MaxAge:      l.Window,
		MaxMsgs:     l.MaxMsgs,
		MaxBytes:    l.MaxBytes,
		MaxMsgSize:  MaxTurnMsgSize,
		Duplicates:  dup,
		Storage:     c.storage(),
		Replicas:    c.Replicas,
	}
}

// Results is a tenant's results stream: the last reply of each turn, one
// per subject, readable by the tenant through direct get on its result
// import and republished to brain.live.<account>.<key> for the live path.
func Results(c Config, account string, l Limits) jetstream.StreamConfig {
	c, l = c.withDefaults(), l.WithDefaults()
	return jetstream.StreamConfig{
		Name:              subjects.ResultsStream(account),
		Description:       "The last reply of each turn of one tenant, fetched by its edge when it missed the live reply.",
		Subjects:          []string{subjects.ResultsStreamSubject(account)},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		MaxAge:            l.Window,
		MaxBytes:          c.ResultsMaxBytes,
		MaxMsgsPerSubject: 1,
		MaxMsgSize:        1 << 20,
		AllowDirect:       true,
		// A reply reaches the tenant live only once it is stored: the stream
		// republishes it, so a live reply and a fetchable result never race.
		RePublish: &jetstream.RePublish{Source: subjects.ResultsStreamSubject(account), Destination: subjects.LiveSubjects(account)},
		Storage:   c.storage(),
		Replicas:  c.Replicas,
	}
}

// Consumer is the durable pull consumer all brain replicas share on a
// tenant's turn stream.
func Consumer(c Config, l Limits) jetstream.ConsumerConfig {
	c, l = c.withDefaults(), l.WithDefaults()
	return jetstream.ConsumerConfig{
		Durable:       subjects.TurnsConsumer,
		Description:   "Shared by every brain replica; an unacked turn is redelivered to another.",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    -1, // the brain answers a turn that keeps failing with a typed error instead
		MaxAckPending: l.MaxInflight,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

// EnsureTenant creates or updates a tenant's two streams and its consumer.
// js must be a STREAMS account provisioner's.
func EnsureTenant(ctx context.Context, js jetstream.JetStream, c Config, account string, l Limits) error {
	for _, sc := range []jetstream.StreamConfig{Turns(c, account, l), Results(c, account, l)} {
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("ensure stream %s: %w", sc.Name, err)
		}
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, subjects.TurnsStream(account), Consumer(c, l)); err != nil {
		return fmt.Errorf("ensure consumer %s of %s: %w", subjects.TurnsConsumer, subjects.TurnsStream(account), err)
	}
	return nil
}

// DeleteTenant deletes a tenant's streams (and with them its consumer and
// every turn and reply they held). Deleting what does not exist is no error.
func DeleteTenant(ctx context.Context, js jetstream.JetStream, account string) error {
	for _, name := range []string{subjects.TurnsStream(account), subjects.ResultsStream(account)} {
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("delete stream %s: %w", name, err)
		}
	}
	return nil
}

// AckWaitOrDefault is the consumer's ack wait after defaults.
func (c Config) AckWaitOrDefault() time.Duration { return c.withDefaults().AckWait }

// Schedules is the brain's timer stream (subjects.SchedulesStream): message
// schedules (ADR-51, nats-server 2.12+) on brain.sched.<account>.<kind>.<id>
// that fire, at their time, a message on brain.due.<account>.<kind>.<id>
// for the brain's consumer. One schedule per subject (publishing again
// replaces it); a fired message lives DueTTL. No MaxAge: a schedule waits as
// long as its approval may (up to its TTL). DiscardOld, because schedules
// refuse DiscardNew; MaxBytes bounds it (each brain process keeps one
// schedule per tenant and kind while the tenant has work of that kind
// pending; a fired schedule is removed).
func Schedules(c Config) jetstream.StreamConfig {
	c = c.withDefaults()
	return jetstream.StreamConfig{
		Name:              subjects.SchedulesStream,
		Description:       "The brain's timers: approval expiries and event re-deliveries, fired when due.",
		Subjects:          []string{subjects.ScheduleAll, subjects.DueAll},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		MaxMsgsPerSubject: 1,
		MaxBytes:          1 << 30,
		AllowMsgSchedules: true,
		AllowMsgTTL:       true,
		Storage:           c.storage(),
		Replicas:          c.Replicas,
	}
}

// DueTTL is how long a fired schedule's message stays in the stream.
const DueTTL = time.Hour

// SchedulesConsumer is the durable consumer every brain replica shares on
// the fired messages.
func SchedulesConsumer() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       subjects.TurnsConsumer,
		Description:   "Due timers for every brain replica.",
		FilterSubject: subjects.DueAll,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxDeliver:    -1,
		MaxAckPending: 256,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

// EnsureShared creates or updates what every tenant shares in STREAMS: the
// schedules stream and its consumer.
func EnsureShared(ctx context.Context, js jetstream.JetStream, c Config) error {
	if _, err := js.CreateOrUpdateStream(ctx, Schedules(c)); err != nil {
		return fmt.Errorf("ensure stream %s: %w", subjects.SchedulesStream, err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, subjects.SchedulesStream, SchedulesConsumer()); err != nil {
		return fmt.Errorf("ensure consumer %s of %s: %w", subjects.TurnsConsumer, subjects.SchedulesStream, err)
	}
	return nil
}
