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
	small := func(store string) config {
		return config{
			store: store, instances: 2, workers: 2, attempts: 4,
			wait: 5 * time.Second, hold: time.Millisecond, ttl: 10 * time.Second,
			spinMin: 10 * time.Millisecond, spinRand: 10 * time.Millisecond,
			compare: true, notify: true, yield: 20 * time.Millisecond, key: "contention-test",
		}
	}
	for _, tc := range []struct {
		name string
		url  func(t *testing.T) string
		want string
	}{
		{"redis", func(t *testing.T) string { return "redis://" + testserver.Redis(t).Addr }, "SET/success"},
		{"redlock", func(t *testing.T) string {
			var urls []string
			for _, n := range testserver.RedisNodes(t, 3) {
				urls = append(urls, "redis://"+n.Addr)
			}
			return "redlock:" + strings.Join(urls, ",")
		}, "remote/success"},
		{"etcd", func(t *testing.T) string {
			return "etcd://" + strings.ReplaceAll(strings.Join(testserver.Etcd(t).Endpoints, ","), "http://", "")
		}, "remote/success"},
		{"zookeeper", func(t *testing.T) string { return "zk://" + testserver.ZooKeeper(t).Addr }, "remote/success"},
		{"postgres", func(t *testing.T) string { return testserver.Postgres(t).DSN }, "remote/success"},
		{"mysql", func(t *testing.T) string { return "mysql://" + testserver.MariaDB(t).DSN }, "remote/success"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := small(tc.url(t))
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
