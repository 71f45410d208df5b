package healthcheck

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestProbe(t *testing.T) {
	t.Parallel()
	ready := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != Path {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(`{"status":"ready"}`))
	}))
	t.Cleanup(ready.Close)
	notReady := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"status":"nats RECONNECTING"}`))
	}))
	t.Cleanup(notReady.Close)
	_, readyPort, _ := net.SplitHostPort(ready.Listener.Addr().String())
	// A port that was free a moment ago: nothing listens there.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()

	for _, tc := range []struct {
		name, addr, wantErr string
	}{
		{"Ready", ready.Listener.Addr().String(), ""},
		{"AllInterfacesAskedOnLoopback", ":" + readyPort, ""},
		{"UnspecifiedIPv4AskedOnLoopback", "0.0.0.0:" + readyPort, ""},
		{"NotReady", notReady.Listener.Addr().String(), "503 Service Unavailable {\"status\":\"nats RECONNECTING\"}"},
		{"NothingListening", closed, "connection refused"},
		{"NotAnAddress", "8480", "listen address \"8480\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := Probe(t.Context(), tc.addr)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Probe(%q): %v", tc.addr, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Probe(%q) = %v; want an error containing %q", tc.addr, err, tc.wantErr)
			}
		})
	}
}

func TestMainExitCodes(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(srv.Close)
	if code := Main(srv.Listener.Addr().String(), nil); code != 0 {
		t.Errorf("ready service: exit %d, want 0", code)
	}
	if code := Main("", nil); code != 1 {
		t.Errorf("no address: exit %d, want 1", code)
	}
	if code := Main(srv.Listener.Addr().String(), net.ErrClosed); code != 1 {
		t.Errorf("configuration error: exit %d, want 1", code)
	}
}
