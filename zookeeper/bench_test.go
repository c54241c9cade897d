package zookeeper

import (
	"context"
	"io"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
)

// The benchmarks compare this backend, through the facade, with
// go-zookeeper's own recipe (zk.NewLock) on the same server in the same
// run:
//
//	go test -run '^$' -bench . -count 6 ./zookeeper | tee new.txt; benchstat new.txt
//
// Cycle is one uncontended Lock and Unlock. Cycle/interleaved alternates
// the two, cycle by cycle, so that a busy machine slows both alike, and
// reports each one's mean (distlock-ns, zk-ns) and zk-ns/distlock-ns as
// speed-vs-zk (1 = as fast). Handoff measures, with two clients taking
// turns, the time from the holder's Unlock to the queued waiter's return
// from Lock; it reports the median and the 90th percentile as
// handoff-p50-ns and handoff-p90-ns.
func BenchmarkZooKeeper(b *testing.B) {
	addrs := []string{testserver.ZooKeeper(b).Addr}
	warmUp(b, addrs) // the server's JIT, so that the first benchmark is not penalised

	b.Run("Cycle/distlock", func(b *testing.B) {
		d := newBenchLock(b, addrs)
		key := uniqueKey(b)
		ctx := b.Context()
		before := packets(b, addrs[0])
		for b.Loop() {
			lk, err := d.TryLock(ctx, key, time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
		reportPackets(b, addrs[0], before)
	})
	b.Run("Cycle/zk.NewLock", func(b *testing.B) {
		l := zk.NewLock(connect(b, addrs), "/bench-zklock/"+uniqueName(b), zk.WorldACL(zk.PermAll))
		before := packets(b, addrs[0])
		for b.Loop() {
			if err := l.Lock(); err != nil {
				b.Fatal(err)
			}
			if err := l.Unlock(); err != nil {
				b.Fatal(err)
			}
		}
		reportPackets(b, addrs[0], before)
	})

	b.Run("Cycle/interleaved", func(b *testing.B) {
		d := newBenchLock(b, addrs)
		key := uniqueKey(b)
		ctx := b.Context()
		l := zk.NewLock(connect(b, addrs), "/bench-zklock/"+uniqueName(b), zk.WorldACL(zk.PermAll))
		var ours, theirs time.Duration
		for b.Loop() {
			t0 := time.Now()
			lk, err := d.TryLock(ctx, key, time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := l.Lock(); err != nil {
				b.Fatal(err)
			}
			if err := l.Unlock(); err != nil {
				b.Fatal(err)
			}
			ours, theirs = ours+t1.Sub(t0), theirs+time.Since(t1)
		}
		n := float64(b.N)
		b.ReportMetric(float64(ours.Nanoseconds())/n, "distlock-ns")
		b.ReportMetric(float64(theirs.Nanoseconds())/n, "zk-ns")
		b.ReportMetric(float64(theirs)/float64(ours), "speed-vs-zk")
	})

	distlockPair := func(b *testing.B) *pair {
		key := uniqueKey(b)
		mk := func() locker {
			d := newBenchLock(b, addrs)
			var lk *distlock.Lock
			return locker{
				lock: func() error {
					var err error
					lk, err = d.TryLock(b.Context(), key, time.Minute)
					return err
				},
				unlock: func() error { return lk.Unlock(b.Context()) },
			}
		}
		conn := connect(b, addrs)
		probe := mustNew(b, conn)
		return newPair(b, mk(), mk(), func() bool {
			cs, _ := children(conn, probe, key)
			return len(cs) == 2 && watching(b, addrs[0])
		})
	}
	zkPair := func(b *testing.B) *pair {
		path := "/bench-zklock/" + uniqueName(b)
		mk := func() locker {
			l := zk.NewLock(connect(b, addrs), path, zk.WorldACL(zk.PermAll))
			return locker{lock: l.Lock, unlock: l.Unlock}
		}
		conn := connect(b, addrs)
		return newPair(b, mk(), mk(), func() bool {
			cs, _, _ := conn.Children(path)
			return len(cs) == 2 && watching(b, addrs[0])
		})
	}
	b.Run("Handoff/distlock", func(b *testing.B) {
		p := distlockPair(b)
		for b.Loop() {
			p.step(b)
		}
		p.report(b, "handoff")
	})
	b.Run("Handoff/zk.NewLock", func(b *testing.B) {
		p := zkPair(b)
		for b.Loop() {
			p.step(b)
		}
		p.report(b, "handoff")
	})
	b.Run("Handoff/interleaved", func(b *testing.B) {
		ours, theirs := distlockPair(b), zkPair(b)
		for b.Loop() {
			ours.step(b)
			theirs.step(b)
		}
		ours.report(b, "distlock")
		theirs.report(b, "zk")
		b.ReportMetric(float64(ours.p50())/float64(theirs.p50()), "p50-vs-zk")
	})
}

// warmUp runs both recipes for a while.
func warmUp(b *testing.B, addrs []string) {
	conn := connect(b, addrs)
	r := mustNew(b, conn)
	defer r.Close()
	l := zk.NewLock(conn, "/bench-zklock/"+uniqueName(b), zk.WorldACL(zk.PermAll))
	key := uniqueKey(b)
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		if err := l.Lock(); err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(); err != nil {
			b.Fatal(err)
		}
		ls := lease(key, time.Minute)
		if err := r.Acquire(b.Context(), ls, time.Time{}); err != nil {
			b.Fatal(err)
		}
		if err := r.Release(b.Context(), ls); err != nil {
			b.Fatal(err)
		}
	}
}

func newBenchLock(b *testing.B, addrs []string) *distlock.DistributeLock {
	r, _ := newResource(b, addrs)
	d, err := distlock.New(r, distlock.WithDefaultTTL(time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = d.Close() })
	return d
}

// uniqueName is a znode name unique to the benchmark and run.
func uniqueName(b *testing.B) string { return encodeKey(uniqueKey(b)) }

type locker struct{ lock, unlock func() error }

// pair is two clients taking turns on one lock.
type pair struct {
	holder, waiter locker
	queued         func() bool // the waiter is queued and watching
	lat            []time.Duration
}

func newPair(b *testing.B, a, c locker, queued func() bool) *pair {
	if err := a.lock(); err != nil {
		b.Fatal(err)
	}
	p := &pair{holder: a, waiter: c, queued: queued}
	b.Cleanup(func() { _ = p.holder.unlock() })
	return p
}

// step queues the waiter, waits until the server shows it queued and
// watching its predecessor, then unlocks the holder: the time until the waiter's Lock returns is one
// sample. The two swap roles.
func (p *pair) step(b *testing.B) {
	got := make(chan error, 1)
	var t1 time.Time
	go func() {
		err := p.waiter.lock()
		t1 = time.Now()
		got <- err
	}()
	for !p.queued() {
		time.Sleep(100 * time.Microsecond)
	}
	t0 := time.Now()
	if err := p.holder.unlock(); err != nil {
		b.Fatal(err)
	}
	if err := <-got; err != nil {
		b.Fatal(err)
	}
	p.lat = append(p.lat, t1.Sub(t0))
	p.holder, p.waiter = p.waiter, p.holder
}

func (p *pair) p50() time.Duration {
	slices.Sort(p.lat)
	return p.lat[len(p.lat)/2]
}

func (p *pair) report(b *testing.B, name string) {
	slices.Sort(p.lat)
	b.ReportMetric(float64(p.lat[len(p.lat)/2].Nanoseconds()), name+"-p50-ns")
	b.ReportMetric(float64(p.lat[len(p.lat)*9/10].Nanoseconds()), name+"-p90-ns")
}

// watching reports whether the server at addr holds a watch (the wchs
// command), so that a handoff is timed from a waiter that is ready. When
// the server does not answer wchs it reports true: the handoffs then
// include some of the waiter's queueing.
func watching(b *testing.B, addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, "wchs"); err != nil {
		b.Fatal(err)
	}
	out, _ := io.ReadAll(c)
	_, total, ok := strings.Cut(string(out), "Total watches:")
	if !ok {
		return true
	}
	n, err := strconv.Atoi(strings.TrimSpace(total))
	return err != nil || n > 0
}

// BenchmarkHeld acquires b.N locks on distinct keys, all held at once by
// one resource (through the store alone, not the facade), 32 at a time,
// then releases them: what the store costs per held lock, in heap
// (heap-B/lock: live heap after GC, less the heap before; the leases, and
// zk.NewLock's paths, are made before) and in time, next to
// go-zookeeper's recipe (zk.NewLock) doing the same. The locks are kept
// alive by the session (AutoRenew), as the facade's WithAutoRenew has
// them.
//
//	go test -run '^$' -bench Held -benchtime 10000x ./zookeeper
func BenchmarkHeld(b *testing.B) {
	addrs := []string{testserver.ZooKeeper(b).Addr}
	warmUp(b, addrs)
	const workers = 32
	// held makes what lock i needs (outside the measure), then takes the
	// locks and measures.
	held := func(b *testing.B, prepare func(i int), acquire func(i int) error, release func(i int) error) {
		for i := range b.N {
			prepare(i)
		}
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		b.ResetTimer()
		parallel(b, b.N, workers, acquire)
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&m1)
		b.ReportMetric((float64(m1.HeapAlloc)-float64(m0.HeapAlloc))/float64(b.N), "heap-B/lock")
		parallel(b, b.N, workers, release)
	}
	b.Run("distlock", func(b *testing.B) {
		r, _ := newResource(b, addrs, WithSessionTimeout(sessionTimeout))
		base := uniqueKey(b)
		ls := make([]*backend.Lease, b.N)
		held(b, func(i int) {
			ls[i] = lease(base+"/"+strconv.Itoa(i), time.Minute)
			ls[i].AutoRenew = true
		}, func(i int) error {
			return r.Acquire(b.Context(), ls[i], time.Now().Add(time.Minute))
		}, func(i int) error {
			return r.Release(context.Background(), ls[i])
		})
	})
	b.Run("zk.NewLock", func(b *testing.B) {
		conn := connect(b, addrs)
		base := "/bench-zklock/" + uniqueName(b) + "-"
		paths := make([]string, b.N)
		ls := make([]*zk.Lock, b.N)
		held(b, func(i int) {
			paths[i] = base + strconv.Itoa(i)
		}, func(i int) error {
			ls[i] = zk.NewLock(conn, paths[i], zk.WorldACL(zk.PermAll))
			return ls[i].Lock()
		}, func(i int) error {
			return ls[i].Unlock()
		})
	})
}

// parallel runs f(0..n-1) on workers goroutines, failing b on an error.
func parallel(b *testing.B, n, workers int, f func(i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := f(i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
