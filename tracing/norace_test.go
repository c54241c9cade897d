//go:build !race

package tracing_test

const raceEnabled = false
