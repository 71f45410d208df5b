// Command ollama-standin is NOT Ollama. It is the offline stand-in that
// deploy/images-local.sh installs as `ollama` in the local image replacing
// ollama/ollama, for machines where neither the image nor any model weights
// can be downloaded. It speaks just enough of Ollama's HTTP API and command
// line for compose's model profiles (cpu, gpu-nvidia, gpu-amd) to run as
// they do with the real image:
//
//	ollama serve        the API on OLLAMA_HOST (the image sets 0.0.0.0:11434)
//	ollama list         the health check: lists the "pulled" models
//	ollama show MODEL   exit 0 when MODEL was pulled
//	ollama pull MODEL   records MODEL as pulled (in $HOME/.ollama, the volume)
//
// It has no model: every /api/chat and /api/generate is answered 503 with an
// error that says so, which the brain reports as model_unavailable and
// escalates, as it does while a real Ollama is still pulling. The commands
// use Ollama's own client package (github.com/ollama/ollama/api), so they
// read OLLAMA_HOST exactly as the real CLI does.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/ollama/ollama/envconfig"
)

// Version is what /api/version reports: the real version the stand-in
// answers for, marked as a stand-in.
const Version = "0.17.4-n8nbrain-standin"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ollama (n8nbrain stand-in):", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: ollama serve | list | show MODEL | pull MODEL")
	}
	if args[0] == "serve" {
		home, err := os.UserHomeDir()
		if err != nil {
			return err
		}
		return serve(ctx, envconfig.Host().Host, filepath.Join(home, ".ollama", "standin-models"))
	}
	client, err := api.ClientFromEnvironment()
	if err != nil {
		return err
	}
	switch {
	case args[0] == "list" && len(args) == 1:
		list, err := client.List(ctx)
		if err != nil {
			return err
		}
		fmt.Println("NAME")
		for _, m := range list.Models {
			fmt.Println(m.Name)
		}
		return nil
	case args[0] == "show" && len(args) == 2:
		_, err := client.Show(ctx, &api.ShowRequest{Model: args[1]})
		return err
	case args[0] == "pull" && len(args) == 2:
		return client.Pull(ctx, &api.PullRequest{Model: args[1]}, func(p api.ProgressResponse) error {
			fmt.Println(p.Status)
			return nil
		})
	}
	return fmt.Errorf("unknown command %q: usage: ollama serve | list | show MODEL | pull MODEL", args)
}

// modelName is what a model reference may be here: it becomes a file name.
var modelName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$`)

func serve(ctx context.Context, addr, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := func(model string) string { return filepath.Join(dir, filepath.FromSlash(model)) }
	mux := http.NewServeMux()
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "Ollama is running (n8nbrain stand-in: no model)")
	})
	mux.HandleFunc("GET /api/version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": Version})
	})
	mux.HandleFunc("GET /api/tags", func(w http.ResponseWriter, _ *http.Request) {
		resp := api.ListResponse{Models: []api.ListModelResponse{}}
		err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			name, err := filepath.Rel(dir, p)
			resp.Models = append(resp.Models, api.ListModelResponse{Name: filepath.ToSlash(name), Model: filepath.ToSlash(name)})
			return err
		})
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
			return
		}
		sort.Slice(resp.Models, func(i, j int) bool { return resp.Models[i].Name < resp.Models[j].Name })
		writeJSON(w, http.StatusOK, resp)
	})
	mux.HandleFunc("POST /api/show", func(w http.ResponseWriter, r *http.Request) {
		model, ok := decodeModel(w, r)
		if !ok {
			return
		}
		if _, err := os.Stat(path(model)); err != nil {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("model '%s' not found", model)})
			return
		}
		writeJSON(w, http.StatusOK, api.ShowResponse{Details: api.ModelDetails{Format: "n8nbrain-standin"}})
	})
	mux.HandleFunc("POST /api/pull", func(w http.ResponseWriter, r *http.Request) {
		model, ok := decodeModel(w, r)
		if !ok {
			return
		}
		p := path(model)
		err := os.MkdirAll(filepath.Dir(p), 0o755)
		if err == nil {
			err = os.WriteFile(p, []byte("n8nbrain stand-in: no weights\n"), 0o644)
		}
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, api.ProgressResponse{Status: "success"})
	})
	noModel := func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{
			"error": "n8nbrain ollama stand-in: there is no model here (offline local images); use ollama/ollama for a real model",
		})
	}
	mux.HandleFunc("POST /api/chat", noModel)
	mux.HandleFunc("POST /api/generate", noModel)
	// One line per request (no bodies): what reached the stand-in is visible
	// in `docker compose logs`.
	logged := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		mux.ServeHTTP(rec, r)
		slog.Info("request", "method", r.Method, "path", r.URL.Path, "status", rec.status)
	})
	srv := &http.Server{Addr: addr, Handler: logged, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	slog.Info("ollama stand-in listening (no model)", "addr", addr)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		return srv.Shutdown(shutdown)
	}
}

// decodeModel reads the model named by a small JSON body (show, pull:
// "model", or "name" from older clients), or answers 400.
func decodeModel(w http.ResponseWriter, r *http.Request) (string, bool) {
	var req struct {
		Model string `json:"model"`
		Name  string `json:"name"`
	}
	err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req)
	if req.Model == "" {
		req.Model = req.Name
	}
	if err == nil && (!modelName.MatchString(req.Model) || strings.Contains(req.Model, "..")) {
		err = fmt.Errorf("invalid model name %q", req.Model)
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return "", false
	}
	return req.Model, true
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
