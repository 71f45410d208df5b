package loglevel

import (
	"log/slog"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]slog.Level{"": slog.LevelInfo, "debug": slog.LevelDebug, " WARN ": slog.LevelWarn, "error": slog.LevelError} {
		if got, err := Parse("X_LOG_LEVEL", in); err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := Parse("X_LOG_LEVEL", "loud"); err == nil {
		t.Error("Parse accepted loud")
	}
}
