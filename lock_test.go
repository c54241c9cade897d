package distlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
)

func newLock(t testing.TB, store *memory.Store, opts ...distlock.Option) *distlock.DistributeLock {
	t.Helper()
	d, err := distlock.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// A spin sleep far longer than the test shows that only the mechanism
// under test (deadline, holder TTL, release notice) can end the wait.
const longSpin = time.Hour

func TestSpinNeverSleepsPastDeadline(t *testing.T) {
	store := memory.New()
	a, b := newLock(t, store), newLock(t, store, distlock.WithSpin(longSpin, 0))
	lk, _ := a.TryLock(t.Context(), "k", 0)
	defer lk.Unlock(t.Context())
	start := time.Now()
	_, err := b.TryLock(t.Context(), "k", 100*time.Millisecond)
	if !errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("TryLock = %v; want ErrNotAcquired", err)
	}
	if el := time.Since(start); el > 30*time.Second {
		t.Fatalf("returned after %v; the wait was 100ms", el)
	}
}

func TestSpinWakesAtHolderExpiry(t *testing.T) {
	store := memory.New()
	a, b := newLock(t, store), newLock(t, store, distlock.WithSpin(longSpin, 0))
	if _, err := a.TryLock(distlock.ContextWithTTL(t.Context(), 50*time.Millisecond), "k", 0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	lk, err := b.TryLock(t.Context(), "k", time.Minute)
	if err != nil {
		t.Fatalf("TryLock = %v; want the key once the holder's TTL ran out", err)
	}
	defer lk.Unlock(t.Context())
	if el := time.Since(start); el > 30*time.Second {
		t.Fatalf("acquired after %v; the holder's TTL was 50ms", el)
	}
}

func TestSpinWakesOnReleaseNotice(t *testing.T) {
	store := memory.New()
	a, b := newLock(t, store), newLock(t, store, distlock.WithSpin(longSpin, 0))
	lk, _ := a.TryLock(t.Context(), "k", 0)
	time.AfterFunc(50*time.Millisecond, func() { lk.Unlock(context.Background()) })
	lk2, err := b.TryLock(t.Context(), "k", time.Minute)
	if err != nil {
		t.Fatalf("TryLock = %v; want the key after the release notice", err)
	}
	lk2.Unlock(t.Context())
}

// order records the nesting of handler calls.
type order struct {
	mu  sync.Mutex
	log []string
}

func (o *order) add(s string) {
	o.mu.Lock()
	o.log = append(o.log, s)
	o.mu.Unlock()
}

type named struct {
	name string
	o    *order
	fail error // returned by Acquire after next succeeded
	stop error // returned by Acquire without calling next
	lost chan error
}

func (h *named) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	h.o.add(h.name + ">")
	if h.stop != nil {
		return h.stop
	}
	err := next(ctx, r)
	h.o.add(fmt.Sprintf("%s<%v", h.name, err))
	if err == nil && h.fail != nil {
		return h.fail
	}
	return err
}

func (h *named) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	h.o.add(h.name + " release>")
	err := next(ctx, r)
	h.o.add(h.name + " release<")
	return err
}

func (h *named) LockLost(r *distlock.Request, cause error) {
	if h.lost != nil {
		h.lost <- cause
	}
}

func TestHandlerOrder(t *testing.T) {
	o := &order{}
	d := newLock(t, memory.New(), distlock.WithHandlers(&named{name: "h1", o: o}, &named{name: "h2", o: o}))
	lk, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	lk.Unlock(t.Context())
	got := strings.Join(o.log, " ")
	want := "h1> h2> h2<<nil> h1<<nil> h1 release> h2 release> h2 release< h1 release<"
	if got != want {
		t.Errorf("order = %q; want %q", got, want)
	}
}

func TestHandlerShortCircuit(t *testing.T) {
	o := &order{}
	store := memory.New()
	stop := fmt.Errorf("quota: %w", distlock.ErrNotAcquired)
	d := newLock(t, store, distlock.WithHandlers(&named{name: "h1", o: o}, &named{name: "h2", o: o, stop: stop}))
	if _, err := d.TryLock(t.Context(), "k", 0); !errors.Is(err, stop) {
		t.Fatalf("TryLock = %v; want the handler's error", err)
	}
	if got, want := strings.Join(o.log, " "), "h1> h2> h1<quota: distlock: not acquired"; got != want {
		t.Errorf("order = %q; want %q", got, want)
	}
	if store.Len() != 0 {
		t.Errorf("the store was reached")
	}
}

// A handler that fails after the handlers inside it and the store
// succeeded: the lock is given back through those inner handlers (a local
// lock they took is freed), and the failing and outer handlers see no
// release.
func TestHandlerFailingAfterGrantReleases(t *testing.T) {
	store := memory.New()
	boom := errors.New("boom")
	o := &order{}
	d := newLock(t, store, distlock.WithHandlers(&named{name: "h1", o: o}, &named{name: "h2", o: o, fail: boom}, &named{name: "h3", o: o}))
	if _, err := d.TryLock(t.Context(), "k", 0); !errors.Is(err, boom) {
		t.Fatalf("TryLock = %v; want boom", err)
	}
	if _, _, held := store.Holder("k"); held {
		t.Errorf("the store kept a lock whose acquisition failed")
	}
	got := strings.Join(o.log, " ")
	want := "h1> h2> h3> h3<<nil> h2<<nil> h1<boom h3 release> h3 release<"
	if got != want {
		t.Errorf("order = %q; want %q", got, want)
	}
}

func TestLossObserver(t *testing.T) {
	store := memory.New()
	h := &named{name: "h", o: &order{}, lost: make(chan error, 1)}
	d := newLock(t, store, distlock.WithHandlers(h), distlock.WithDefaultTTL(time.Minute), distlock.WithAutoRenew())
	lk, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	store.Evict("k")
	// Renewal runs at TTL/3, too slow for a test; a short-TTL lock shows it.
	lk2, err := d.TryLock(distlock.ContextWithTTL(t.Context(), 60*time.Millisecond), "k2", 0)
	if err != nil {
		t.Fatal(err)
	}
	store.Evict("k2")
	select {
	case cause := <-h.lost:
		if !errors.Is(cause, distlock.ErrNotHeld) {
			t.Errorf("cause = %v; want ErrNotHeld", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("LockLost not called")
	}
	<-lk2.Done()
	lk.Unlock(t.Context())
}

func TestCloseReleasesHeldLocks(t *testing.T) {
	store := memory.New()
	d, err := distlock.New(store, distlock.WithAutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	lk, _ := d.TryLock(t.Context(), "k", 0)
	done := lk.Done()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	<-done
	if store.Len() != 0 {
		t.Errorf("Close left %d locks in the store", store.Len())
	}
	if err := lk.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("Unlock after Close = %v; want ErrNotHeld", err)
	}
}

func TestValueFunc(t *testing.T) {
	store := memory.New()
	d := newLock(t, store, distlock.WithValueFunc(func() string { return "me" }))
	lk, _ := d.TryLock(t.Context(), "k", 0)
	if v, _, _ := store.Holder("k"); v != "me" {
		t.Errorf("owner value = %q; want %q", v, "me")
	}
	lk.Unlock(t.Context())
	empty := newLock(t, store, distlock.WithValueFunc(func() string { return "" }))
	if _, err := empty.TryLock(t.Context(), "k", 0); !errors.Is(err, distlock.ErrInvalid) {
		t.Errorf("empty owner value: TryLock = %v; want ErrInvalid", err)
	}
}

func TestTTLFromContext(t *testing.T) {
	if _, ok := distlock.TTLFromContext(context.Background()); ok {
		t.Error("TTL found in a bare context")
	}
	ttl, ok := distlock.TTLFromContext(distlock.ContextWithTTL(context.Background(), time.Second))
	if !ok || ttl != time.Second {
		t.Errorf("TTLFromContext = %v, %v; want 1s, true", ttl, ok)
	}
}

func TestAutoRenewNeedsRefresher(t *testing.T) {
	_, err := distlock.New(spinOnly{memory.New()}, distlock.WithAutoRenew())
	if !errors.Is(err, distlock.ErrInvalid) {
		t.Errorf("New(WithAutoRenew) over a store that cannot extend = %v; want ErrInvalid", err)
	}
}

// spinOnly hides the memory store's optional abilities.
type spinOnly struct{ s *memory.Store }

func (s spinOnly) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	return s.s.TryAcquire(ctx, l)
}
func (s spinOnly) Release(ctx context.Context, l *backend.Lease) error { return s.s.Release(ctx, l) }

// counting is the memory store with its attempts and subscriptions
// counted: instrumentation around the real store, not a stand-in.
type counting struct {
	*memory.Store
	attempts, subs atomic.Int32
}

func (c *counting) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	c.attempts.Add(1)
	return c.Store.TryAcquire(ctx, l)
}

func (c *counting) Subscribe(key string) (<-chan struct{}, func()) {
	c.subs.Add(1)
	return c.Store.Subscribe(key)
}

// TestReleaseWakesOneWaiter: the waiters of one key in a process share one
// subscription, so each release wakes one of them to try the key, not all
// (only one could take it). Three waiters, each holding the key briefly
// when it gets it: 3 first attempts + 1 per release = 6 attempts (waking all
// would make 3+3+2+1 = 9). The spin sleeps an hour: only notices wake.
func TestReleaseWakesOneWaiter(t *testing.T) {
	store := &counting{Store: memory.New()}
	d, err := distlock.New(store, distlock.WithSpin(longSpin, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := t.Context()
	holder, err := d.TryLock(ctx, "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 3
	errs := make(chan error, waiters)
	for range waiters {
		go func() {
			lk, err := d.TryLock(ctx, "k", time.Minute)
			if err == nil {
				time.Sleep(20 * time.Millisecond) // work under the lock: woken losers would try meanwhile
				err = lk.Unlock(ctx)
			}
			errs <- err
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for store.attempts.Load() < 1+waiters || store.subs.Load() < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("waiters did not all try and subscribe: %d attempts, %d subscriptions", store.attempts.Load(), store.subs.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for range waiters {
		if err := <-errs; err != nil {
			t.Fatalf("waiter: %v", err)
		}
	}
	if got, want := store.attempts.Load()-1, int32(2*waiters); got != want {
		t.Errorf("waiters made %d attempts; want %d (one first attempt each, one per release)", got, want)
	}
	if got := store.subs.Load(); got != 1 {
		t.Errorf("%d subscriptions to the store; want 1 shared by the waiters", got)
	}
}

// deaf is the memory store whose release notices never arrive: every
// subscription gets a channel nobody sends on (a fault: notices lost).
type deaf struct{ counting }

func (d *deaf) Subscribe(key string) (<-chan struct{}, func()) {
	d.subs.Add(1)
	return make(chan struct{}), func() {}
}

// TestSubscribedSpinSleepsLonger: a waiter subscribed to release notices
// still retries on its own (a notice may be lost), but 4 times less often
// than the spin policy says: the notices are what wake it. 400ms of
// waiting with a 10ms spin: about 400/40 = 10 attempts, not 40.
func TestSubscribedSpinSleepsLonger(t *testing.T) {
	store := &deaf{counting{Store: memory.New()}}
	const spin, wait = 10 * time.Millisecond, 400 * time.Millisecond
	d, err := distlock.New(store, distlock.WithSpin(spin, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	holder, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Unlock(t.Context())
	before := store.attempts.Load()
	if _, err := d.TryLock(t.Context(), "k", wait); !errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("TryLock = %v; want ErrNotAcquired", err)
	}
	got := store.attempts.Load() - before
	// At most one attempt per 4 spins, plus the first and the last (at
	// the deadline); a loaded machine only makes fewer.
	if max := int32(wait/(4*spin)) + 3; got > max || got < 3 {
		t.Errorf("%d attempts in %v subscribed with a %v spin; want 3 to %d", got, wait, spin, max)
	}
	if store.subs.Load() != 1 {
		t.Errorf("%d subscriptions; want 1", store.subs.Load())
	}
}

// TestExtendNotHeldLosesAtOnce: an Extend the store refuses with
// ErrNotHeld (the key evicted; the memory store signals no loss) ends the
// grant then, not when its validity runs out a minute later: Done closes
// before Extend returns, and the loss observer is told ErrNotHeld.
func TestExtendNotHeldLosesAtOnce(t *testing.T) {
	store := memory.New()
	h := &named{name: "h", o: &order{}, lost: make(chan error, 1)}
	d := newLock(t, store, distlock.WithHandlers(h), distlock.WithDefaultTTL(time.Minute))
	lk, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	done := lk.Done()
	store.Evict("k")
	if err := lk.Extend(t.Context(), time.Minute); !errors.Is(err, distlock.ErrNotHeld) {
		t.Fatalf("Extend of an evicted lock = %v; want ErrNotHeld", err)
	}
	select {
	case <-done:
	default:
		t.Fatal("Done open after Extend found the lock gone")
	}
	select {
	case cause := <-h.lost:
		if !errors.Is(cause, distlock.ErrNotHeld) {
			t.Errorf("loss cause = %v; want ErrNotHeld", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("LockLost not called")
	}
}
