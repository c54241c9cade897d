package hotspot_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/hotspot"
)

// A hot key's semaphore lets as many goroutines of the process reach the
// store as the semaphore has permits: never fewer.
func TestHotspotSemaphoreAdmitsLimit(t *testing.T) {
	store := memory.New()
	d, err := distlock.New(store, distlock.WithHandlers(hotspot.New("k")))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const limit = 3
	var in, most atomic.Int64
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range 6 {
		wg.Go(func() {
			lk, err := d.Semaphore("k", limit).TryAcquire(context.Background(), time.Minute)
			if err != nil {
				t.Error(err)
				return
			}
			n := in.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-release
			in.Add(-1)
			lk.Unlock(context.Background())
		})
	}
	for in.Load() < limit { // the permits are all taken, locally and in the store
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // a fourth holder would show now: a check, not synchronisation
	if n := most.Load(); n != limit {
		t.Errorf("%d holders at once; want %d (the limit)", n, limit)
	}
	close(release)
	wg.Wait()
}

// A hot key's read/write lock: readers share the local gate; a key's mutex
// and its read/write lock are distinct, locally too.
func TestHotspotReadersShareAndKindsDistinct(t *testing.T) {
	d, err := distlock.New(memory.New(), distlock.WithHandlers(hotspot.New("k")))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	m, err := d.TryLock(ctx, "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	var readers []*distlock.Lock
	for i := range 4 {
		r, err := d.RWMutex("k").TryRLock(ctx, 0)
		if err != nil {
			t.Fatalf("reader %d with the mutex and %d readers held: %v", i, i, err)
		}
		readers = append(readers, r)
	}
	if w, err := d.RWMutex("k").TryLock(ctx, 0); err == nil {
		w.Unlock(ctx)
		t.Fatalf("a writer got in among readers")
	}
	for _, r := range readers {
		r.Unlock(ctx)
	}
	w, err := d.RWMutex("k").TryLock(ctx, time.Second)
	if err != nil {
		t.Fatalf("writer after the readers left: %v", err)
	}
	w.Unlock(ctx)
	m.Unlock(ctx)
}

// A campaign passes the handler through, even for a key registered as
// hot: its kind has no local gate (a gate sized by its limit, 0, would
// never let it in).
func TestHotspotCampaignPassesThrough(t *testing.T) {
	d, err := distlock.New(memory.New(), distlock.WithHandlers(hotspot.New(backend.ElectionPrefix+"e")))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for range 2 {
		lead, err := d.Election("e").Campaign(ctx, "v")
		if err != nil {
			t.Fatalf("Campaign of an election whose key is hot: %v; want elected", err)
		}
		if err := lead.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
