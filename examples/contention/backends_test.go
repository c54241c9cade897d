package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/distlock/distlock/internal/testserver"
)

// TestBackends runs a small -compare workload on every backend against a
// real server.
func TestBackends(t *testing.T) {
	small := func(backend string) config {
		return config{
			backend: backend, instances: 2, workers: 2, attempts: 4,
			wait: 5 * time.Second, hold: time.Millisecond, ttl: 10 * time.Second,
			spinMin: 10 * time.Millisecond, spinRand: 10 * time.Millisecond,
			compare: true, notify: true, yield: 20 * time.Millisecond, key: "contention-test",
		}
	}
	for _, tc := range []struct {
		backend string
		addrs   func(t *testing.T) addrs
		want    string
	}{
		{"redis", func(t *testing.T) addrs { return addrs{redis: testserver.Redis(t).Addr} }, "SET/success"},
		{"etcd", func(t *testing.T) addrs { return addrs{etcd: strings.Join(testserver.Etcd(t).Endpoints, ",")} }, "remote/success"},
		{"zookeeper", func(t *testing.T) addrs { return addrs{zookeeper: testserver.ZooKeeper(t).Addr} }, "remote/success"},
		{"postgres", func(t *testing.T) addrs { return addrs{postgres: testserver.Postgres(t).DSN} }, "remote/success"},
		{"mysql", func(t *testing.T) addrs { return addrs{mysql: testserver.MariaDB(t).DSN} }, "remote/success"},
	} {
		t.Run(tc.backend, func(t *testing.T) {
			c := small(tc.backend)
			c.addrs = tc.addrs(t)
			var out bytes.Buffer
			if err := run(c, &out, io.Discard); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), tc.want) {
				t.Errorf("output lacks %q:\n%s", tc.want, out.String())
			}
			t.Log("\n" + out.String())
		})
	}
}
