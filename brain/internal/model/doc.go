// Package model is the brain's one client of the model server (Ollama). It
// wraps github.com/ollama/ollama/api with our own http.Client, a bounded
// timeout per call, at most one retry (transport errors and 5xx only), and a
// circuit breaker (github.com/sony/gobreaker/v2) that stops calling a server
// that keeps failing, answers its caller cannot use included. It knows
// nothing of prompts, tenants or the catalogue: it sends a chat and reports
// what every HTTP call cost (token counts clamped), the failed ones included.
package model
