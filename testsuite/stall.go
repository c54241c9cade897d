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

// StallSlack is how far past its bound a call may return while the store
// does not answer, in the StalledStore case and in stores' own stall
// tests. The promise is a few milliseconds; the slack is for a loaded
// 2-core machine under the race detector (the fault suite measures the
// real figure).
const StallSlack = time.Second

// stallWatchdog ends a stall that a call did not return from: a call that
// waits for the store would otherwise wait as long as the test.
const stallWatchdog = 8 * time.Second

// RunStalled runs the cases of a store that stops answering
// (StalledStore, OneAttemptOnStalledStore) alone: for variants of a
// harness that differ only in how its client meets a stall (its timeouts,
// whether it honours the context's deadline), whose other cases Run has
// covered.
func RunStalled(t *testing.T, h Harness) {
	if h.NewResource == nil || h.Leftovers == nil {
		t.Fatal("testsuite: Harness needs NewResource and Leftovers")
	}
	t.Run("StalledStore", func(t *testing.T) { testStalledStore(t, &h) })
	t.Run("OneAttemptOnStalledStore", func(t *testing.T) { testOneAttemptStalled(t, &h) })
}

// testStalledStore: while the store does not answer, each call returns at
// its bound (plus StallSlack), whatever the store and its client do: a
// TryLock when its context ends (by deadline or by cancel, its wait
// longer), the first TryLock of a TTL not used before, a TryLock when its
// wait ends, a waiter queued before the stall when it is cancelled, an
// Unlock when its context ends, and Close at its bound. Each call has a
// stall of its own. Once the store answers again, nothing an abandoned
// attempt did is left, another owner takes the key, and no abandoned
// attempt takes it from under that owner.
func testStalledStore(t *testing.T, h *Harness) {
	needStall(t, h)
	ctx := context.Background()
	d := newManual(t, h.NewResource(t), distlock.WithCloseTimeout(500*time.Millisecond))
	t.Cleanup(func() { d.Close() })
	other, third := newLock(t, h), newLock(t, h)

	// stalled stops the store until the returned resume, or the watchdog.
	stalled := func(t *testing.T) (resume func()) {
		var once sync.Once
		r := h.Stall(t)
		resume = func() { once.Do(r) }
		dog := time.AfterFunc(stallWatchdog, resume)
		t.Cleanup(func() { dog.Stop(); resume() })
		return resume
	}
	timed := func(t *testing.T, what string, bound time.Duration, fn func() error) error {
		t.Helper()
		start := time.Now()
		err := fn()
		el := time.Since(start)
		t.Logf("%s: returned after %v: %v", what, el.Round(time.Millisecond), err)
		if el > bound+StallSlack {
			t.Errorf("%s returned after %v; its bound was %v", what, el, bound)
		}
		return err
	}
	tryLock := func(t *testing.T, ctx context.Context, key string, wait time.Duration) error {
		lk, err := d.TryLock(ctx, key, wait)
		if lk != nil {
			t.Errorf("TryLock(%q) on a stalled store returned a lock", key)
			defer lk.Unlock(context.Background())
		}
		return err
	}
	// warm takes key once and lets it go: what a store keeps per key
	// beyond the lock (a parent znode, a key watch) exists, so that a
	// request sent during a stall lands once the store answers.
	warm := func(t *testing.T, key string) {
		t.Helper()
		mustUnlock(t, mustLock(t, other, ctx, key, 0))
	}
	// taken: another owner takes key, no abandoned attempt takes it from
	// under that owner, and once it is released nothing of key is left.
	taken := func(t *testing.T, key string) {
		t.Helper()
		lk := mustLock(t, other, ctx, key, 10*time.Second)
		lk2, err := third.TryLock(ctx, key, 0)
		wantNotAcquired(t, lk2, err)
		mustUnlock(t, lk)
		noLeftovers(t, h, key)
	}
	// settled: once the store answers, nothing of key is left, another
	// owner takes it, and no abandoned attempt takes it from under that
	// owner.
	settled := func(t *testing.T, key string) {
		t.Helper()
		start := time.Now()
		noLeftovers(t, h, key)
		t.Logf("%s: nothing left %v after the store answered", key, time.Since(start).Round(time.Millisecond))
		taken(t, key)
	}
	// One lock held across the stalls: connections, scripts and the
	// store's state for the default TTL exist.
	mustLock(t, d, ctx, Key(t)+"-held", 0)

	for _, c := range []struct {
		name, what string
		ctx        func() (context.Context, context.CancelFunc)
		wantErr    error
	}{
		{"TryLockContext", "TryLock with a 300ms context and a 5s wait", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, 300*time.Millisecond)
		}, context.DeadlineExceeded},
		{"TryLockCancel", "TryLock with a context cancelled at 300ms and a 5s wait", func() (context.Context, context.CancelFunc) {
			cctx, cancel := context.WithCancel(ctx)
			time.AfterFunc(300*time.Millisecond, cancel)
			return cctx, cancel
		}, context.Canceled},
		{"TryLockNewTTL", "TryLock of a new TTL with a 300ms context and a 5s wait", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(distlock.ContextWithTTL(ctx, 42*time.Second), 300*time.Millisecond)
		}, context.DeadlineExceeded},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := Key(t)
			warm(t, key)
			resume := stalled(t)
			err := timed(t, c.what, 300*time.Millisecond, func() error {
				cctx, cancel := c.ctx()
				defer cancel()
				return tryLock(t, cctx, key, 5*time.Second)
			})
			resume()
			if !errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, c.wantErr) {
				t.Errorf("%s = %v; want ErrNotAcquired joined with %v", c.what, err, c.wantErr)
			}
			settled(t, key)
		})
	}

	t.Run("TryLockWait", func(t *testing.T) {
		key := Key(t)
		warm(t, key)
		resume := stalled(t)
		err := timed(t, "TryLock with a 500ms wait", 500*time.Millisecond, func() error {
			return tryLock(t, ctx, key, 500*time.Millisecond)
		})
		resume()
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, distlock.ErrNotAcquired) {
			t.Errorf("TryLock with a 500ms wait = %v; want a store error wrapping context.DeadlineExceeded, not ErrNotAcquired", err)
		}
		settled(t, key)
	})

	t.Run("QueuedWaiter", func(t *testing.T) {
		key := Key(t)
		holder := mustLock(t, other, ctx, key, 0)
		r, calls := wrapCounting(t, h.NewResource(t))
		waiter := newLockOver(t, r)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		errc := make(chan error, 1)
		go func() {
			lk, err := waiter.TryLock(wctx, key, time.Minute)
			if lk != nil {
				t.Errorf("the cancelled waiter got the lock")
				_ = lk.Unlock(context.Background())
			}
			errc <- err
		}()
		// Waiting: a Spinner has tried again, a Waiter's entry is in the
		// key's queue.
		_, isWaiter := r.(backend.Waiter)
		poll(t, 10*time.Second, "the waiter waits behind the holder", func() bool {
			if !isWaiter {
				return calls.calls.Load() >= 2
			}
			left, err := h.Leftovers(ctx, key)
			return err == nil && len(left) >= 2
		})
		resume := stalled(t)
		err := timed(t, "a queued TryLock cancelled during the stall", 0, func() error {
			cancel()
			return <-errc
		})
		resume()
		if !errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			t.Errorf("the cancelled waiter's TryLock = %v; want ErrNotAcquired joined with context.Canceled", err)
		}
		mustUnlock(t, holder)
		settled(t, key)
	})

	t.Run("Unlock", func(t *testing.T) {
		key := Key(t)
		lk := mustLock(t, d, ctx, key, 0)
		resume := stalled(t)
		err := timed(t, "Unlock with a 300ms context", 300*time.Millisecond, func() error {
			cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			return lk.Unlock(cctx)
		})
		resume()
		if err == nil {
			t.Errorf("Unlock on a stalled store = nil; want an error")
		}
		// The lock Unlock could not release is still held: Unlock again.
		if err := lk.Unlock(ctx); err != nil && !errors.Is(err, distlock.ErrNotHeld) {
			t.Errorf("Unlock once the store answers = %v; want nil or ErrNotHeld", err)
		}
		settled(t, key)
	})

	t.Run("Close", func(t *testing.T) {
		key := Key(t)
		closer := newManual(t, h.NewResource(t), distlock.WithCloseTimeout(500*time.Millisecond))
		// Close will not release this one while the store is stalled: a
		// short TTL frees it soon after.
		mustLock(t, closer, distlock.ContextWithTTL(ctx, 2*h.ttl()), key, 0)
		resume := stalled(t)
		err := timed(t, "Close bounded to 500ms", 500*time.Millisecond, closer.Close)
		resume()
		if err == nil {
			t.Errorf("Close on a stalled store = nil; want the release it could not make")
		}
		// Close gave the lock up: the store frees it with its TTL (an
		// SQL row stays, expired, until taken over), unless the release
		// it sent lands.
		taken(t, key)
	})

	// Every clean-up is done: Close has nothing to report.
	if err := d.Close(); err != nil {
		t.Errorf("Close once the store answers = %v", err)
	}
}

// needStall skips t, saying why, when h cannot stall its store, and fails
// it when h says nothing.
func needStall(t *testing.T, h *Harness) {
	t.Helper()
	if h.Stall == nil {
		if h.NoStall != "" {
			t.Skip(h.NoStall)
		}
		t.Fatal("the harness sets neither Stall nor NoStall")
	}
}

// poll waits until cond holds, checking every few milliseconds, and
// fails t if it does not within d.
func poll(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
