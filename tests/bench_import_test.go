package tests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"n8nbrain/nats/account"
	"n8nbrain/subjects"
)

// BenchmarkImportCost is what the account topology costs one JetStream
// publish: the tenant's publish through its service import into its TURNS
// stream in the STREAMS account (the JetStream floor, with the edge's
// headers), against the same publish by a user of the STREAMS account
// itself, which crosses no account. One caller (p50) and 16 callers
// (publishes/s), in interleaved rounds. A diagnostic for issue 13's question
// of the topology, not a shape the system may run: no runtime user connects
// to STREAMS.
func BenchmarkImportCost(b *testing.B) {
	bs := newBenchStack(b)
	creds, err := account.UserCreds(bs.s.stack.StreamsAccount, "bench-direct", account.RoleUnrestricted)
	if err != nil {
		b.Fatal(err)
	}
	credsFile := filepath.Join(b.TempDir(), "direct.creds")
	if err := os.WriteFile(credsFile, creds, 0o600); err != nil {
		b.Fatal(err)
	}
	dnc, err := nats.Connect(bs.s.stack.NATS.ClientURL(), nats.UserCredentials(credsFile))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(dnc.Close)
	djs, err := jetstream.New(dnc)
	if err != nil {
		b.Fatal(err)
	}
	acc := bs.tn.Account.Public
	direct := func(ctx context.Context) (time.Duration, error) {
		id, body := bs.turnBody()
		key := subjects.TurnKey(id, 1)
		msg := &nats.Msg{Subject: subjects.Turn(acc, key), Data: body}
		t0 := time.Now()
		ack, err := djs.PublishMsg(ctx, msg, jetstream.WithMsgID(key+".direct"),
			jetstream.WithExpectLastSequencePerSubject(0), jetstream.WithRetryAttempts(0))
		d := time.Since(t0)
		if err == nil && (ack.Duplicate || ack.Stream != subjects.TurnsStream(acc)) {
			err = fmt.Errorf("unexpected PubAck %+v", ack)
		}
		return d, err
	}
	shapes := []struct {
		name string
		op   op
	}{{"import", bs.jetStreamFloor()}, {"direct", direct}}

	const rounds = 5
	p50, tps := map[string][]float64{}, map[string][]float64{}
	for r := range rounds {
		for _, s := range shapes {
			b.Run(fmt.Sprintf("round%d/%s/1", r+1, s.name), func(b *testing.B) {
				l := measure(b, s.op)
				l.report(b, "")
				p50[s.name] = append(p50[s.name], us(l.pct(0.5)))
			})
			b.Run(fmt.Sprintf("round%d/%s/parallel%d", r+1, s.name, benchConcurrency), func(b *testing.B) {
				l, t := measureParallel(b, s.op)
				l.report(b, "")
				b.ReportMetric(t, "publishes/s")
				tps[s.name] = append(tps[s.name], t)
			})
			bs.purgeTurns(b)
		}
	}
	median := func(v []float64) float64 {
		v = slices.Clone(v)
		slices.Sort(v)
		return v[len(v)/2]
	}
	if len(p50["import"]) == rounds && len(p50["direct"]) == rounds {
		b.Logf("one caller, p50: import %.0f µs, direct %.0f µs: the import costs %.2f× the direct publish",
			median(p50["import"]), median(p50["direct"]), median(p50["import"])/median(p50["direct"]))
		b.Logf("%d callers: import %.0f/s, direct %.0f/s: direct gives %.2f× the publishes/s",
			benchConcurrency, median(tps["import"]), median(tps["direct"]), median(tps["direct"])/median(tps["import"]))
	}
}
