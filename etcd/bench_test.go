package etcd

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
)

// Compare with benchstat:
//
//	go test -run '^$' -bench . -count 6 ./etcd/ | tee new.txt

// BenchmarkCycle is one uncontended TryLock + Unlock through the facade
// with auto-renew on, and concurrency.Mutex Lock + Unlock on one session,
// over the same server.
func BenchmarkCycle(b *testing.B) {
	endpoints := testserver.Etcd(b).Endpoints
	var rpcs atomic.Int64 // requests sent by c: reported as rpcs/op
	c := countingClient(b, endpoints, &rpcs)
	for _, m := range modes {
		b.Run("distlock-"+m.name, func(b *testing.B) {
			d, err := distlock.New(mustNew(b, c, m.opts...), distlock.WithAutoRenew(), distlock.WithDefaultTTL(10*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			key := uniqueKey(b)
			ctx := context.Background()
			rpcs.Store(0)
			for b.Loop() {
				lk, err := d.TryLock(ctx, key, 0)
				if err != nil {
					b.Fatal(err)
				}
				if err := lk.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(rpcs.Load())/float64(b.N), "rpcs/op")
		})
	}
	for _, m := range modes {
		b.Run("resource-"+m.name, func(b *testing.B) {
			r := mustNew(b, c, m.opts...)
			defer r.Close()
			key := uniqueKey(b)
			ctx := context.Background()
			rpcs.Store(0)
			for b.Loop() {
				l := &backend.Lease{Key: key, Value: "v", TTL: 10 * time.Second}
				if err := r.Acquire(ctx, l, time.Time{}); err != nil {
					b.Fatal(err)
				}
				if err := r.Release(ctx, l); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(rpcs.Load())/float64(b.N), "rpcs/op")
		})
	}
	b.Run("concurrency.Mutex", func(b *testing.B) {
		s, err := concurrency.NewSession(c, concurrency.WithTTL(10))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		m := concurrency.NewMutex(s, "/bench/"+uniqueKey(b))
		ctx := context.Background()
		rpcs.Store(0)
		for b.Loop() {
			if err := m.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			if err := m.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(rpcs.Load())/float64(b.N), "rpcs/op")
	})
}

// BenchmarkCycleVsMutex interleaves a distlock cycle (auto-renew on) and a
// concurrency.Mutex cycle in every iteration, so that load from elsewhere
// on the machine hits both alike, and reports the mean of each and the
// speed ratio: speed-x = mutex time / distlock time (>= 0.9 is the goal).
func BenchmarkCycleVsMutex(b *testing.B) {
	endpoints := testserver.Etcd(b).Endpoints
	c := newClient(b, endpoints)
	s, err := concurrency.NewSession(c, concurrency.WithTTL(10))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			d, err := distlock.New(mustNew(b, c, m.opts...), distlock.WithAutoRenew(), distlock.WithDefaultTTL(10*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			key := uniqueKey(b)
			mu := concurrency.NewMutex(s, "/bench/"+key)
			ctx := context.Background()
			var ours, theirs time.Duration
			for b.Loop() {
				t0 := time.Now()
				lk, err := d.TryLock(ctx, key, 0)
				if err != nil {
					b.Fatal(err)
				}
				if err := lk.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := mu.Lock(ctx); err != nil {
					b.Fatal(err)
				}
				if err := mu.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
				ours, theirs = ours+t1.Sub(t0), theirs+time.Since(t1)
			}
			n := float64(b.N)
			b.ReportMetric(float64(ours.Microseconds())/n, "distlock-us")
			b.ReportMetric(float64(theirs.Microseconds())/n, "mutex-us")
			b.ReportMetric(float64(theirs)/float64(ours), "speed-x")
		})
	}
}

// BenchmarkAcquireHeldVsMutex acquires distinct keys and keeps them all,
// as a process that holds many locks does, interleaving a
// distlock acquire (auto-renew on: kept alive by the shared lease) and a
// concurrency.Mutex Lock in every iteration; it reports the mean of each
// and speed-x = mutex time / distlock time (>= 1 is the goal). The locks
// are released after the timing.
func BenchmarkAcquireHeldVsMutex(b *testing.B) {
	endpoints := testserver.Etcd(b).Endpoints
	c := newClient(b, endpoints)
	s, err := concurrency.NewSession(c, concurrency.WithTTL(10))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	d, err := distlock.New(mustNew(b, c), distlock.WithAutoRenew(), distlock.WithDefaultTTL(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	base := uniqueKey(b)
	var (
		ours, theirs time.Duration
		locks        []*distlock.Lock
		mus          []*concurrency.Mutex
		i            int
	)
	for b.Loop() {
		key := fmt.Sprintf("%s-%d", base, i)
		i++
		t0 := time.Now()
		lk, err := d.TryLock(ctx, key, 0)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		mu := concurrency.NewMutex(s, "/bench/"+key)
		if err := mu.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		ours, theirs = ours+t1.Sub(t0), theirs+time.Since(t1)
		locks, mus = append(locks, lk), append(mus, mu)
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(ours.Microseconds())/n, "distlock-us")
	b.ReportMetric(float64(theirs.Microseconds())/n, "mutex-us")
	b.ReportMetric(float64(theirs)/float64(ours), "speed-x")
	for i, lk := range locks {
		if err := lk.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		if err := mus[i].Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHandoff measures the time from the holder's Unlock call to the
// queued waiter holding the lock, and reports its median as p50-ms.
// "watch-at-read" starts the predecessor watch at the revision read, as
// concurrency.Mutex does: the server then serves it as an unsynced watcher
// from its 100 ms catch-up loop.
func BenchmarkHandoff(b *testing.B) {
	endpoints := testserver.Etcd(b).Endpoints
	for _, m := range modes {
		{
			b.Run("distlock-"+m.name, func(b *testing.B) {
				ra := mustNew(b, newClient(b, endpoints), m.opts...)
				rb := mustNew(b, newClient(b, endpoints), m.opts...)
				da, _ := distlock.New(ra, distlock.WithAutoRenew(), distlock.WithDefaultTTL(10*time.Second))
				db, _ := distlock.New(rb, distlock.WithAutoRenew(), distlock.WithDefaultTTL(10*time.Second))
				defer da.Close()
				defer db.Close()
				key := uniqueKey(b)
				ctx := context.Background()
				var handoffs []time.Duration
				for b.Loop() {
					lkA, err := da.TryLock(ctx, key, 0)
					if err != nil {
						b.Fatal(err)
					}
					got := make(chan time.Time, 1)
					go func() {
						lkB, err := db.TryLock(ctx, key, time.Minute)
						got <- time.Now()
						if err != nil {
							b.Error(err)
							return
						}
						_ = lkB.Unlock(ctx)
					}()
					waitQueued(b, ra, key, 2)
					start := time.Now()
					if err := lkA.Unlock(ctx); err != nil {
						b.Fatal(err)
					}
					handoffs = append(handoffs, (<-got).Sub(start))
					waitQueued(b, ra, key, 0)
				}
				reportP50(b, handoffs)
			})
		}
	}
	b.Run("concurrency.Mutex", func(b *testing.B) {
		ca, cb := newClient(b, endpoints), newClient(b, endpoints)
		sa, err := concurrency.NewSession(ca, concurrency.WithTTL(10))
		if err != nil {
			b.Fatal(err)
		}
		defer sa.Close()
		sb, err := concurrency.NewSession(cb, concurrency.WithTTL(10))
		if err != nil {
			b.Fatal(err)
		}
		defer sb.Close()
		pfx := "/bench/" + uniqueKey(b)
		ctx := context.Background()
		var handoffs []time.Duration
		for b.Loop() {
			ma, mb := concurrency.NewMutex(sa, pfx), concurrency.NewMutex(sb, pfx)
			if err := ma.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			got := make(chan time.Time, 1)
			go func() {
				err := mb.Lock(ctx)
				got <- time.Now()
				if err != nil {
					b.Error(err)
					return
				}
				_ = mb.Unlock(ctx)
			}()
			waitPrefix(b, ca, pfx+"/", 2)
			start := time.Now()
			if err := ma.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
			handoffs = append(handoffs, (<-got).Sub(start))
			waitPrefix(b, ca, pfx+"/", 0)
		}
		reportP50(b, handoffs)
	})
}

func waitQueued(b *testing.B, r *Resource, key string, n int) {
	b.Helper()
	waitPrefix(b, r.c, r.queuePrefix(key), n)
}

// waitPrefix polls until n keys are under pfx.
func waitPrefix(b *testing.B, c *clientv3.Client, pfx string, n int) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := c.Get(context.Background(), pfx, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err == nil && resp.Count == int64(n) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s holds %d keys (err %v); want %d", pfx, resp.Count, err, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func reportP50(b *testing.B, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2])/float64(time.Millisecond), "p50-ms")
}
