package hotspot

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestGateRandomized drives a gate with goroutines taking random weights
// (ones, and the whole gate, as readers and writers do), with random
// deadlines and cancellations, and checks after every grant that what is
// held never exceeds the gate, and at the end that everything came back and
// nobody is left waiting. DISTLOCK_TEST_SEED is not needed: a failure
// prints the weights it saw.
func TestGateRandomized(t *testing.T) {
	for _, size := range []int64{1, 3, rwSize} {
		g := &gate{size: size}
		var held atomic.Int64
		var grants, refusals atomic.Int64
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), uint64(size)))
				for range 300 {
					n := int64(1)
					if rng.IntN(4) == 0 {
						n = size // a writer, or a whole semaphore
					}
					ctx, cancel := context.WithCancel(context.Background())
					var deadline time.Time
					if rng.IntN(3) > 0 {
						deadline = time.Now().Add(time.Duration(rng.IntN(2000)) * time.Microsecond)
					}
					if rng.IntN(5) == 0 {
						time.AfterFunc(time.Duration(rng.IntN(500))*time.Microsecond, cancel)
					}
					if err := g.acquire(ctx, n, deadline, "k"); err != nil {
						refusals.Add(1)
						cancel()
						continue
					}
					if h := held.Add(n); h > size {
						t.Errorf("size %d: %d held", size, h)
					}
					grants.Add(1)
					time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond) // the hold
					held.Add(-n)
					g.release(n)
					cancel()
				}
			})
		}
		wg.Wait()
		g.mu.Lock()
		if g.cur != 0 || g.waiters.Len() != 0 {
			t.Errorf("size %d: %d still taken and %d waiting at the end", size, g.cur, g.waiters.Len())
		}
		g.mu.Unlock()
		if grants.Load() == 0 {
			t.Errorf("size %d: nothing granted", size)
		}
		t.Logf("size %d: %d grants, %d refusals", size, grants.Load(), refusals.Load())
	}
}

// TestGateOrder: a waiter for the whole gate (a writer) keeps later small
// waiters (readers) out until it had its turn.
func TestGateOrder(t *testing.T) {
	g := &gate{size: 4}
	ctx := context.Background()
	far := time.Now().Add(time.Minute)
	if err := g.acquire(ctx, 1, far, "k"); err != nil { // a reader holds
		t.Fatal(err)
	}
	writer := make(chan error, 1)
	go func() { writer <- g.acquire(ctx, 4, far, "k") }()
	for { // the writer is queued
		g.mu.Lock()
		n := g.waiters.Len()
		g.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err := g.acquire(ctx, 1, time.Time{}, "k"); err == nil {
		t.Fatalf("a reader got in ahead of the waiting writer")
	}
	g.release(1)
	if err := <-writer; err != nil {
		t.Fatalf("writer: %v", err)
	}
	g.release(4)
}
