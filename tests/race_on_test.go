//go:build race

package tests

// raceDetector is whether this test binary was built with -race, which
// slows every component here (the NATS server included) several times.
const raceDetector = true
