package redis_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

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
