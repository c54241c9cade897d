package testsuite

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
)

// BenchmarkHeld holds b.N locks on distinct keys of r at once through the
// facade with WithAutoRenew, as the bench's scale workload does, and
// reports the live heap each costs the process (heap-B/lock: live heap
// after GC, less the heap before; the keys and the *Lock slice are made
// before): the facade's grant and the store's. The target: at most 300 B
// per held lock.
func BenchmarkHeld(b *testing.B, r backend.RemoteResource) {
	d, err := distlock.New(r, distlock.WithAutoRenew(), distlock.WithDefaultTTL(time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	base := Key(b)
	keys := make([]string, b.N)
	for i := range keys {
		keys[i] = base + "/" + strconv.Itoa(i)
	}
	locks := make([]*distlock.Lock, b.N)
	h0 := liveHeap()
	b.ResetTimer()
	for i := range b.N {
		if locks[i], err = d.TryLock(ctx, keys[i], 0); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(liveHeap()-h0)/float64(b.N), "heap-B/lock")
	for _, lk := range locks {
		if err := lk.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// liveHeap returns the bytes of live heap objects, after two collections.
func liveHeap() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
