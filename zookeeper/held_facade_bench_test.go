package zookeeper

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/internal/testserver"
)

// BenchmarkHeldFacade holds b.N locks on distinct keys at once through the
// facade with WithAutoRenew, as the bench's scale workload does, and
// reports the live heap each costs the process (heap-B/lock: live heap
// after GC, less the heap before; the keys and the *Lock slice are made
// before): the facade's grant and the store's, next to BenchmarkHeld's
// store alone. The target: at most 300 B per held lock.
//
//	go test -run '^$' -bench HeldFacade -benchtime 10000x ./zookeeper
func BenchmarkHeldFacade(b *testing.B) {
	addrs := []string{testserver.ZooKeeper(b).Addr}
	warmUp(b, addrs)
	r, _ := newResource(b, addrs, WithSessionTimeout(sessionTimeout))
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
	h0 := facadeHeap()
	b.ResetTimer()
	for i := range b.N {
		if locks[i], err = d.TryLock(ctx, keys[i], 0); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(facadeHeap()-h0)/float64(b.N), "heap-B/lock")
	for _, lk := range locks {
		if err := lk.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// facadeHeap returns the bytes of live heap objects, after two collections.
func facadeHeap() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
