package safety

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/safety/harness"
	"github.com/distlock/distlock/safety/history"
)

const redisTTL = 300 * time.Millisecond

// redisTarget is the Redis at addr; direct is a client that bypasses any
// proxy, for the test's own checks. Its workers' fenced writes go to a
// Redis of their own, through redis.Fence: a resource apart from the lock
// service, which the lock server's faults do not touch.
func redisTarget(t testing.TB, addr string) (target, *goredis.Client) {
	direct := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { _ = direct.Close() })
	return target{
		fence:   harness.Fence{Kind: "redis", Addr: testserver.Redis(t).Addr},
		name:    "redis",
		backend: harness.Backend{Kind: "redis", Addrs: []string{addr}, Timeout: redisTTL},
		ttl:     redisTTL,
		expiry:  redisTTL,
		server:  addr,
		via: func(hp string) harness.Backend {
			return harness.Backend{Kind: "redis", Addrs: []string{hp}, Timeout: redisTTL}
		},
		leftovers: func(ctx context.Context, key string) ([]string, error) {
			lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
			n, err := direct.Exists(ctx, lock).Result()
			if err != nil || n == 0 {
				return nil, err
			}
			v, _ := direct.Get(ctx, lock).Result()
			return []string{lock + "=" + v}, nil
		},
	}, direct
}

func TestRedis(t *testing.T) {
	srv := testserver.Redis(t)
	tg, direct := redisTarget(t, srv.Addr)

	t.Run("NoFault", func(t *testing.T) { testNoFault(t, tg) })
	t.Run("HolderPause", func(t *testing.T) { testHolderPause(t, tg) })
	t.Run("ServerKillRestart", func(t *testing.T) { testRedisServerKill(t, tg, srv) })
	t.Run("ServerPause", func(t *testing.T) { testServerPause(t, tg, srv) })
	t.Run("Partition", func(t *testing.T) { testPartition(t, tg) })
	t.Run("StalledStore", func(t *testing.T) { testRedisStalledServer(t, srv) })
	// Fences expire, and tokens go on rising.
	t.Run("FenceExpiry", func(t *testing.T) { testRedisFenceExpiry(t, tg, direct) })
}

// testRedisServerKill kills the server (SIGKILL) in the middle of a mix
// and starts it again at once, as a supervisor would. The testserver's
// Redis keeps no data (no AOF, no RDB), like a cache node: the lock and
// the fence are gone after the restart. Tokens still increase: the next
// one comes from the server's clock, later than every token
// handed out before the crash.
func testRedisServerKill(t *testing.T, tg target, srv *testserver.RedisServer) {
	r := harness.NewRun(t)
	key := uniqueKey(t)
	ws := startMix(r, tg, key, 3)
	waitAcquisitions(t, tg, 10*soak, ws...)
	killAt := r.Note("SIGKILL server")
	srv.Kill()
	srv.Start()
	upAt := r.Note("server restarted")
	waitAcquisitions(t, tg, 15*soak, ws...)
	stopAll(t, tg, ws...)

	evs := r.History()
	res := harness.Check(t, tg.name, "server SIGKILL + restart (no persistence)", evs)
	res.Orphans = orphans(t, tg, key)
	if first, ok := firstAcquisitionAfter(evs, upAt); ok {
		res.Recovery = time.Duration(first.Return - upAt)
	}
	res.Notes = "restart empties Redis, fence included: tokens go on from the server's clock"
	res.Log(t)
	// A holder from before the crash and one after it may both write
	// while they overlap, in token order (stale writes are still
	// refused and asserted below): fencing orders writes, it cannot
	// fence the newer holder's read that came before the older one's
	// last write. Such an overlap across the restart is the data loss
	// itself; any other must still be caught.
	res.Uncaught = slices.DeleteFunc(res.Uncaught, func(o history.Overlap) bool {
		return o.Older.Start <= killAt && o.Newer.Start >= killAt
	})
	assertSafe(t, res)
	if len(res.TokenIssues) != 0 || res.Linearizable != porcupine.Ok {
		t.Errorf("%d token issues, porcupine %v; want 0, Ok (the hybrid clock's tokens never go backwards)", len(res.TokenIssues), res.Linearizable)
	}
	for _, o := range res.Overlaps {
		// Only a holder from before the crash, which learns of the
		// loss at its next renewal, may overlap a holder after it.
		if o.Older.Start > killAt || o.Newer.Start < killAt {
			t.Errorf("overlap not across the restart: %v", o)
		}
	}
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}

// keysOf lists the Redis keys of key's locks under prefix: the lock, its
// fence and every other key in its hash slot's names.
func keysOf(t testing.TB, c *goredis.Client, prefix, key string) []string {
	t.Helper()
	lock, _ := redisscript.Layout(prefix, key)
	keys, err := c.Keys(context.Background(), lock+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// testRedisFenceExpiry: two rounds of workers on one key, with no grant
// between them until every key of the lock has expired (the fence a
// grace, redisscript.FenceGrace, after the last lock): the tokens of the
// second round must be larger than every token of the first (the hybrid
// clock; the token checkers and porcupine look at the whole history), and
// nothing of the lock is left in the end. Then, in this process, 1000
// distinct keys are locked and released, as a job runner that locks
// job:<id> would: their keys must all expire too.
func testRedisFenceExpiry(t *testing.T, tg target, direct *goredis.Client) {
	r := harness.NewRun(t)
	key := uniqueKey(t)
	round := func(n int) {
		ws := startMix(r, tg, key, 2)
		waitAcquisitions(t, tg, n, ws...)
		stopAll(t, tg, ws...)
	}
	round(5 * soak)
	endAt := r.Note("round 1 over")
	if got := keysOf(t, direct, redis.DefaultPrefix, key); len(got) == 0 {
		t.Fatalf("no key of the lock after round 1; want its fence at least")
	}
	waitUntil(t, tg.ttl+redisscript.FenceGrace+10*time.Second, "every key of the lock to expire",
		func() bool { return len(keysOf(t, direct, redis.DefaultPrefix, key)) == 0 })
	goneAt := r.Note("every key of the lock expired")
	round(5 * soak)
	settle := time.Now()
	waitUntil(t, tg.ttl+redisscript.FenceGrace+10*time.Second, "every key of the lock to expire again",
		func() bool { return len(keysOf(t, direct, redis.DefaultPrefix, key)) == 0 })
	settled := time.Since(settle)

	// Distinct keys, in this process.
	prefix := "jobs-" + key + ":"
	jobsRes, err := redis.New(direct, redis.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	d, err := distlock.New(jobsRes, distlock.WithDefaultTTL(tg.ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const jobs = 1000
	for i := range jobs {
		lk, err := d.TryLock(t.Context(), fmt.Sprintf("job:%d", i), 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	count := func() int {
		keys, err := direct.Keys(context.Background(), redisscript.EscapeTag(prefix)+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return len(keys)
	}
	after := count()
	jobsEnd := time.Now()
	waitUntil(t, tg.ttl+redisscript.FenceGrace+10*time.Second, "the jobs' keys to expire", func() bool { return count() == 0 })
	jobsGone := time.Since(jobsEnd)

	evs := r.History()
	var before, next uint64
	for _, e := range evs {
		if e.Kind != history.Acquire || e.Err != "" {
			continue
		}
		if e.Return < endAt {
			before = max(before, e.Token)
		} else if e.Call > goneAt && (next == 0 || e.Token < next) {
			next = e.Token
		}
	}
	res := harness.Check(t, tg.name, fmt.Sprintf("fences expire (TTL + %v grace): no grant until every key of the lock expired, then more grants; %d distinct keys locked and released", redisscript.FenceGrace, jobs), evs)
	res.Orphans = len(keysOf(t, direct, redis.DefaultPrefix, key)) + count()
	res.Notes = fmt.Sprintf("the lock's keys gone %v after round 1; its first token after that %d above round 1's largest (µs of the server's clock); %d keys right after the %d jobs, 0 after %v; the lock's keys gone %v after round 2 (orphans: keys left of both)",
		time.Duration(goneAt-endAt).Round(100*time.Millisecond), int64(next)-int64(before), after, jobs, jobsGone.Round(100*time.Millisecond), settled.Round(100*time.Millisecond))
	res.Log(t)
	assertSafe(t, res)
	assertNoOverlap(t, res)
	if next <= before {
		t.Errorf("first token after the fence expired = %d; want above %d, round 1's largest", next, before)
	}
	if res.Orphans != 0 {
		t.Errorf("%d keys left; want 0", res.Orphans)
	}
}
