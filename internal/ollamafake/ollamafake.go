// Package ollamafake is an in-process stand-in for an Ollama server, for
// tests: it speaks /api/chat with stream off exactly as Ollama v0.17 answers
// (api.ChatResponse with its metrics), plus /api/version, /api/tags and the
// root heartbeat. Each test scripts the answers with a function that sees
// the decoded request; the server counts calls, can return HTTP errors, and
// can hold a call until the test releases it.
package ollamafake

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
)

// Version is what /api/version reports.
const Version = "0.17.4"

// Reply is a scripted answer to one chat call.
type Reply struct {
	// Content is the assistant message (the model's raw output).
	Content string
	// Status, when not 0 or 200, answers with that HTTP status and Ollama's
	// error body {"error": Error} instead.
	Status int
	Error  string
	// RetryAfter, when set, is sent as the Retry-After header (with Status).
	RetryAfter string
	// PromptTokens and OutputTokens are reported as prompt_eval_count and
	// eval_count; when 0, they are estimated from the text (4 bytes a token).
	PromptTokens int
	OutputTokens int
	// DoneReason defaults to "stop".
	DoneReason string
	// Wait, when not nil, holds the call until it is closed (or the client
	// gives up), then answers as scripted.
	Wait <-chan struct{}
	// Hijack closes the connection without an answer (a transport error).
	Hijack bool
	// Model, when set, is the model the answer names instead of the one
	// asked for (a server or proxy that lies about what answered).
	Model string
}

// ChatFunc scripts the server: it sees each decoded chat request and says
// how to answer it. It may be called concurrently.
type ChatFunc func(req *api.ChatRequest) Reply

// Server is a running fake.
type Server struct {
	srv *httptest.Server

	mu       sync.Mutex
	chat     ChatFunc
	requests []api.ChatRequest
	calls    int
}

// New starts a fake Ollama server, stopped at the end of the test. A nil fn
// answers every chat with an empty JSON object.
func New(t testing.TB, fn ChatFunc) *Server {
	t.Helper()
	if fn == nil {
		fn = func(*api.ChatRequest) Reply { return Reply{Content: "{}"} }
	}
	s := &Server{chat: fn}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/chat", s.handleChat)
	version := func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": Version})
	}
	mux.HandleFunc("GET /api/version", version)
	mux.HandleFunc("HEAD /api/version", version)
	mux.HandleFunc("GET /api/tags", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, api.ListResponse{Models: []api.ListModelResponse{}})
	})
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("Ollama is running"))
	})
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.srv.Close)
	return s
}

// URL is the server's base URL, as BRAIN_OLLAMA_URL takes it.
func (s *Server) URL() string { return s.srv.URL }

// Close stops the server now (a model server that went away); it is also
// stopped at the end of the test.
func (s *Server) Close() { s.srv.Close() }

// SetChatFunc replaces the script (a model that recovers, say).
func (s *Server) SetChatFunc(fn ChatFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.chat = fn
}

// Calls is how many chat requests arrived (answered or not).
func (s *Server) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// Requests returns a copy of every chat request received, in arrival order.
func (s *Server) Requests() []api.ChatRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]api.ChatRequest(nil), s.requests...)
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	var req api.ChatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	s.mu.Lock()
	s.calls++
	s.requests = append(s.requests, req)
	fn := s.chat
	s.mu.Unlock()
	// What the real server refuses, so a client regression shows here.
	switch {
	case req.Model == "":
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "model is required"})
		return
	case req.Stream == nil || *req.Stream:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "ollamafake answers stream:false only"})
		return
	}
	start := time.Now()
	rep := fn(&req)
	if rep.Wait != nil {
		select {
		case <-rep.Wait:
		case <-r.Context().Done():
			return
		}
	}
	if rep.Hijack {
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
				return
			}
		}
		panic(http.ErrAbortHandler)
	}
	if rep.Status != 0 && rep.Status != http.StatusOK {
		msg := rep.Error
		if msg == "" {
			msg = http.StatusText(rep.Status)
		}
		if rep.RetryAfter != "" {
			w.Header().Set("Retry-After", rep.RetryAfter)
		}
		writeJSON(w, rep.Status, map[string]string{"error": msg})
		return
	}
	prompt := rep.PromptTokens
	if prompt == 0 {
		n := 0
		for _, m := range req.Messages {
			n += len(m.Content)
		}
		prompt = n/4 + 1
	}
	out := rep.OutputTokens
	if out == 0 {
		out = len(rep.Content)/4 + 1
	}
	reason := rep.DoneReason
	if reason == "" {
		reason = "stop"
	}
	total := time.Since(start) + time.Millisecond
	model := req.Model
	if rep.Model != "" {
		model = rep.Model
	}
	writeJSON(w, http.StatusOK, api.ChatResponse{
		Model:      model,
		CreatedAt:  time.Now().UTC(),
		Message:    api.Message{Role: "assistant", Content: rep.Content},
		Done:       true,
		DoneReason: reason,
		Metrics: api.Metrics{
			TotalDuration:      total,
			LoadDuration:       total / 10,
			PromptEvalCount:    prompt,
			PromptEvalDuration: total / 3,
			EvalCount:          out,
			EvalDuration:       total / 2,
		},
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
