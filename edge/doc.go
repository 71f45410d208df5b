// Package edge is the per-tenant HTTP sidecar that runs beside a tenant's n8n.
// It authenticates n8n with a bearer token, validates each turn strictly and
// relays it to the brain over JetStream with the tenant's NATS credential,
// returning the brain's decision, a replay of a stored one, or a 202 with a
// URL to fetch it later; it never holds database credentials.
//
// It also relays the tenant API (approvals and the outcome report) for n8n,
// serves the review page where humans approve, edit or reject what the
// brain proposed (review.go), and delivers the brain's events to n8n's
// webhook, acknowledging each only after n8n accepted it (webhook.go).
package edge
