package testsuite

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
)

// testBadInputMatrix is the bad-input matrix: odd, huge and missing
// arguments, and calls in the wrong order, each under a recover that fails
// the case instead of crashing the test binary. Every case checks the
// error class with errors.Is and that the store is left clean.
func testBadInputMatrix(t *testing.T, h *Harness) {
	cases := []struct {
		name string
		fn   func(*testing.T, *Harness)
	}{
		{"LongKey", testLongKey},
		{"KeyAtLimit", testKeyAtLimit},
		{"MoreOddKeys", testMoreOddKeys},
		{"BareKeys", testBareKeys},
		{"TTLInvalid", testTTLInvalid},
		{"TTLBelowFloor", testTTLBelowFloor},
		{"TTLHuge", testTTLHuge},
		{"WaitExtremes", testWaitExtremes},
		{"NilContext", testNilContext},
		{"ConcurrentDoubleUnlock", testConcurrentDoubleUnlock},
		{"StaleHandleAfterEvict", testStaleHandleAfterEvict},
		{"ExtendAfterLoss", testExtendAfterLoss},
		{"UseAfterClose", testUseAfterClose},
		{"WaiterDuringClose", testWaiterDuringClose},
		{"ClosedClient", testClosedClient},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer failOnPanic(t)
			c.fn(t, h)
		})
	}
}

// failOnPanic turns a panic of the calling goroutine into a test failure.
// Deferred directly.
func failOnPanic(t *testing.T) {
	if r := recover(); r != nil {
		t.Fatalf("panic: %v\n%s", r, debug.Stack())
	}
}

// hangLimit bounds a call that must return promptly; reaching it is a hang,
// not slowness.
const hangLimit = 30 * time.Second

// within runs fn in a goroutine and fails the test if it panics or has not
// returned after hangLimit.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan any, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Sprintf("%v\n%s", r, debug.Stack())
				return
			}
			done <- nil
		}()
		fn()
	}()
	select {
	case p := <-done:
		if p != nil {
			t.Fatalf("%s: panic: %v", what, p)
		}
	case <-time.After(hangLimit):
		t.Fatalf("%s: no return within %v", what, hangLimit)
	}
}

// maxBadInputErr is the longest error message bad input may give: an error
// that echoes a megabyte key is not a clear error.
const maxBadInputErr = 4 << 10

func wantInvalid(t *testing.T, what string, lk *distlock.Lock, err error) {
	t.Helper()
	if lk != nil || !errors.Is(err, distlock.ErrInvalid) {
		t.Errorf("%s = %v, %.200v; want nil, ErrInvalid", what, lk, err)
		if lk != nil {
			_ = lk.Unlock(context.Background())
		}
		return
	}
	if errors.Is(err, distlock.ErrNotAcquired) {
		t.Errorf("%s = %.200v; bad input must not look like contention", what, err)
	}
	if n := len(err.Error()); n > maxBadInputErr {
		t.Errorf("%s: error message of %d bytes (%.120q...); want at most %d", what, n, err.Error(), maxBadInputErr)
	}
}

func wantNoCalls(t *testing.T, c *counting, what string) {
	t.Helper()
	if n := c.calls.Load(); n != 0 {
		t.Errorf("%s made %d store calls; want 0", what, n)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// rejectsKey reports whether the harness declares that the store cannot
// hold key.
func (h *Harness) rejectsKey(key string) bool {
	return h.RejectsNUL && strings.ContainsRune(key, 0) || h.RejectsInvalidUTF8 && !utf8.ValidString(key)
}

// testLongKey: a 1 MiB key fails with ErrInvalid and no I/O when the store
// has a limit below it; otherwise it is a key like any other.
func testLongKey(t *testing.T, h *Harness) {
	base := Key(t)
	key := base + strings.Repeat("k", 1<<20-len(base))
	r, c := wrapCounting(t, h.NewResource(t))
	d := newLockOver(t, r)
	// A 1 MiB key with another fault: whichever is reported, briefly.
	lk, err := d.TryLock(t.Context(), key, -1)
	wantInvalid(t, "TryLock(1 MiB key, negative wait)", lk, err)
	lk, err = d.TryLock(distlock.ContextWithTTL(t.Context(), 0), key, 0)
	wantInvalid(t, "TryLock(1 MiB key, TTL 0)", lk, err)
	wantNoCalls(t, c, "a 1 MiB key with a bad wait or TTL")
	if h.MaxKeyLen > 0 && len(key) > h.MaxKeyLen {
		lk, err = d.TryLock(t.Context(), key, 0)
		wantInvalid(t, "TryLock(1 MiB key)", lk, err)
		called := false
		err = d.Do(t.Context(), key, time.Second, func(context.Context, *distlock.Lock) error { called = true; return nil })
		wantInvalid(t, "Do(1 MiB key)", nil, err)
		if called {
			t.Errorf("Do(1 MiB key) ran fn")
		}
		wantNoCalls(t, c, "a 1 MiB key over MaxKeyLen")
		return
	}
	lk = mustLock(t, d, t.Context(), key, 0)
	got, err := newLock(t, h).TryLock(t.Context(), key, 0)
	wantNotAcquired(t, got, err)
	mustUnlock(t, lk)
	noLeftovers(t, h, key)
}

// testKeyAtLimit: a key of exactly MaxKeyLen bytes, all of which a store
// must escape, works and leaves nothing; one byte more is ErrInvalid.
func testKeyAtLimit(t *testing.T, h *Harness) {
	if h.MaxKeyLen <= 0 {
		t.Skip("the harness sets no MaxKeyLen: LongKey covers long keys")
	}
	base := "limit-" + randHex(6)
	if len(base) > h.MaxKeyLen {
		base = base[:h.MaxKeyLen]
	}
	key := base + strings.Repeat("/%{}.", h.MaxKeyLen)[:h.MaxKeyLen-len(base)]
	r, c := wrapCounting(t, h.NewResource(t))
	d := newLockOver(t, r)
	lk, err := d.TryLock(t.Context(), key+"}", 0)
	wantInvalid(t, fmt.Sprintf("TryLock(key of MaxKeyLen+1 = %d bytes)", h.MaxKeyLen+1), lk, err)
	wantNoCalls(t, c, "a key over MaxKeyLen")
	lk = mustLock(t, d, t.Context(), key, 0)
	got, err := newLock(t, h).TryLock(t.Context(), key, 0)
	wantNotAcquired(t, got, err)
	mustUnlock(t, lk)
	noLeftovers(t, h, key)
}

// moreOddKeys adds to OddKeys the keys an escaping scheme or a store's
// collation could merge: escape sequences next to the bytes they stand
// for, case, Unicode normal forms, trailing spaces, control bytes and
// invalid UTF-8 next to U+FFFD.
var moreOddKeys = []string{
	"a%2Fb", "a%2fb", "%", "%%", "a%", "a%25", "%7Bx%7D", "%7bx%7d", "%00", "a%00b",
	"{}", "{{}}", "{", "}", "a{b}c{d}",
	"//", "a//b", "a/b/", "/",
	".", "..", "...", "%2E",
	"A", "é", "e\u0301", "ａ", "a ", "a  ", "\t", "\n", "\r\n", "\x01", "\x7f",
	"\u2028", "\u200b", "🔒", "\U0010FFFF", "\ufffd",
	"\xff", "\xc3", "\xed\xa0\x80", "\xc0\x80",
}

// testMoreOddKeys holds every odd key at once, each prefixed and suffixed
// with a unique base: keys that a store merged would collide here.
func testMoreOddKeys(t *testing.T, h *Harness) {
	base := Key(t)
	var keys []string
	for _, k := range moreOddKeys {
		keys = append(keys, base+k, k+base)
	}
	keys = append(keys, base, base+"a", "a"+base)
	r, c := wrapCounting(t, h.NewResource(t))
	a, b := newLockOver(t, r), newLock(t, h)
	var held []*distlock.Lock
	defer func() {
		for _, lk := range held {
			_ = lk.Unlock(context.Background())
		}
	}()
	for _, k := range keys {
		before := c.calls.Load()
		lk, err := a.TryLock(t.Context(), k, 0)
		if h.rejectsKey(k) {
			wantInvalid(t, fmt.Sprintf("TryLock(%q) (the harness declares the store rejects it)", k), lk, err)
			if n := c.calls.Load() - before; n != 0 {
				t.Errorf("TryLock(%q): %d store calls for a rejected key; want 0", k, n)
			}
			continue
		}
		if err != nil {
			t.Fatalf("TryLock(%q) = %v; want a lock: odd keys are independent", k, err)
		}
		held = append(held, lk)
	}
	for _, lk := range held {
		got, err := b.TryLock(t.Context(), lk.Key(), 0)
		wantNotAcquired(t, got, err)
	}
	for _, lk := range held {
		mustUnlock(t, lk)
		noLeftovers(t, h, lk.Key())
	}
	held = nil
}

// testBareKeys takes keys that are special as a whole (a path of dots, a
// lone slash, an empty hash tag). They are not unique to the test, so each
// is taken with a wait, in case another run holds it.
func testBareKeys(t *testing.T, h *Harness) {
	a, b := newLock(t, h), newLock(t, h)
	for _, k := range []string{".", "..", "/", "{}", "%", "zookeeper"} {
		lk := mustLock(t, a, t.Context(), k, 10*time.Second)
		got, err := b.TryLock(t.Context(), k, 0)
		wantNotAcquired(t, got, err)
		mustUnlock(t, lk)
		noLeftovers(t, h, k)
	}
}

// testTTLInvalid: TTL <= 0, from the context or the default, is ErrInvalid
// with no I/O.
func testTTLInvalid(t *testing.T, h *Harness) {
	r, c := wrapCounting(t, h.NewResource(t))
	d := newLockOver(t, r)
	for _, ttl := range []time.Duration{0, -1, -time.Second, math.MinInt64} {
		lk, err := d.TryLock(distlock.ContextWithTTL(t.Context(), ttl), Key(t), 0)
		wantInvalid(t, fmt.Sprintf("TryLock with TTL %v", ttl), lk, err)
		err = d.Do(distlock.ContextWithTTL(t.Context(), ttl), Key(t), 0, func(context.Context, *distlock.Lock) error {
			t.Errorf("Do with TTL %v ran fn", ttl)
			return nil
		})
		wantInvalid(t, fmt.Sprintf("Do with TTL %v", ttl), nil, err)
		if _, err := distlock.New(r, distlock.WithDefaultTTL(ttl)); !errors.Is(err, distlock.ErrInvalid) {
			t.Errorf("New(WithDefaultTTL(%v)) = %v; want ErrInvalid", ttl, err)
		}
	}
	wantNoCalls(t, c, "TTL <= 0")
}

// testTTLBelowFloor: a positive TTL below what the store can express is
// rounded up, never down, and the lock then ends with that TTL.
func testTTLBelowFloor(t *testing.T, h *Harness) {
	for _, ttl := range []time.Duration{time.Nanosecond, time.Millisecond + time.Nanosecond} {
		t.Run(ttl.String(), func(t *testing.T) {
			defer failOnPanic(t)
			r, c := wrapCounting(t, h.NewResource(t))
			a, b := newLockOver(t, r), newLock(t, h)
			key := Key(t)
			lk, err := a.TryLock(distlock.ContextWithTTL(t.Context(), ttl), key, 0)
			eff := time.Duration(c.lastTTL.Load())
			if errors.Is(err, distlock.ErrNotHeld) && eff < 20*time.Millisecond {
				// The store kept the TTL, which ran out before TryLock
				// could return the lock: it was rolled back, not
				// returned already expired.
				t.Logf("TTL %v: expired before it could be returned: %v", ttl, err)
				if eff < ttl {
					t.Errorf("TTL %v became %v: rounded down", ttl, eff)
				}
				noLeftovers(t, h, key)
				return
			}
			if err != nil {
				t.Fatalf("TryLock with TTL %v = %v; want a lock (a store rounds a short TTL up)", ttl, err)
			}
			t.Logf("TTL %v: the store holds the lock for %v", ttl, eff)
			if eff < ttl {
				t.Errorf("TTL %v became %v: rounded down", ttl, eff)
			}
			waitClosed(t, lk.Done(), 3*eff+2*time.Second, fmt.Sprintf("TTL %v (effective %v) ran out", ttl, eff))
			lkB := mustLock(t, b, t.Context(), key, 3*eff+5*time.Second)
			if err := lk.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
				t.Errorf("Unlock of the expired lock = %v; want ErrNotHeld", err)
			}
			stillHeld(t, a, key)
			mustUnlock(t, lkB)
			noLeftovers(t, h, key)
		})
	}
}

// testTTLHuge: a TTL of a century, or the largest Duration, either works
// for at least that long or fails with a clear error; it never overflows
// into a short or negative lease.
func testTTLHuge(t *testing.T, h *Harness) {
	const century = 100 * 365 * 24 * time.Hour
	for _, ttl := range []time.Duration{century, math.MaxInt64} {
		t.Run(fmt.Sprintf("%.0fh", ttl.Hours()), func(t *testing.T) {
			defer failOnPanic(t)
			r, c := wrapCounting(t, h.NewResource(t))
			a := newLockOver(t, r)
			key := Key(t)
			lk, err := a.TryLock(distlock.ContextWithTTL(t.Context(), ttl), key, 0)
			if err != nil {
				if errors.Is(err, distlock.ErrNotAcquired) {
					t.Errorf("TryLock with TTL %v = %v; a TTL the store cannot take is not contention", ttl, err)
				}
				t.Logf("TTL %v refused: %v", ttl, err)
				noLeftovers(t, h, key)
				return
			}
			eff := time.Duration(c.lastTTL.Load())
			t.Logf("TTL %v: the store holds the lock for %v", ttl, eff)
			if eff < ttl {
				t.Errorf("TTL %v became %v: overflowed or cut short", ttl, eff)
			}
			if isClosed(lk.Done()) {
				t.Errorf("Done closed at once for TTL %v", ttl)
			}
			stillHeld(t, newLock(t, h), key)
			mustUnlock(t, lk)
			noLeftovers(t, h, key)
		})
	}
}

// testWaitExtremes: a negative wait is ErrInvalid with no I/O; the largest
// wait acquires a free key at once and ends with its context.
func testWaitExtremes(t *testing.T, h *Harness) {
	r, c := wrapCounting(t, h.NewResource(t))
	d := newLockOver(t, r)
	for _, wait := range []time.Duration{-1, math.MinInt64} {
		lk, err := d.TryLock(t.Context(), Key(t), wait)
		wantInvalid(t, fmt.Sprintf("TryLock with wait %v", wait), lk, err)
	}
	wantNoCalls(t, c, "a negative wait")

	key := Key(t)
	var lk *distlock.Lock
	var err error
	within(t, "TryLock of a free key with the largest wait", func() {
		lk, err = d.TryLock(t.Context(), key, math.MaxInt64)
	})
	if err != nil {
		t.Fatalf("TryLock of a free key with the largest wait = %v; want a lock", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	var got *distlock.Lock
	within(t, "TryLock of a held key with the largest wait, cancelled", func() {
		got, err = newLock(t, h).TryLock(ctx, key, math.MaxInt64)
	})
	wantNotAcquired(t, got, err)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled wait = %v; want it to wrap context.Canceled", err)
	}
	mustUnlock(t, lk)
	noLeftovers(t, h, key)
}

// testNilContext: a nil context is ErrInvalid with no I/O for TryLock, Do
// and Unlock, and a failed Unlock(nil) leaves the handle usable.
func testNilContext(t *testing.T, h *Harness) {
	var nilCtx context.Context
	r, c := wrapCounting(t, h.NewResource(t))
	d := newLockOver(t, r)
	key := Key(t)
	lk, err := d.TryLock(nilCtx, key, time.Second)
	wantInvalid(t, "TryLock(nil ctx)", lk, err)
	err = d.Do(nilCtx, key, 0, func(context.Context, *distlock.Lock) error {
		t.Errorf("Do(nil ctx) ran fn")
		return nil
	})
	wantInvalid(t, "Do(nil ctx)", nil, err)
	err = d.Do(nilCtx, key, 0, nil)
	wantInvalid(t, "Do(nil ctx, nil fn)", nil, err)
	wantNoCalls(t, c, "a nil context")

	lk = mustLock(t, d, t.Context(), key, 0)
	if err := lk.Unlock(nilCtx); !errors.Is(err, distlock.ErrInvalid) {
		t.Errorf("Unlock(nil ctx) = %v; want ErrInvalid", err)
	}
	stillHeld(t, newLock(t, h), key)
	if isClosed(lk.Done()) {
		t.Errorf("Done closed by Unlock(nil ctx)")
	}
	mustUnlock(t, lk) // the handle still works
	noLeftovers(t, h, key)
}

// testConcurrentDoubleUnlock: of many Unlocks of one handle at once,
// exactly one succeeds; the others get ErrNotHeld.
func testConcurrentDoubleUnlock(t *testing.T, h *Harness) {
	d := newLock(t, h)
	key := Key(t)
	lk := mustLock(t, d, t.Context(), key, 0)
	const n = 16
	var ok, notHeld atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("Unlock panicked: %v\n%s", r, debug.Stack())
				}
			}()
			<-start
			switch err := lk.Unlock(context.Background()); {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, distlock.ErrNotHeld):
				notHeld.Add(1)
			default:
				t.Errorf("Unlock = %v; want nil or ErrNotHeld", err)
			}
		})
	}
	close(start)
	wg.Wait()
	if ok.Load() != 1 || notHeld.Load() != n-1 {
		t.Errorf("%d concurrent Unlocks: %d nil, %d ErrNotHeld; want 1, %d", n, ok.Load(), notHeld.Load(), n-1)
	}
	waitClosed(t, lk.Done(), time.Second, "Unlock")
	noLeftovers(t, h, key)
}

// testStaleHandleAfterEvict: a lock deleted behind its owner's back and
// taken by another owner: the stale handle's Unlock is ErrNotHeld and
// leaves the new owner's lock alone.
func testStaleHandleAfterEvict(t *testing.T, h *Harness) {
	a, b := newLock(t, h), newLock(t, h)
	key := Key(t)
	lkA := mustLock(t, a, t.Context(), key, 0)
	if err := h.Evict(t.Context(), key); err != nil {
		t.Fatalf("Evict: %v", err)
	}
	lkB := mustLock(t, b, t.Context(), key, 10*time.Second)
	if err := lkA.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("Unlock by the evicted owner after another took the key = %v; want ErrNotHeld", err)
	}
	stillHeld(t, a, key)
	mustUnlock(t, lkB)
	noLeftovers(t, h, key)
}

// testExtendAfterLoss: an auto-renewed lock evicted behind its owner's back
// is lost for good: Done closes, its renewer neither brings it back nor
// touches the next owner's lock, and Unlock is ErrNotHeld.
func testExtendAfterLoss(t *testing.T, h *Harness) {
	ttl := h.ttl()
	a := newLock(t, h, distlock.WithDefaultTTL(ttl), distlock.WithAutoRenew())
	b := newLock(t, h)
	key := Key(t)
	lkA := mustLock(t, a, t.Context(), key, 0)
	if err := h.Evict(t.Context(), key); err != nil {
		t.Fatalf("Evict: %v", err)
	}
	waitClosed(t, lkA.Done(), 3*ttl+2*time.Second, "lock evicted under auto-renew")
	lkB := mustLock(t, b, t.Context(), key, 10*ttl)
	time.Sleep(ttl) // three of the lost lock's renewal periods: a renewer still running would act now
	if err := lkA.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("Unlock after loss = %v; want ErrNotHeld", err)
	}
	stillHeld(t, a, key)
	if isClosed(lkB.Done()) {
		t.Errorf("the new owner's Done closed")
	}
	mustUnlock(t, lkB)
	noLeftovers(t, h, key)
}

// newManual returns a DistributeLock over r whose Close the test calls.
func newManual(t *testing.T, r backend.RemoteResource, opts ...distlock.Option) *distlock.DistributeLock {
	t.Helper()
	opts = append([]distlock.Option{distlock.WithDefaultTTL(time.Minute), distlock.WithSpin(5*time.Millisecond, 5*time.Millisecond)}, opts...)
	d, err := distlock.New(r, opts...)
	if err != nil {
		t.Fatalf("distlock.New: %v", err)
	}
	return d
}

// testUseAfterClose: Close releases what it holds; afterwards TryLock and
// Do are ErrClosed (a reentry too), Unlock of a lock Close released is
// ErrNotHeld, and a second Close is a no-op.
func testUseAfterClose(t *testing.T, h *Harness) {
	r := h.NewResource(t)
	var opts []distlock.Option
	if _, ok := r.(backend.Refresher); ok {
		opts = append(opts, distlock.WithAutoRenew())
	}
	d := newManual(t, r, opts...)
	key := Key(t)
	lk := mustLock(t, d, t.Context(), key, 0)
	done := lk.Done()
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	waitClosed(t, done, time.Second, "Close")
	noLeftovers(t, h, key)
	if err := lk.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("Unlock of a lock Close released = %v; want ErrNotHeld", err)
	}
	for _, wait := range []time.Duration{0, time.Minute} {
		var got *distlock.Lock
		var err error
		within(t, "TryLock after Close", func() { got, err = d.TryLock(t.Context(), key, wait) })
		if got != nil || !errors.Is(err, distlock.ErrClosed) {
			t.Errorf("TryLock(wait %v) after Close = %v, %v; want nil, ErrClosed", wait, got, err)
		}
	}
	if got, err := d.TryLock(distlock.ContextWithLock(t.Context(), lk), key, 0); got != nil || !errors.Is(err, distlock.ErrClosed) {
		t.Errorf("reentering TryLock after Close = %v, %v; want nil, ErrClosed", got, err)
	}
	err := d.Do(t.Context(), key, 0, func(context.Context, *distlock.Lock) error {
		t.Errorf("Do after Close ran fn")
		return nil
	})
	if !errors.Is(err, distlock.ErrClosed) {
		t.Errorf("Do after Close = %v; want ErrClosed", err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("second Close = %v; want nil", err)
	}
	mustUnlock(t, mustLock(t, newLock(t, h), t.Context(), key, 0))
	noLeftovers(t, h, key)
}

// signal is a handler that tells when an acquisition enters the chain.
type signal struct{ entered chan struct{} }

func (s *signal) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	return next(ctx, r)
}

func (s *signal) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	return next(ctx, r)
}

// testWaiterDuringClose: a TryLock waiting when Close is called does not
// hand out a lock once Close has returned (Close could not release it),
// and leaves nothing behind.
func testWaiterDuringClose(t *testing.T, h *Harness) {
	a := newLock(t, h)
	sig := &signal{entered: make(chan struct{}, 1)}
	d := newManual(t, h.NewResource(t), distlock.WithHandlers(sig))
	key := Key(t)
	lkA := mustLock(t, a, t.Context(), key, 0)
	type result struct {
		lk  *distlock.Lock
		err error
	}
	res := make(chan result, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("TryLock panicked: %v\n%s", r, debug.Stack())
				res <- result{}
			}
		}()
		lk, err := d.TryLock(t.Context(), key, time.Minute)
		res <- result{lk, err}
	}()
	select {
	case <-sig.entered:
	case <-time.After(hangLimit):
		t.Fatalf("the waiter's TryLock did not reach the handler chain")
	}
	if err := d.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	mustUnlock(t, lkA)
	var got result
	select {
	case got = <-res:
	case <-time.After(hangLimit):
		t.Fatalf("the waiter did not return within %v of Close and the release", hangLimit)
	}
	if got.lk != nil {
		t.Errorf("a TryLock waiting during Close acquired the lock after Close returned; want ErrClosed or ErrNotAcquired")
		_ = got.lk.Unlock(t.Context())
	} else if !errors.Is(got.err, distlock.ErrClosed) && !errors.Is(got.err, distlock.ErrNotAcquired) {
		t.Errorf("TryLock waiting during Close = %v; want ErrClosed or ErrNotAcquired", got.err)
	}
	noLeftovers(t, h, key)
}

// testClosedClient: over a client the application has closed, TryLock and
// Do fail with the store's error (not contention, not bad input), promptly
// and without a panic, and leave nothing behind.
func testClosedClient(t *testing.T, h *Harness) {
	if h.NewClosedResource == nil {
		t.Skip("the harness sets no NewClosedResource: the store has no client to close")
	}
	r := h.NewClosedResource(t)
	d := newManual(t, r)
	key := Key(t)
	check := func(what string, lk *distlock.Lock, err error) {
		t.Helper()
		switch {
		case lk != nil:
			t.Errorf("%s over a closed client returned a lock", what)
			_ = lk.Unlock(t.Context())
		case err == nil:
			t.Errorf("%s over a closed client = nil; want the store's error", what)
		case errors.Is(err, distlock.ErrNotAcquired), errors.Is(err, distlock.ErrInvalid):
			t.Errorf("%s over a closed client = %v; want the store's error, not contention or bad input", what, err)
		default:
			t.Logf("%s over a closed client: %v", what, err)
		}
	}
	for _, wait := range []time.Duration{0, time.Second} {
		var lk *distlock.Lock
		var err error
		within(t, "TryLock over a closed client", func() { lk, err = d.TryLock(t.Context(), key, wait) })
		check(fmt.Sprintf("TryLock(wait %v)", wait), lk, err)
	}
	var err error
	within(t, "Do over a closed client", func() {
		err = d.Do(t.Context(), key, 0, func(context.Context, *distlock.Lock) error {
			t.Errorf("Do over a closed client ran fn")
			return nil
		})
	})
	check("Do", nil, err)
	within(t, "Close over a closed client", func() {
		if err := d.Close(); err != nil {
			t.Logf("Close over a closed client: %v", err)
		}
	})
	noLeftovers(t, h, key)
}
