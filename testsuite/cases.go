package testsuite

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
)

func testAcquireRelease(t *testing.T, h *Harness) {
	d := newLock(t, h)
	key := Key(t)
	lk := mustLock(t, d, t.Context(), key, 0)
	if lk.Key() != key {
		t.Errorf("Key() = %q; want %q", lk.Key(), key)
	}
	if h.NoToken && lk.Token() != 0 {
		t.Errorf("Token() = %d; want 0 (NoToken)", lk.Token())
	}
	if !h.NoToken && lk.Token() == 0 {
		t.Errorf("Token() = 0; want a fencing token")
	}
	if isClosed(lk.Done()) {
		t.Errorf("Done closed while held")
	}
	mustUnlock(t, lk)
	waitClosed(t, lk.Done(), time.Second, "after Unlock")
	noLeftovers(t, h, key)
	mustUnlock(t, mustLock(t, d, t.Context(), key, 0))
	noLeftovers(t, h, key)
}

func testContender(t *testing.T, h *Harness) {
	a, b := newLock(t, h), newLock(t, h)
	key := Key(t)
	lk := mustLock(t, a, t.Context(), key, 0)
	got, err := b.TryLock(t.Context(), key, 0)
	wantNotAcquired(t, got, err)
	if errors.Is(err, distlock.ErrInvalid) {
		t.Errorf("contention reported as ErrInvalid: %v", err)
	}
	// The same instance contends too: a lock is not reentrant without a ctx carrying it.
	got, err = a.TryLock(t.Context(), key, 0)
	wantNotAcquired(t, got, err)
	mustUnlock(t, lk)
	mustUnlock(t, mustLock(t, b, t.Context(), key, 0))
}

func testZeroWait(t *testing.T, h *Harness) {
	a := newLock(t, h)
	rec := &recorder{}
	b := newLock(t, h, distlock.WithHandlers(rec))
	key := Key(t)
	lk := mustLock(t, a, t.Context(), key, 0)
	defer mustUnlock(t, lk)
	got, err := b.TryLock(t.Context(), key, 0)
	wantNotAcquired(t, got, err)
	if r := rec.get(); r.RemoteAttempts != 1 || !r.Deadline.IsZero() {
		t.Errorf("wait 0: RemoteAttempts = %d, Deadline = %v; want 1, zero", r.RemoteAttempts, r.Deadline)
	}
}

func testWaitBounds(t *testing.T, h *Harness) {
	a := newLock(t, h)
	rec := &recorder{}
	r := h.NewResource(t)
	_, spins := r.(backend.Spinner)
	b := newLockOver(t, r, distlock.WithHandlers(rec), distlock.WithSpin(10*time.Millisecond, 10*time.Millisecond))
	key := Key(t)
	lk := mustLock(t, a, t.Context(), key, 0)
	defer mustUnlock(t, lk)
	const wait = 300 * time.Millisecond
	start := time.Now()
	got, err := b.TryLock(t.Context(), key, wait)
	elapsed := time.Since(start)
	wantNotAcquired(t, got, err)
	if elapsed < wait {
		t.Errorf("gave up after %v; want at least the wait %v", elapsed, wait)
	}
	// Generous: this is "does not sleep on past the deadline", not a speed test.
	if elapsed > wait+3*time.Second {
		t.Errorf("returned after %v; want soon after the wait %v", elapsed, wait)
	}
	if spins {
		if n := rec.get().RemoteAttempts; n < 2 {
			t.Errorf("RemoteAttempts = %d over a %v wait; want several", n, wait)
		}
	}
}

func testTTLExpiry(t *testing.T, h *Harness) {
	ttl := h.ttl()
	a, b := newLock(t, h, distlock.WithDefaultTTL(ttl)), newLock(t, h)
	key := Key(t)
	lkA := mustLock(t, a, t.Context(), key, 0)
	start := time.Now()
	lkB := mustLock(t, b, t.Context(), key, 10*ttl)
	if el := time.Since(start); el < ttl/2 {
		t.Errorf("second owner got the key after %v; the first's TTL is %v", el, ttl)
	}
	if !h.NoToken && lkB.Token() <= lkA.Token() {
		t.Errorf("token after expiry %d <= first owner's %d", lkB.Token(), lkA.Token())
	}
	mustUnlock(t, lkB)
	_ = lkA.Unlock(t.Context())
	noLeftovers(t, h, key)
}

func testUnlockAfterExpiry(t *testing.T, h *Harness) {
	ttl := h.ttl()
	a, b, c := newLock(t, h, distlock.WithDefaultTTL(ttl)), newLock(t, h), newLock(t, h)
	key := Key(t)
	lkA := mustLock(t, a, t.Context(), key, 0)
	lkB := mustLock(t, b, t.Context(), key, 10*ttl)
	if err := lkA.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Fatalf("Unlock of an expired lock = %v; want ErrNotHeld", err)
	}
	got, err := c.TryLock(t.Context(), key, 0)
	wantNotAcquired(t, got, err) // the new owner keeps the key
	mustUnlock(t, lkB)
	noLeftovers(t, h, key)
}

func testContextTTL(t *testing.T, h *Harness) {
	ttl := h.ttl()
	rec := &recorder{}
	a := newLock(t, h, distlock.WithDefaultTTL(time.Hour), distlock.WithHandlers(rec))
	b := newLock(t, h)
	key := Key(t)
	lkA := mustLock(t, a, distlock.ContextWithTTL(t.Context(), ttl), key, 0)
	if got := rec.get().TTL; got != ttl {
		t.Errorf("Request.TTL = %v; want the context's %v", got, ttl)
	}
	lkB := mustLock(t, b, t.Context(), key, 10*ttl) // expires with the context's TTL, not the hour
	mustUnlock(t, lkB)
	_ = lkA.Unlock(t.Context())

	lk2 := mustLock(t, a, t.Context(), Key(t), 0)
	if got := rec.get().TTL; got != time.Hour {
		t.Errorf("next call's Request.TTL = %v; want the default %v", got, time.Hour)
	}
	mustUnlock(t, lk2)
}

func testDoubleUnlock(t *testing.T, h *Harness) {
	a, b := newLock(t, h), newLock(t, h)
	key := Key(t)
	lk := mustLock(t, a, t.Context(), key, 0)
	mustUnlock(t, lk)
	if err := lk.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Fatalf("second Unlock = %v; want ErrNotHeld", err)
	}
	lkB := mustLock(t, b, t.Context(), key, 0)
	if err := lk.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Fatalf("third Unlock = %v; want ErrNotHeld", err)
	}
	got, err := a.TryLock(t.Context(), key, 0)
	wantNotAcquired(t, got, err) // the stale handle touched nothing
	mustUnlock(t, lkB)
}

func testTokens(t *testing.T, h *Harness) {
	ds := []*distlock.DistributeLock{newLock(t, h), newLock(t, h)}
	key := Key(t)
	var last uint64
	for i := range 6 {
		lk := mustLock(t, ds[i%2], t.Context(), key, 0)
		tok := lk.Token()
		mustUnlock(t, lk)
		if h.NoToken {
			if tok != 0 {
				t.Fatalf("Token() = %d; want 0 (NoToken)", tok)
			}
			continue
		}
		if tok <= last {
			t.Fatalf("holder %d: token %d <= previous %d", i, tok, last)
		}
		last = tok
	}
}

func testNoOverlap(t *testing.T, h *Harness) {
	const instances, workers, rounds = 3, 4, 8
	key := Key(t)
	var (
		inside    atomic.Int32
		counter   atomic.Int64 // read and written apart: loses increments without the lock
		successes atomic.Int64
		mu        sync.Mutex
		lastTok   uint64
		wg        sync.WaitGroup
	)
	for range instances {
		d := newLock(t, h)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					lk, err := d.TryLock(t.Context(), key, 30*time.Second)
					if err != nil {
						t.Errorf("TryLock: %v", err)
						return
					}
					if n := inside.Add(1); n != 1 {
						t.Errorf("%d holders at once", n)
					}
					v := counter.Load()
					runtime.Gosched()
					time.Sleep(time.Millisecond) // widen the window a second holder would use
					counter.Store(v + 1)
					if !h.NoToken {
						mu.Lock()
						if lk.Token() <= lastTok {
							t.Errorf("token %d <= previous holder's %d", lk.Token(), lastTok)
						}
						lastTok = lk.Token()
						mu.Unlock()
					}
					successes.Add(1)
					inside.Add(-1)
					if err := lk.Unlock(context.Background()); err != nil {
						t.Errorf("Unlock: %v", err)
					}
				}
			}()
		}
	}
	wg.Wait()
	if got, want := counter.Load(), successes.Load(); got != want {
		t.Errorf("counter = %d; want %d (one per acquisition)", got, want)
	}
	if got := successes.Load(); got != instances*workers*rounds {
		t.Errorf("successes = %d; want %d", got, instances*workers*rounds)
	}
	noLeftovers(t, h, key)
}

func testCancelledWait(t *testing.T, h *Harness) {
	a, b := newLock(t, h), newLock(t, h)
	key := Key(t)
	lk := mustLock(t, a, t.Context(), key, 0)

	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	got, err := b.TryLock(ctx, key, time.Minute)
	wantNotAcquired(t, got, err)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled wait = %v; want it to wrap context.Canceled", err)
	}

	ctx, cancel = context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	got, err = b.TryLock(ctx, key, time.Minute)
	wantNotAcquired(t, got, err)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("timed-out wait = %v; want it to wrap context.DeadlineExceeded", err)
	}

	// Cancelled before the call: no attempt at all.
	ctx, cancel = context.WithCancel(t.Context())
	cancel()
	got, err = b.TryLock(ctx, key, time.Minute)
	wantNotAcquired(t, got, err)

	mustUnlock(t, lk)
	noLeftovers(t, h, key) // the waiters left nothing behind
	mustUnlock(t, mustLock(t, b, t.Context(), key, 0))
	noLeftovers(t, h, key)
}

func testAutoRenew(t *testing.T, h *Harness) {
	ttl := h.ttl()
	a := newLock(t, h, distlock.WithDefaultTTL(ttl), distlock.WithAutoRenew())
	b := newLock(t, h)
	key := Key(t)
	lk := mustLock(t, a, t.Context(), key, 0)
	done := lk.Done()
	end := time.Now().Add(4 * ttl)
	for time.Now().Before(end) {
		got, err := b.TryLock(t.Context(), key, 0)
		wantNotAcquired(t, got, err)
		if isClosed(done) {
			t.Fatalf("Done closed while auto-renewed")
		}
		time.Sleep(ttl / 4) // let the TTL pass; the lock must outlive it
	}
	mustUnlock(t, lk)
	noLeftovers(t, h, key)
}

func testDoneOnUnlock(t *testing.T, h *Harness) {
	d := newLock(t, h)
	lk := mustLock(t, d, t.Context(), Key(t), 0)
	done := lk.Done()
	mustUnlock(t, lk)
	waitClosed(t, done, time.Second, "Unlock")
}

func testDoneOnExpiry(t *testing.T, h *Harness) {
	ttl := h.ttl()
	d := newLock(t, h, distlock.WithDefaultTTL(ttl))
	key := Key(t)
	lk := mustLock(t, d, t.Context(), key, 0)
	waitClosed(t, lk.Done(), 3*ttl+time.Second, "TTL ran out")
	if err := lk.Unlock(t.Context()); err != nil && !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("Unlock after expiry = %v; want nil or ErrNotHeld", err)
	}
	noLeftovers(t, h, key)
}

func testDoneOnFailedRenewal(t *testing.T, h *Harness) {
	ttl := h.ttl()
	d := newLock(t, h, distlock.WithDefaultTTL(ttl), distlock.WithAutoRenew())
	key := Key(t)
	lk := mustLock(t, d, t.Context(), key, 0)
	done := lk.Done()
	if err := h.Evict(t.Context(), key); err != nil {
		t.Fatalf("Evict: %v", err)
	}
	waitClosed(t, done, 3*ttl+2*time.Second, "lock evicted under auto-renew")
	if err := lk.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("Unlock after loss = %v; want ErrNotHeld", err)
	}
	noLeftovers(t, h, key)
}

func testDoCancelsOnLoss(t *testing.T, h *Harness) {
	ttl := h.ttl()
	d := newLock(t, h, distlock.WithDefaultTTL(ttl), distlock.WithAutoRenew())
	key := Key(t)
	ran := false
	err := d.Do(t.Context(), key, 0, func(ctx context.Context, lk *distlock.Lock) error {
		ran = true
		if err := h.Evict(ctx, key); err != nil {
			t.Errorf("Evict: %v", err)
		}
		select {
		case <-ctx.Done():
			if !errors.Is(context.Cause(ctx), distlock.ErrNotHeld) {
				t.Errorf("cause = %v; want ErrNotHeld", context.Cause(ctx))
			}
			return ctx.Err()
		case <-time.After(3*ttl + 2*time.Second):
			t.Errorf("fn's context not cancelled after the lock was lost")
			return nil
		}
	})
	if !ran {
		t.Fatalf("Do did not run fn: %v", err)
	}
	if !errors.Is(err, context.Canceled) || !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("Do = %v; want fn's context.Canceled joined with Unlock's ErrNotHeld", err)
	}
	noLeftovers(t, h, key)
}

func testOddKeys(t *testing.T, h *Harness) {
	base := Key(t)
	var keys []string
	for _, k := range []string{"a/b", "a", "a/", "/a", "{x}", "x", "{a}:fence", "a:fence", "}{", "ключ", "鍵", "a b", " ", "a\x00b", "a\x00"} {
		keys = append(keys, base+k, k+base)
	}
	a, b := newLock(t, h), newLock(t, h)
	var held []*distlock.Lock
	for _, k := range keys {
		lk, err := a.TryLock(t.Context(), k, 0)
		if h.RejectsNUL && strings.ContainsRune(k, 0) {
			if !errors.Is(err, distlock.ErrInvalid) {
				t.Errorf("TryLock(%q) = %v; want ErrInvalid (RejectsNUL)", k, err)
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
		if err == nil {
			t.Errorf("TryLock(%q) by another owner succeeded", lk.Key())
			_ = got.Unlock(t.Context())
		}
	}
	for _, lk := range held {
		mustUnlock(t, lk)
		noLeftovers(t, h, lk.Key())
	}
}

func testBadInput(t *testing.T, h *Harness) {
	if _, err := distlock.New(nil); !errors.Is(err, distlock.ErrInvalid) {
		t.Errorf("New(nil) = %v; want ErrInvalid", err)
	}
	r, calls := newCounting(t, h.NewResource(t))
	d := newLockOver(t, r)
	var nilCtx context.Context
	cases := []struct {
		name string
		ctx  context.Context
		key  string
		wait time.Duration
	}{
		{"empty key", t.Context(), "", 0},
		{"negative wait", t.Context(), "k", -time.Second},
		{"TTL 0", distlock.ContextWithTTL(t.Context(), 0), "k", 0},
		{"negative TTL", distlock.ContextWithTTL(t.Context(), -time.Second), "k", 0},
		{"nil context", nilCtx, "k", 0},
	}
	if h.MaxKeyLen > 0 {
		cases = append(cases, struct {
			name string
			ctx  context.Context
			key  string
			wait time.Duration
		}{"key over the limit", t.Context(), strings.Repeat("k", h.MaxKeyLen+1), 0})
	}
	for _, c := range cases {
		lk, err := d.TryLock(c.ctx, c.key, c.wait)
		if lk != nil || !errors.Is(err, distlock.ErrInvalid) {
			t.Errorf("%s: TryLock = %v, %v; want nil, ErrInvalid", c.name, lk, err)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("bad input made %d store calls; want 0", n)
	}
	if err := d.Do(t.Context(), "k", 0, nil); !errors.Is(err, distlock.ErrInvalid) {
		t.Errorf("Do(nil fn) = %v; want ErrInvalid", err)
	}
	for _, opt := range []distlock.Option{
		distlock.WithDefaultTTL(0), distlock.WithSpin(-1, 0), distlock.WithSpin(0, 0),
		distlock.WithHandlers(nil), distlock.WithValueFunc(nil), distlock.WithMaxReentrancy(-1), nil,
	} {
		if _, err := distlock.New(h.NewResource(t), opt); !errors.Is(err, distlock.ErrInvalid) {
			t.Errorf("New with a bad option = %v; want ErrInvalid", err)
		}
	}
	// Use after Close.
	d2 := newLock(t, h)
	if err := d2.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := d2.TryLock(t.Context(), Key(t), 0); !errors.Is(err, distlock.ErrClosed) {
		t.Errorf("TryLock after Close = %v; want ErrClosed", err)
	}
}
