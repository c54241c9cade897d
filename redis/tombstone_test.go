package redis_test

import (
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/redis"
)

// TestTombstoneHint: an acquire looks for its value's tombstone only while
// a clean-up's hint says one may exist, which a grant learns from a mark
// on the fence (or asks when the lock has no fence); grants in the
// meantime keep the mark. An acquire request of a given-up value that
// arrives after another owner took and released the lock is still refused,
// and takes no token, whether the lock had a fence when the clean-up ran
// or not. Once the hint expires, the next grant clears the mark, and the
// ones after look for nothing.
func TestTombstoneHint(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c)
	ctx := t.Context()
	const ttl = 400 * time.Millisecond
	ms := redisscript.Millis(ttl)

	cycle := func(key, what string) map[string]int64 {
		t.Helper()
		l := newLease(key, time.Minute)
		before := commandStats(t, c)
		mustAcquire(t, r, l)
		d := statsDelta(before, commandStats(t, c))
		if err := r.Release(ctx, l); err != nil {
			t.Fatalf("%s: Release = %v", what, err)
		}
		return d
	}
	lookups := func(d map[string]int64) (pttl, exists int64) { return d["pttl"], d["exists"] }
	fenceOf := func(fence string) int64 {
		t.Helper()
		v, err := c.Get(ctx, fence).Int64()
		if err != nil {
			t.Fatalf("fence %q: %v", fence, err)
		}
		return v
	}
	late := func(lock, fence, value string) {
		t.Helper()
		before, _ := c.Get(ctx, fence).Result()
		err := redisscript.Acquire.Run(ctx, c, []string{lock, fence}, value, ms).Err()
		if !redisscript.IsDead(err) {
			t.Errorf("late acquire of a given-up value after another grant = %v; want the DEAD error", err)
		}
		if exists(t, c, lock) {
			t.Errorf("late acquire left lock %q behind", lock)
		}
		if after, _ := c.Get(ctx, fence).Result(); after != before {
			t.Errorf("fence after the refused acquire = %q; want %q (no token taken)", after, before)
		}
	}

	t.Run("fence", func(t *testing.T) {
		key := uniqueKey(t)
		lock, fence := redisscript.Layout(redis.DefaultPrefix, key)
		if p, e := lookups(cycle(key, "first grant")); p != 1 || e != 0 {
			t.Errorf("first grant of a key: %d PTTL, %d EXISTS; want 1, 0 (no fence: it asks the hint, which is not there)", p, e)
		}
		if p, e := lookups(cycle(key, "second grant")); p != 0 || e != 0 {
			t.Errorf("grant with an unmarked fence: %d PTTL, %d EXISTS; want 0, 0", p, e)
		}
		// A failed attempt of a value is cleaned up: its request is
		// still on its way.
		given := newLease(key, ttl)
		if err := redisscript.Cleanup.Run(ctx, c, []string{lock, fence}, given.Value, ms).Err(); err != nil {
			t.Fatalf("Cleanup: %v", err)
		}
		marked := fenceOf(fence)
		if marked >= 0 {
			t.Fatalf("fence after the clean-up = %d; want its token negated", marked)
		}
		hint := lock + redisscript.DeadHintSuffix
		if pttl := c.PTTL(ctx, hint).Val(); pttl <= 0 || pttl > ttl {
			t.Fatalf("hint PTTL after the clean-up = %v; want in (0, %v]: it lives as long as the tombstone", pttl, ttl)
		}
		// Another owner takes and releases the lock meanwhile: it looks
		// for its tombstone, and keeps the mark.
		if p, e := lookups(cycle(key, "grant while marked")); p != 1 || e != 1 {
			t.Errorf("grant with a marked fence: %d PTTL, %d EXISTS; want 1, 1", p, e)
		}
		if f := fenceOf(fence); f >= 0 || -f <= -marked {
			t.Fatalf("fence after a grant while marked = %d; want a negated token above %d", f, -marked)
		}
		late(lock, fence, given.Value)

		// The hint expires with the tombstone: the next grant clears the
		// mark, and the one after looks for nothing.
		waitFor(t, "the hint to expire", func() bool {
			_, err := c.Get(ctx, hint).Result()
			return errors.Is(err, goredis.Nil)
		})
		if p, e := lookups(cycle(key, "first grant after the hint")); p != 1 || e != 0 {
			t.Errorf("first grant after the hint expired: %d PTTL, %d EXISTS; want 1, 0", p, e)
		}
		if f := fenceOf(fence); f <= 0 {
			t.Errorf("fence after the hint expired = %d; want a token", f)
		}
		if p, e := lookups(cycle(key, "grant after the hint")); p != 0 || e != 0 {
			t.Errorf("grant after the hint expired: %d PTTL, %d EXISTS; want 0, 0", p, e)
		}
	})

	// A clean-up finds no fence (the key was never granted, or its fence
	// expired): the first grant after it marks the fence it makes.
	t.Run("no fence", func(t *testing.T) {
		key := uniqueKey(t)
		lock, fence := redisscript.Layout(redis.DefaultPrefix, key)
		given := newLease(key, ttl)
		if err := redisscript.Cleanup.Run(ctx, c, []string{lock, fence}, given.Value, ms).Err(); err != nil {
			t.Fatalf("Cleanup: %v", err)
		}
		if n := c.Exists(ctx, fence).Val(); n != 0 {
			t.Fatalf("the clean-up made a fence")
		}
		if p, e := lookups(cycle(key, "first grant")); p != 1 || e != 1 {
			t.Errorf("first grant after a clean-up: %d PTTL, %d EXISTS; want 1, 1", p, e)
		}
		if f := fenceOf(fence); f >= 0 {
			t.Fatalf("fence made while the hint lives = %d; want a negated token", f)
		}
		late(lock, fence, given.Value)
	})
}
