package redis_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/redis"
)

// queuedLease is a lease of an acquisition that waits: a refused attempt
// queues it.
func queuedLease(key string, ttl time.Duration) *backend.Lease {
	l := newLease(key, ttl)
	l.Waits = true
	return l
}

// refused makes one attempt of l, which must be refused.
func refused(t *testing.T, r *redis.Resource, l *backend.Lease) {
	t.Helper()
	if ok, _, err := r.TryAcquire(t.Context(), l); ok || err != nil {
		t.Fatalf("TryAcquire(%q) of a held lock = %v, %v; want false, nil", l.Key, ok, err)
	}
}

// TestQueueKeepsLockForHead: a release with waiters keeps the lock for the
// head of the line: a newcomer's attempt is refused (and queues, behind),
// a waiter behind the head is refused, and the head takes it; a single
// attempt (no Waits) queues nothing. The head's release goes on to the
// next, and the last release frees the lock: nothing of the line is left.
func TestQueueKeepsLockForHead(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c)
	key := uniqueKey(t)
	lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
	holder := newLease(key, time.Minute)
	mustAcquire(t, r, holder)

	once := newLease(key, time.Minute) // a single attempt: no place in line
	refused(t, r, once)
	a, b := queuedLease(key, time.Minute), queuedLease(key, time.Minute)
	refused(t, r, a)
	refused(t, r, b)
	if n := c.ZCard(t.Context(), lock+redisscript.QueueSuffix).Val(); n != 2 {
		t.Fatalf("line of %d waiters; want 2 (the single attempt does not queue)", n)
	}
	if err := r.Release(t.Context(), holder); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(t.Context(), lock).Val(); v != "\x00"+a.Value {
		t.Fatalf("released lock holds %q; want it kept for the head %q", v, a.Value)
	}
	newcomer := queuedLease(key, time.Minute)
	refused(t, r, newcomer)
	refused(t, r, b)
	refused(t, r, once)
	mustAcquire(t, r, a)
	if err := r.Release(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, r, b)
	if err := r.Release(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, r, newcomer)
	if err := r.Release(t.Context(), newcomer); err != nil {
		t.Fatal(err)
	}
	for _, k := range redisscript.StateKeys(redis.DefaultPrefix, key) {
		if exists(t, c, k) {
			t.Errorf("%q left after every waiter was granted and released", k)
		}
	}
}

// TestQueueDeadHeadPassedOver: a head that never comes back for the lock
// kept for it (its process died) keeps it at most for what was left of its
// intent; the next waiter, through the facade, gets it then, not before
// the release and not a TTL later.
func TestQueueDeadHeadPassedOver(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c)
	key := uniqueKey(t)
	holder := newLease(key, time.Minute)
	mustAcquire(t, r, holder)
	const headTTL = 600 * time.Millisecond
	dead := queuedLease(key, headTTL)
	refused(t, r, dead) // queued first, then never seen again

	d, err := distlock.New(r, distlock.WithDefaultTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got := make(chan time.Time, 1)
	go func() {
		lk, err := d.TryLock(t.Context(), key, 30*time.Second)
		if err != nil {
			t.Errorf("waiter: %v", err)
			got <- time.Time{}
			return
		}
		got <- time.Now()
		_ = lk.Unlock(context.Background())
	}()
	lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
	waitFor(t, "the waiter to queue", func() bool {
		return c.ZCard(context.Background(), lock+redisscript.QueueSuffix).Val() == 2
	})
	released := time.Now()
	if err := r.Release(t.Context(), holder); err != nil {
		t.Fatal(err)
	}
	at := <-got
	if at.IsZero() {
		return
	}
	// The dead head's intent lapses within headTTL of its attempt, which
	// came before the release; the waiter then comes within its poll (a
	// third of headTTL's... its own TTL is a minute: backend.HeadPoll).
	if late := at.Sub(released); late > headTTL+backend.HeadPoll+time.Second {
		t.Errorf("waiter granted %v after the release; want within the dead head's TTL %v and a poll", late, headTTL)
	}
}

// TestQueueWithdrawHandsOn: a waiter whose wait ends while it is the head
// (the lock kept for it) withdraws, and the lock goes on to the next in
// line at once, who is told: it does not wait out the head's intent (a
// minute).
func TestQueueWithdrawHandsOn(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c)
	key := uniqueKey(t)
	holder := newLease(key, time.Minute)
	mustAcquire(t, r, holder)
	head := queuedLease(key, time.Minute)
	refused(t, r, head)

	d, err := distlock.New(r, distlock.WithDefaultTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		lk, err := d.TryLock(ctx, key, distlock.WaitForever)
		if err == nil {
			err = lk.Unlock(context.Background())
		}
		got <- err
	}()
	lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
	waitFor(t, "the waiter to queue", func() bool {
		return c.ZCard(context.Background(), lock+redisscript.QueueSuffix).Val() == 2
	})
	if err := r.Release(t.Context(), holder); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(t.Context(), lock).Val(); v != "\x00"+head.Value {
		t.Fatalf("released lock holds %q; want it kept for the head", v)
	}
	if err := r.Withdraw(t.Context(), head); err != nil { // the head's wait ended
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("next waiter: %v", err)
		}
	case <-time.After(backend.HeadPoll / 2):
		t.Fatalf("next waiter not granted within %v of the head's withdrawal", backend.HeadPoll/2)
	}
}

// TestQueueCancelledWaiterLeaves: a waiter whose context ends leaves the
// line before TryLock returns, so that the holder's release goes to the
// next one at once.
func TestQueueCancelledWaiterLeaves(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c)
	key := uniqueKey(t)
	lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
	d, err := distlock.New(r, distlock.WithDefaultTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	holder, err := d.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	gone := make(chan error, 1)
	go func() {
		_, err := d.TryLock(ctx, key, distlock.WaitForever)
		gone <- err
	}()
	waitFor(t, "the waiter to queue", func() bool {
		return c.ZCard(context.Background(), lock+redisscript.QueueSuffix).Val() == 1
	})
	cancel()
	if err := <-gone; !errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v; want ErrNotAcquired and context.Canceled", err)
	}
	if n := c.ZCard(t.Context(), lock+redisscript.QueueSuffix).Val(); n != 0 {
		t.Fatalf("line of %d after the cancelled waiter returned; want 0", n)
	}
	if err := holder.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if exists(t, c, lock) {
		t.Errorf("lock key left after the release with nobody waiting: %q", c.Get(t.Context(), lock).Val())
	}
}

// TestQueueOneWakePerRelease: waiters of three processes queue; each
// release wakes the head only, and the others make no attempt until their
// turn: attempts = one refused and one granted per waiter, plus at most
// one per waiter woken by its process's subscription being confirmed.
// (Waking one waiter per process per release, each waiter trying every
// 40-80ms while it waits, makes several times as many.)
func TestQueueOneWakePerRelease(t *testing.T) {
	c := standalone(t)
	key := uniqueKey(t)
	lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
	const procs, waiters, hold = 3, 9, 30 * time.Millisecond
	ds := make([]*distlock.DistributeLock, procs)
	for i := range ds {
		d, err := distlock.New(newResource(t, c), distlock.WithDefaultTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ds[i] = d
	}
	holder, err := ds[0].TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	before := commandStats(t, c)
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() {
			lk, err := ds[i%procs].TryLock(t.Context(), key, 30*time.Second)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			time.Sleep(hold) // work under the lock, while the others wait
			if err := lk.Unlock(context.Background()); err != nil {
				t.Errorf("waiter %d: Unlock: %v", i, err)
			}
		})
	}
	waitFor(t, "the waiters to queue", func() bool {
		return c.ZCard(context.Background(), lock+redisscript.QueueSuffix).Val() == waiters
	})
	if err := holder.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	d := statsDelta(before, commandStats(t, c))
	attempts := d["evalsha"] - (waiters + 1) // every EVALSHA but the releases
	if max := int64(3 * waiters); attempts > max {
		t.Errorf("%d attempts for %d waiters; want at most %d (refused, granted, one woken by a subscription)", attempts, waiters, max)
	}
	t.Logf("%d attempts for %d waiters (%v)", attempts, waiters, d)
}
