package redlock_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/redlock"
)

func TestNewRejects(t *testing.T) {
	// Nothing listens on port 1: New must not dial anyway.
	c := func() goredis.UniversalClient {
		cl := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
		t.Cleanup(func() { _ = cl.Close() })
		return cl
	}
	three := []goredis.UniversalClient{c(), c(), c()}
	for _, tc := range []struct {
		name  string
		nodes []goredis.UniversalClient
		opts  []redlock.Option
		want  string
	}{
		{"nil list", nil, nil, "0 nodes"},
		{"one", three[:1], nil, "1 nodes"},
		{"two", three[:2], nil, "2 nodes"},
		{"four", append(three[:3:3], c()), nil, "odd"},
		{"nil node", []goredis.UniversalClient{c(), nil, c()}, nil, "node 1 is nil"},
		{"typed nil node", []goredis.UniversalClient{c(), c(), (*goredis.Client)(nil)}, nil, "node 2 is nil"},
		{"nil option", three, []redlock.Option{nil}, "nil option"},
		{"negative timeout", three, []redlock.Option{redlock.WithNodeTimeout(-time.Second)}, "negative node timeout"},
		{"drift factor 1", three, []redlock.Option{redlock.WithDrift(1, 0)}, "bad drift"},
		{"negative drift", three, []redlock.Option{redlock.WithDrift(0.01, -time.Millisecond)}, "bad drift"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := redlock.New(tc.nodes, tc.opts...)
			if !errors.Is(err, distlock.ErrInvalid) || r != nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, %v; want nil and an ErrInvalid error containing %q", r, err, tc.want)
			}
		})
	}
	for _, n := range []int{3, 5, 7, 9} {
		nodes := make([]goredis.UniversalClient, n)
		for i := range nodes {
			nodes[i] = c()
		}
		r, err := redlock.New(nodes)
		if err != nil {
			t.Fatalf("New(%d nodes) = %v", n, err)
		}
		if got, want := r.Quorum(), n/2+1; got != want {
			t.Errorf("Quorum() of %d nodes = %d; want %d", n, got, want)
		}
		_ = r.Close()
	}
}

func TestHolderTTL(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		res  []int64 // > 0 ours, < 0 held for -v ms, 0 held with no TTL, 99 failed
		need int
		want time.Duration
	}{
		{"need one", []int64{-300, -100, -200, 1, 1}, 1, 100 * ms},
		{"need two", []int64{-300, -100, -200, 1, 99}, 2, 200 * ms},
		{"need three", []int64{-300, -100, -200, -50, -400}, 3, 200 * ms},
		{"too few known", []int64{-300, 0, 99, 1, 1}, 2, 0},
		{"unknown skipped", []int64{0, -70, 1, 1, 0}, 1, 70 * ms},
		{"need nothing", []int64{1, 1, 1, -5, -5}, 0, 0},
	} {
		if got := redlock.HolderTTL(tc.res, tc.need); got != tc.want {
			t.Errorf("%s: holderTTL(%v, %d) = %v; want %v", tc.name, tc.res, tc.need, got, tc.want)
		}
	}
}

func newLock(t *testing.T, r backend.RemoteResource, opts ...distlock.Option) *distlock.DistributeLock {
	t.Helper()
	opts = append([]distlock.Option{distlock.WithDefaultTTL(time.Minute)}, opts...)
	d, err := distlock.New(r, opts...)
	if err != nil {
		t.Fatalf("distlock.New: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// TestNodesDown: with 2 of 5 nodes down locks work; with 3 down an
// acquire fails at once with a store error naming them, not ErrNotAcquired.
func TestNodesDown(t *testing.T) {
	c := startNodes(t, 5, nil)
	r := c.newResource(t, redlock.WithNodeTimeout(time.Second))
	ctx := t.Context()

	c.servers[1].Kill()
	c.servers[3].Kill()
	t.Run("two down", func(t *testing.T) {
		d := newLock(t, r)
		key := uniqueKey(t)
		lk, err := d.TryLock(ctx, key, 0)
		if err != nil {
			t.Fatalf("TryLock with 2 of 5 nodes down = %v; want a lock", err)
		}
		if got := c.values(t, key); got[0] == "" || got[2] == "" || got[4] == "" {
			t.Errorf("live nodes hold %s; want our value on nodes 0, 2, 4", describe(got))
		}
		if _, err := newLock(t, r).TryLock(ctx, key, 0); !errors.Is(err, distlock.ErrNotAcquired) {
			t.Errorf("second TryLock = %v; want ErrNotAcquired", err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("Unlock with 2 of 5 nodes down = %v", err)
		}
		for i, v := range c.values(t, key) {
			if v != "" && v != "<down>" {
				t.Errorf("node %d holds %q after Unlock", i, v)
			}
		}
	})

	c.servers[4].Kill()
	t.Run("three down", func(t *testing.T) {
		rec := &recorder{}
		d := newLock(t, r, distlock.WithHandlers(rec))
		key := uniqueKey(t)
		const wait = 30 * time.Second
		start := time.Now()
		lk, err := d.TryLock(ctx, key, wait)
		elapsed := time.Since(start)
		if lk != nil || err == nil {
			t.Fatalf("TryLock with 3 of 5 nodes down = %v, %v; want an error", lk, err)
		}
		if errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, redlock.ErrNoQuorum) {
			t.Errorf("err = %v; want ErrNoQuorum, not ErrNotAcquired", err)
		}
		for _, i := range nodes(1, 3, 4) {
			if addr := c.servers[i].Addr; !strings.Contains(err.Error(), addr) {
				t.Errorf("err does not name failed node %d (%s): %v", i, addr, err)
			}
		}
		for _, i := range nodes(0, 2) {
			if addr := c.servers[i].Addr; strings.Contains(err.Error(), addr) {
				t.Errorf("err names live node %d (%s): %v", i, addr, err)
			}
		}
		// A store error ends the wait at the first attempt.
		if n := rec.attempts(); n != 1 {
			t.Errorf("RemoteAttempts = %d; want 1", n)
		}
		if elapsed > wait/2 {
			t.Errorf("TryLock spun for %v of its %v wait", elapsed, wait)
		}
		for _, i := range nodes(0, 2) {
			if v := c.values(t, key)[i]; v != "" {
				t.Errorf("live node %d keeps %q after the failed acquire", i, v)
			}
		}
	})

	// Nodes come back empty; locks work again.
	for _, i := range nodes(1, 3, 4) {
		c.servers[i].Restart()
	}
	t.Run("restarted", func(t *testing.T) {
		d := newLock(t, r)
		key := uniqueKey(t)
		// A client's pooled connections to a restarted node fail once:
		// poll until all five nodes take part.
		waitFor(t, "a lock on all five nodes after restarting three", func() bool {
			lk, err := d.TryLock(ctx, key, 0)
			if err != nil {
				return false
			}
			n := c.count(t, key, c.values(t, key)[0])
			if err := lk.Unlock(ctx); err != nil {
				t.Fatalf("Unlock = %v", err)
			}
			return n == 5
		})
	})
}

// TestHeldByOthers: 3 of 5 nodes held by another owner is contention
// (ErrNotAcquired), and nothing of ours stays behind; 2 of 5 still gives
// the lock.
func TestHeldByOthers(t *testing.T) {
	c := startNodes(t, 5, nil)
	r := c.newResource(t)
	ctx := t.Context()

	t.Run("three held", func(t *testing.T) {
		key := uniqueKey(t)
		c.hold(t, key, "other", time.Minute, 0, 2, 4)
		l := newLease(key, time.Minute)
		ok, holderTTL, err := r.TryAcquire(ctx, l)
		if ok || err != nil {
			t.Fatalf("TryAcquire = %v, %v; want false, nil (contention)", ok, err)
		}
		// The second-shortest of the holders' TTLs (we need two more
		// nodes free): about a minute.
		if holderTTL <= 50*time.Second || holderTTL > time.Minute {
			t.Errorf("holderTTL = %v; want about a minute", holderTTL)
		}
		c.noneHoldNow(t, key, l.Value) // a failed acquire cleans up before it returns
		if got := c.count(t, key, "other"); got != 3 {
			t.Errorf("%d nodes hold the other owner's value; want 3 (untouched)", got)
		}
		_, err = newLock(t, r).TryLock(ctx, key, 0)
		if !errors.Is(err, distlock.ErrNotAcquired) {
			t.Errorf("TryLock = %v; want ErrNotAcquired", err)
		}
	})

	t.Run("two held", func(t *testing.T) {
		key := uniqueKey(t)
		c.hold(t, key, "other", time.Minute, 1, 3)
		l := newLease(key, time.Minute)
		ok, _, err := r.TryAcquire(ctx, l)
		if !ok || err != nil {
			t.Fatalf("TryAcquire = %v, %v; want true, nil", ok, err)
		}
		if got := c.count(t, key, l.Value); got != 3 {
			t.Errorf("%d nodes hold our value; want 3", got)
		}
		if err := r.Release(ctx, l); err != nil {
			t.Fatalf("Release = %v", err)
		}
		c.noneHold(t, key, l.Value)
		if got := c.count(t, key, "other"); got != 2 {
			t.Errorf("%d nodes hold the other owner's value; want 2 (untouched)", got)
		}
	})

	t.Run("wait for holders", func(t *testing.T) {
		// The holders' keys expire at different times; the spin loop
		// gets the lock once a majority is free.
		key := uniqueKey(t)
		c.hold(t, key, "other", 100*time.Millisecond, 0)
		c.hold(t, key, "other", 200*time.Millisecond, 1, 2)
		d := newLock(t, r, distlock.WithSpin(time.Second, 0))
		lk, err := d.TryLock(ctx, key, 10*time.Second)
		if err != nil {
			t.Fatalf("TryLock = %v; want the lock once the holders expire", err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("Unlock = %v", err)
		}
	})
}

// TestLease checks what a successful acquire writes into the lease, and
// that a TTL too short for the drift allowance fails before any I/O.
func TestLease(t *testing.T) {
	c := startNodes(t, 3, nil)
	r := c.newResource(t)
	ctx := t.Context()

	l := newLease(uniqueKey(t), 1500*time.Microsecond+time.Second)
	ok, _, err := r.TryAcquire(ctx, l)
	if !ok || err != nil {
		t.Fatalf("TryAcquire = %v, %v", ok, err)
	}
	if want := 1002 * time.Millisecond; l.TTL != want {
		t.Errorf("TTL = %v; want %v (rounded up to whole ms)", l.TTL, want)
	}
	if want := l.TTL - (l.TTL/100 + 2*time.Millisecond); l.Validity != want {
		t.Errorf("Validity = %v; want TTL - drift = %v", l.Validity, want)
	}
	if l.Token != 0 {
		t.Errorf("Token = %d; want 0: Redlock makes no fencing tokens", l.Token)
	}
	c.eventually(t, l.Key, "every node to hold our value", func(v []string) bool {
		s := redlock.Stored(l)
		return v[0] == s && v[1] == s && v[2] == s
	})
	for i, cl := range c.inspect {
		pttl, err := cl.PTTL(ctx, lockKey(l.Key)).Result()
		if err != nil || pttl <= 900*time.Millisecond || pttl > l.TTL {
			t.Errorf("node %d: PTTL = %v, %v; want about %v", i, pttl, err, l.TTL)
		}
	}
	if err := r.Release(ctx, l); err != nil {
		t.Fatalf("Release = %v", err)
	}
	c.noneHold(t, l.Key, l.Value) // the release's stragglers are done

	// A TTL too short for the drift allowance is rounded up, not refused.
	short := newLease(uniqueKey(t), 2*time.Millisecond)
	ok, _, err = r.TryAcquire(ctx, short)
	if !ok || err != nil {
		t.Errorf("TryAcquire with TTL 2ms = %v, %v; want the lock, its TTL rounded up", ok, err)
	}
	if short.TTL <= 2*time.Millisecond || short.TTL-short.Validity < 2*time.Millisecond || short.Validity < redlock.MinNodeTimeout {
		t.Errorf("TTL 2ms became TTL %v, validity %v; want a validity of at least %v after the drift", short.TTL, short.Validity, redlock.MinNodeTimeout)
	}
	if ok {
		_ = r.Release(ctx, short)
	}

	// With no drift allowance a 2ms TTL is allowed.
	r0 := c.newResource(t, redlock.WithDrift(0, 0))
	short = newLease(uniqueKey(t), 2*time.Millisecond)
	if _, _, err := r0.TryAcquire(ctx, short); err != nil {
		t.Errorf("TryAcquire with TTL 2ms and no drift = %v", err)
	}
}

// TestReleaseRefresh: a majority decides release and refresh.
func TestReleaseRefresh(t *testing.T) {
	c := startNodes(t, 5, nil)
	r := c.newResource(t)
	ctx := t.Context()

	acquire := func(t *testing.T, ttl time.Duration) *backend.Lease {
		t.Helper()
		l := newLease(uniqueKey(t), ttl)
		if ok, _, err := r.TryAcquire(ctx, l); !ok || err != nil {
			t.Fatalf("TryAcquire = %v, %v", ok, err)
		}
		// TryAcquire returns once a majority set the key: wait for the
		// rest, so that the test's evictions are not undone by them.
		c.eventually(t, l.Key, "every node to hold our value", func(v []string) bool {
			return !slices.ContainsFunc(v, func(s string) bool { return s != redlock.Stored(l) })
		})
		return l
	}

	t.Run("refresh extends every node", func(t *testing.T) {
		// 2s: a node timeout (5% of it) that a loaded machine's replies
		// meet; 500ms left 25ms, and a CI run saw 4 of 5 nodes miss it.
		l := acquire(t, 2*time.Second)
		for i, cl := range c.inspect {
			if err := cl.PExpire(ctx, lockKey(l.Key), 100*time.Millisecond).Err(); err != nil {
				t.Fatalf("node %d: %v", i, err)
			}
		}
		if err := r.Refresh(ctx, l); err != nil {
			t.Fatalf("Refresh = %v", err)
		}
		// A majority at once, the others in the background.
		n := 0
		for _, cl := range c.inspect {
			if pttl := cl.PTTL(ctx, lockKey(l.Key)).Val(); pttl > time.Second {
				n++
			}
		}
		if n < 3 {
			t.Errorf("%d nodes extended after Refresh; want at least 3", n)
		}
		waitFor(t, "every node to be extended", func() bool {
			for _, cl := range c.inspect {
				if pttl := cl.PTTL(ctx, lockKey(l.Key)).Val(); pttl <= 200*time.Millisecond {
					return false
				}
			}
			return true
		})
		if err := r.Release(ctx, l); err != nil {
			t.Fatalf("Release = %v", err)
		}
	})

	t.Run("two evicted", func(t *testing.T) {
		l := acquire(t, time.Minute)
		c.del(t, l.Key, 0, 4)
		if err := r.Refresh(ctx, l); err != nil {
			t.Errorf("Refresh with 3 of 5 nodes holding = %v; want nil", err)
		}
		if err := r.Release(ctx, l); err != nil {
			t.Errorf("Release with 3 of 5 nodes holding = %v; want nil", err)
		}
		c.noneHold(t, l.Key, l.Value)
	})

	t.Run("three evicted", func(t *testing.T) {
		l := acquire(t, time.Minute)
		c.del(t, l.Key, 0, 2, 4)
		if err := r.Refresh(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Refresh with 2 of 5 nodes holding = %v; want ErrNotHeld", err)
		}
		c.hold(t, l.Key, "other", time.Minute, 0, 2, 4) // taken over
		if err := r.Release(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Release with 2 of 5 nodes holding = %v; want ErrNotHeld", err)
		}
		// Our minority was deleted anyway; the new owner's keys stay.
		c.noneHold(t, l.Key, l.Value)
		if got := c.count(t, l.Key, "other"); got != 3 {
			t.Errorf("%d nodes hold the new owner's value; want 3", got)
		}
	})

	t.Run("nodes down", func(t *testing.T) {
		l := acquire(t, time.Minute)
		c.servers[3].Kill()
		c.servers[4].Kill()
		if err := r.Refresh(ctx, l); err != nil {
			t.Errorf("Refresh with 2 of 5 nodes down = %v; want nil", err)
		}
		c.servers[2].Kill()
		err := r.Refresh(ctx, l)
		if !errors.Is(err, redlock.ErrNoQuorum) || errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Refresh with 3 of 5 nodes down = %v; want ErrNoQuorum", err)
		}
		err = r.Release(ctx, l)
		if !errors.Is(err, redlock.ErrNoQuorum) || errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Release with 3 of 5 nodes down = %v; want ErrNoQuorum (the lock may still be held)", err)
		}
		for _, i := range nodes(0, 1) {
			if v := c.values(t, l.Key)[i]; v != "" {
				t.Errorf("live node %d keeps %q after Release", i, v)
			}
		}
	})
}

// TestNoScript: a node that lost its script cache (restart, SCRIPT FLUSH)
// gets the script by EVAL.
func TestNoScript(t *testing.T) {
	c := startNodes(t, 3, nil)
	r := c.newResource(t)
	ctx := t.Context()
	for _, cl := range c.inspect {
		if err := cl.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	l := newLease(uniqueKey(t), time.Minute)
	if ok, _, err := r.TryAcquire(ctx, l); !ok || err != nil {
		t.Fatalf("TryAcquire after SCRIPT FLUSH = %v, %v", ok, err)
	}
	for _, cl := range c.inspect {
		_ = cl.ScriptFlush(ctx).Err()
	}
	if err := r.Refresh(ctx, l); err != nil {
		t.Fatalf("Refresh after SCRIPT FLUSH = %v", err)
	}
	for _, cl := range c.inspect {
		_ = cl.ScriptFlush(ctx).Err()
	}
	if err := r.Release(ctx, l); err != nil {
		t.Fatalf("Release after SCRIPT FLUSH = %v", err)
	}
	c.noneHold(t, l.Key, l.Value)
}

// recorder is a handler that keeps the remote attempts of the last
// acquire.
type recorder struct {
	n chan int
}

func (r *recorder) Acquire(ctx context.Context, req *distlock.Request, next distlock.AcquireFunc) error {
	err := next(ctx, req)
	if r.n == nil {
		r.n = make(chan int, 1)
	}
	select {
	case <-r.n:
	default:
	}
	r.n <- req.RemoteAttempts
	return err
}

func (r *recorder) Release(ctx context.Context, req *distlock.Request, next distlock.ReleaseFunc) error {
	return next(ctx, req)
}

func (r *recorder) attempts() int {
	if r.n == nil {
		return -1
	}
	return <-r.n
}
