package redis_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/redis"
)

// standalone starts a Redis server for t and returns a client of it.
func standalone(t testing.TB) *goredis.Client {
	t.Helper()
	srv := testserver.Redis(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// cluster starts a three-master Redis Cluster for t and returns a client.
func cluster(t testing.TB) *goredis.ClusterClient {
	t.Helper()
	srv := testserver.RedisCluster(t)
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: srv.Addrs})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// uniqueKey is t's name plus random hex, so tests never share a key.
func uniqueKey(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return t.Name() + "-" + hex.EncodeToString(b[:])
}

func newLease(key string, ttl time.Duration) *backend.Lease {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return &backend.Lease{Key: key, Value: hex.EncodeToString(b[:]), TTL: ttl}
}

// waitedCycle takes key through r, has an attempt of another owner
// refused it (as a waiter's first attempt is, which marks the lock as
// waited for: its release sends a notice), and releases it.
func waitedCycle(t testing.TB, r *redis.Resource, key string) {
	t.Helper()
	l := newLease(key, time.Minute)
	mustAcquire(t, r, l)
	if ok, _, err := r.TryAcquire(context.Background(), newLease(key, time.Minute)); ok || err != nil {
		t.Fatalf("TryAcquire(%q) of a held lock = %v, %v; want false, nil", key, ok, err)
	}
	if err := r.Release(context.Background(), l); err != nil {
		t.Fatalf("Release(%q) = %v", key, err)
	}
}

// cleanupCtx is for t.Cleanup: t.Context() is already cancelled there.
func cleanupCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Second)
}

// commandStats returns calls per command from INFO commandstats.
func commandStats(t testing.TB, c *goredis.Client) map[string]int64 {
	t.Helper()
	return commandField(t, c, "calls", "")
}

// commandUsec returns the server time spent per command, in
// microseconds, from INFO commandstats (usec=): a script's EVALSHA
// counts the time of the commands it runs.
func commandUsec(t testing.TB, c *goredis.Client) map[string]int64 {
	t.Helper()
	return commandField(t, c, "usec", "")
}

// statsDelta is after - before, without INFO itself and zero entries.
func statsDelta(before, after map[string]int64) map[string]int64 {
	d := make(map[string]int64)
	for k, v := range after {
		if k == "info" {
			continue
		}
		if n := v - before[k]; n != 0 {
			d[k] = n
		}
	}
	return d
}

// waitFor polls cond every few ms until it holds or 10s pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// commandRejections returns rejected_calls per command from INFO
// commandstats, keyed "name.rejected".
func commandRejections(t testing.TB, c *goredis.Client) map[string]int64 {
	t.Helper()
	return commandField(t, c, "rejected_calls", ".rejected")
}

// commandField returns field's value per command from INFO commandstats,
// keyed by the command's name plus suffix.
func commandField(t testing.TB, c *goredis.Client, field, suffix string) map[string]int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	m := make(map[string]int64)
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for f := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(f, field+"="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("INFO commandstats line %q: %v", line, err)
				}
				m[strings.TrimPrefix(name, "cmdstat_")+suffix] = n
			}
		}
	}
	return m
}

// testSeed returns the seed of a randomized test: $DISTLOCK_TEST_SEED
// when set, else the time; it logs it, so that a failure can be rerun.
func testSeed(t testing.TB) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("DISTLOCK_TEST_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("seed %d (DISTLOCK_TEST_SEED=%d reruns it)", seed, seed)
	return seed
}
