package hotspot_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/hotspot"
)

// seed runs instances x workers x n acquisitions of key, each instance a
// DistributeLock over store with its own hotspot handler built by opts,
// and returns remote attempts per success.
func seed(t *testing.T, store *memory.Store, key string, instances, workers, n int, opts ...hotspot.Option) float64 {
	t.Helper()
	met := newCounter()
	var wg sync.WaitGroup
	for range instances {
		h, err := hotspot.NewWithOptions(append(opts, hotspot.WithKeys(key))...)
		if err != nil {
			t.Fatal(err)
		}
		d, err := distlock.New(store, distlock.WithHandlers(met, h),
			distlock.WithSpin(100*time.Millisecond, 100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		for range workers {
			wg.Go(func() {
				for range n {
					lk, err := d.TryLock(t.Context(), key, 10*time.Second)
					if err != nil {
						t.Error(err)
						continue
					}
					time.Sleep(2 * time.Millisecond) // the work under the lock
					if err := lk.Unlock(t.Context()); err != nil {
						t.Error(err)
					}
				}
			})
		}
	}
	wg.Wait()
	s := met.Stats()
	if want := uint64(instances * workers * n); s.Acquired != want {
		t.Fatalf("acquired %d; want %d", s.Acquired, want)
	}
	return float64(s.RemoteAttempts) / float64(s.Acquired)
}

// TestYieldGivesWay: with three processes contending and release notices,
// the releasing process's next waiter waits for the next notice instead of
// racing the others, so a handoff costs about two attempts, not three.
func TestYieldGivesWay(t *testing.T) {
	store := memory.New()
	key := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	plain := seed(t, store, key+"-plain", 3, 3, 10)
	yield := seed(t, store, key+"-yield", 3, 3, 10, hotspot.WithYield(store, 50*time.Millisecond))
	t.Logf("remote attempts per success: without yield %.2f, with yield %.2f", plain, yield)
	if yield > 2.5 || yield >= plain {
		t.Errorf("with yield %.2f remote attempts per success; want <= 2.5 and below %.2f without", yield, plain)
	}
}

// TestYieldFallsBack: when no other process takes the key after a
// contended release, the yielding waiter tries after the maximum anyway.
func TestYieldFallsBack(t *testing.T) {
	store := memory.New()
	key := t.Name()
	h, err := hotspot.NewWithOptions(hotspot.WithKeys(key), hotspot.WithYield(store, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	met := newCounter()
	c := &faulty{Store: store} // counts calls; never fails
	c.failAt.Store(-1)
	d := newLock(t, c, met, h)
	other := newLock(t, store)

	theirs, err := other.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan *distlock.Lock, 1)
	go func() {
		lk, err := d.TryLock(t.Context(), key, 10*time.Second)
		if err != nil {
			t.Error(err)
		}
		first <- lk
	}()
	poll(t, "the first waiter tried the store", func() bool { return c.calls.Load() >= 1 })
	if err := theirs.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	lk := <-first
	if lk == nil {
		t.FailNow()
	}
	// lk met another process: the next waiter yields, and nobody else
	// will release the key.
	second := make(chan error, 1)
	go func() {
		lk, err := d.TryLock(t.Context(), key, 10*time.Second)
		if err == nil {
			err = lk.Unlock(t.Context())
		}
		second <- err
	}()
	poll(t, "the second waiter queues", func() bool { return met.Stats().Waiting == 1 })
	if err := lk.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatalf("yielding waiter: %v", err)
	}
}

func TestWithYieldRejectsBadValues(t *testing.T) {
	if _, err := hotspot.NewWithOptions(hotspot.WithYield(nil, time.Second)); err == nil {
		t.Error("WithYield(nil notifier) accepted")
	}
	if _, err := hotspot.NewWithOptions(hotspot.WithYield(memory.New(), 0)); err == nil {
		t.Error("WithYield(max 0) accepted")
	}
	if _, err := hotspot.NewWithOptions(hotspot.WithNotifier(nil)); err == nil {
		t.Error("WithNotifier(nil) accepted")
	}
}
