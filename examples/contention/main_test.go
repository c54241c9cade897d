package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"
)

// A small -compare run on the memory store: both rows, guarded counter equal
// to the successes (run fails otherwise).
func TestCompareMemory(t *testing.T) {
	c := config{
		store: "memory", instances: 2, workers: 2, attempts: 5,
		wait: 5 * time.Second, hold: time.Millisecond, ttl: 10 * time.Second,
		spinMin: 10 * time.Millisecond, spinRand: 10 * time.Millisecond,
		compare: true, notify: true, yield: 20 * time.Millisecond, key: t.Name(),
	}
	var out bytes.Buffer
	if err := run(c, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"hotspot", "off", "on", "remote/success", "hotspot cut remote attempts by"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, c := range []config{
		{store: "memory", instances: 0, workers: 1, attempts: 1, ttl: time.Second},
		{store: "memory", instances: 1, workers: 1, attempts: 1, hold: time.Second, ttl: time.Second},
		{store: "nosuch://x", instances: 1, workers: 1, attempts: 1, ttl: time.Second},
	} {
		if err := run(c, io.Discard, io.Discard); err == nil {
			t.Errorf("run(%+v) = nil; want an error", c)
		}
	}
}
