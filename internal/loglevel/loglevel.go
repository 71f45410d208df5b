// Package loglevel reads a process's log level from its environment, the
// one setting the brain (BRAIN_LOG_LEVEL) and the edge (EDGE_LOG_LEVEL)
// share: debug, info (the default), warn or error.
package loglevel

import (
	"fmt"
	"log/slog"
	"strings"
)

// Parse returns the level a variable's value names; "" is info.
func Parse(name, value string) (slog.Level, error) {
	var l slog.Level
	if strings.TrimSpace(value) == "" {
		return slog.LevelInfo, nil
	}
	if err := l.UnmarshalText([]byte(strings.TrimSpace(value))); err != nil {
		return 0, fmt.Errorf("%s must be debug, info, warn or error, got %q", name, value)
	}
	return l, nil
}
