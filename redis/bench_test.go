package redis_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/redis"
)

// Run the uncontended cycles with client and server on one CPU, side by
// side, and compare with benchstat:
//
//	taskset -c 0 go test -run '^$' -bench 'Cycle|Floor|Paired' -count 10 ./redis

// reportCommands reports the calls per op of the named top-level commands
// (commands run inside scripts count in commandstats too: leave them out).
func reportCommands(b *testing.B, c *goredis.Client, before map[string]int64, names ...string) {
	d := statsDelta(before, commandStats(b, c))
	var n int64
	for _, name := range names {
		n += d[name]
	}
	b.ReportMetric(float64(n)/float64(b.N), "cmds/op")
}

// BenchmarkCycle is one uncontended TryLock + Unlock through distlock.New.
func BenchmarkCycle(b *testing.B) {
	c := standalone(b)
	d, err := distlock.New(mustNew(b, c), distlock.WithDefaultTTL(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	key := uniqueKey(b)
	before, usec := commandStats(b, c), commandUsec(b, c)
	b.ReportAllocs()
	for b.Loop() {
		lk, err := d.TryLock(ctx, key, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
	reportCommands(b, c, before, "evalsha", "eval")
	reportScriptTime(b, c, usec)
}

// reportScriptTime reports the server time the scripts took per op
// (INFO commandstats: an EVALSHA's usec includes its commands').
func reportScriptTime(b *testing.B, c *goredis.Client, before map[string]int64) {
	d := statsDelta(before, commandUsec(b, c))
	b.ReportMetric(float64(d["evalsha"]+d["eval"])/float64(b.N), "script-us/op")
}

// floorRelease is the usual compare-and-delete script, as redislock has it.
var floorRelease = goredis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)

// BenchmarkFloor is the least a correct Redis lock can do with go-redis:
// SET NX PX, then EVALSHA compare-and-delete. Two round trips, no token,
// no notice.
func BenchmarkFloor(b *testing.B) {
	c := standalone(b)
	ctx := context.Background()
	key := uniqueKey(b)
	var n uint64
	before := commandStats(b, c)
	b.ReportAllocs()
	for b.Loop() {
		n++
		value := strconv.FormatUint(n, 16)
		ok, err := c.SetNX(ctx, key, value, 10*time.Second).Result()
		if err != nil || !ok {
			b.Fatalf("SETNX = %v, %v", ok, err)
		}
		if err := floorRelease.Run(ctx, c, []string{key}, value).Err(); err != nil {
			b.Fatal(err)
		}
	}
	reportCommands(b, c, before, "set", "evalsha", "eval")
}

// BenchmarkPaired alternates one distlock cycle and one floor cycle per
// iteration and times each, so both see the same machine load (the
// machine may be shared); floor/distlock is distlock's relative throughput.
func BenchmarkPaired(b *testing.B) {
	c := standalone(b)
	d, err := distlock.New(mustNew(b, c), distlock.WithDefaultTTL(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	key, floorKey := uniqueKey(b), uniqueKey(b)+"-floor"
	var (
		n                  uint64
		cycleSum, floorSum time.Duration
	)
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
		n++
		value := strconv.FormatUint(n, 16)
		if ok, err := c.SetNX(ctx, floorKey, value, 10*time.Second).Result(); err != nil || !ok {
			b.Fatalf("SETNX = %v, %v", ok, err)
		}
		if err := floorRelease.Run(ctx, c, []string{floorKey}, value).Err(); err != nil {
			b.Fatal(err)
		}
		cycleSum += t1.Sub(t0)
		floorSum += time.Since(t1)
	}
	b.ReportMetric(float64(cycleSum.Nanoseconds())/float64(b.N), "cycle-ns/op")
	b.ReportMetric(float64(floorSum.Nanoseconds())/float64(b.N), "floor-ns/op")
	b.ReportMetric(float64(floorSum)/float64(cycleSum), "floor/cycle")
}

// noNotice hides the Resource's Notifier, leaving the spin alone.
type noNotice struct{ *redis.Resource }

func (n noNotice) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	return n.Resource.TryAcquire(ctx, l)
}

// watched signals the first failed attempt of each acquisition, so the
// holder releases only once the waiter is waiting.
type watched struct {
	backend.Spinner
	waiting chan struct{}
	failed  atomic.Bool
}

func (w *watched) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	ok, ttl, err := w.Spinner.TryAcquire(ctx, l)
	if !ok && err == nil && !w.failed.Swap(true) {
		w.waiting <- struct{}{}
	}
	return ok, ttl, err
}

type watchedNotifier struct {
	*watched
	backend.Notifier
}

// BenchmarkHandoff measures the time from the holder's Unlock to the
// waiter's TryLock returning the lock, with the release notice (wakeup) and
// with the random spin alone (spin: 10ms + [0, 10ms)). The holder releases
// 2ms after the waiter's first failed attempt, or at once (wakeup-at-once:
// the release races the waiter's SUBSCRIBE, and the subscription's
// confirmation makes the waiter retry).
func BenchmarkHandoff(b *testing.B) {
	c := standalone(b)
	for _, mode := range []string{"wakeup", "wakeup-at-once", "spin"} {
		b.Run(mode, func(b *testing.B) {
			ctx := distlock.ContextWithTTL(context.Background(), 10*time.Second)
			r := mustNew(b, c)
			defer r.Close()
			w := &watched{Spinner: r, waiting: make(chan struct{}, 1)}
			var res backend.RemoteResource = w
			if mode != "spin" {
				res = watchedNotifier{w, r}
			} else {
				w.Spinner = noNotice{r}
			}
			waiter, err := distlock.New(res)
			if err != nil {
				b.Fatal(err)
			}
			holder, err := distlock.New(mustNew(b, c))
			if err != nil {
				b.Fatal(err)
			}
			key := uniqueKey(b)
			var lat []time.Duration
			got := make(chan time.Time, 1)
			for b.Loop() {
				lk, err := holder.TryLock(ctx, key, 0)
				if err != nil {
					b.Fatal(err)
				}
				w.failed.Store(false)
				go func() {
					lk, err := waiter.TryLock(ctx, key, 10*time.Second)
					at := time.Now()
					if err != nil {
						b.Error(err)
					} else {
						_ = lk.Unlock(ctx)
					}
					got <- at
				}()
				<-w.waiting
				if mode != "wakeup-at-once" {
					time.Sleep(2 * time.Millisecond)
				}
				released := time.Now()
				if err := lk.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, (<-got).Sub(released))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2])/1e6, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*9/10])/1e6, "p90-ms")
		})
	}
}

// BenchmarkCycleParallel is BenchmarkCycle from 16 goroutines of one
// process, each on its own key: the calls that overlap share pipelines
// (natural batching); round-trips/op says how many.
//
//	go test -run '^$' -bench CycleParallel -cpu 1 ./redis
func BenchmarkCycleParallel(b *testing.B) {
	c := standalone(b)
	var pipes atomic.Int64
	c.AddHook(pipeCounter{&pipes})
	d, err := distlock.New(mustNew(b, c), distlock.WithDefaultTTL(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	base := uniqueKey(b)
	var id atomic.Int64
	before, usec := commandStats(b, c), commandUsec(b, c)
	pipes.Store(0)
	b.ReportAllocs()
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		key := base + strconv.FormatInt(id.Add(1), 10)
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
	b.ReportMetric(float64(pipes.Load())/float64(b.N), "round-trips/op")
	reportCommands(b, c, before, "evalsha", "eval")
	reportScriptTime(b, c, usec)
}

// pipeCounter counts the commands and pipelines a client sends.
type pipeCounter struct{ n *atomic.Int64 }

func (pipeCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h pipeCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h pipeCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// BenchmarkHeld acquires b.N locks on distinct keys, all held at once by
// one Resource (through the store alone, not the facade), 32 at a time,
// then releases them: what the store keeps per held lock, in heap
// (heap-B/lock: live heap after GC, less the heap before; the leases are
// made before, as the facade makes them), and the time to take them.
//
//	go test -run '^$' -bench Held -benchtime 20000x ./redis
func BenchmarkHeld(b *testing.B) {
	const workers = 32
	r := mustNew(b, standalone(b))
	defer r.Close()
	base := uniqueKey(b)
	ls := make([]*backend.Lease, b.N)
	for i := range ls {
		ls[i] = newLease(base+"-"+strconv.Itoa(i), time.Minute)
	}
	ctx := context.Background()
	// Warm up: the client's connections (a buffer each) and the pools are
	// the Resource's, not the locks'.
	parallel(b, 4*workers, workers, func(i int) error {
		l := newLease(base+"-warm-"+strconv.Itoa(i), time.Minute)
		if _, _, err := r.TryAcquire(ctx, l); err != nil {
			return err
		}
		return r.Release(ctx, l)
	})
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	b.ResetTimer()
	parallel(b, b.N, workers, func(i int) error {
		ok, _, err := r.TryAcquire(ctx, ls[i])
		if err == nil && !ok {
			err = fmt.Errorf("%s: not acquired", ls[i].Key)
		}
		return err
	})
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&m1)
	b.ReportMetric((float64(m1.HeapAlloc)-float64(m0.HeapAlloc))/float64(b.N), "heap-B/lock")
	parallel(b, b.N, workers, func(i int) error { return r.Release(ctx, ls[i]) })
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
