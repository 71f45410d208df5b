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

// Stream, consumer and export names shared by the brain and the account generator.
const (
	TurnsStream   = "TURNS"
	ResultsStream = "RESULTS"
	TurnsConsumer = "brain"

	// APIQueue is the queue group brain replicas share for tenant API requests.
	APIQueue = "brain"
)

// Prefixes of the BRAIN account's exports. Each is followed by the importing
// account's public key (token 3) and then by a subject-specific tail.
const (
	turnPrefix  = "brain.turn."
	replyPrefix = "brain.reply."
	// livePrefix carries replies to tenants live. RESULTS republishes every
	// stored reply from brain.reply.> to brain.live.>, so a live reply
	// always means the reply is already stored and fetchable.
	livePrefix  = "brain.live."
	apiPrefix   = "brain.api."
	eventPrefix = "brain.event."
	// resultPrefix is JetStream's direct-get API on the RESULTS stream, for
	// subjects under brain.reply.<account>.
	resultPrefix = "$JS.API.DIRECT.GET." + ResultsStream + "." + replyPrefix
)

// Export subjects (BRAIN account side), with a wildcard in the account token.
const (
	TurnExport   = turnPrefix + "*.>"
	ReplyExport  = replyPrefix + "*.>"
	LiveExport   = livePrefix + "*.>"
	APIExport    = apiPrefix + "*.>"
	EventExport  = eventPrefix + "*.>"
	ResultExport = resultPrefix + "*.>"

	// TurnsStreamSubject is what the TURNS stream captures.
	TurnsStreamSubject = TurnExport
	// ResultsStreamSubject is what the RESULTS stream captures.
	ResultsStreamSubject = ReplyExport
	// ResultsRePublishSource and ResultsRePublishDest map stored replies to
	// the live subjects tenants import.
	ResultsRePublishSource = replyPrefix + ">"
	ResultsRePublishDest   = livePrefix + ">"
)

// Account token positions (counted from 1, as NATS counts) of each export.
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
)

// Import describes one import a tenant account needs: the BRAIN subject for
// that account and the local subject it is mapped to.
type Import struct {
	Name      string
	Subject   string // with the tenant's account key in the token position
	Local     string
	IsService bool
}

// TenantImports lists every import a tenant account must have, in one place.
func TenantImports(account string) []Import {
	return []Import{
		{Name: "turns", Subject: turnPrefix + account + ".>", Local: LocalTurn + ">", IsService: true},
		{Name: "replies", Subject: livePrefix + account + ".>", Local: LocalReply + ">"},
		{Name: "results", Subject: resultPrefix + account + ".>", Local: LocalResult + ">", IsService: true},
		{Name: "api", Subject: apiPrefix + account + ".>", Local: LocalAPI + ">", IsService: true},
		{Name: "events", Subject: eventPrefix + account + ".>", Local: LocalEvent + ">"},
	}
}

// Export describes one export of the BRAIN account.
type Export struct {
	Name          string
	Subject       string
	TokenPosition uint
	IsService     bool
}

// BrainExports lists every export of the BRAIN account, in one place.
func BrainExports() []Export {
	return []Export{
		{Name: "turns", Subject: TurnExport, TokenPosition: AccountTokenPosition, IsService: true},
		{Name: "replies", Subject: LiveExport, TokenPosition: AccountTokenPosition},
		{Name: "results", Subject: ResultExport, TokenPosition: ResultAccountTokenPosition, IsService: true},
		{Name: "api", Subject: APIExport, TokenPosition: AccountTokenPosition, IsService: true},
		{Name: "events", Subject: EventExport, TokenPosition: AccountTokenPosition},
	}
}

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

// APIQueueSubject is what brain replicas subscribe to for tenant API calls.
func APIQueueSubject() string { return APIExport }

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
