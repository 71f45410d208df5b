// Command turnload is the load client of the CPU benchmark
// (tests/bench_cpu_test.go): it posts new turns to an edge as n8n would,
// from a number of callers, and prints their latencies and throughput as
// one JSON line. With -events it is n8n's events webhook instead: it
// accepts every event the edge delivers, until killed. It runs as its own
// process, so the processes under test are measured without it.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	url := flag.String("url", "", "the edge's base URL")
	token := flag.String("token", "", "the edge's bearer token")
	callers := flag.Int("callers", 1, "callers at once")
	n := flag.Int("n", 1000, "turns in all")
	warmup := flag.Int("warmup", 50, "turns before the measurement, per caller")
	run := flag.String("run", fmt.Sprint(time.Now().UnixNano()), "distinguishes this run's work items")
	events := flag.String("events", "", "serve an events webhook on this address instead")
	flag.Parse()
	if *events != "" {
		// n8n answers 200 once its webhook took the event.
		err := http.ListenAndServe(*events, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusOK)
		}))
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tr := &http.Transport{MaxIdleConns: 4 * *callers, MaxIdleConnsPerHost: 4 * *callers, DisableCompression: true}
	client := &http.Client{Transport: tr, Timeout: time.Minute}
	var seq atomic.Int64
	post := func() (time.Duration, error) {
		id := fmt.Sprintf("<load-%s-%d@customer.example>", *run, seq.Add(1))
		body, _ := json.Marshal(map[string]any{"work_item_id": id, "turn": 1, "email": map[string]string{
			"message_id": id, "from": "Jo Bloggs <jo@customer.example>", "subject": "Quote for a new deck please",
			"body": "Hi, could you quote for a 20m2 hardwood deck? Thanks, Jo"}})
		req, _ := http.NewRequest(http.MethodPost, *url+"/v1/turns", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+*token)
		req.Header.Set("Content-Type", "application/json")
		t0 := time.Now()
		res, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		d := time.Since(t0)
		if res.StatusCode != http.StatusOK || bytes.Contains(b, []byte(`"replayed":true`)) {
			return d, fmt.Errorf("status %d: %s", res.StatusCode, b)
		}
		return d, nil
	}
	var wg sync.WaitGroup
	for range *callers {
		wg.Go(func() {
			for range *warmup {
				if _, err := post(); err != nil {
					fmt.Fprintln(os.Stderr, "warm-up:", err)
					os.Exit(1)
				}
			}
		})
	}
	wg.Wait()
	var mu sync.Mutex
	var lat []time.Duration
	var errs atomic.Int64
	var left atomic.Int64
	left.Store(int64(*n))
	start := time.Now()
	for range *callers {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				d, err := post()
				if err != nil {
					errs.Add(1)
					continue
				}
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lat)
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[max(int(math.Ceil(p*float64(len(lat))))-1, 0)].Nanoseconds()) / 1e3
	}
	_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"turns": len(lat), "errors": errs.Load(), "seconds": elapsed.Seconds(),
		"turns_per_s": float64(len(lat)) / elapsed.Seconds(), "p50_us": pct(0.5), "p90_us": pct(0.9), "p99_us": pct(0.99)})
}
