package redlock_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/redlock"
)

// cleanUp runs ab's Cleanup as the facade does, until it returns nil, for
// at most 10s.
func cleanUp(t testing.TB, ab *backend.AbandonedError) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		err := ab.Cleanup(ctx)
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("Cleanup did not succeed within 10s: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // the facade's first backoff
	}
}

// readTimeout is the node clients' socket timeout in the tests of paused
// nodes: far longer than any per-node timeout, so that waiting for a
// paused node instead of giving up on it would show.
const readTimeout = 30 * time.Second

// bound is the most a round with a paused node may take in these tests:
// well above the per-node timeout (the race detector, shared cores), well
// below readTimeout.
const bound = 5 * time.Second

func pausedNodeClients(contextTimeout bool) func(*goredis.Options) {
	return func(o *goredis.Options) {
		o.ContextTimeoutEnabled = contextTimeout
		o.ReadTimeout, o.WriteTimeout = readTimeout, readTimeout
	}
}

// TestPausedNode: a node frozen by SIGSTOP costs one per-node timeout per
// round, not the client's socket timeout nor the caller's wait, whether or
// not the client honours context deadlines.
func TestPausedNode(t *testing.T) {
	for _, tc := range []struct {
		name           string
		contextTimeout bool
	}{
		{"ContextTimeoutEnabled", true},
		{"ContextTimeoutDisabled", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startNodes(t, 5, pausedNodeClients(tc.contextTimeout))
			const nodeTimeout = 100 * time.Millisecond
			r := c.newResource(t, redlock.WithNodeTimeout(nodeTimeout))
			ctx := t.Context()
			c.servers[2].Pause()
			resumed := false
			defer func() {
				if !resumed {
					c.servers[2].Resume()
				}
			}()

			var keys []string
			for range 3 {
				l := newLease(uniqueKey(t), time.Minute)
				keys = append(keys, l.Key)
				start := time.Now()
				ok, _, err := r.TryAcquire(ctx, l)
				if el := time.Since(start); el > bound {
					t.Errorf("TryAcquire with a paused node took %v; want about the node timeout %v", el, nodeTimeout)
				}
				if !ok || err != nil {
					t.Fatalf("TryAcquire with 1 of 5 nodes paused = %v, %v; want true, nil", ok, err)
				}
				if n := c.count(t, l.Key, l.Value); n < 3 {
					t.Errorf("%d nodes hold our value; want a majority", n)
				}
				c.eventually(t, l.Key, "all but the paused node to hold our value", func(v []string) bool {
					s := redlock.Stored(l)
					return v[0] == s && v[1] == s && v[3] == s && v[4] == s
				})
				if err := r.Refresh(ctx, l); err != nil {
					t.Errorf("Refresh with a paused node = %v", err)
				}
				start = time.Now()
				if err := r.Release(ctx, l); err != nil {
					t.Errorf("Release with a paused node = %v", err)
				}
				if el := time.Since(start); el > bound {
					t.Errorf("Release with a paused node took %v; want about the node timeout %v", el, nodeTimeout)
				}
			}
			// A contended acquire has a second round, the cleanup: both
			// are bounded.
			key := uniqueKey(t)
			c.hold(t, key, "other", time.Minute, 0, 1, 3)
			start := time.Now()
			ok, _, err := r.TryAcquire(ctx, newLease(key, time.Minute))
			if el := time.Since(start); ok || err != nil || el > bound {
				t.Errorf("contended TryAcquire with a paused node = %v, %v after %v; want false, nil, bounded", ok, err, el)
			}

			c.servers[2].Resume()
			resumed = true
			if tc.contextTimeout {
				return
			}
			// The client still waited for the paused node's replies: the
			// SETs it applied on waking after their locks were released
			// are deleted by the workers that get the late replies.
			for _, key := range keys {
				waitFor(t, "node 2 to drop "+key, func() bool { return c.values(t, key)[2] == "" })
			}
		})
	}
}

// TestFailedAcquireLeavesNothing: whatever makes an acquire fail, no node
// keeps our value afterwards (a paused node: once it wakes and answers).
func TestFailedAcquireLeavesNothing(t *testing.T) {
	c := startNodes(t, 5, pausedNodeClients(false))
	ctx := t.Context()

	check := func(t *testing.T, key, value string) {
		t.Helper()
		for i, v := range c.values(t, key) {
			if ours(v, value) {
				t.Errorf("node %d keeps our value after the failed acquire", i)
			}
		}
	}

	t.Run("cancelled", func(t *testing.T) {
		// Three nodes paused: the two live ones cannot decide the round,
		// which waits until the caller gives up.
		r := c.newResource(t, redlock.WithNodeTimeout(3*time.Second))
		for _, i := range nodes(2, 3, 4) {
			c.servers[i].Pause()
		}
		l := newLease(uniqueKey(t), time.Minute)
		cctx, cancel := context.WithCancel(ctx)
		go func() {
			// Cancel once the round has reached the live nodes.
			defer cancel()
			for cctx.Err() == nil {
				if ours(c.valueOn(l.Key, 0), l.Value) && ours(c.valueOn(l.Key, 1), l.Value) {
					return
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
		start := time.Now()
		ok, _, err := r.TryAcquire(cctx, l)
		if el := time.Since(start); el > bound {
			t.Errorf("TryAcquire cancelled returned after %v", el)
		}
		var ab *backend.AbandonedError
		if ok || !errors.Is(err, context.Canceled) || !errors.As(err, &ab) {
			t.Fatalf("TryAcquire cancelled = %v, %v; want false, an AbandonedError wrapping context.Canceled", ok, err)
		}
		// The deletes were sent at once: the live nodes drop the key
		// while the others sleep.
		for _, i := range nodes(0, 1) {
			waitFor(t, "the live nodes to drop our value", func() bool { return !ours(c.valueOn(l.Key, i), l.Value) })
		}
		// The paused nodes apply the SET and the deletes when they wake;
		// the Cleanup, which the facade runs until it succeeds, succeeds
		// once they answered.
		for _, i := range nodes(2, 3, 4) {
			c.servers[i].Resume()
		}
		cleanUp(t, ab)
		c.noneHoldNow(t, l.Key, l.Value)
	})

	t.Run("no validity", func(t *testing.T) {
		// Half the TTL is drift, so 250ms of validity; the caller is
		// paused for longer between the majority's yes and the decision.
		r := c.newResource(t, redlock.WithDrift(0.5, 0))
		defer redlock.PauseAfterWait(300 * time.Millisecond)()
		l := newLease(uniqueKey(t), 500*time.Millisecond)
		ok, _, err := r.TryAcquire(ctx, l)
		if ok || !errors.Is(err, redlock.ErrNoValidity) {
			t.Errorf("TryAcquire = %v, %v; want false, ErrNoValidity", ok, err)
		}
		c.noneHold(t, l.Key, l.Value)
	})

	t.Run("contention", func(t *testing.T) {
		r := c.newResource(t)
		key := uniqueKey(t)
		c.hold(t, key, "other", time.Minute, 1, 2, 3)
		l := newLease(key, time.Minute)
		if ok, _, err := r.TryAcquire(ctx, l); ok || err != nil {
			t.Fatalf("TryAcquire = %v, %v; want false, nil", ok, err)
		}
		check(t, key, l.Value)
		// Contention is no error, and every node answered: nothing of the
		// round is on its way, so its cleanup writes no tombstone.
		if n, err := c.inspect[0].Exists(ctx, redisscript.DeadKey(lockKey(key), redlock.Stored(l))).Result(); n != 0 || err != nil {
			t.Errorf("EXISTS tombstone after contention = %d, %v; want 0", n, err)
		}
		c.del(t, key, 1, 2, 3)
		if ok, _, err := r.TryAcquire(ctx, l); !ok || err != nil {
			t.Fatalf("TryAcquire again with the same lease = %v, %v; want true, nil", ok, err)
		}
		if err := r.Release(ctx, l); err != nil {
			t.Errorf("Release = %v", err)
		}
	})

	t.Run("nodes down", func(t *testing.T) {
		r := c.newResource(t, redlock.WithNodeTimeout(time.Second))
		c.servers[0].Kill()
		c.servers[3].Kill()
		c.servers[4].Kill()
		defer func() {
			for _, i := range nodes(0, 3, 4) {
				c.servers[i].Restart()
			}
		}()
		l := newLease(uniqueKey(t), time.Minute)
		if ok, _, err := r.TryAcquire(ctx, l); ok || !errors.Is(err, redlock.ErrNoQuorum) {
			t.Fatalf("TryAcquire = %v, %v; want false, ErrNoQuorum", ok, err)
		}
		check(t, l.Key, l.Value)
	})
}

// holdRequest is a go-redis hook that keeps the next script call from the
// node and reports a timeout, keeping its arguments: the test sends them
// later, as a request delayed on the network that reaches the node after
// its sender gave up and cleaned up.
type holdRequest struct {
	armed atomic.Bool
	mu    sync.Mutex
	held  []any
}

func (h *holdRequest) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *holdRequest) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}
func (h *holdRequest) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if (cmd.Name() == "evalsha" || cmd.Name() == "eval") && h.armed.CompareAndSwap(true, false) {
			h.mu.Lock()
			h.held = cmd.Args()
			h.mu.Unlock()
			err := &net.OpError{Op: "read", Net: "tcp", Err: context.DeadlineExceeded}
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h *holdRequest) args() []any {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held
}

// TestDelayedAcquireAfterCleanup: two of three nodes get the acquire
// request only after the round failed and cleaned up. The cleanup's
// tombstones make those late requests set nothing, so no node keeps the
// value until its TTL.
func TestDelayedAcquireAfterCleanup(t *testing.T) {
	c := startNodes(t, 3, nil)
	ctx := t.Context()
	// No node has the cleanup script cached: it must go by EVAL.
	for i, cl := range c.inspect {
		if err := cl.ScriptFlush(ctx).Err(); err != nil {
			t.Fatalf("SCRIPT FLUSH on node %d: %v", i, err)
		}
	}
	hooks := []*holdRequest{{}, {}}
	for i, h := range hooks {
		c.clients[i].AddHook(h)
		// The held EVALSHA must find the script when it is sent.
		if err := redisscript.AcquireQuiet.Load(ctx, c.inspect[i]).Err(); err != nil {
			t.Fatalf("SCRIPT LOAD on node %d: %v", i, err)
		}
		h.armed.Store(true)
	}
	r := c.newResource(t)
	l := newLease(uniqueKey(t), time.Minute)
	ok, _, err := r.TryAcquire(ctx, l)
	if ok || !errors.Is(err, redlock.ErrNoQuorum) {
		t.Fatalf("TryAcquire with 2 of 3 requests held = %v, %v; want ErrNoQuorum", ok, err)
	}
	dead := redisscript.DeadKey(lockKey(l.Key), redlock.Stored(l))
	for i, cl := range c.inspect {
		if ttl, err := cl.PTTL(ctx, dead).Result(); err != nil || ttl <= 0 || ttl > l.TTL {
			t.Errorf("node %d: tombstone PTTL = %v, %v; want in (0, %v]", i, ttl, err, l.TTL)
		}
	}
	for i, h := range hooks {
		if h.args() == nil {
			t.Fatalf("node %d: no request held", i)
		}
		// The request arrives now.
		if err := c.inspect[i].Do(ctx, h.args()...).Err(); !redisscript.IsDead(err) {
			t.Errorf("node %d: late acquire = %v; want the DEAD error", i, err)
		}
	}
	c.noneHoldNow(t, l.Key, l.Value)
	next := newLease(l.Key, time.Minute)
	if ok, _, err := r.TryAcquire(ctx, next); !ok || err != nil {
		t.Fatalf("next TryAcquire = %v, %v; want true, nil", ok, err)
	}
	if err := r.Release(ctx, next); err != nil {
		t.Errorf("Release = %v", err)
	}
}

// TestClose: idle workers exit on Close, and the Resource still works.
func TestClose(t *testing.T) {
	c := startNodes(t, 3, nil)
	r, err := redlock.New(c.clients)
	if err != nil {
		t.Fatal(err)
	}
	l := newLease(uniqueKey(t), time.Minute)
	if ok, _, err := r.TryAcquire(t.Context(), l); !ok || err != nil {
		t.Fatalf("TryAcquire = %v, %v", ok, err)
	}
	if n := r.Workers(); n < 3 {
		t.Errorf("Workers() = %d after a round on 3 nodes; want at least 3", n)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	waitFor(t, "the workers to exit", func() bool { return r.Workers() == 0 })
	if err := r.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if err := r.Release(t.Context(), l); err != nil {
		t.Errorf("Release after Close = %v", err)
	}
	c.noneHold(t, l.Key, l.Value)
	waitFor(t, "the release's goroutines to end", func() bool { return r.Workers() == 0 })
}
