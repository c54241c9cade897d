//go:build unix

package main

import (
	"testing"
	"time"
)

// TestLossMargin: a twentieth of the TTL, within [10ms, 1s], at most half.
func TestLossMargin(t *testing.T) {
	for ttl, want := range map[time.Duration]time.Duration{10 * time.Second: 500 * time.Millisecond,
		time.Minute: time.Second, 100 * time.Millisecond: 10 * time.Millisecond, 10 * time.Millisecond: 5 * time.Millisecond} {
		if got := lossMargin(ttl); got != want {
			t.Errorf("lossMargin(%v) = %v; want %v", ttl, got, want)
		}
	}
}

// TestListenerSeesConnections: the listener the usage test checks for
// "no connection" does see one when distlock connects.
func TestListenerSeesConnections(t *testing.T) {
	ln := listen(t)
	code, stderr := runDistlock(t, nil, "run", "--store", "redis://"+ln.Addr().String()+"?max_retries=-1", "k", "--", "true")
	if code != exitUnavailable {
		t.Errorf("status %d; want %d (the listener is no Redis); stderr:\n%s", code, exitUnavailable, stderr)
	}
	if n := ln.connections(t); n == 0 {
		t.Error("the listener saw no connection")
	}
}
