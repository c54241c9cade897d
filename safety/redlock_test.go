package safety

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/internal/testserver/proxy"
	"github.com/distlock/distlock/redlock"
	"github.com/distlock/distlock/safety/harness"
	"github.com/distlock/distlock/safety/history"
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
	t.Run("DelayedRequest", func(t *testing.T) { testRedlockDelayedRequest(t, nodes) })
	t.Run("StalledStore", func(t *testing.T) { testRedlockStalledMajority(t, nodes) })
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

// evalshaCalls returns how many EVALSHA commands the server behind c ran.
func evalshaCalls(t testing.TB, c *goredis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls="); ok {
			calls, _, _ := strings.Cut(rest, ",")
			n, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				t.Fatalf("INFO commandstats line %q: %v", line, err)
			}
			return n
		}
	}
	return 0
}

// nthScriptRun matches the n-th chunk (from 1) that runs script, an
// EVALSHA naming it, for proxy.Hold.
func nthScriptRun(script *goredis.Script, n int32) func([]byte) bool {
	sha := []byte(script.Hash())
	var seen atomic.Int32
	return func(chunk []byte) bool {
		return bytes.Contains(chunk, sha) && seen.Add(1) == n
	}
}

// testRedlockDelayedRequest: no two holders after one delayed packet. c
// holds the lock on a bare majority (nodes 0-2: its paths to
// nodes 3 and 4 stay stalled). a asks, spinning: its first round finds
// the lock held, and its request to node 4 is held in the proxy until
// after the round's clean-up, then delivered, once c has released. a's
// next round comes a spin later; its requests to nodes 0 and 1 are lost,
// so it stands on nodes 2-4. b asks then, directly, until it gets the
// lock. When a round counts what an earlier round's late request set on
// node 4 as its own, that key expires a spin early, and b gets nodes 0, 1
// and 4 while a still holds its lock.
func testRedlockDelayedRequest(t *testing.T, nodes []*testserver.RedisServer) {
	const (
		ttl         = time.Second
		nodeTimeout = 250 * time.Millisecond
		// age is a's spin: how long what the late request set has aged
		// when a's second round asks.
		age = 600 * time.Millisecond
	)
	r := harness.NewRun(t)
	a, b, c := r.Client("a"), r.Client("b"), r.Client("c")
	ctx := t.Context()
	key := uniqueKey(t)
	var viaA, viaC []*proxy.Proxy
	var clientsA, clientsC, direct []goredis.UniversalClient
	var inspect []*goredis.Client
	for _, n := range nodes {
		pa, pc := startProxy(t, n.Addr), startProxy(t, n.Addr)
		viaA, viaC = append(viaA, pa), append(viaC, pc)
		clientsA, clientsC = append(clientsA, redisVia(t, pa.Addr)), append(clientsC, redisVia(t, pc.Addr))
		in := redisVia(t, n.Addr)
		direct, inspect = append(direct, in), append(inspect, in)
		for _, s := range []*goredis.Script{redisscript.AcquireQuiet, redisscript.Release, redisscript.Cleanup, redisscript.Extend} {
			if err := s.Load(ctx, in).Err(); err != nil { // every request an EVALSHA the proxies recognise
				t.Fatalf("SCRIPT LOAD: %v", err)
			}
		}
	}
	newLock := func(cs []goredis.UniversalClient, opts ...distlock.Option) *distlock.DistributeLock {
		// A drift allowance of 10% keeps a's Done well ahead of its keys'
		// expiry, whatever the timer lateness on a loaded machine.
		res, err := redlock.New(cs, redlock.WithNodeTimeout(nodeTimeout), redlock.WithDrift(0.1, 2*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		d, err := distlock.New(res, append([]distlock.Option{distlock.WithDefaultTTL(ttl)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d
	}
	da := newLock(clientsA, distlock.WithSpin(age, 0))
	db, dc := newLock(direct, distlock.WithSpin(10*time.Millisecond, 10*time.Millisecond)), newLock(clientsC)

	// c on nodes 0-2 only: nothing of c's reaches nodes 3 and 4, so
	// node 4's EVALSHA count tells a's requests there.
	viaC[3].Stall(proxy.Up)
	viaC[4].Stall(proxy.Up)
	lkc, ownerC, err := c.TryLock(ctx, dc, key, 0)
	if err != nil {
		t.Fatalf("c: %v", err)
	}

	late := viaA[4].Hold(proxy.Up, nthScriptRun(redisscript.AcquireQuiet, 1))
	t.Cleanup(late.Release)
	// a's second round's requests to nodes 0 and 1 are lost: held until
	// the proxies close, never released (go-redis gives up on them at the
	// node timeout, with no retry since the round's deadline passed).
	var lost []*proxy.Held
	for _, p := range viaA[:2] {
		lost = append(lost, p.Hold(proxy.Up, nthScriptRun(redisscript.AcquireQuiet, 2)))
	}
	before := evalshaCalls(t, inspect[4])
	type grant struct {
		lk    *distlock.Lock
		owner string
		err   error
	}
	granted := make(chan grant, 1)
	go func() {
		lk, owner, err := a.TryLock(ctx, da, key, 10*time.Second)
		granted <- grant{lk, owner, err}
	}()
	select {
	case <-late.Seen():
	case <-time.After(10 * time.Second):
		t.Fatal("a's first request to node 4 never reached the proxy")
	}
	// The round gives up on node 4 and cleans up there (on another
	// connection); then c releases, and the held request arrives.
	waitUntil(t, 10*time.Second, "a's first round to clean up node 4", func() bool { return evalshaCalls(t, inspect[4]) >= before+1 })
	if err := c.Unlock(ctx, lkc, ownerC); err != nil {
		t.Fatalf("c's unlock: %v", err)
	}
	late.Release()
	arrived := r.Note("a's delayed request to node 4 delivered after its round's clean-up")
	waitUntil(t, 10*time.Second, "the delayed request to run", func() bool { return evalshaCalls(t, inspect[4]) >= before+2 })
	if time.Duration(history.Now()-arrived) > age/2 {
		t.Fatalf("the delayed request ran %v after its release: a's next round may have come first (test setup)", time.Duration(history.Now()-arrived))
	}

	ga := <-granted
	if ga.err != nil {
		t.Fatalf("a: %v (its second round should stand on nodes 2-4)", ga.err)
	}
	for i, h := range lost {
		select {
		case <-h.Seen():
		default:
			t.Fatalf("a's second request to node %d was not held (test setup)", i)
		}
	}

	// b asks until it gets the lock; a works until its lock's validity
	// ends (its Done), then both unlock.
	grantedB := make(chan grant, 1)
	go func() {
		lk, owner, err := b.TryLock(ctx, db, key, 10*time.Second)
		grantedB <- grant{lk, owner, err}
	}()
	select {
	case <-ga.lk.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a's Done never closed")
	}
	gb := <-grantedB
	ownerB := gb.owner
	if gb.err == nil {
		if err := b.Unlock(ctx, gb.lk, gb.owner); err != nil {
			t.Logf("b's unlock: %v", err)
		}
	}
	uctx, cancel := context.WithTimeout(ctx, time.Second)
	_ = a.Unlock(uctx, ga.lk, ga.owner)
	cancel()
	if gb.err != nil {
		t.Fatalf("b: %v", gb.err)
	}

	evs := r.History()
	res := harness.Check(t, "redlock", "one delayed request: a contended round's request to 1 of 5 nodes delivered after its clean-up", evs)
	res.Uncaught = res.Overlaps // no token: nothing can catch them
	res.Orphans = orphans(t, redlockTarget(t, nodes), key)
	var doneA, grantB int64
	if e, ok := lostOf(evs, ga.owner); ok {
		doneA = e.At
	}
	for _, e := range evs {
		if e.Kind == history.Acquire && e.Owner == ownerB && e.Err == "" {
			grantB = e.Return
		}
	}
	switch d := time.Duration(grantB - doneA).Round(100 * time.Microsecond); {
	case doneA == 0 || grantB == 0:
	case d >= 0:
		res.Notes = fmt.Sprintf("b granted %v after a's Done closed", d)
	default:
		res.Notes = fmt.Sprintf("b granted %v before a's Done closed", -d)
	}
	res.Log(t)
	assertNoOverlap(t, res)
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}
