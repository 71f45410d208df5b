package wire

// TenantLimitsRequest asks the brain for the calling tenant's bounds
// (api.tenant.limits). It has no fields: the tenant is the NATS account.
type TenantLimitsRequest struct{}

// TenantLimitsReply is a tenant's bounds on the shared brain, enforced by
// the NATS server on the tenant's own turn stream. The edge names them when
// it refuses a turn over quota.
type TenantLimitsReply struct {
	// MaxTurns and MaxBytes bound the turns in the tenant's stream, answered
	// or not, within WindowSeconds.
	MaxTurns      int64 `json:"max_turns"`
	MaxBytes      int64 `json:"max_bytes"`
	WindowSeconds int64 `json:"window_seconds"`
	// MaxInflight is how many of the tenant's turns brain replicas work on at once.
	MaxInflight int `json:"max_inflight"`
	// MaxTurnBytes is the largest turn a tenant may publish.
	MaxTurnBytes int `json:"max_turn_bytes"`
}
