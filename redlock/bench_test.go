package redlock_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/redlock"
)

// BenchmarkCycle measures an uncontended TryLock + Unlock through
// distlock.New on five independent nodes: two quorum rounds (acquire,
// release), ten round trips sent in parallel. It reports the p50 and p99
// of a cycle's latency. Compare runs with benchstat; go-redsync/redsync is
// measured beside it outside the module (see the package's report).
func BenchmarkCycle(b *testing.B) {
	for _, n := range []int{3, 5} {
		b.Run(map[int]string{3: "nodes=3", 5: "nodes=5"}[n], func(b *testing.B) {
			c := startNodes(b, n, nil)
			r, err := redlock.New(c.clients)
			if err != nil {
				b.Fatal(err)
			}
			d, err := distlock.New(r, distlock.WithDefaultTTL(10*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = d.Close() })
			ctx := context.Background()
			key := uniqueKey(b)
			cycle := func() {
				lk, err := d.TryLock(ctx, key, 0)
				if err != nil {
					b.Fatal(err)
				}
				if err := lk.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
			for range 100 { // connections and workers warm
				cycle()
			}
			lat := make([]time.Duration, 0, 1<<16)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				start := time.Now()
				cycle()
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(start))
				}
			}
			b.StopTimer()
			reportPercentiles(b, lat)
		})
	}
}

// BenchmarkCycleParallel is BenchmarkCycle from GOMAXPROCS goroutines,
// each on its own key.
func BenchmarkCycleParallel(b *testing.B) {
	c := startNodes(b, 5, nil)
	r, err := redlock.New(c.clients)
	if err != nil {
		b.Fatal(err)
	}
	d, err := distlock.New(r, distlock.WithDefaultTTL(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = d.Close() })
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		key := uniqueKey(b)
		for pb.Next() {
			lk, err := d.TryLock(ctx, key, 0)
			if err != nil {
				b.Error(err)
				return
			}
			if err := lk.Unlock(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
