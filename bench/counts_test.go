package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"
)

// Counts per uncontended cycle that do not depend on machine load: what a
// lock+unlock of one key costs in server commands and round trips, heap
// allocations, goroutines started, timers made, context callbacks
// registered and goroutine blocks (a goroutine parked on a channel, a
// select or a sync primitive: a handoff to a worker and back is two), for
// distlock and its peers over the same store.
//
//	go test -run '^$' -bench '^BenchmarkCycleCounts$' -benchtime 2000x ./bench
//	go test -run '^$' -bench '^BenchmarkCycleCounts$/redis' -benchtime 2000x ./bench
//
// The stores start as the bench program starts them (internal/testserver).
// make test's bench-check runs the Redis, PostgreSQL, etcd and ZooKeeper rows and fails
// when distlock's cycle needs more server commands, allocations,
// goroutine blocks, goroutines or timers than countTargets allow.

// countTargets are the most an uncontended distlock cycle may cost on a
// store, fencing on (the default): checked by BenchmarkCycleCounts. Redis:
// the acquire's EVALSHA, SET NX, TIME and SET ... GET of the fence; the
// release's EVALSHA, GET and RENAME (its trace), no PUBLISH when nobody
// waits; at most the floor's allocations; no goroutine block (a handoff
// to a worker and back), no timer. The target is 6 commands: the
// seventh is the fence's TIME (see the redis package's Fencing tokens).
// PostgreSQL: the acquire's upsert and the release's delete; no goroutine
// (the statement runs on the caller's, bounded by the connection's
// deadline), no block; no timer (the acquisition context's bound, which
// the pool's Acquire waits on, is the facade's one timer for all
// acquisitions); allocations as measured (21), not yet the floor's (16).
// etcd (WithAutoRenew, as concurrency.Mutex's Session): the acquire's
// transaction and the release's; no goroutine started (gRPC derives its
// per-call contexts from the acquisition's without one); at most as many
// goroutine blocks as concurrency.Mutex's cycle, about 6.5, with a margin
// (the Resource's key watch, had it run, would add 4); no timer (gRPC
// waits on the acquisition context's bound, the facade's shared timer);
// allocations as measured (328-329; concurrency.Mutex: 277). ZooKeeper
// (WithAutoRenew: the session keeps the lock): the create (a multi that
// tells the czxid and whether the child is alone) and the delete, no loss
// watch until something waits for a loss (zk.Lock: 3 requests); go-zookeeper
// takes no context, so a request the caller may abandon runs on a
// goroutine of its own (the acquire's create; the release's delete only
// when its context can end); no timer (the acquisition context's bound is
// the facade's shared timer); allocations as measured (60; zk.Lock 53).
var countTargets = map[string]struct {
	cmds   float64 // server commands per cycle, scripts' inner commands included
	allocs float64 // heap allocations per cycle, at most: the floor's when 0
	blocks float64 // goroutine blocks per cycle
	timers float64 // timers made per cycle
	gos    float64 // goroutines created per cycle
}{
	"redis":     {cmds: 7, blocks: 0, timers: 0, gos: 0},
	"postgres":  {cmds: 2, allocs: 21, blocks: 0, timers: 0, gos: 0},
	"etcd":      {cmds: 2.05, allocs: 330, blocks: 8, timers: 0, gos: 0},   // cmds: the session's keep-alives add ~0.001; blocks: 6.3-6.5, a margin for load
	"zookeeper": {cmds: 2.1, allocs: 62, blocks: 8, timers: 0.5, gos: 1.5}, // the session watcher's probes add ~0.1 of each, more on a slow machine
}

var (
	countServersOnce sync.Once
	countServers     *servers
)

func TestMain(m *testing.M) {
	// Every allocation recorded in the heap profile, so that timers and
	// context callbacks can be counted by their allocation sites. Set
	// before anything allocates much: the rate is read when a sample is
	// due. Only the counting benchmark reads the profile.
	runtime.MemProfileRate = 1
	registerVariants()
	code := m.Run()
	if countServers != nil {
		countServers.close()
	}
	os.Exit(code)
}

// cycleCounts is what countCycles measured, per cycle.
type cycleCounts struct {
	cmds, rt           float64
	allocs, bytes      float64
	goroutines, blocks float64
	timers, callbacks  float64
}

// BenchmarkCycleCounts runs uncontended cycles per peer on each store and
// reports the counts per cycle (see above). Each peer's sub-benchmark
// does b.N cycles after a warm-up; the profile-based counts (timers,
// callbacks, blocks) come from a second pass of the same length.
func BenchmarkCycleCounts(b *testing.B) {
	countServersOnce.Do(func() { countServers = newServers() })
	s := countServers
	floorAllocs := map[string]float64{}
	for _, store := range []string{"redis", "etcd", "zookeeper", "postgres"} {
		ps, err := selectPeers([]string{store}, []string{"distlock", "distlock-cancellable", "redislock", "concurrency.Mutex", "zk.Lock", "floor"})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(store, func(b *testing.B) {
			for _, p := range ps {
				b.Run(p.name, func(b *testing.B) {
					c := countCycles(b, s, p)
					if p.ref && p.name == "floor" {
						floorAllocs[store] = c.allocs
					}
					t, ok := countTargets[store]
					if !ok || p.name != "distlock" {
						return
					}
					maxAllocs := t.allocs
					if maxAllocs == 0 {
						maxAllocs = floorAllocs[store]
					}
					if c.cmds > t.cmds {
						b.Errorf("%s: %.2f server commands per cycle; the target is at most %v", store, c.cmds, t.cmds)
					}
					if maxAllocs == 0 {
						b.Errorf("%s: no floor measured to hold the allocations to: run the store's whole row", store)
					}
					if maxAllocs > 0 && c.allocs > maxAllocs+0.5 {
						whose := ""
						if t.allocs == 0 {
							whose = " (the floor's)"
						}
						b.Errorf("%s: %.2f allocations per cycle; the target is at most %.2f%s", store, c.allocs, maxAllocs, whose)
					}
					if c.blocks > t.blocks+0.05 {
						b.Errorf("%s: %.2f goroutine blocks per cycle; the target is %v", store, c.blocks, t.blocks)
					}
					if c.timers > t.timers+0.05 {
						b.Errorf("%s: %.2f timers per cycle; the target is %v", store, c.timers, t.timers)
					}
					if c.goroutines > t.gos+0.05 {
						b.Errorf("%s: %.2f goroutines created per cycle; the target is %v", store, c.goroutines, t.gos)
					}
				})
			}
		})
	}
}

// countCycles measures p's uncontended cycle and reports it on b.
func countCycles(b *testing.B, s *servers, p *peer) cycleCounts {
	ctx := context.Background()
	in, err := p.open(ctx, s, openOpts{ttl: 10 * time.Second, retry: 10 * time.Millisecond})
	if err != nil {
		if os.Getenv("CI") != "" {
			b.Fatalf("%s/%s: %v", p.store, p.name, err)
		}
		b.Skipf("%s/%s: %v", p.store, p.name, err)
	}
	defer in.close()
	key := keyName("counts", runID, p.name)
	cycle := func() {
		if err := in.cycle(ctx, key); err != nil {
			b.Fatalf("cycle: %v", err)
		}
	}
	// Warm up: connections made, scripts loaded, pools filled.
	for range 200 {
		cycle()
	}
	c0, err := p.counters(ctx, s)
	if err != nil {
		b.Fatal(err)
	}
	g0 := goroutinesCreated()
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	for b.Loop() {
		cycle()
		n++
	}
	runtime.ReadMemStats(&m1)
	g1 := goroutinesCreated()
	c1, err := p.counters(ctx, s)
	if err != nil {
		b.Fatal(err)
	}
	var out cycleCounts
	per := func(d int64) float64 { return float64(d) / float64(n) }
	d := c1.sub(c0)
	out.cmds, out.rt = per(d.cmds), per(d.rt)
	out.allocs, out.bytes = per(int64(m1.Mallocs-m0.Mallocs)), per(int64(m1.TotalAlloc-m0.TotalAlloc))
	out.goroutines = per(int64(g1 - g0))

	// The profile pass: the same cycles again, with every blocking event
	// recorded, and the heap profile (every allocation, see TestMain)
	// read before and after.
	runtime.SetBlockProfileRate(1)
	defer runtime.SetBlockProfileRate(0)
	h0, bl0 := heapSites(), blockEvents()
	for range n {
		cycle()
	}
	h1, bl1 := heapSites(), blockEvents()
	out.blocks = per(bl1 - bl0)
	for site, k := range h1 {
		k -= h0[site]
		switch {
		case strings.Contains(site, "context.AfterFunc"):
			out.callbacks += per(k)
		case strings.Contains(site, "time.newTimer") || strings.Contains(site, "time.NewTimer") || strings.Contains(site, "time.AfterFunc"):
			out.timers += per(k)
		}
	}
	if d.cmds > 0 {
		b.ReportMetric(out.cmds, "cmds/op")
	}
	b.ReportMetric(out.rt, "rt/op")
	b.ReportMetric(out.goroutines, "goroutines/op")
	b.ReportMetric(out.blocks, "blocks/op")
	b.ReportMetric(out.timers, "timers/op")
	b.ReportMetric(out.callbacks, "ctxcb/op")
	b.Logf("%s/%s per cycle: %.2f server commands, %.2f round trips, %.2f allocations, %.0f B, %.2f goroutines started, %.2f blocks, %.2f timers, %.2f context callbacks",
		p.store, p.name, out.cmds, out.rt, out.allocs, out.bytes, out.goroutines, out.blocks, out.timers, out.callbacks)
	return out
}

var goroutinesSample = []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}

// goroutinesCreated returns how many goroutines the process has started.
func goroutinesCreated() uint64 {
	metrics.Read(goroutinesSample)
	return goroutinesSample[0].Value.Uint64()
}

// heapSites returns, per allocation site that makes a timer or registers
// a context callback, the objects it allocated so far (the profile as of
// the last GC: two GCs make it current). Sites are named by the first
// frame of the time or context package in their stack.
func heapSites() map[string]int64 {
	runtime.GC()
	runtime.GC()
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, true)
	for {
		recs = make([]runtime.MemProfileRecord, n+64)
		var ok bool
		if n, ok = runtime.MemProfile(recs, true); ok {
			recs = recs[:n]
			break
		}
	}
	out := map[string]int64{}
	for i := range recs {
		if site := timerSite(recs[i].Stack()); site != "" {
			out[site] += recs[i].AllocObjects
		}
	}
	return out
}

// timerSite names the stack's timer or context callback allocation, or "".
func timerSite(stk []uintptr) string {
	frames := runtime.CallersFrames(stk)
	for {
		f, more := frames.Next()
		switch f.Function {
		case "context.AfterFunc", "time.newTimer", "time.NewTimer", "time.AfterFunc":
			return fmt.Sprintf("%s@%x", f.Function, stk)
		}
		if !more {
			return ""
		}
	}
}

// blockEvents returns the blocking events recorded so far.
func blockEvents() int64 {
	n, _ := runtime.BlockProfile(nil)
	for {
		recs := make([]runtime.BlockProfileRecord, n+64)
		var ok bool
		if n, ok = runtime.BlockProfile(recs); ok {
			var total int64
			for _, r := range recs[:n] {
				total += r.Count
			}
			return total
		}
	}
}
