//go:build race

package tracing_test

// raceEnabled: the race detector changes allocation counts.
const raceEnabled = true
