package testsuite

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
)

// testArrivalOrder: waiters from several processes (DistributeLocks over
// resources of their own) arrive one after another while the lock is held
// and are granted it in the order they arrived, for a mutex and for a
// semaphore of 2 permits (one held throughout, so that the other passes
// from waiter to waiter). Each waiter holds the lock briefly and unlocks.
func testArrivalOrder(t *testing.T, h *Harness) {
	for _, kind := range []backend.Kind{backend.KindMutex, backend.KindSemaphore} {
		t.Run(kind.String(), func(t *testing.T) {
			if h.Unsupported[kind] != "" {
				t.Skip(h.Unsupported[kind])
			}
			if h.NoLine[kind] != "" {
				t.Skip(h.NoLine[kind])
			}
			if h.Requests == nil {
				// A store that keeps no line says so (NoLine); a
				// harness that forgot the count must not pass by
				// skipping.
				t.Fatalf("the harness sets neither Requests (to count a lock's queued waiters) nor NoLine[%v] (why the store keeps no line)", kind)
			}
			arrivalOrder(t, h, kind)
		})
	}
}

func arrivalOrder(t *testing.T, h *Harness, kind backend.Kind) {
	const procs, waiters = 3, 6
	key := Key(t)
	ds := make([]*distlock.DistributeLock, procs)
	for i := range ds {
		ds[i] = newLock(t, h)
	}
	lock := func(ctx context.Context, d *distlock.DistributeLock, wait time.Duration) (*distlock.Lock, error) {
		if kind == backend.KindSemaphore {
			return d.Semaphore(key, 2).TryAcquire(ctx, wait)
		}
		return d.TryLock(ctx, key, wait)
	}
	holders := 1
	first := mustOK(t)(lock(t.Context(), ds[0], 0))
	if kind == backend.KindSemaphore {
		// The second permit is held by another process throughout.
		holders = 2
		kept := mustOK(t)(lock(t.Context(), ds[1], 0))
		t.Cleanup(func() { _ = kept.Unlock(context.Background()) })
	}
	count := func() int {
		n, err := h.Requests(t.Context(), key, kind)
		if errors.Is(err, errors.ErrUnsupported) {
			t.Skipf("the harness cannot count the waiters of a %v: %v", kind, err)
		}
		if err != nil {
			t.Fatalf("Requests(%v): %v", kind, err)
		}
		return n
	}
	if n := count(); n != holders {
		t.Fatalf("the store keeps %d requests with %d holders and nobody waiting; want %d", n, holders, holders)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := range waiters {
		wg.Go(func() {
			lk, err := lock(ctx, ds[i%procs], time.Minute)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := lk.Unlock(context.Background()); err != nil {
				t.Errorf("waiter %d: Unlock: %v", i, err)
			}
		})
		// Queued before the next one comes.
		deadline := time.Now().Add(10 * time.Second)
		for count() < holders+i+1 {
			if time.Now().After(deadline) {
				t.Fatalf("waiter %d did not queue within 10s: the store keeps %d requests; want %d", i, count(), holders+i+1)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	if err := first.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if want := []int{0, 1, 2, 3, 4, 5}; !slices.Equal(order, want) {
		t.Errorf("granted in order %v; want the order of arrival %v", order, want)
	}
}

// mustOK returns a function that fails t on a non-nil error and returns
// the lock.
func mustOK(t *testing.T) func(*distlock.Lock, error) *distlock.Lock {
	return func(lk *distlock.Lock, err error) *distlock.Lock {
		t.Helper()
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
		return lk
	}
}

// queuedSpinner returns a fresh resource of h as a pull store that queues
// the waiters of kind, or nil (the store keeps no line, or waits on a
// watch: a push store's dead waiter goes with its session or lease).
func queuedSpinner(t *testing.T, h *Harness, kind backend.Kind) backend.Spinner {
	r := h.NewResource(t)
	s, ok := r.(backend.Spinner)
	if !ok {
		return nil
	}
	if q, ok := r.(backend.Queuer); !ok || !q.Queues(kind) {
		return nil
	}
	if _, ok := r.(backend.Withdrawer); !ok {
		t.Fatalf("%T queues %v waiters but is no backend.Withdrawer", r, kind)
	}
	return s
}

// deadWaiter queues a waiter of key's lock of kind (a mutex, or a
// semaphore of limit 2) that never comes back (its process died): one
// refused attempt of a waiting acquisition, with ttl.
func deadWaiter(t *testing.T, s backend.Spinner, key string, ttl time.Duration, kind backend.Kind) *backend.Lease {
	t.Helper()
	l := &backend.Lease{Key: key, Value: "dead-" + Key(t), TTL: ttl, Kind: kind, Waits: true}
	if kind == backend.KindSemaphore {
		l.Limit = 2
	}
	ok, _, err := s.TryAcquire(t.Context(), l)
	if ok || err != nil {
		t.Fatalf("TryAcquire of a held lock = %v, %v; want false, nil", ok, err)
	}
	return l
}

// testDeadHeadPassedOver: on a pull store that queues mutex (semaphore)
// waiters, a waiter at the head of the line whose process died (it never
// tries again, nor withdraws) is passed over within its TTL: the next
// waiter gets the lock (the permit a release freed, with the semaphore's
// other permit held throughout) once the dead one's place lapsed, at
// most a TTL and a poll (backend.HeadPoll) after the release.
func testDeadHeadPassedOver(t *testing.T, h *Harness) {
	for _, kind := range []backend.Kind{backend.KindMutex, backend.KindSemaphore} {
		t.Run(kind.String(), func(t *testing.T) {
			if h.Unsupported[kind] != "" {
				t.Skip(h.Unsupported[kind])
			}
			deadHeadPassedOver(t, h, kind)
		})
	}
}

func deadHeadPassedOver(t *testing.T, h *Harness, kind backend.Kind) {
	s := queuedSpinner(t, h, kind)
	if s == nil {
		t.Skipf("the store keeps no line of %v waiters that a dead waiter could block (a push store's goes with its session)", kind)
	}
	key := Key(t)
	lock := func(ctx context.Context, d *distlock.DistributeLock, wait time.Duration) (*distlock.Lock, error) {
		if kind == backend.KindSemaphore {
			return d.Semaphore(key, 2).TryAcquire(ctx, wait)
		}
		return d.TryLock(ctx, key, wait)
	}
	d := newLock(t, h)
	holder := mustOK(t)(lock(t.Context(), d, 0))
	holders := 1
	if kind == backend.KindSemaphore {
		holders = 2
		kept := mustOK(t)(lock(t.Context(), newLock(t, h), 0))
		t.Cleanup(func() { _ = kept.Unlock(context.Background()) })
	}
	ttl := h.ttl()
	deadWaiter(t, s, key, ttl, kind)
	got := make(chan time.Duration, 1)
	var released time.Time
	var mu sync.Mutex
	go func() {
		lk, err := lock(t.Context(), newLock(t, h), time.Minute)
		if err != nil {
			t.Errorf("the waiter behind the dead head: %v", err)
			got <- -1
			return
		}
		mu.Lock()
		got <- time.Since(released)
		mu.Unlock()
		_ = lk.Unlock(context.Background())
	}()
	waitRequests(t, h, key, kind, holders+2)
	mu.Lock()
	released = time.Now()
	err := holder.Unlock(t.Context())
	mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if late := <-got; late > ttl+backend.HeadPoll+2*time.Second {
		t.Errorf("the waiter behind a dead head got the lock %v after the release; want within the dead head's TTL %v and a poll", late, ttl)
	}
}

// testCancelledHeadLeaves: a waiter whose wait ends (its context
// cancelled) while it is the head leaves the line (before TryLock
// returns, unless the store takes longer than the facade waits for
// that), and a lock kept for it goes on to the next in line at once:
// the next waiter does not wait out the first one's place (a minute).
// Both ways a head's wait can end: before the release (through the
// facade) and after it, while the lock is kept for it (its withdrawal,
// as the facade sends it, through the store).
func testCancelledHeadLeaves(t *testing.T, h *Harness) {
	s := queuedSpinner(t, h, backend.KindMutex)
	if s == nil {
		t.Skip("the store keeps no line of mutex waiters")
	}
	const long = time.Minute // the waiters' TTL: their places last as long
	ctx := distlock.ContextWithTTL(t.Context(), long)
	t.Run("BeforeRelease", func(t *testing.T) {
		key := Key(t)
		d1, d2 := newLock(t, h), newLock(t, h)
		holder := mustLock(t, d1, t.Context(), key, 0)
		cctx, cancel := context.WithCancel(ctx)
		first := make(chan error, 1)
		go func() { _, err := d1.TryLock(cctx, key, distlock.WaitForever); first <- err }()
		waitRequests(t, h, key, backend.KindMutex, 2)
		next := make(chan error, 1)
		go func() {
			lk, err := d2.TryLock(ctx, key, distlock.WaitForever)
			if err == nil {
				err = lk.Unlock(context.Background())
			}
			next <- err
		}()
		waitRequests(t, h, key, backend.KindMutex, 3)
		cancel()
		if err := <-first; !errors.Is(err, distlock.ErrNotAcquired) {
			t.Fatalf("cancelled waiter: %v; want ErrNotAcquired", err)
		}
		// The facade waits withdrawBound (50 ms) for the withdrawal and
		// finishes it in the background after: on a loaded machine the
		// line may still hold the cancelled waiter when TryLock returns.
		waitRequests(t, h, key, backend.KindMutex, 2) // the holder and the next waiter
		if err := holder.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
		expectSoon(t, next, "the next waiter, after the cancelled head")
	})
	t.Run("WhileKept", func(t *testing.T) {
		key := Key(t)
		d := newLock(t, h)
		holder := mustLock(t, d, t.Context(), key, 0)
		head := deadWaiter(t, s, key, long, backend.KindMutex)
		next := make(chan error, 1)
		go func() {
			lk, err := newLock(t, h).TryLock(ctx, key, distlock.WaitForever)
			if err == nil {
				err = lk.Unlock(context.Background())
			}
			next <- err
		}()
		waitRequests(t, h, key, backend.KindMutex, 3)
		if err := holder.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
		// The lock is kept for the head, which does not come: its wait
		// ended, and the facade withdraws it.
		if err := s.(backend.Withdrawer).Withdraw(t.Context(), head); err != nil {
			t.Fatal(err)
		}
		expectSoon(t, next, "the next waiter, after the head kept the lock and withdrew")
	})
}

// expectSoon waits for a waiter's result, well within backend.HeadPoll
// and far within its place's life: only the store's hand-over (and its
// notice) gets it the lock that soon.
func expectSoon(t *testing.T, got <-chan error, who string) {
	t.Helper()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("%s: %v", who, err)
		}
	case <-time.After(backend.HeadPoll / 2):
		t.Fatalf("%s: not granted within %v", who, backend.HeadPoll/2)
	}
}

// waitRequests waits until the store keeps n requests (holders and
// queued waiters) for key's lock of kind.
func waitRequests(t *testing.T, h *Harness, key string, kind backend.Kind, n int) {
	t.Helper()
	if h.Requests == nil {
		t.Skip("the harness cannot count a lock's queued waiters (Harness.Requests)")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := h.Requests(t.Context(), key, kind)
		if err != nil {
			t.Fatalf("Requests: %v", err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store keeps %d requests for %q; want %d within 10s", got, key, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
