package brain

import (
	"testing"
	"time"

	"n8nbrain/brain/internal/turn"
	"n8nbrain/wire"
)

// BenchmarkTurnMetrics is what the metrics cost one turn on the brain's hot
// path: the six stage observations, the backlog gauge and the outcome
// counter of a decided turn (BENCHMARKS.md, "What observability costs").
func BenchmarkTurnMetrics(b *testing.B) {
	in := newInstruments()
	ans := turn.Answer{OK: true, Status: wire.WorkItemStatusAwaitingApproval,
		Timings: turn.Timings{Decide: 80 * time.Microsecond, Commit: 300 * time.Microsecond}}
	for b.Loop() {
		in.observeStage("client-zero", StageQueue, 200*time.Microsecond)
		in.observeStage("client-zero", StageSchedule, 5*time.Microsecond)
		in.backlog.WithLabelValues("client-zero").Set(0)
		in.observeStage("client-zero", StageReply, 150*time.Microsecond)
		in.answered("client-zero", ans)
		in.observeStage("client-zero", StageProcess, 700*time.Microsecond)
	}
}
