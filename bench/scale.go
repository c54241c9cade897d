package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
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
	renewPerSec  float64 // requests per second while the locks were held
	lost         int     // locks found gone at release
	release      time.Duration
}

// scaleHoldWorkers acquire and release the locks in parallel.
const scaleHoldWorkers = 32

// runHeld holds cfg.scaleLocks distinct locks at once in one instance:
// how much memory a held lock costs the process, and how many requests per
// second keep them alive (distlock: WithAutoRenew, a refresh per lock
// every TTL/3; etcd's Session and ZooKeeper's session: one keep-alive for
// all; the others do not renew, and get a TTL that outlasts the window).
func runHeld(ctx context.Context, cfg config, s *servers, p *peer) (res heldResult) {
	res = heldResult{p: p, n: cfg.scaleLocks}
	o := openOpts{ttl: cfg.scaleTTL, autoRenew: true, retry: cfg.retry}
	if p.renewal == "" {
		o.ttl = cfg.scaleTTL + cfg.scaleWindow + time.Minute
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
	unlocks := make([]func(context.Context) error, len(keys))
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	t0 := time.Now()
	if err := parallelDo(ctx, len(keys), func(i int) error {
		u, err := l.lock(ctx, keys[i], 10*time.Second)
		unlocks[i] = u
		return err
	}); err != nil {
		res.err = fmt.Errorf("acquire: %w", err)
	}
	res.acquire = time.Since(t0)
	runtime.GC()
	runtime.ReadMemStats(&m1)
	res.bytesPerLock = (float64(m1.HeapAlloc) - float64(m0.HeapAlloc)) / float64(len(keys))

	if res.err == nil {
		c0, err := p.counters(ctx, s)
		if err == nil {
			w0 := time.Now()
			_ = sleepCtx(ctx, cfg.scaleWindow)
			var c1 counts
			c1, err = p.counters(ctx, s)
			res.renewPerSec = float64(c1.sub(c0).rt) / time.Since(w0).Seconds()
		}
		if err != nil {
			res.err = err
		}
	}
	var lost atomic.Int64
	t1 := time.Now()
	err = parallelDo(context.WithoutCancel(ctx), len(keys), func(i int) error {
		if unlocks[i] == nil {
			return nil
		}
		if err := unlocks[i](ctx); err != nil {
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

var errNoHotspot = errors.New("no hotspot variant")
