// Package subjects builds and parses every NATS subject the system uses.
//
// Two views of each subject exist. The BRAIN account sees the full subject,
// with the tenant's account public key in token 3 (written there by the NATS
// server through an export with an account token position). A tenant sees the
// local subject of its import (turn.<key>, reply.<key>, …), without any
// account key: it cannot name another tenant.
//
// This is a leaf package (standard library only) so the brain, the edge and
// the NATS account generator all agree on the same strings.
package subjects

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// The accounts of the system, besides the system account and the tenants.
// A tenant's imports come from both; the brain's from STREAMS.
const (
	// AccountStreams holds the JetStream streams of every tenant (turns and
	// results) and nothing else: no runtime user connects to it. Keeping
	// them out of the brain's own account means no message the brain
	// publishes, nor any answer the server sends to a reply subject the
	// brain chooses, can land in a tenant's stream: the brain reaches them
	// only through imports, whose replies come back mapped.
	AccountStreams = "STREAMS"
	// AccountBrain is the brain replicas' account: no JetStream of its own.
	AccountBrain = "BRAIN"
)

// TurnsConsumer is the durable pull consumer every brain replica shares on
// each tenant's turn stream.
const TurnsConsumer = "brain"

// APIQueue is the queue group brain replicas share for tenant API requests.
const APIQueue = "brain"

// Each tenant has its own pair of streams in the STREAMS account, named
// after its account public key: its own limits, its own Nats-Msg-Id dedupe
// window and its own sequence numbers, so nothing a tenant sees (PubAcks,
// errors, headers) counts or names another tenant's messages.
const (
	turnsStreamPrefix   = "TURNS_"
	resultsStreamPrefix = "RESULTS_"
)

// TurnsStream is the stream of a tenant's turns.
func TurnsStream(account string) string { return turnsStreamPrefix + account }

// ResultsStream is the stream of a tenant's replies, the last one per turn key.
func ResultsStream(account string) string { return resultsStreamPrefix + account }

// SchedulesStream holds the brain's own timers (approval expiries, event
// re-deliveries) as JetStream message schedules: work that becomes due is
// delivered to the brain at its time, so idle tenants cost nothing. Only
// the brain and provisioning reach it; no tenant imports it.
const SchedulesStream = "SCHEDULES"

// Schedule kinds: what becomes due. A tenant has one timer of each kind per
// brain process, its id the process's own (timers of older brains, id
// "next" or an approval id, are handled alike).
const (
	// DueExpiry: the earliest expiry of the tenant's pending approvals.
	DueExpiry = "expiry"
	// DueOutbox: the tenant's next undelivered event's attempt.
	DueOutbox = "outbox"
)

const (
	schedPrefix = "brain.sched."
	duePrefix   = "brain.due."
	// ScheduleAll is every schedule subject: the brain's (private) import.
	ScheduleAll = schedPrefix + ">"
	// DueAll is every subject a schedule fires on: the brain's consumer's filter.
	DueAll = duePrefix + ">"
)

// Schedule is the subject of a schedule: one per subject, so scheduling
// again replaces it.
func Schedule(account, kind, id string) string { return schedPrefix + account + "." + kind + "." + id }

// Due is the subject a schedule fires on.
func Due(account, kind, id string) string { return duePrefix + account + "." + kind + "." + id }

// ParseDue splits brain.due.<account>.<kind>.<id>.
func ParseDue(subject string) (account, kind, id string, err error) {
	rest, ok := strings.CutPrefix(subject, duePrefix)
	parts := strings.Split(rest, ".")
	if !ok || len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return "", "", "", fmt.Errorf("%w: %q is not brain.due.<account>.<kind>.<id>", ErrSubject, subject)
	}
	return parts[0], parts[1], parts[2], nil
}

// AccountOfTurnsStream returns the account of a turn stream's name.
func AccountOfTurnsStream(stream string) (string, bool) {
	return strings.CutPrefix(stream, turnsStreamPrefix)
}

// Prefixes of the subjects. Each is followed by a tenant's account public
// key (token 3) and then by a subject-specific tail.
const (
	turnPrefix  = "brain.turn."
	replyPrefix = "brain.reply."
	// livePrefix carries replies to tenants live. A tenant's RESULTS stream
	// republishes every stored reply from brain.reply.<account>.> to
	// brain.live.<account>.>, so a live reply always means the reply is
	// already stored and fetchable.
	livePrefix  = "brain.live."
	apiPrefix   = "brain.api."
	eventPrefix = "brain.event."
	// directGetPrefix is JetStream's direct-get API; a tenant's result
	// import reads its own RESULTS stream with it.
	directGetPrefix = "$JS.API.DIRECT.GET."
)

// Subjects with a wildcard in the account token: what the exports offer,
// what the API queue subscribes to.
const (
	TurnExport   = turnPrefix + "*.>"
	LiveExport   = livePrefix + "*.>"
	APIExport    = apiPrefix + "*.>"
	EventExport  = eventPrefix + "*.>"
	ResultExport = directGetPrefix + "*." + replyPrefix + "*.>"
	// ReplyAll is every reply subject, the brain's (private) reply import.
	ReplyAll = replyPrefix + ">"
)

// The consumer API and acknowledgements of the turn consumers, exported by
// STREAMS to the BRAIN account only (activation tokens): pull the next
// turns, read the consumer (to bind to it), and acknowledge. Nothing that
// creates, changes or deletes a stream or a consumer.
//
// The BRAIN account imports the two API subjects under StreamsAPIPrefix
// (its own $JS.API would be answered "JetStream not enabled" by the server,
// since the account has none); acknowledgements keep their subjects, which
// are the reply subjects of the messages the brain receives.
const (
	ConsumerNext = "$JS.API.CONSUMER.MSG.NEXT.*." + TurnsConsumer
	ConsumerInfo = "$JS.API.CONSUMER.INFO.*." + TurnsConsumer
	ConsumerAck  = "$JS.ACK.*." + TurnsConsumer + ".>"

	// StreamsAPIPrefix is the brain's JetStream API prefix
	// (jetstream.NewWithAPIPrefix): its imports map it to STREAMS' $JS.API.
	StreamsAPIPrefix  = "streams.api"
	ConsumerNextLocal = StreamsAPIPrefix + ".CONSUMER.MSG.NEXT.*." + TurnsConsumer
	ConsumerInfoLocal = StreamsAPIPrefix + ".CONSUMER.INFO.*." + TurnsConsumer
)

// Account token positions (counted from 1, as NATS counts) of the exports.
const (
	AccountTokenPosition       = 3
	ResultAccountTokenPosition = 8
)

// Local subject prefixes as a tenant sees them through its imports.
const (
	LocalTurn   = "turn."
	LocalReply  = "reply."
	LocalResult = "result."
	LocalAPI    = "api."
	LocalEvent  = "event."
)

// API methods a tenant may call on brain.api.<account>.<method>.
const (
	APIApprovalList   = "approval.list"
	APIApprovalGet    = "approval.get"
	APIApprovalDecide = "approval.decide"
	APIEventAck       = "event.ack"
	APIReport         = "report.outcomes"
	APITenantLimits   = "tenant.limits"
)

// Import describes one import: the exporting account's subject (for a
// tenant, with its account key in the token position), the local subject it
// is mapped to ("" keeps the subject), and which account exports it.
type Import struct {
	Name      string
	From      string // AccountStreams or AccountBrain
	Subject   string
	Local     string
	IsService bool
}

// TenantImports lists every import a tenant account must have, in one place.
func TenantImports(account string) []Import {
	return []Import{
		{Name: "turns", From: AccountStreams, Subject: turnPrefix + account + ".>", Local: LocalTurn + ">", IsService: true},
		{Name: "replies", From: AccountStreams, Subject: livePrefix + account + ".>", Local: LocalReply + ">"},
		{Name: "results", From: AccountStreams, Subject: directGetPrefix + ResultsStream(account) + "." + replyPrefix + account + ".>",
			Local: LocalResult + ">", IsService: true},
		{Name: "api", From: AccountBrain, Subject: apiPrefix + account + ".>", Local: LocalAPI + ">", IsService: true},
		{Name: "events", From: AccountBrain, Subject: eventPrefix + account + ".>", Local: LocalEvent + ">"},
	}
}

// BrainImports lists the BRAIN account's imports from STREAMS, each
// authorised by an activation token (the exports are private).
func BrainImports() []Import {
	return []Import{
		{Name: "turn-next", From: AccountStreams, Subject: ConsumerNext, Local: ConsumerNextLocal, IsService: true},
		{Name: "turn-info", From: AccountStreams, Subject: ConsumerInfo, Local: ConsumerInfoLocal, IsService: true},
		{Name: "turn-ack", From: AccountStreams, Subject: ConsumerAck, IsService: true},
		{Name: "replies", From: AccountStreams, Subject: ReplyAll, IsService: true},
		{Name: "schedules", From: AccountStreams, Subject: ScheduleAll, IsService: true},
	}
}

// Export describes one export. A public export has an account token
// position: the server installs only an import whose token is the importing
// account's own key. A private one needs an activation token from the
// exporting account for each importer.
type Export struct {
	Name          string
	Subject       string
	TokenPosition uint // 0 for a private export
	IsService     bool
	Private       bool
	// Streamed marks a service whose one request gets many responses (a
	// pull request gets every message of its batch and heartbeats).
	Streamed bool
}

// StreamsExports lists every export of the STREAMS account, in one place.
func StreamsExports() []Export {
	return []Export{
		{Name: "turns", Subject: TurnExport, TokenPosition: AccountTokenPosition, IsService: true},
		{Name: "replies", Subject: LiveExport, TokenPosition: AccountTokenPosition},
		{Name: "results", Subject: ResultExport, TokenPosition: ResultAccountTokenPosition, IsService: true},
		{Name: "turn-next", Subject: ConsumerNext, IsService: true, Private: true, Streamed: true},
		{Name: "turn-info", Subject: ConsumerInfo, IsService: true, Private: true},
		{Name: "turn-ack", Subject: ConsumerAck, IsService: true, Private: true},
		{Name: "reply-store", Subject: ReplyAll, IsService: true, Private: true},
		{Name: "schedule-store", Subject: ScheduleAll, IsService: true, Private: true},
	}
}

// BrainExports lists every export of the BRAIN account, in one place.
func BrainExports() []Export {
	return []Export{
		{Name: "api", Subject: APIExport, TokenPosition: AccountTokenPosition, IsService: true},
		{Name: "events", Subject: EventExport, TokenPosition: AccountTokenPosition},
	}
}

// ExportsOf returns the exports of an account (AccountStreams or AccountBrain).
func ExportsOf(acc string) []Export {
	if acc == AccountStreams {
		return StreamsExports()
	}
	return BrainExports()
}

// Stream subjects of a tenant's streams in STREAMS.
func TurnsStreamSubject(account string) string   { return turnPrefix + account + ".>" }
func ResultsStreamSubject(account string) string { return replyPrefix + account + ".>" }
func LiveSubjects(account string) string         { return livePrefix + account + ".>" }

// TurnKey derives the NATS token for a turn from the idempotency key (work
// item id, turn number). Work item ids are arbitrary strings from n8n (e-mail
// message ids contain dots, '@', '<>' and spaces), so the key is a hash: the
// same (work item, turn) always lands on the same subject, and the token is
// always 32 lowercase hex characters, safe in any NATS subject.
func TurnKey(workItemID string, turn int) string {
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(workItemID)))
	h.Write(n[:])
	h.Write([]byte(workItemID))
	binary.BigEndian.PutUint64(n[:], uint64(turn))
	h.Write(n[:])
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// ValidTurnKey reports whether s has the shape TurnKey produces.
func ValidTurnKey(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Turn is the subject a turn arrives on in the BRAIN account.
func Turn(account, key string) string { return turnPrefix + account + "." + key }

// Reply is the subject the brain publishes a turn's answer on (into RESULTS).
func Reply(account, key string) string { return replyPrefix + account + "." + key }

// Live is the subject RESULTS republishes a stored answer on, exported to
// the tenant as reply.<key>.
func Live(account, key string) string { return livePrefix + account + "." + key }

// Event is the subject the brain publishes a tenant event on.
func Event(account, eventID string) string { return eventPrefix + account + "." + eventID }

// APIQueueSubject is every tenant's API subjects (tests stand in for the brain with it).
func APIQueueSubject() string { return APIExport }

// APISubject is one tenant's API subjects, as a brain replica subscribes to them.
func APISubject(account string) string { return apiPrefix + account + ".>" }

// TurnLocal is the subject a tenant's edge publishes a turn on.
func TurnLocal(key string) string { return LocalTurn + key }

// ReplyLocal is the subject a tenant's edge receives a turn's answer on.
func ReplyLocal(key string) string { return LocalReply + key }

// ResultLocal is the subject a tenant's edge requests a stored answer on.
func ResultLocal(key string) string { return LocalResult + key }

// APILocal is the subject a tenant's edge calls an API method on.
func APILocal(method string) string { return LocalAPI + method }

// ErrSubject is returned for a subject that does not have the expected shape.
var ErrSubject = errors.New("malformed subject")

// ParseTurn splits brain.turn.<account>.<key> into its account and key. It
// checks the shape only; the caller checks that the account is a valid
// account public key and known to the registry.
func ParseTurn(subject string) (account, key string, err error) {
	return parseAccountSubject(subject, turnPrefix, true)
}

// ParseAPI splits brain.api.<account>.<method> into its account and method.
func ParseAPI(subject string) (account, method string, err error) {
	return parseAccountSubject(subject, apiPrefix, false)
}

// ParseReply splits brain.reply.<account>.<key>, the subject RESULTS
// stores a reply under, into its account and key.
func ParseReply(subject string) (account, key string, err error) {
	return parseAccountSubject(subject, replyPrefix, true)
}

// ParseReplyLocal returns the key of a tenant-local reply.<key> subject.
func ParseReplyLocal(subject string) (string, error) {
	key, ok := strings.CutPrefix(subject, LocalReply)
	if !ok || !ValidTurnKey(key) {
		return "", fmt.Errorf("%w: %q is not reply.<turn key>", ErrSubject, subject)
	}
	return key, nil
}

func parseAccountSubject(subject, prefix string, isTurn bool) (account, tail string, err error) {
	rest, ok := strings.CutPrefix(subject, prefix)
	if !ok {
		return "", "", fmt.Errorf("%w: %q does not start with %q", ErrSubject, subject, prefix)
	}
	account, tail, ok = strings.Cut(rest, ".")
	if !ok || account == "" || tail == "" {
		return "", "", fmt.Errorf("%w: %q has no account and tail tokens", ErrSubject, subject)
	}
	if isTurn && !ValidTurnKey(tail) {
		return "", "", fmt.Errorf("%w: %q: turn key is not 32 hex characters", ErrSubject, subject)
	}
	return account, tail, nil
}
