package etcd

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/internal/testserver"
)

// BenchmarkHeld holds b.N locks on distinct keys at once through the
// facade with WithAutoRenew, as the bench's scale workload does, and
// reports the live heap each costs the process (heap-B/lock: live heap
// after GC, less the heap before; the keys and the *Lock slice are made
// before). The target: at most 300 B per held lock.
//
//	go test -run '^$' -bench Held -benchtime 10000x ./etcd
func BenchmarkHeld(b *testing.B) {
	r := newResource(b, testserver.Etcd(b).Endpoints)
	d, err := distlock.New(r, distlock.WithAutoRenew(), distlock.WithDefaultTTL(time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	base := uniqueKey(b)
	keys := make([]string, b.N)
	for i := range keys {
		keys[i] = base + "/" + strconv.Itoa(i)
	}
	locks := make([]*distlock.Lock, b.N)
	h0 := heldHeap()
	b.ResetTimer()
	for i := range b.N {
		if locks[i], err = d.TryLock(ctx, keys[i], 0); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(heldHeap()-h0)/float64(b.N), "heap-B/lock")
	for _, lk := range locks {
		if err := lk.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// heldHeap returns the bytes of live heap objects, after two collections.
func heldHeap() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
