package brain

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"n8nbrain/wire"
)

// An API reply larger than the server's max_payload reaches the caller as
// an error saying so, at once, instead of no answer until its timeout.
func TestAPIReplyOverMaxPayloadIsAnError(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, MaxPayload: 4096, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(5 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Subscribe("api", func(m *nats.Msg) {
		out := nats.NewMsg(m.Reply)
		out.Header.Set(wire.HeaderStatus, wire.StatusOK)
		out.Data = []byte(`{"approvals":"` + strings.Repeat("x", 8192) + `"}`)
		respondAPI(m, out, slog.New(slog.DiscardHandler))
	}); err != nil {
		t.Fatal(err)
	}
	rep, err := nc.Request("api", []byte(`{}`), 2*time.Second)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	if rep.Header.Get(wire.HeaderStatus) != wire.StatusError || !strings.Contains(string(rep.Data), "larger than the NATS server's max_payload") {
		t.Fatalf("answer %s %s, want an error naming max_payload", rep.Header.Get(wire.HeaderStatus), rep.Data)
	}
}
