package testsuite

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/distlock/distlock"
)

func testReentrancy(t *testing.T, h *Harness) {
	t.Run("NestedTryLock", func(t *testing.T) { testNestedTryLock(t, h) })
	t.Run("OutOfOrderUnlock", func(t *testing.T) { testOutOfOrderUnlock(t, h) })
	t.Run("NestedDo", func(t *testing.T) { testNestedDo(t, h) })
	t.Run("AfterLoss", func(t *testing.T) { testReenterAfterLoss(t, h) })
	t.Run("SharedContext", func(t *testing.T) { testSharedContext(t, h) })
	t.Run("OtherKeyOrInstance", func(t *testing.T) { testOtherKeyOrInstance(t, h) })
	t.Run("MaxReentrancy", func(t *testing.T) { testMaxReentrancy(t, h) })
}

// stillHeld asserts another owner cannot take key now.
func stillHeld(t *testing.T, other *distlock.DistributeLock, key string) {
	t.Helper()
	got, err := other.TryLock(t.Context(), key, 0)
	if err == nil {
		_ = got.Unlock(t.Context())
		t.Fatalf("another owner took %q: the lock was released too early", key)
	}
	wantNotAcquired(t, got, err)
}

func testNestedTryLock(t *testing.T, h *Harness) {
	r, calls := newCounting(t, h.NewResource(t))
	d, other := newLockOver(t, r), newLock(t, h)
	key := Key(t)
	outer := mustLock(t, d, t.Context(), key, 0)
	ctx := distlock.ContextWithLock(t.Context(), outer)
	before := calls.Load()
	inner := mustLock(t, d, ctx, key, 0)
	if inner.Token() != outer.Token() || inner.Done() != outer.Done() || inner.Key() != key {
		t.Errorf("nested handle: token %d, Done %v; want the outer's %d, %v", inner.Token(), inner.Done(), outer.Token(), outer.Done())
	}
	mustUnlock(t, inner)
	if n := calls.Load() - before; n != 0 {
		t.Errorf("nested TryLock and Unlock made %d store calls; want 0", n)
	}
	if err := inner.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("second Unlock of a nested handle = %v; want ErrNotHeld", err)
	}
	stillHeld(t, other, key)
	mustUnlock(t, outer)
	waitClosed(t, inner.Done(), time.Second, "last handle unlocked")
	mustUnlock(t, mustLock(t, other, t.Context(), key, 0))
	noLeftovers(t, h, key)
}

func testOutOfOrderUnlock(t *testing.T, h *Harness) {
	d, other := newLock(t, h), newLock(t, h)
	key := Key(t)
	outer := mustLock(t, d, t.Context(), key, 0)
	inner := mustLock(t, d, distlock.ContextWithLock(t.Context(), outer), key, 0)
	mustUnlock(t, outer)
	stillHeld(t, other, key)
	if isClosed(inner.Done()) {
		t.Fatalf("Done closed while a handle is live")
	}
	mustUnlock(t, inner)
	mustUnlock(t, mustLock(t, other, t.Context(), key, 0))
	noLeftovers(t, h, key)
}

func testNestedDo(t *testing.T, h *Harness) {
	d, other := newLock(t, h), newLock(t, h)
	key := Key(t)
	depth := 0
	err := d.Do(t.Context(), key, 0, func(ctx context.Context, outer *distlock.Lock) error {
		return d.Do(ctx, key, 0, func(ctx context.Context, inner *distlock.Lock) error {
			depth = 2
			if inner.Token() != outer.Token() {
				t.Errorf("nested Do token %d; want %d", inner.Token(), outer.Token())
			}
			return nil
		})
	})
	if err != nil || depth != 2 {
		t.Fatalf("nested Do = %v, depth %d; want nil, 2", err, depth)
	}
	mustUnlock(t, mustLock(t, other, t.Context(), key, 0))
	noLeftovers(t, h, key)
}

func testReenterAfterLoss(t *testing.T, h *Harness) {
	ttl := h.ttl()
	d := newLock(t, h, distlock.WithDefaultTTL(ttl))
	key := Key(t)
	outer := mustLock(t, d, t.Context(), key, 0)
	ctx := distlock.ContextWithLock(t.Context(), outer)
	waitClosed(t, outer.Done(), 3*ttl+2*ttl, "TTL ran out")
	lk, err := d.TryLock(ctx, key, 0)
	if lk != nil || !errors.Is(err, distlock.ErrNotHeld) {
		t.Fatalf("reentering a lost lock = %v, %v; want nil, ErrNotHeld", lk, err)
	}
	_ = outer.Unlock(t.Context())
	noLeftovers(t, h, key)
}

func testSharedContext(t *testing.T, h *Harness) {
	d, other := newLock(t, h), newLock(t, h)
	key := Key(t)
	outer := mustLock(t, d, t.Context(), key, 0)
	ctx := distlock.ContextWithLock(t.Context(), outer)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				lk, err := d.TryLock(ctx, key, 0)
				if err != nil {
					t.Errorf("nested TryLock: %v", err)
					return
				}
				if err := lk.Unlock(t.Context()); err != nil {
					t.Errorf("nested Unlock: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	stillHeld(t, other, key)
	mustUnlock(t, outer)
	mustUnlock(t, mustLock(t, other, t.Context(), key, 0))
	noLeftovers(t, h, key)
}

func testOtherKeyOrInstance(t *testing.T, h *Harness) {
	d, other := newLock(t, h), newLock(t, h)
	key, key2 := Key(t), Key(t)
	outer := mustLock(t, d, t.Context(), key, 0)
	ctx := distlock.ContextWithLock(t.Context(), outer)
	lk2 := mustLock(t, d, ctx, key2, 0) // another key: a lock of its own
	if lk2.Done() == outer.Done() {
		t.Errorf("a lock of another key shares the outer lock's Done")
	}
	got, err := other.TryLock(ctx, key, 0) // another DistributeLock: no reentry
	wantNotAcquired(t, got, err)
	mustUnlock(t, lk2)
	mustUnlock(t, outer)
	noLeftovers(t, h, key)
	noLeftovers(t, h, key2)
}

func testMaxReentrancy(t *testing.T, h *Harness) {
	for _, max := range []int{1, 2} {
		d := newLock(t, h, distlock.WithMaxReentrancy(max))
		key := Key(t)
		ctx := t.Context()
		var held []*distlock.Lock
		for range max {
			lk := mustLock(t, d, ctx, key, 0)
			ctx = distlock.ContextWithLock(ctx, lk)
			held = append(held, lk)
		}
		lk, err := d.TryLock(ctx, key, 0)
		if lk != nil || !errors.Is(err, distlock.ErrReentrancy) {
			t.Errorf("max %d: TryLock #%d = %v, %v; want nil, ErrReentrancy", max, max+1, lk, err)
		}
		for _, lk := range held {
			mustUnlock(t, lk)
		}
		noLeftovers(t, h, key)
	}
}
