// Package stream defines the JetStream streams and the consumer of the
// durable turn path (DESIGN §3) and creates them idempotently. The brain calls
// Ensure at start; every replica may, concurrently.
package stream

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/subjects"
)

// Config sizes the streams. The zero value of a field means its default.
type Config struct {
	// MaxAge of both streams: as short as the retry horizon allows, because
	// they hold client email content and decisions. The tenant database is
	// the durable record. Default 1h.
	MaxAge time.Duration
	// Duplicates is the Nats-Msg-Id dedupe window. Default 2m.
	Duplicates time.Duration
	// TurnsMaxBytes bounds TURNS; sized for peak rate × MaxAge. Default 1 GiB.
	// When full, new turns are refused (visible 503 at the edge), never
	// dropped silently: discard policy New.
	TurnsMaxBytes int64
	// ResultsMaxBytes bounds RESULTS. Default 1 GiB.
	ResultsMaxBytes int64
	// Replicas of each stream: 1 in development, 3 in production.
	Replicas int
	// Storage: file (default) or memory.
	Memory bool
	// AckWait is how long a replica may hold a turn before JetStream
	// redelivers it to another. Default 30s; the brain extends it with
	// progress acks during long model calls.
	AckWait time.Duration
	// MaxAckPending bounds turns in flight across all replicas. Default 1024.
	MaxAckPending int
}

func (c Config) withDefaults() Config {
	if c.MaxAge == 0 {
		c.MaxAge = time.Hour
	}
	if c.Duplicates == 0 {
		c.Duplicates = 2 * time.Minute
	}
	if c.Duplicates > c.MaxAge {
		c.Duplicates = c.MaxAge
	}
	if c.TurnsMaxBytes == 0 {
		c.TurnsMaxBytes = 1 << 30
	}
	if c.ResultsMaxBytes == 0 {
		c.ResultsMaxBytes = 1 << 30
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 1024
	}
	return c
}

func (c Config) storage() jetstream.StorageType {
	if c.Memory {
		return jetstream.MemoryStorage
	}
	return jetstream.FileStorage
}

// Turns is the TURNS stream: every turn a tenant publishes through its
// import, with the tenant's account key in the subject. Limits retention, not
// WorkQueue: with WorkQueue an acked turn is deleted and its dedupe state is
// gone after a server restart (proven in shared/reference/nats-topology).
func Turns(c Config) jetstream.StreamConfig {
	c = c.withDefaults()
	return jetstream.StreamConfig{
		Name:        subjects.TurnsStream,
		Description: "Turns from tenant edges; subject token 3 is the tenant's NATS account.",
		Subjects:    []string{subjects.TurnsStreamSubject},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardNew,
		MaxAge:      c.MaxAge,
		MaxBytes:    c.TurnsMaxBytes,
		MaxMsgSize:  1 << 20,
		Duplicates:  c.Duplicates,
		Storage:     c.storage(),
		Replicas:    c.Replicas,
	}
}

// Results is the RESULTS stream: the last reply of each turn, one per
// subject, readable by the tenant through direct get on its result import
// and republished to brain.live.<account>.<key> for the live path.
func Results(c Config) jetstream.StreamConfig {
	c = c.withDefaults()
	return jetstream.StreamConfig{
		Name:              subjects.ResultsStream,
		Description:       "The last reply of each turn, fetched by edges that missed the live reply.",
		Subjects:          []string{subjects.ResultsStreamSubject},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		MaxAge:            c.MaxAge,
		MaxBytes:          c.ResultsMaxBytes,
		MaxMsgsPerSubject: 1,
		MaxMsgSize:        1 << 20,
		AllowDirect:       true,
		// A reply reaches the tenant live only once it is stored: the stream
		// republishes it, so a live reply and a fetchable result never race.
		RePublish:  &jetstream.RePublish{Source: subjects.ResultsRePublishSource, Destination: subjects.ResultsRePublishDest},
		Duplicates: c.Duplicates,
		Storage:    c.storage(),
		Replicas:   c.Replicas,
	}
}

// Consumer is the durable pull consumer all brain replicas share.
func Consumer(c Config) jetstream.ConsumerConfig {
	c = c.withDefaults()
	return jetstream.ConsumerConfig{
		Durable:       subjects.TurnsConsumer,
		Description:   "Shared by every brain replica; an unacked turn is redelivered to another.",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    -1, // the brain answers a turn that keeps failing with a typed error instead
		MaxAckPending: c.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

// Ensure creates or updates both streams and the consumer.
func Ensure(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.Consumer, error) {
	for _, sc := range []jetstream.StreamConfig{Turns(c), Results(c)} {
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return nil, fmt.Errorf("ensure stream %s: %w", sc.Name, err)
		}
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, subjects.TurnsStream, Consumer(c))
	if err != nil {
		return nil, fmt.Errorf("ensure consumer %s: %w", subjects.TurnsConsumer, err)
	}
	return cons, nil
}

// AckWaitOrDefault is the consumer's ack wait after defaults.
func (c Config) AckWaitOrDefault() time.Duration { return c.withDefaults().AckWait }
