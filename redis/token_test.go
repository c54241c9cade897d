package redis_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/redis"
)

// grants takes and releases key n times and returns the largest token.
func grants(t *testing.T, r *redis.Resource, key string, n int) uint64 {
	t.Helper()
	var last uint64
	for range n {
		l := newLease(key, time.Minute)
		mustAcquire(t, r, l)
		if l.Token <= last {
			t.Fatalf("token %d after %d; want strictly increasing", l.Token, last)
		}
		last = l.Token
		if err := r.Release(context.Background(), l); err != nil {
			t.Fatal(err)
		}
	}
	return last
}

// serverMicros is the server's clock (TIME) in microseconds.
func serverMicros(t *testing.T, c goredis.UniversalClient) uint64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return uint64(now.UnixMicro())
}

// TestTokenIsServerClock: a token is the server's time in microseconds
// when the fence is behind it, and the last token + 1 when the fence is
// ahead of it (the clock went back, or grants came faster than it ticks).
func TestTokenIsServerClock(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c)
	key := uniqueKey(t)
	before := serverMicros(t, c)
	tok := grants(t, r, key, 1)
	after := serverMicros(t, c)
	if tok < before || tok > after {
		t.Errorf("token %d; want the server's time in µs, in [%d, %d]", tok, before, after)
	}
	_, fence := redisscript.Layout(redis.DefaultPrefix, key)
	ahead := after + uint64(time.Hour/time.Microsecond)
	if err := c.Set(t.Context(), fence, ahead, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got := grants(t, r, key, 1); got != ahead+1 {
		t.Errorf("token with the fence an hour ahead of the clock = %d; want %d (last + 1)", got, ahead+1)
	}
	if got, err := c.Get(t.Context(), fence).Uint64(); err != nil || got != ahead+1 {
		t.Errorf("fence after the grant = %d, %v; want %d, written as an integer", got, err, ahead+1)
	}
}

// TestTokensAfterDataLoss: tokens issued after the dataset is lost
// (FLUSHALL, as a restart without persistence leaves it) or rolled back
// to an earlier snapshot (as a failover to a replica that missed the last
// grants leaves it) are larger than every token issued before.
func TestTokensAfterDataLoss(t *testing.T) {
	t.Run("flushall", func(t *testing.T) {
		c := standalone(t)
		r := newResource(t, c)
		key := uniqueKey(t)
		last := grants(t, r, key, 5)
		if err := c.FlushAll(t.Context()).Err(); err != nil {
			t.Fatal(err)
		}
		l := newLease(key, time.Minute)
		mustAcquire(t, r, l)
		if l.Token <= last {
			t.Errorf("token after FLUSHALL = %d; want > %d, the last before", l.Token, last)
		}
	})
	t.Run("snapshot", func(t *testing.T) {
		srv := testserver.Redis(t)
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = c.Close() })
		r := newResource(t, c)
		key := uniqueKey(t)
		_, fence := redisscript.Layout(redis.DefaultPrefix, key)
		grants(t, r, key, 3)
		// The snapshot: the server loads it again when it restarts.
		if err := c.Save(t.Context()).Err(); err != nil {
			t.Fatal(err)
		}
		snap, err := c.Get(t.Context(), fence).Result()
		if err != nil {
			t.Fatal(err)
		}
		last := grants(t, r, key, 5) // lost with the roll-back
		srv.Kill()
		srv.Start()
		waitFor(t, "the restarted server", func() bool { return c.Ping(context.Background()).Err() == nil })
		if got, err := c.Get(t.Context(), fence).Result(); err != nil || got != snap {
			t.Fatalf("fence after the restart = %q, %v; want %q, the snapshot's (the roll-back did not happen)", got, err, snap)
		}
		l := newLease(key, time.Minute)
		mustAcquire(t, r, l)
		if l.Token <= last {
			t.Errorf("token after the roll-back = %d; want > %d, the last before (the snapshot's fence: %s)", l.Token, last, snap)
		}
	})
}

// prefixKeys counts the keys under prefix (KEYS: a test server of its own).
func prefixKeys(t *testing.T, c goredis.UniversalClient, prefix string) int {
	t.Helper()
	keys, err := c.Keys(context.Background(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

// TestFencesExpire: distinct keys locked and released (or left
// to expire, as by a holder that died) leave nothing in Redis once their
// TTL and the fence's grace have passed: fences (a mutex's, a
// semaphore's, a read/write lock's), tombstones and everything else
// expire, as a job runner that locks job:<id> needs. The tokens of each
// key taken again after its fence expired are larger than every earlier
// one (the hybrid clock). Before, every fence stayed forever: the count
// stayed at one key per lock name.
func TestFencesExpire(t *testing.T) {
	c := standalone(t)
	prefix := "fences-" + uniqueKey(t) + ":"
	r := newResource(t, c, redis.WithPrefix(prefix))
	ctx := t.Context()
	const ttl = 100 * time.Millisecond
	kinds := []struct {
		kind  backend.Kind
		limit int
	}{{backend.KindMutex, 0}, {backend.KindSemaphore, 2}, {backend.KindRead, 0}, {backend.KindWrite, 0}}
	take := func(key string, i int) *backend.Lease {
		k := kinds[i%len(kinds)]
		l := newLease(key, ttl)
		l.Kind, l.Limit = k.kind, int32(k.limit)
		mustAcquire(t, r, l)
		return l
	}
	const n = 400
	last := make([]uint64, n)
	for i := range n {
		key := fmt.Sprintf("job:%d", i)
		for range 2 {
			l := take(key, i)
			if l.Token <= last[i] {
				t.Fatalf("%s: token %d after %d", key, l.Token, last[i])
			}
			last[i] = l.Token
			if i%5 == 0 {
				break // left to expire, as by a holder that died
			}
			if err := r.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := prefixKeys(t, c, prefix); got < n {
		t.Fatalf("%d keys after %d locks; want at least their fences", got, n)
	}
	start := time.Now()
	for prefixKeys(t, c, prefix) != 0 {
		if time.Since(start) > ttl+redisscript.FenceGrace+5*time.Second {
			t.Fatalf("%d keys left %v after the last release; want none after the TTL (%v) and the grace (%v)",
				prefixKeys(t, c, prefix), time.Since(start).Round(time.Millisecond), ttl, redisscript.FenceGrace)
		}
		time.Sleep(50 * time.Millisecond) // a poll with a deadline
	}
	t.Logf("no key left %v after the last release (TTL %v, grace %v)", time.Since(start).Round(time.Millisecond), ttl, redisscript.FenceGrace)
	for i := range n {
		l := take(fmt.Sprintf("job:%d", i), i)
		if l.Token <= last[i] {
			t.Errorf("job:%d: token %d after its fence expired; want above %d, the last before", i, l.Token, last[i])
		}
		if err := r.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFenceOutlivesRenewedLock: a mutex renewed to a longer TTL (Refresh,
// and RefreshAll's batch) keeps its fence alive past the lock, so that
// Inspect still reads the holder's token from it.
func TestFenceOutlivesRenewedLock(t *testing.T) {
	deployments(t, func(t *testing.T, c goredis.UniversalClient) {
		r := newResource(t, c)
		ctx := t.Context()
		for _, batch := range []bool{false, true} {
			key := uniqueKey(t)
			lock, fence := redisscript.Layout(redis.DefaultPrefix, key)
			l := newLease(key, 200*time.Millisecond)
			mustAcquire(t, r, l)
			l.TTL = time.Hour
			var err error
			if batch {
				err = errors.Join(r.RefreshAll(ctx, []*backend.Lease{l})...)
			} else {
				err = r.Refresh(ctx, l)
			}
			if err != nil {
				t.Fatal(err)
			}
			lockLeft, _ := c.PTTL(ctx, lock).Result()
			fenceLeft, _ := c.PTTL(ctx, fence).Result()
			if lockLeft < 59*time.Minute || fenceLeft < lockLeft+redisscript.FenceGrace-time.Second {
				t.Errorf("batch %v: lock lives %v, fence %v; want the fence to outlive the lock by the grace (%v)", batch, lockLeft, fenceLeft, redisscript.FenceGrace)
			}
			in, err := r.Inspect(ctx, key, backend.KindMutex)
			if err != nil || len(in.Holders) != 1 || in.Holders[0].Token != l.Token {
				t.Errorf("Inspect = %+v, %v; want the holder with token %d", in, err, l.Token)
			}
			if err := r.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
	})
}
