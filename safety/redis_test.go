package safety

import (
	"context"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/safety/harness"
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
	tg, _ := redisTarget(t, srv.Addr)

	t.Run("NoFault", func(t *testing.T) { testNoFault(t, tg) })
	t.Run("HolderPause", func(t *testing.T) { testHolderPause(t, tg) })
	t.Run("ServerKillRestart", func(t *testing.T) { testRedisServerKill(t, tg, srv) })
	t.Run("ServerPause", func(t *testing.T) { testServerPause(t, tg, srv) })
	t.Run("Partition", func(t *testing.T) { testPartition(t, tg) })
	t.Run("StalledStore", func(t *testing.T) { testRedisStalledServer(t, srv) })
}

// testRedisServerKill kills the server (SIGKILL) in the middle of a mix
// and starts it again at once, as a supervisor would. The testserver's
// Redis keeps no data (no AOF, no RDB), like a cache node: the lock and
// the fence are gone after the restart. Tokens still increase: the next
// one comes from the server's clock (issue 19), later than every token
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
