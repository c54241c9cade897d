package distlock_test

import (
	"context"
	"errors"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
)

// wrappingWaiter is a push store whose client, as gRPC's does, wraps the
// acquisition's context with a value and derives a cancel context from
// it for each request; block makes Acquire wait for that context's end.
type wrappingWaiter struct {
	block   bool
	entered chan struct{} // a blocking Acquire waits, when block
	ended   chan error    // the derived context's error, when block
}

type valueKey struct{}

func (w *wrappingWaiter) Acquire(ctx context.Context, l *backend.Lease, deadline time.Time) error {
	rctx, cancel := context.WithCancel(context.WithValue(ctx, valueKey{}, "v"))
	defer cancel()
	if rctx.Value(valueKey{}) != "v" {
		return errors.New("the derived context lost its value")
	}
	if !w.block {
		l.Token = 1
		return nil
	}
	w.entered <- struct{}{}
	<-rctx.Done()
	w.ended <- rctx.Err()
	return rctx.Err()
}

func (w *wrappingWaiter) Release(context.Context, *backend.Lease) error { return nil }

var createdSample = []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}

func goroutinesCreated() uint64 {
	metrics.Read(createdSample)
	return createdSample[0].Value.Uint64()
}

// TestDerivedRequestContextNoGoroutine: a store's client that derives a
// cancel context from the acquisition's, wrapped with a value (gRPC's
// metadata), starts no goroutine to follow it (the context package's
// fallback for a parent it does not know), and the derived context still
// ends with the acquisition: at the wait's bound, and at Close.
func TestDerivedRequestContextNoGoroutine(t *testing.T) {
	ctx := context.Background()
	w := &wrappingWaiter{}
	d, err := distlock.New(w)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	cycle := func() {
		lk, err := d.TryLock(ctx, "k", time.Second)
		if err != nil {
			t.Fatalf("TryLock = %v", err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("Unlock = %v", err)
		}
	}
	cycle() // warm up
	// The count is the process's: a timer of another test's facade that
	// fires meanwhile starts a goroutine too. A goroutine per cycle shows
	// in every try; a stray one in one try only.
	const n, tries = 200, 3
	var got []uint64
	for range tries {
		before := goroutinesCreated()
		for range n {
			cycle()
		}
		got = append(got, goroutinesCreated()-before)
		if got[len(got)-1] == 0 {
			break
		}
	}
	if len(got) == tries {
		t.Errorf("%d cycles started %v goroutines in %d tries; want 0 in one", n, got, tries)
	}

	// The derived context ends at the bound...
	w.block, w.entered, w.ended = true, make(chan struct{}, 1), make(chan error, 1)
	start := time.Now()
	_, err = d.TryLock(ctx, "k", 50*time.Millisecond)
	<-w.entered
	if err == nil {
		t.Fatal("TryLock of a store that never answers = nil")
	}
	if got := <-w.ended; !errors.Is(got, context.DeadlineExceeded) {
		t.Errorf("derived context ended with %v; want context.DeadlineExceeded", got)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("TryLock with a 50ms wait returned after %v", el)
	}
	// ... and at Close.
	errc := make(chan error, 1)
	go func() {
		_, err := d.TryLock(ctx, "k", time.Hour)
		errc <- err
	}()
	<-w.entered
	if err := d.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	if got := <-w.ended; !errors.Is(got, context.Canceled) {
		t.Errorf("derived context ended by Close with %v; want context.Canceled", got)
	}
	if err := <-errc; !errors.Is(err, distlock.ErrClosed) {
		t.Errorf("TryLock ended by Close = %v; want ErrClosed", err)
	}
}

// TestAcquisitionLeavesNothingOnCallerContext: an acquisition whose
// context's Done was asked for (a store that watches it) leaves nothing
// registered with the caller's context once it returns: a caller's
// long-lived context (a server's) would otherwise keep every acquisition
// it ever made.
func TestAcquisitionLeavesNothingOnCallerContext(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	d, err := distlock.New(&doneAsker{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	var before, after runtime.MemStats
	cycle := func() {
		lk, err := d.TryLock(parent, "k", time.Second)
		if err != nil {
			t.Fatalf("TryLock = %v", err)
		}
		if err := lk.Unlock(parent); err != nil {
			t.Fatalf("Unlock = %v", err)
		}
	}
	cycle()
	runtime.GC()
	runtime.ReadMemStats(&before)
	const n = 20000
	for range n {
		cycle()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > n*8 {
		t.Errorf("the heap grew by %d B over %d acquisitions (%d B each) with the caller's context alive; want nothing kept", grew, n, grew/n)
	}
}

// doneAsker is a push store that asks its context for Done, as a client
// that watches it does.
type doneAsker struct{}

func (doneAsker) Acquire(ctx context.Context, l *backend.Lease, _ time.Time) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	default:
	}
	l.Token = 1
	return nil
}

func (doneAsker) Release(context.Context, *backend.Lease) error { return nil }
