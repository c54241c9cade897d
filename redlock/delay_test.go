package redlock_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/internal/testserver/proxy"
	"github.com/distlock/distlock/redlock"
)

// holdScript holds, in p, the next request that runs one of scripts (an
// EVALSHA naming it), until the test releases it: a packet delayed on the
// network for as long as the test needs. Other requests pass at once.
func holdScript(t testing.TB, p *proxy.Proxy, scripts ...*goredis.Script) *proxy.Held {
	h := p.Hold(proxy.Up, func(chunk []byte) bool {
		for _, s := range scripts {
			if bytes.Contains(chunk, []byte(s.Hash())) {
				return true
			}
		}
		return false
	})
	t.Cleanup(h.Release)
	return h
}

// seen fails t unless h holds its request.
func seen(t testing.TB, h *proxy.Held, what string) {
	t.Helper()
	select {
	case <-h.Seen():
	case <-time.After(10 * time.Second):
		t.Fatalf("%s never reached the proxy", what)
	}
}

// evalshaCalls returns how many EVALSHA commands node has run.
func evalshaCalls(t testing.TB, node *goredis.Client) int64 {
	t.Helper()
	info, err := node.Info(context.Background(), "commandstats").Result()
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

// loadScripts caches every script on every node, so that every request
// is an EVALSHA naming its script (the proxy recognises it by that).
func (c *cluster) loadScripts(t testing.TB) {
	t.Helper()
	for i, in := range c.inspect {
		for _, s := range []*goredis.Script{redisscript.AcquireQuiet, redisscript.Release, redisscript.Cleanup, redisscript.Extend} {
			if err := s.Load(context.Background(), in).Err(); err != nil {
				t.Fatalf("SCRIPT LOAD on node %d: %v", i, err)
			}
		}
	}
}

// Timing of the delayed-request tests: a node that does not answer costs
// a round delayTestNodeTimeout; the TTL is long against it.
const (
	delayTestTTL         = 2 * time.Second
	delayTestNodeTimeout = 200 * time.Millisecond
)

// TestDelayedSetOfContendedRound: a round finds
// the lock held by another owner; its request to node 4 is delayed and
// reaches the node only after the round cleaned up, when the key is free
// there. The next round of the same acquisition must not count that key,
// set before the round started, as a fresh yes: its expiry is as old as
// the delayed request, so node 4 would free the key before the lock's
// validity ends, and a second owner could take a majority (nodes 0, 1, 4)
// while the first one still believes it holds the lock.
func TestDelayedSetOfContendedRound(t *testing.T) {
	ctx := t.Context()
	c := startNodes(t, 5, nil)
	p := c.viaProxy(t, 4)
	c.loadScripts(t)
	r := c.newResource(t, redlock.WithNodeTimeout(delayTestNodeTimeout))
	other := c.direct(t, redlock.WithNodeTimeout(delayTestNodeTimeout))
	key := uniqueKey(t)
	c.hold(t, key, "other", time.Minute, 0, 1, 2)

	set := holdScript(t, p, redisscript.AcquireQuiet)
	before := evalshaCalls(t, c.inspect[4])
	l := newLease(key, delayTestTTL)
	if ok, _, err := r.TryAcquire(ctx, l); ok || err != nil {
		t.Fatalf("first round = %v, %v; want false, nil (held by another owner)", ok, err)
	}
	seen(t, set, "the first round's request to node 4")

	// The other owner leaves node 2; the delayed request reaches node 4,
	// after the round's clean-up there (the round did not wait for it).
	c.del(t, key, 2)
	set.Release()
	waitFor(t, "the delayed request to run on node 4", func() bool {
		return evalshaCalls(t, c.inspect[4]) >= before+2 // the clean-up, then the delayed request
	})
	// What the delayed request set there ages, as it would on a network
	// that delays a packet by this much.
	time.Sleep(delayTestTTL / 4)

	start := time.Now()
	ok, _, err := r.TryAcquire(ctx, l)
	if !ok || err != nil {
		t.Fatalf("second round = %v, %v; want true, nil (nodes 2, 3 and 4 are free)", ok, err)
	}
	validUntil := start.Add(l.Validity)
	t.Logf("nodes after the second round: %s", describe(c.values(t, key)))

	// The other owner leaves nodes 0 and 1: from now on a second owner
	// needs one of ours to make a majority. It must not get one before
	// our validity ends.
	c.del(t, key, 0, 1)
	second := newLease(key, delayTestTTL)
	for {
		ok, _, err := other.TryAcquire(ctx, second)
		if err != nil {
			t.Fatalf("second owner: %v", err)
		}
		now := time.Now()
		if ok {
			if now.Before(validUntil) {
				t.Errorf("a second owner acquired the lock %v before the first one's validity ended", validUntil.Sub(now))
			}
			_ = other.Release(ctx, second)
			break
		}
		if now.After(validUntil.Add(10 * time.Second)) {
			t.Fatal("the second owner never acquired the lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDelayedCleanupOfContendedRound: a contended round's clean-up is
// delayed on its way to node 4 and arrives after the next round set the
// key there. It must not delete the next round's key: the lock would then
// stand on two nodes of five, and a second owner could take a majority
// with node 4 while the first one holds the lock.
func TestDelayedCleanupOfContendedRound(t *testing.T) {
	ctx := t.Context()
	c := startNodes(t, 5, nil)
	p := c.viaProxy(t, 4)
	c.loadScripts(t)
	r := c.newResource(t, redlock.WithNodeTimeout(delayTestNodeTimeout))
	other := c.direct(t, redlock.WithNodeTimeout(delayTestNodeTimeout))
	key := uniqueKey(t)
	c.hold(t, key, "other", time.Minute, 0, 1, 2)

	// The first round's request to node 4 and its clean-up are both
	// delayed (on two connections: go-redis drops one whose reply is
	// late), so the round's clean-up cannot fail on a node that set the
	// key, and the spin loop tries again.
	set := holdScript(t, p, redisscript.AcquireQuiet)
	cleanup := holdScript(t, p, redisscript.Release, redisscript.Cleanup)
	before := evalshaCalls(t, c.inspect[4])
	l := newLease(key, delayTestTTL)
	if ok, _, err := r.TryAcquire(ctx, l); ok || err != nil {
		t.Fatalf("first round = %v, %v; want false, nil (held by another owner)", ok, err)
	}
	seen(t, set, "the first round's request to node 4")
	seen(t, cleanup, "the first round's clean-up of node 4")

	c.del(t, key, 2)
	ok, _, err := r.TryAcquire(ctx, l)
	if !ok || err != nil {
		t.Fatalf("second round = %v, %v; want true, nil (nodes 2, 3 and 4 are free)", ok, err)
	}
	// The delayed requests arrive, in the order they were sent.
	set.Release()
	waitFor(t, "the delayed request to run on node 4", func() bool { return evalshaCalls(t, c.inspect[4]) >= before+2 })
	cleanup.Release()
	waitFor(t, "the delayed clean-up to run on node 4", func() bool { return evalshaCalls(t, c.inspect[4]) >= before+3 })
	t.Logf("nodes after the delayed requests: %s", describe(c.values(t, key)))

	c.del(t, key, 0, 1)
	second := newLease(key, delayTestTTL)
	if ok, _, err := other.TryAcquire(ctx, second); ok || err != nil {
		t.Errorf("second owner = %v, %v while the first one holds the lock; want false, nil", ok, err)
	}
	if err := r.Release(ctx, l); err != nil {
		t.Errorf("Release = %v", err)
	}
}

// TestRandomDelaysKeepOwnersApart runs owners that contend for one key
// through proxies that delay some of their requests past the per-node
// timeout, at random (seeded), so that rounds give up on nodes whose
// requests land later: after the round's clean-up, during another
// round, after a release. Each owner spins on its lease as the facade
// does and holds the lock for a random time, sometimes past its validity.
// The invariant: the holding intervals of two acquisitions never
// intersect, where an acquisition holds from the return of the round
// that got it to the first of its release and the end of its validity
// (the round's start + l.Validity, measured on the same clock).
func TestRandomDelaysKeepOwnersApart(t *testing.T) {
	const (
		owners      = 3
		ttl         = 400 * time.Millisecond
		nodeTimeout = 40 * time.Millisecond
	)
	run := 8 * time.Second
	if testing.Short() {
		run = 2 * time.Second
	}
	seed := testSeed(t)
	c := startNodes(t, 5, nil)
	key := uniqueKey(t)

	type interval struct {
		owner      int
		from, till time.Time
	}
	var (
		mu        sync.Mutex
		intervals []interval
		stats     struct{ rounds, acquired, gaveUp int }
	)
	end := time.Now().Add(run)
	var wg sync.WaitGroup
	for o := range owners {
		rnd := rand.New(rand.NewPCG(seed, uint64(o)))
		var rmu sync.Mutex
		delay := func() time.Duration {
			rmu.Lock()
			defer rmu.Unlock()
			if rnd.IntN(100) < 10 { // late: the round gives up on the node
				return nodeTimeout + time.Duration(rnd.Int64N(int64(8*nodeTimeout)))
			}
			return time.Duration(rnd.Int64N(int64(time.Millisecond)))
		}
		var clients []goredis.UniversalClient
		for _, s := range c.servers {
			p, err := proxy.Start(s.Addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			p.SetDelay(proxy.Up, delay)
			clients = append(clients, c.client(t, p.Addr))
		}
		r, err := redlock.New(clients, redlock.WithNodeTimeout(nodeTimeout))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		wg.Go(func() {
			ctx := context.Background()
			for time.Now().Before(end) {
				l := newLease(key, ttl)
				giveUp := time.Now().Add(2 * ttl)
				for {
					start := time.Now()
					ok, _, err := r.TryAcquire(ctx, l)
					mu.Lock()
					stats.rounds++
					mu.Unlock()
					if err != nil || (!ok && time.Now().After(giveUp)) {
						mu.Lock()
						stats.gaveUp++
						mu.Unlock()
						break
					}
					if !ok {
						rmu.Lock()
						d := 5*time.Millisecond + time.Duration(rnd.Int64N(int64(10*time.Millisecond)))
						rmu.Unlock()
						time.Sleep(d) // the spin, as the facade's
						continue
					}
					from, validUntil := time.Now(), start.Add(l.Validity)
					rmu.Lock()
					hold := time.Duration(rnd.Int64N(int64(l.Validity * 6 / 5)))
					rmu.Unlock()
					time.Sleep(hold) // the work done under the lock
					till := time.Now()
					if till.After(validUntil) {
						till = validUntil
					}
					_ = r.Release(ctx, l)
					mu.Lock()
					stats.acquired++
					intervals = append(intervals, interval{o, from, till})
					mu.Unlock()
					break
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d rounds, %d acquisitions, %d gave up", stats.rounds, stats.acquired, stats.gaveUp)
	if stats.acquired < 3 {
		t.Errorf("only %d acquisitions: the run measured next to nothing", stats.acquired)
	}
	slices.SortFunc(intervals, func(a, b interval) int { return a.from.Compare(b.from) })
	for i, a := range intervals {
		for _, b := range intervals[i+1:] {
			if !b.from.Before(a.till) {
				break
			}
			t.Errorf("owner %d acquired %v before owner %d's lock ended (validity or release)", b.owner, a.till.Sub(b.from), a.owner)
		}
	}
}

// contendedNodes starts 5 nodes, the given ones behind proxies (returned
// in that order), with the scripts loaded, and a Resource over them with
// the delay tests' node timeout; another owner holds nodes 0, 1 and 2 of
// the returned key, so that a round on it is contended.
func contendedNodes(t *testing.T, proxied ...int) (*cluster, *redlock.Resource, string, []*proxy.Proxy) {
	c := startNodes(t, 5, nil)
	ps := make([]*proxy.Proxy, len(proxied))
	for i, n := range proxied {
		ps[i] = c.viaProxy(t, n)
	}
	c.loadScripts(t)
	r := c.newResource(t, redlock.WithNodeTimeout(delayTestNodeTimeout))
	key := uniqueKey(t)
	c.hold(t, key, "other", time.Minute, 0, 1, 2)
	return c, r, key, ps
}

// TestCleanupOfContendedRoundWaitsForUnanswered: a contended round (other
// owners hold nodes 0, 1 and 2) whose request to node 4 is delayed on the
// network, and whose clean-up of node 3, the one node that set the key,
// does not answer in time: TryAcquire returns an AbandonedError. Its
// Cleanup must not succeed before node 4 confirmed its clean-up too: the
// delayed request may still set the key there, and only a clean-up that
// ran on node 4 (its tombstone) keeps it from doing so after Cleanup
// returned nil.
func TestCleanupOfContendedRoundWaitsForUnanswered(t *testing.T) {
	ctx := t.Context()
	c, r, key, ps := contendedNodes(t, 3, 4)
	p3, p4 := ps[0], ps[1]

	// Node 4 gets neither the request nor the clean-ups until the test
	// lets them through (the round's clean-up and the first round of
	// Cleanup: at most two).
	set := holdScript(t, p4, redisscript.AcquireQuiet)
	cleanups4 := []*proxy.Held{holdScript(t, p4, redisscript.Cleanup, redisscript.Release),
		holdScript(t, p4, redisscript.Cleanup, redisscript.Release), holdScript(t, p4, redisscript.Cleanup, redisscript.Release)}
	// Node 3's first clean-up is late: the round cannot confirm it.
	cleanup3 := holdScript(t, p3, redisscript.Cleanup, redisscript.Release)
	l := newLease(key, delayTestTTL)
	ok, _, err := r.TryAcquire(ctx, l)
	var ab *backend.AbandonedError
	if ok || !errors.As(err, &ab) {
		t.Fatalf("TryAcquire = %v, %v; want false, an AbandonedError (node 3's clean-up did not answer)", ok, err)
	}
	seen(t, set, "the round's request to node 4")
	seen(t, cleanup3, "the round's clean-up of node 3")
	cleanup3.Release()
	value := redlock.Stored(l)

	cctx, cancel := context.WithTimeout(ctx, 2*delayTestNodeTimeout)
	cerr := ab.Cleanup(cctx)
	cancel()
	// The delayed request reaches node 4 now.
	before := evalshaCalls(t, c.inspect[4])
	set.Release()
	waitFor(t, "the delayed request to run on node 4", func() bool { return evalshaCalls(t, c.inspect[4]) > before })
	if v := c.valueOn(key, 4); cerr == nil && v == value {
		t.Errorf("node 4 holds the round's value after its Cleanup returned nil")
	}
	held := 0
	for _, h := range cleanups4 {
		select {
		case <-h.Seen():
			held++
		default:
		}
		h.Release()
	}
	cleanUp(t, ab)
	// The clean-ups held on their way to node 4 land too; then no node
	// may hold the value.
	waitFor(t, "the delayed clean-ups to run on node 4", func() bool { return evalshaCalls(t, c.inspect[4]) >= before+1+int64(held) })
	c.noneHoldNow(t, key, l.Value)
}

// TestContendedRoundDeletesUnansweredNodeAgain: a contended round (other
// owners hold nodes 0, 1 and 2; node 3 sets the key) whose request to
// node 4 is delayed on the network, and whose first clean-up of node 4 is
// held too, so that it fails without saying what happened. TryAcquire
// returns (false, nil): the lock is held by others, and no Cleanup of the
// facade's follows. The delayed request then sets the key on node 4. The
// round's value must not stay there for its TTL (30s), keeping node 4 from
// every other owner: the round sends node 4 its delete again.
func TestContendedRoundDeletesUnansweredNodeAgain(t *testing.T) {
	ctx := t.Context()
	c, r, key, ps := contendedNodes(t, 4)
	p4 := ps[0]

	set := holdScript(t, p4, redisscript.AcquireQuiet)
	first := holdScript(t, p4, redisscript.Cleanup, redisscript.Release)
	l := newLease(key, 30*time.Second)
	ok, _, err := r.TryAcquire(ctx, l)
	if ok || err != nil {
		t.Fatalf("TryAcquire = %v, %v; want false, nil (other owners hold a majority)", ok, err)
	}
	seen(t, set, "the round's request to node 4")
	seen(t, first, "the round's clean-up of node 4")
	value := redlock.Stored(l)
	if v := c.valueOn(key, 3); v == value {
		t.Fatalf("node 3 still holds the round's value after TryAcquire returned")
	}
	// The delayed request reaches node 4 now.
	before := evalshaCalls(t, c.inspect[4])
	set.Release()
	waitFor(t, "the delayed request to run on node 4", func() bool { return evalshaCalls(t, c.inspect[4]) > before })
	waitFor(t, "node 4 to lose the round's value", func() bool { return c.valueOn(key, 4) != value })
	first.Release()
}
