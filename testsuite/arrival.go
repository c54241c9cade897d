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
	if h.NoArrivalOrder != "" {
		t.Skip(h.NoArrivalOrder)
	}
	if h.Requests == nil {
		t.Skip("the harness cannot count a lock's queued waiters (Harness.Requests)")
	}
	for _, kind := range []backend.Kind{backend.KindMutex, backend.KindSemaphore} {
		t.Run(kind.String(), func(t *testing.T) {
			if h.Unsupported[kind] != "" {
				t.Skip(h.Unsupported[kind])
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
