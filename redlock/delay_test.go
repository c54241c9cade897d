package redlock_test

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/redlock"
	"github.com/distlock/distlock/safety/proxy"
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
		for _, s := range []*goredis.Script{redisscript.Acquire, redisscript.Release, redisscript.Cleanup, redisscript.Extend} {
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

// TestDelayedSetOfContendedRound is issue 23's first defect. A round finds
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

	set := holdScript(t, p, redisscript.Acquire)
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
	set := holdScript(t, p, redisscript.Acquire)
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
