package main

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// heldResult is one peer's row of the "many locks held" scale workload.
type heldResult struct {
	p            *peer
	err          error
	n            int
	acquire      time.Duration
	bytesPerLock float64
	window       time.Duration // how long the requests were counted
	requests     int64         // requests to the store while merely holding (see peer.serverRequests)
	other        int64         // the other count meanwhile: the server's (Redis) or the clients' (PostgreSQL)
	lost         int           // locks found gone at release
	release      time.Duration
	// ratios are the peer's acquire time over the native peer's, one per
	// round (runHeldRounds), when there were several.
	ratios []float64
}

func (h heldResult) perSec(n int64) float64 {
	if h.window <= 0 {
		return 0
	}
	return float64(n) / h.window.Seconds()
}

// scaleHoldWorkers acquire and release the locks in parallel.
const scaleHoldWorkers = 32

// runHeld holds cfg.scaleLocks distinct locks at once in one instance, as
// a process that owns many shards would: how long taking them all takes,
// how much heap a held lock costs the process, how many requests per
// second to the store keep them alive (distlock: WithAutoRenew; etcd's
// Session and ZooKeeper's session: their keep-alive; the others do not
// renew, and get a TTL that outlasts the hold), and whether any was lost.
func runHeld(ctx context.Context, cfg config, s *servers, p *peer) (res heldResult) {
	res = heldResult{p: p, n: cfg.scaleLocks}
	o := openOpts{ttl: cfg.scaleTTL, autoRenew: true, retry: cfg.retry}
	if p.renewal == "" { // outlast taking them all, the hold and the release
		o.ttl = cfg.scaleTTL + cfg.scaleWindow + time.Minute*time.Duration(1+cfg.scaleLocks/50_000)
	}
	in, err := p.open(ctx, s, o)
	if err != nil {
		res.err = err
		return res
	}
	defer in.close()
	l, err := in.worker(ctx)
	if err != nil {
		res.err = err
		return res
	}
	keys := make([]string, cfg.scaleLocks)
	for i := range keys {
		keys[i] = keyName("scale", runID, p.name, fmt.Sprint(i))
	}
	locks := make([]held, len(keys))
	m0 := liveHeap()
	t0 := time.Now()
	if err := parallelDo(ctx, len(keys), func(i int) error {
		h, err := l.lock(ctx, keys[i], time.Minute)
		locks[i] = h
		return err
	}); err != nil {
		res.err = fmt.Errorf("acquire: %w", err)
	}
	res.acquire = time.Since(t0)
	res.bytesPerLock = float64(liveHeap()-m0) / float64(len(keys))

	if res.err == nil {
		c0, err := p.counters(ctx, s)
		if err == nil {
			w0 := time.Now()
			_ = sleepCtx(ctx, cfg.scaleWindow)
			var c1 counts
			c1, err = p.counters(ctx, s)
			res.window = time.Since(w0)
			d := c1.sub(c0)
			res.requests, res.other = d.rt, d.cmds
			if p.serverRequests {
				res.requests, res.other = d.cmds, d.rt
			}
		}
		if err != nil {
			res.err = err
		}
	}
	var lost atomic.Int64
	t1 := time.Now()
	err = parallelDo(context.WithoutCancel(ctx), len(keys), func(i int) error {
		if locks[i] == nil {
			return nil
		}
		if err := locks[i].unlock(ctx); err != nil {
			lost.Add(1)
		}
		return nil
	})
	res.release = time.Since(t1)
	res.lost = int(lost.Load())
	if res.err == nil {
		res.err = err
	}
	return res
}

// runHeldRounds runs the many-locks-held workload cfg.scaleRounds times
// over ps, in their order in even rounds and the reverse in odd ones, so
// that neither the load nor what a peer leaves the server (deleted keys
// not yet compacted, a warm page cache) favours one peer. Each peer's row
// is its round of median acquire time; with several rounds, ratios holds
// its acquire time over the native peer's round by round.
func runHeldRounds(ctx context.Context, cfg config, s *servers, ps []*peer, log logger) []heldResult {
	rounds := make([][]heldResult, len(ps))
	for round := range cfg.scaleRounds {
		idx := make([]int, len(ps))
		for i := range idx {
			idx[i] = i
		}
		for _, i := range order(idx, round) {
			if ctx.Err() != nil {
				break
			}
			p := ps[i]
			h := runHeld(ctx, cfg, s, p)
			log.printf("  round %d, %s: %d locks held in %v, %.0f B/lock, %.1f requests/s while held, %d lost (err %v)",
				round+1, p.name, h.n, h.acquire.Round(time.Millisecond), h.bytesPerLock, h.perSec(h.requests), h.lost, h.err)
			rounds[i] = append(rounds[i], h)
		}
	}
	native := -1
	for i, p := range ps {
		if p.name == nativePeer[p.store] {
			native = i
		}
	}
	out := make([]heldResult, 0, len(ps))
	for _, rs := range rounds {
		if len(rs) == 0 {
			continue
		}
		byTime := slices.Clone(rs)
		slices.SortStableFunc(byTime, func(a, b heldResult) int { return cmp.Compare(a.acquire, b.acquire) })
		h := byTime[(len(byTime)-1)/2]
		if cfg.scaleRounds > 1 && native >= 0 {
			for j, r := range rs {
				if j < len(rounds[native]) && r.err == nil && rounds[native][j].err == nil {
					h.ratios = append(h.ratios, r.acquire.Seconds()/rounds[native][j].acquire.Seconds())
				}
			}
		}
		for _, r := range rs { // an error or a lost lock in any round shows
			if h.err == nil && r.err != nil {
				h.err = r.err
			}
			h.lost = max(h.lost, r.lost)
		}
		out = append(out, h)
	}
	return out
}

// acquireRatio is h's acquire time over native's: the median over rounds
// when there were several, else this run's.
func acquireRatio(h, native heldResult) float64 {
	if len(h.ratios) > 0 {
		return median(h.ratios)
	}
	return h.acquire.Seconds() / native.acquire.Seconds()
}

// liveHeap returns the bytes of live heap objects, after two collections
// (the second frees what the first moved to sync.Pool victim caches).
func liveHeap() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// parallelDo runs f(0..n-1) on scaleHoldWorkers goroutines; the first
// error stops the remaining calls.
func parallelDo(ctx context.Context, n int, f func(i int) error) error {
	var (
		next     atomic.Int64
		firstErr error
		once     sync.Once
		failed   atomic.Bool
		wg       sync.WaitGroup
	)
	for range scaleHoldWorkers {
		wg.Go(func() {
			for !failed.Load() && ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { firstErr = err })
					failed.Store(true)
				}
			}
		})
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return firstErr
}

// runHotKey runs cfg.scaleGoroutines goroutines, spread over
// cfg.instances instances, each locking one key once (wait 60s, hold 1ms).
// With the hotspot handler, only one goroutine per instance reaches the
// store at a time, so requests per success stay near the number of
// instances.
func runHotKey(ctx context.Context, cfg config, s *servers, p *peer) contendedResult {
	v := variant{name: fmt.Sprintf("%d goroutines, one attempt each, wait 60s, hold 1ms", cfg.scaleGoroutines), wait: time.Minute, hold: time.Millisecond, attempts: 1}
	c := cfg
	per := (cfg.scaleGoroutines + cfg.instances - 1) / cfg.instances
	c.workers = per
	return runContended(ctx, c, s, p, v, 0)
}

// nativePeer names, per store, the peer the scale targets compare acquisition
// time with: the store's own client recipe (PostgreSQL has none: the
// bare floor).
var nativePeer = map[string]string{
	"redis":     "redislock",
	"etcd":      "concurrency.Mutex",
	"zookeeper": "zk.Lock",
	"postgres":  "floor",
}

// scaleTarget is one of the scale targets, as the held table checks it.
type scaleTarget struct {
	what string
	got  string
	ok   bool
	// known: measured in this run at the size the target names
	known bool
}

// heldTargets checks the scale targets on one store's held results: the
// distlock row against the store's native peer in the same run.
func heldTargets(cfg config, store string, rs []heldResult) []scaleTarget {
	var dl, native *heldResult
	for i := range rs {
		switch rs[i].p.name {
		case "distlock":
			dl = &rs[i]
		case nativePeer[store]:
			native = &rs[i]
		}
	}
	if dl == nil || store == "memory" {
		return nil
	}
	var ts []scaleTarget
	full := cfg.scaleLocks >= 100_000
	size := fmt.Sprintf("%d locks held", dl.n)
	if !full {
		size += " (the target is 100,000: -scale-locks 100000)"
	}
	ts = append(ts, scaleTarget{what: "100,000 locks held by one process, 0 lost",
		got: fmt.Sprintf("%s, %d lost%s", size, dl.lost, errNote(dl.err)), ok: dl.err == nil && dl.lost == 0, known: full})
	interval := cfg.scaleTTL / 3
	switch store {
	case "redis", "postgres", "mysql":
		x := requestsPer500(*dl, interval)
		ts = append(ts, scaleTarget{what: "requests while held <= 1 per 500 locks per renewal interval",
			got: fmt.Sprintf("%s per 500 locks per %v", f2(x), interval), ok: x <= 1, known: dl.err == nil})
	case "etcd", "zookeeper":
		if native != nil {
			a, b := dl.perSec(dl.requests), native.perSec(native.requests)
			ts = append(ts, scaleTarget{what: "requests while held <= the session's own keep-alive (" + native.p.name + ", same run)",
				got: fmt.Sprintf("%s/s vs %s/s", f1(a), f1(b)), ok: a <= b+0.5, known: dl.err == nil && native.err == nil})
		}
	}
	ts = append(ts, scaleTarget{what: "heap per held lock <= 300 B",
		got: f0(dl.bytesPerLock) + " B", ok: dl.bytesPerLock <= 300, known: dl.err == nil})
	if native != nil {
		x := acquireRatio(*dl, *native)
		got := fmt.Sprintf("%v vs %v (%sx its time) for %d", dl.acquire.Round(10*time.Millisecond), native.acquire.Round(10*time.Millisecond), f2(x), dl.n)
		if len(dl.ratios) > 0 {
			got = fmt.Sprintf("%sx its time for %d, the median of %d alternating rounds (range %s; median times %v vs %v)",
				f2(x), dl.n, len(dl.ratios), spread(dl.ratios), dl.acquire.Round(10*time.Millisecond), native.acquire.Round(10*time.Millisecond))
		}
		ts = append(ts, scaleTarget{what: fmt.Sprintf("acquiring %d locks at least as fast as %s", dl.n, native.p.name),
			got: got, ok: x <= 1, known: dl.err == nil && native.err == nil})
	}
	return ts
}

// requestsPer500 is h's requests while held per 500 locks per renewal
// interval.
func requestsPer500(h heldResult, interval time.Duration) float64 {
	if h.n == 0 {
		return 0
	}
	return h.perSec(h.requests) * interval.Seconds() / (float64(h.n) / 500)
}

func errNote(err error) string {
	if err == nil {
		return ""
	}
	return " (error: " + oneLine(err.Error()) + ")"
}
