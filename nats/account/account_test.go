package account

import (
	"testing"

	"n8nbrain/wire"
)

// What the edge accepts as a tenant API request (wire.MaxAPIBytes) fits
// the tenant account's payload limit with room for the request's headers:
// otherwise the server, not the brain, would refuse it, with no word on why.
func TestTenantPayloadCarriesTheLargestAPIRequest(t *testing.T) {
	if wire.MaxAPIBytes+64<<10 > TenantMaxPayload {
		t.Fatalf("wire.MaxAPIBytes %d leaves under 64 KiB below TenantMaxPayload %d", wire.MaxAPIBytes, TenantMaxPayload)
	}
}
