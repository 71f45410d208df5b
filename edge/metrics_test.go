package edge

import (
	"log/slog"
	"testing"
)

// The outcome label of a turn comes from what its handler noted, and only
// from the wire package's closed sets of codes and reasons.
func TestTurnOutcomeLabel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		attrs []slog.Attr
		want  string
	}{
		{"Decided", []slog.Attr{slog.String("turn_key", "k"), slog.Bool("replayed", false)}, "decided"},
		{"Replayed", []slog.Attr{slog.Bool("replayed", true)}, "replayed"},
		{"Pending", []slog.Attr{slog.Bool("pending", true)}, "pending"},
		{"Reason", []slog.Attr{slog.String("error_code", "conflict"), slog.String("error_reason", "idempotency_key_reused")}, "idempotency_key_reused"},
		{"CodeOnly", []slog.Attr{slog.String("error_code", "unavailable")}, "unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := turnOutcomeLabel(tc.attrs); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
