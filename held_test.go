package distlock_test

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
)

// heldBytes measures the heap a lock held with WithAutoRenew costs, over
// n locks held at once: facade over a store that keeps nothing (grant
// with its lease and first handle, owner value, scheduler entry), total on
// the memory store, store the difference (the memory store's entries).
// The keys and the *Lock slice are the caller's and are not counted.
func heldBytes(tb testing.TB, n int) (total, store, facade float64) {
	tb.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "held/" + strconv.Itoa(i)
	}
	facade = holdAll(tb, nullStore{}, keys)
	total = holdAll(tb, memory.New(), keys)
	return total, total - facade, facade
}

// holdAll holds every key on r with WithAutoRenew and returns the live
// heap per lock; a TTL long enough that no renewal runs meanwhile.
func holdAll(tb testing.TB, r backend.RemoteResource, keys []string) float64 {
	ctx := context.Background()
	d, err := distlock.New(r, distlock.WithAutoRenew(), distlock.WithDefaultTTL(time.Hour))
	if err != nil {
		tb.Fatal(err)
	}
	defer d.Close()
	locks := make([]*distlock.Lock, len(keys))
	before := liveHeap()
	for i, k := range keys {
		if locks[i], err = d.TryLock(ctx, k, 0); err != nil {
			tb.Fatal(err)
		}
	}
	per := float64(liveHeap()-before) / float64(len(keys))
	for _, lk := range locks {
		if err := lk.Unlock(ctx); err != nil {
			tb.Fatal(err)
		}
	}
	return per
}

// nullStore grants every lock and keeps nothing: what a held lock costs
// over it is the facade's alone.
type nullStore struct{}

func (nullStore) TryAcquire(context.Context, *backend.Lease) (bool, time.Duration, error) {
	return true, 0, nil
}
func (nullStore) Release(context.Context, *backend.Lease) error { return nil }
func (nullStore) Refresh(context.Context, *backend.Lease) error { return nil }

// liveHeap returns the bytes of live heap objects, after two collections
// (the second frees what the first moved to sync.Pool victim caches).
func liveHeap() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// BenchmarkHeldLocks holds 100,000 locks with WithAutoRenew on the memory
// store and reports the heap each costs: the facade's (grant with its
// Lease and first handle, owner value, scheduler entry) and the store's
// entries, measured apart (the target: at most 300 B per held
// lock). TestHeldLockHeap holds the facade's bound.
func BenchmarkHeldLocks(b *testing.B) {
	const n = 100_000
	var total, store, facade float64
	for b.Loop() {
		total, store, facade = heldBytes(b, n)
	}
	b.ReportMetric(facade, "facade-B/lock")
	b.ReportMetric(store, "store-B/lock")
	b.ReportMetric(total, "B/lock")
}
