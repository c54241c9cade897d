package testsuite

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
)

// testExtend: Extend moves the lock's end and Deadline; a gone lock is not
// extended (ErrNotHeld, Done closes); bad input costs no I/O.
func testExtend(t *testing.T, h *Harness) {
	t.Run("Moves", func(t *testing.T) {
		key := Key(t)
		ttl := h.ttl()
		a, b := newLock(t, h), newLock(t, h)
		lk := mustLock(t, a, distlock.ContextWithTTL(t.Context(), ttl), key, 0)
		before := lk.Deadline()
		if h.FixedTTL != "" {
			if err := lk.Extend(t.Context(), 10*ttl); !errors.Is(err, distlock.ErrUnsupported) {
				t.Errorf("Extend to another TTL on a store that keeps it (%s) = %v; want ErrUnsupported", h.FixedTTL, err)
			}
			// A manual renewal, then: the same TTL, again and again.
			for end := time.Now().Add(2 * ttl); time.Now().Before(end); time.Sleep(ttl / 4) {
				if err := lk.Extend(t.Context(), ttl); err != nil {
					t.Fatalf("Extend(%v) = %v", ttl, err)
				}
				lk2, err := b.TryLock(t.Context(), key, 0)
				wantNotAcquired(t, lk2, err)
			}
			if after := lk.Deadline(); !after.After(before) || !after.After(time.Now()) {
				t.Errorf("Deadline %v after renewing by hand for 2 TTLs; it was %v", after, before)
			}
			mustUnlock(t, lk)
			noLeftovers(t, h, key)
			return
		}
		if err := lk.Extend(t.Context(), 10*ttl); err != nil {
			t.Fatalf("Extend = %v", err)
		}
		if after := lk.Deadline(); !after.After(before.Add(ttl)) {
			t.Errorf("Deadline %v after Extend(%v); it was %v", after, 10*ttl, before)
		}
		// Past the first TTL the lock is still ours.
		for end := time.Now().Add(2 * ttl); time.Now().Before(end); time.Sleep(ttl / 4) {
			lk2, err := b.TryLock(t.Context(), key, 0)
			wantNotAcquired(t, lk2, err)
		}
		mustUnlock(t, lk)
		noLeftovers(t, h, key)
	})
	t.Run("Gone", func(t *testing.T) {
		key := Key(t)
		a := newLock(t, h)
		lk := mustLock(t, a, t.Context(), key, 0)
		done := lk.Done()
		if err := h.Evict(t.Context(), key); err != nil {
			t.Fatal(err)
		}
		if err := lk.Extend(t.Context(), time.Minute); !errors.Is(err, distlock.ErrNotHeld) {
			t.Errorf("Extend of an evicted lock = %v; want ErrNotHeld", err)
		}
		waitClosed(t, done, 5*time.Second, "Extend found the lock gone")
		// Unlock clears what a store may keep of a lost lock (a
		// Redlock node the eviction missed).
		if err := lk.Unlock(t.Context()); err != nil && !errors.Is(err, distlock.ErrNotHeld) {
			t.Errorf("Unlock of the lost lock = %v", err)
		}
		noLeftovers(t, h, key)
	})
	t.Run("BadTTL", func(t *testing.T) {
		r, c := wrapCounting(t, h.NewResource(t))
		d := newLockOver(t, r)
		lk := mustLock(t, d, t.Context(), Key(t), 0)
		calls := c.calls.Load()
		for _, ttl := range []time.Duration{0, -time.Second} {
			if err := lk.Extend(t.Context(), ttl); !errors.Is(err, distlock.ErrInvalid) {
				t.Errorf("Extend(%v) = %v; want ErrInvalid", ttl, err)
			}
		}
		if n := c.calls.Load() - calls; n != 0 {
			t.Errorf("bad Extend made %d store calls", n)
		}
		mustUnlock(t, lk)
	})
}

// testWaitForever: WaitForever waits until the lock is free, or ctx ends.
func testWaitForever(t *testing.T, h *Harness) {
	key := Key(t)
	a, b := newLock(t, h), newLock(t, h)
	lk := mustLock(t, a, t.Context(), key, 0)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	got, err := b.TryLock(ctx, key, distlock.WaitForever)
	cancel()
	if got != nil || !errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitForever ended by ctx = %v, %v; want ErrNotAcquired and DeadlineExceeded", got, err)
	}
	res := make(chan error, 1)
	go func() {
		lk2, err := b.TryLock(context.Background(), key, distlock.WaitForever)
		if err == nil {
			err = lk2.Unlock(context.Background())
		}
		res <- err
	}()
	time.Sleep(100 * time.Millisecond) // the waiter waits: a check of the wait, not synchronisation
	mustUnlock(t, lk)
	select {
	case err := <-res:
		if err != nil {
			t.Errorf("WaitForever once the lock was free = %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("WaitForever did not take the freed lock")
	}
	noLeftovers(t, h, key)
}

// testInspect: a key's holders, tokens, time left and labels, of every
// kind, read without taking the lock.
func testInspect(t *testing.T, h *Harness) {
	if h.NoInspect != "" {
		r, c := wrapCounting(t, h.NewResource(t))
		_, err := newLockOver(t, r).Inspect(t.Context(), Key(t))
		if !errors.Is(err, distlock.ErrUnsupported) {
			t.Errorf("Inspect on a store that cannot (%s) = %v; want ErrUnsupported", h.NoInspect, err)
		}
		wantNoCalls(t, c, "Inspect on a store that cannot")
		t.Logf("inspection: %s", h.NoInspect)
		return
	}
	key := Key(t)
	ttl := 20 * h.ttl()
	a := newLock(t, h, distlock.WithLabel("host-a:123"))
	b := newLock(t, h, distlock.WithLabel("host-b:456"))
	ctx := distlock.ContextWithTTL(t.Context(), ttl)
	in, err := a.Inspect(t.Context(), key)
	if err != nil || in.Held() {
		t.Fatalf("Inspect of a free key = %+v, %v; want not held", in, err)
	}
	lk := mustLock(t, a, ctx, key, 0)
	in, err = b.Inspect(t.Context(), key)
	if err != nil || len(in.Holders) != 1 {
		t.Fatalf("Inspect of a held key = %+v, %v; want one holder", in, err)
	}
	hd := in.Holders[0]
	if hd.Label != "host-a:123" || hd.TTL <= 0 || hd.TTL > ttl+time.Second || (!h.NoToken && hd.Token != lk.Token()) {
		t.Errorf("holder = %+v; want label host-a:123, token %d, 0 < TTL <= %v", hd, lk.Token(), ttl)
	}
	mustUnlock(t, lk)
	if in, err = b.Inspect(t.Context(), key); err != nil || in.Held() {
		t.Errorf("Inspect after Unlock = %+v, %v; want not held", in, err)
	}
	if _, no := h.Unsupported[backend.KindSemaphore]; !no {
		s1 := must(t)(a.Semaphore(key, 3).TryAcquire(ctx, 0))
		s2 := must(t)(b.Semaphore(key, 3).TryAcquire(ctx, 0))
		in, err = a.Semaphore(key, 3).Inspect(t.Context())
		if err != nil || len(in.Holders) != 2 || in.Limit != 3 {
			t.Errorf("Inspect of a semaphore with two holders of 3 = %+v, %v", in, err)
		}
		mustUnlock(t, s1)
		mustUnlock(t, s2)
	}
	if _, no := h.Unsupported[backend.KindRead]; !no {
		r1 := must(t)(a.RWMutex(key).TryRLock(ctx, 0))
		r2 := must(t)(b.RWMutex(key).TryRLock(ctx, 0))
		in, err = a.RWMutex(key).Inspect(t.Context())
		if err != nil || len(in.Holders) != 2 || in.Holders[0].Kind != distlock.KindRead || in.Holders[1].Kind != distlock.KindRead {
			t.Errorf("Inspect of a read/write lock with two readers = %+v, %v", in, err)
		}
		mustUnlock(t, r1)
		mustUnlock(t, r2)
	}
	noLeftovers(t, h, key)
}

// testTryLockAll: several keys all or none, tokens per key, Done on any
// key's loss, Unlock of all, and no deadlock between processes locking
// overlapping sets in opposite orders.
func testTryLockAll(t *testing.T, h *Harness) {
	t.Run("AllOrNone", func(t *testing.T) {
		base := Key(t)
		k1, k2, k3 := base+"-1", base+"-2", base+"-3"
		a, b := newLock(t, h), newLock(t, h)
		held := mustLock(t, b, t.Context(), k2, 0)
		got, err := a.TryLockAll(t.Context(), []string{k3, k1, k2}, 200*time.Millisecond)
		wantNotAcquired(t, got, err)
		noLeftovers(t, h, k1)
		noLeftovers(t, h, k3)
		mustUnlock(t, held)
		lk := must(t)(a.TryLockAll(t.Context(), []string{k3, k1, k2, k1}, time.Second))
		if keys := lk.Keys(); len(keys) != 3 || keys[0] != k1 || keys[1] != k2 || keys[2] != k3 {
			t.Errorf("Keys = %q; want the three keys, sorted", keys)
		}
		if toks := lk.Tokens(); len(toks) != 3 || (!h.NoToken && (toks[0] == 0 || toks[0] == toks[1] || toks[1] == toks[2])) {
			t.Errorf("Tokens = %v; want one per key", toks)
		}
		for _, k := range []string{k1, k2, k3} {
			other, err := b.TryLock(t.Context(), k, 0)
			wantNotAcquired(t, other, err)
		}
		mustUnlock(t, lk)
		for _, k := range []string{k1, k2, k3} {
			noLeftovers(t, h, k)
		}
	})
	t.Run("DoneOnAnyLoss", func(t *testing.T) {
		base := Key(t)
		k1, k2 := base+"-1", base+"-2"
		a := newLock(t, h, distlock.WithAutoRenew())
		lk := must(t)(a.TryLockAll(distlock.ContextWithTTL(t.Context(), h.ttl()), []string{k1, k2}, 0))
		done := lk.Done()
		if err := h.Evict(t.Context(), k2); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, done, 10*h.ttl()+5*time.Second, "a key of the set was evicted")
		if err := lk.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
			t.Errorf("Unlock of a set with a lost key = %v; want ErrNotHeld", err)
		}
		noLeftovers(t, h, k1)
		noLeftovers(t, h, k2)
	})
	t.Run("NoDeadlock", func(t *testing.T) {
		base := Key(t)
		k1, k2, k3 := base+"-1", base+"-2", base+"-3"
		sets := [][]string{{k1, k2, k3}, {k3, k2, k1}, {k2, k3}, {k3, k1}}
		var wg sync.WaitGroup
		for i, set := range sets {
			d := newLock(t, h)
			wg.Go(func() {
				for j := range 15 {
					lk, err := d.TryLockAll(context.Background(), set, 20*time.Second)
					if err != nil {
						t.Errorf("worker %d round %d: %v", i, j, err)
						return
					}
					if err := lk.Unlock(context.Background()); err != nil {
						t.Errorf("worker %d round %d: Unlock = %v", i, j, err)
						return
					}
				}
			})
		}
		wg.Wait()
		for _, k := range []string{k1, k2, k3} {
			noLeftovers(t, h, k)
		}
	})
}
