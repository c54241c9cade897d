package safety

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/redlock"
	"github.com/distlock/distlock/safety/harness"
	"github.com/distlock/distlock/safety/proxy"
)

const redlockTTL = 500 * time.Millisecond

func redlockTarget(t testing.TB, nodes []*testserver.RedisServer) target {
	var addrs []string
	var direct []*goredis.Client
	for _, n := range nodes {
		addrs = append(addrs, n.Addr)
		direct = append(direct, redisVia(t, n.Addr))
	}
	return target{
		name:    "redlock",
		backend: harness.Backend{Kind: "redlock", Addrs: addrs, Timeout: redlockTTL},
		ttl:     redlockTTL,
		expiry:  redlockTTL,
		hold:    100 * time.Millisecond,
		leftovers: func(ctx context.Context, key string) ([]string, error) {
			lock, _ := redisscript.Layout(redlock.DefaultPrefix, key)
			var out []string
			for i, c := range direct {
				n, err := c.Exists(ctx, lock).Result()
				if err != nil {
					continue // a node that is down holds nothing we can see
				}
				if n > 0 {
					out = append(out, fmt.Sprintf("node %d: %s", i, lock))
				}
			}
			return out, nil
		},
	}
}

func TestRedlock(t *testing.T) {
	nodes := testserver.RedisNodes(t, 5)
	tg := redlockTarget(t, nodes)
	t.Run("NoFault", func(t *testing.T) { testNoFault(t, tg) })
	t.Run("TwoOfFiveDown", func(t *testing.T) { testRedlockTwoDown(t, tg, nodes) })
	t.Run("NodeRestartWithoutPersistence", func(t *testing.T) { testRedlockRestart(t, nodes, false) })
	t.Run("NodeRestartKeptOutForTTL", func(t *testing.T) { testRedlockRestart(t, nodes, true) })
}

// testRedlockTwoDown kills two of the five nodes in the middle of a mix:
// a majority (3) still answers, so locks go on; then starts them again,
// empty.
func testRedlockTwoDown(t *testing.T, tg target, nodes []*testserver.RedisServer) {
	r := harness.NewRun(t)
	key := uniqueKey(t)
	ws := startMix(r, tg, key, 3)
	waitAcquisitions(t, tg, 10*soak, ws...)
	downAt := r.Note("SIGKILL nodes 3 and 4")
	nodes[3].Kill()
	nodes[4].Kill()
	waitAcquisitions(t, tg, 10*soak, ws...)
	nodes[3].Start()
	nodes[4].Start()
	r.Note("nodes 3 and 4 restarted, empty")
	waitAcquisitions(t, tg, 10*soak, ws...)
	stopAll(t, tg, ws...)

	evs := r.History()
	res := harness.Check(t, tg.name, "2 of 5 nodes SIGKILLed, then restarted empty", evs)
	res.Orphans = orphans(t, tg, key)
	if first, ok := firstAcquisitionAfter(evs, downAt); ok {
		res.Recovery = time.Duration(first.Return - downAt)
	}
	res.Notes = "no tokens (Redlock): overlaps cannot be fenced; recovery from the kill"
	res.Log(t)
	assertNoOverlap(t, res)
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}

// testRedlockRestart: a takes the lock on a bare majority (nodes 0-2: the
// requests to nodes 3 and 4 are held in a proxy and dropped), node 2 is
// killed and started again without persistence, and b asks for the lock.
// Unless the restarted node is kept out until every lock it held could
// have expired (keptOut: b asks only after a's TTL), b gets a majority
// (nodes 2-4) while a still holds its lock: a double grant that no token
// catches, because Redlock has none.
func testRedlockRestart(t *testing.T, nodes []*testserver.RedisServer, keptOut bool) {
	r := harness.NewRun(t)
	a, b := r.Client("a"), r.Client("b")
	var proxies []*proxy.Proxy
	var viaProxy, direct []goredis.UniversalClient
	for _, n := range nodes {
		p := startProxy(t, n.Addr)
		proxies = append(proxies, p)
		viaProxy = append(viaProxy, redisVia(t, p.Addr))
		direct = append(direct, redisVia(t, n.Addr))
	}
	newLock := func(cs []goredis.UniversalClient) *distlock.DistributeLock {
		res, err := redlock.New(cs)
		if err != nil {
			t.Fatal(err)
		}
		d, err := distlock.New(res, distlock.WithDefaultTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d
	}
	da, db := newLock(viaProxy), newLock(direct)
	ctx := t.Context()
	key := uniqueKey(t)

	proxies[3].Stall(proxy.Up)
	proxies[4].Stall(proxy.Up)
	lka, ownerA, err := a.TryLock(ctx, da, key, 0)
	if err != nil {
		t.Fatalf("a: %v", err)
	}
	for _, p := range proxies[3:] { // the held requests are lost
		p.CloseConns()
		p.Unstall(proxy.Up)
	}
	r.Note("SIGKILL node 2, start it again empty")
	nodes[2].Kill()
	nodes[2].Start()
	fault := "node restarted without persistence, lock on a bare majority"
	if keptOut {
		fault += ", node kept out for a TTL"
		// Keep the node out until a's lock has expired everywhere.
		waitUntil(t, 10*time.Second, "a's lock to end", func() bool {
			select {
			case <-lka.Done():
				return true
			default:
				return false
			}
		})
	}
	lkb, ownerB, errB := b.TryLock(ctx, db, key, 0)
	if errB == nil {
		if err := b.Unlock(ctx, lkb, ownerB); err != nil {
			t.Logf("b's unlock: %v", err)
		}
	}
	uctx, cancel := context.WithTimeout(ctx, time.Second)
	_ = a.Unlock(uctx, lka, ownerA)
	cancel()

	res := harness.Check(t, "redlock", fault, r.History())
	res.Uncaught = res.Overlaps // no token: nothing can catch them
	res.Notes = "Redlock has no token: the overlap cannot be fenced"
	if keptOut {
		res.Notes = "b asked after a's lock had ended"
	}
	res.Log(t)
	if keptOut {
		if len(res.Overlaps) != 0 {
			t.Errorf("%d overlaps with the node kept out; want 0", len(res.Overlaps))
		}
		return
	}
	if errB != nil {
		t.Fatalf("b was not granted the lock (%v): the restarted node should have given it a majority", errB)
	}
	if len(res.Overlaps) != 1 {
		t.Errorf("%d overlaps; want 1 (a and b)", len(res.Overlaps))
	}
}
