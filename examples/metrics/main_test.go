package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestScrape(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`distlock_acquisitions_total{backend="memory",mode="mutex",outcome="acquired"} 41`,
		`distlock_acquisitions_total{backend="memory",mode="mutex",outcome="not_acquired"} 1`,
		`distlock_remote_attempts_total{backend="memory",mode="mutex"} 41`,
		"distlock_wait_duration_seconds_bucket",
		"distlock_hold_duration_seconds_count",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("scrape lacks %q:\n%s", want, out.String())
		}
	}
}
