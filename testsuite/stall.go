package testsuite

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/distlock/distlock"
)

// stallSlack is how far past its bound a call may return in the
// StalledStore case. The promise is a few milliseconds; the slack is for
// a loaded 2-core machine under the race detector (the fault suite
// measures the real figure).
const stallSlack = time.Second

// testStalledStore: while the store does not answer, TryLock returns when
// its context or its wait ends, Unlock when its context ends and Close
// within its bound; once the store answers again, nothing an abandoned
// attempt did is left, and no abandoned attempt takes a key later.
func testStalledStore(t *testing.T, h *Harness) {
	needStall(t, h)
	ctx := context.Background()
	d := newManual(t, h.NewResource(t), distlock.WithCloseTimeout(500*time.Millisecond))
	closer := newManual(t, h.NewResource(t), distlock.WithCloseTimeout(500*time.Millisecond))
	t.Cleanup(func() { d.Close(); closer.Close() })
	kCtx, kWait, kHeld, kClose := Key(t)+"-ctx", Key(t)+"-wait", Key(t)+"-held", Key(t)+"-close"
	held := mustLock(t, d, ctx, kHeld, 0)
	// Close will not release this one while the store is stalled: a short
	// TTL frees it soon after.
	mustLock(t, closer, distlock.ContextWithTTL(ctx, 2*h.ttl()), kClose, 0)

	resume := h.Stall(t)
	resumed := false
	defer func() {
		if !resumed {
			resume()
		}
	}()

	timed := func(what string, bound time.Duration, fn func() error) error {
		t.Helper()
		start := time.Now()
		err := fn()
		if el := time.Since(start); el > bound+stallSlack {
			t.Errorf("%s returned after %v; its bound was %v", what, el, bound)
		}
		return err
	}
	err := timed("TryLock with a 300ms context", 300*time.Millisecond, func() error {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		lk, err := d.TryLock(cctx, kCtx, 5*time.Second)
		if lk != nil {
			t.Errorf("TryLock on a stalled store returned a lock")
		}
		return err
	})
	if !errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("TryLock with a 300ms context = %v; want ErrNotAcquired joined with context.DeadlineExceeded", err)
	}
	err = timed("TryLock with a 500ms wait", 500*time.Millisecond, func() error {
		lk, err := d.TryLock(ctx, kWait, 500*time.Millisecond)
		if lk != nil {
			t.Errorf("TryLock on a stalled store returned a lock")
		}
		return err
	})
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, distlock.ErrNotAcquired) {
		t.Errorf("TryLock with a 500ms wait = %v; want a store error wrapping context.DeadlineExceeded, not ErrNotAcquired", err)
	}
	err = timed("Unlock with a 300ms context", 300*time.Millisecond, func() error {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		return held.Unlock(cctx)
	})
	if err == nil {
		t.Errorf("Unlock on a stalled store = nil; want an error")
	}
	err = timed("Close with a 500ms bound", 500*time.Millisecond, closer.Close)
	if err == nil {
		t.Errorf("Close on a stalled store = nil; want the release it could not make")
	}

	resume()
	resumed = true
	// The lock Unlock could not release is still held: Unlock again.
	if err := held.Unlock(ctx); err != nil && !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("Unlock once the store answers = %v; want nil or ErrNotHeld", err)
	}
	// Close gave the lock it could not release up: the store frees it
	// with its TTL, unless the release it sent lands. Either way another
	// owner gets it; it may wait out the TTL, so check the others first.
	for _, k := range []string{kCtx, kWait, kHeld} {
		noLeftovers(t, h, k)
	}
	other, third := newLock(t, h), newLock(t, h)
	for _, k := range []string{kCtx, kWait, kHeld} {
		lk := mustLock(t, other, ctx, k, 10*time.Second)
		// No abandoned attempt takes the key from under its new owner.
		lk2, err := third.TryLock(ctx, k, 0)
		wantNotAcquired(t, lk2, err)
		mustUnlock(t, lk)
		noLeftovers(t, h, k)
	}
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
