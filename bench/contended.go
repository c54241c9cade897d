package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// variant is one shape of the contended workload.
type variant struct {
	name       string
	wait, hold time.Duration
	attempts   int // per goroutine
}

func variants(cfg config) []variant {
	var vs []variant
	if cfg.longAttempts > 0 {
		vs = append(vs, variant{"wait 3s, hold 20ms", 3 * time.Second, 20 * time.Millisecond, cfg.longAttempts})
	}
	if cfg.shortAttempts > 0 {
		vs = append(vs, variant{"wait 200ms, hold 1ms", 200 * time.Millisecond, time.Millisecond, cfg.shortAttempts})
	}
	return vs
}

// contendedResult is one peer's row for one variant, summed over rounds.
type contendedResult struct {
	p         *peer
	v         variant
	err       error
	attempts  int
	successes int
	timeouts  int
	failures  int // store errors
	overlaps  int // a success while another holder held: must stay 0
	c         counts
	wall      time.Duration
}

// runContended runs the seed workload: instances (each as a process would
// have it) x workers goroutines x attempts on one key. Each success holds
// the key for v.hold. A shared holder count catches two holders at once.
func runContended(ctx context.Context, cfg config, s *servers, p *peer, v variant, round int) (res contendedResult) {
	res = contendedResult{p: p, v: v}
	o := openOpts{ttl: cfg.ttl, retry: cfg.retry}
	var insts []instance
	defer func() {
		for _, in := range insts {
			_ = in.close()
		}
	}()
	key := keyName("contended", runID, p.name, fmt.Sprint(v.attempts), fmt.Sprint(v.hold.Milliseconds()), fmt.Sprint(round))
	var lockers []locker
	for range cfg.instances {
		in, err := p.openHot(ctx, s, o, key)
		if err != nil {
			res.err = err
			return res
		}
		insts = append(insts, in)
		for range cfg.workers {
			l, err := in.worker(ctx)
			if err != nil {
				res.err = err
				return res
			}
			lockers = append(lockers, l)
		}
	}
	c0, err := p.counters(ctx, s)
	if err != nil {
		res.err = err
		return res
	}
	var (
		holders                atomic.Int32
		succ, tout, fail, over atomic.Int64
		firstErr               error
		errOnce                sync.Once
		wg                     sync.WaitGroup
		start                  = make(chan struct{})
	)
	for _, l := range lockers {
		wg.Go(func() {
			<-start
			for range v.attempts {
				if ctx.Err() != nil {
					return
				}
				h, err := l.lock(ctx, key, v.wait)
				switch {
				case errors.Is(err, errNotAcquired):
					tout.Add(1)
					continue
				case err != nil:
					fail.Add(1)
					errOnce.Do(func() { firstErr = err })
					continue
				}
				if holders.Add(1) != 1 {
					over.Add(1)
				}
				time.Sleep(v.hold)
				holders.Add(-1)
				if err := h.unlock(ctx); err != nil {
					fail.Add(1)
					errOnce.Do(func() { firstErr = fmt.Errorf("unlock: %w", err) })
				}
				succ.Add(1)
			}
		})
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	res.wall = time.Since(t0)
	c1, err := p.counters(ctx, s)
	if err != nil {
		res.err = err
		return res
	}
	res.c = c1.sub(c0)
	res.attempts = len(lockers) * v.attempts
	res.successes, res.timeouts = int(succ.Load()), int(tout.Load())
	res.failures, res.overlaps = int(fail.Load()), int(over.Load())
	if firstErr != nil {
		res.err = firstErr
	}
	return res
}

func (r *contendedResult) add(o contendedResult) {
	r.attempts += o.attempts
	r.successes += o.successes
	r.timeouts += o.timeouts
	r.failures += o.failures
	r.overlaps += o.overlaps
	r.c.rt += o.c.rt
	r.c.cmds += o.c.cmds
	r.wall += o.wall
	if r.err == nil {
		r.err = o.err
	}
}

// runContendedAll runs every variant of every peer of one store, the
// peers alternating over rounds.
func runContendedAll(ctx context.Context, cfg config, s *servers, ps []*peer, log logger) []*contendedResult {
	var out []*contendedResult
	for _, v := range variants(cfg) {
		res := map[*peer]*contendedResult{}
		for _, p := range ps {
			res[p] = &contendedResult{p: p, v: v}
		}
		for r := range cfg.contendedRounds {
			for _, p := range order(ps, r) {
				if ctx.Err() != nil {
					break
				}
				one := runContended(ctx, cfg, s, p, v, r)
				res[p].add(one)
				log.printf("  %s, %s: %d/%d held, %d timeouts, %.2f round trips per success, %v",
					p.label(), v.name, one.successes, one.attempts, one.timeouts, per(one.c.rt, one.successes), one.wall.Round(time.Millisecond))
			}
		}
		for _, p := range ps {
			out = append(out, res[p])
		}
	}
	return out
}

// label is the peer's name in tables.
func (p *peer) label() string { return p.name }

// handoffResult is one peer's handoff latencies.
type handoffResult struct {
	p   *peer
	err error
	lat []time.Duration
}

// runHandoff measures, for each peer, the time from the holder's release
// call (t0) to a blocked waiter's acquire returning (t1). The waiter is
// started, then the release waits until the waiter has tried once and
// waits (queued behind the holder, for etcd and ZooKeeper), plus cfg.settle
// and a random part of up to cfg.jitter: a release falls at any phase of a
// waiter's retry timer, as in real use.
//
// With o.election, the lockers campaign for the key's election: the
// holder resigns at t0, and t1 is when the waiting candidate is elected.
func runHandoff(ctx context.Context, cfg config, s *servers, ps []*peer, log logger, o openOpts) []*handoffResult {
	type pair struct {
		a, b   instance
		la, lb locker
	}
	pairs := map[*peer]*pair{}
	res := map[*peer]*handoffResult{}
	var live []*peer
	for _, p := range ps {
		res[p] = &handoffResult{p: p}
		pr := &pair{}
		var err error
		if pr.a, err = p.open(ctx, s, o); err == nil {
			if pr.b, err = p.open(ctx, s, o); err == nil {
				if pr.la, err = pr.a.worker(ctx); err == nil {
					pr.lb, err = pr.b.worker(ctx)
				}
			}
		}
		pairs[p] = pr
		if err != nil {
			res[p].err = err
			continue
		}
		live = append(live, p)
	}
	defer func() {
		for _, pr := range pairs {
			if pr.a != nil {
				_ = pr.a.close()
			}
			if pr.b != nil {
				_ = pr.b.close()
			}
		}
	}()
	budget := cfg.handoffBudget / time.Duration(cfg.rounds)
	for r := range cfg.rounds {
		for _, p := range order(live, r) {
			hr := res[p]
			if hr.err != nil || ctx.Err() != nil {
				continue
			}
			pr := pairs[p]
			key := keyName("handoff", runID, p.name)
			end := time.Now().Add(budget)
			reps := cfg.handoffs*(r+1)/cfg.rounds - cfg.handoffs*r/cfg.rounds
			for i := 0; i < reps && time.Now().Before(end); i++ {
				d, err := handoffOnce(ctx, cfg, pr.la, pr.lb, pr.b, key)
				if err != nil {
					hr.err = err
					break
				}
				hr.lat = append(hr.lat, d)
			}
		}
		var parts []string
		for _, p := range live {
			l := slices.Clone(res[p].lat)
			slices.Sort(l)
			parts = append(parts, fmt.Sprintf("%s p50 %.2fms", p.name, ms(quantile(l, 0.5))))
		}
		log.printf("  round %d: %v", r+1, parts)
	}
	out := make([]*handoffResult, 0, len(ps))
	for _, p := range ps {
		slices.Sort(res[p].lat)
		out = append(out, res[p])
	}
	return out
}

func handoffOnce(ctx context.Context, cfg config, la, lb locker, b instance, key string) (time.Duration, error) {
	heldA, err := la.lock(ctx, key, 10*time.Second)
	if err != nil {
		return 0, fmt.Errorf("holder: %w", err)
	}
	type got struct {
		at  time.Time
		h   held
		err error
	}
	ch := make(chan got, 1)
	mark := b.mark(key)
	go func() {
		u, err := lb.lock(ctx, key, 30*time.Second)
		ch <- got{time.Now(), u, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !b.waiting(ctx, key, mark) {
		if time.Now().After(deadline) {
			_ = heldA.unlock(ctx)
			<-ch
			return 0, errors.New("the waiter did not start waiting within 10s")
		}
		time.Sleep(100 * time.Microsecond)
	}
	pause := cfg.settle
	if cfg.jitter > 0 {
		pause += rand.N(cfg.jitter)
	}
	time.Sleep(pause)
	t0 := time.Now()
	if err := heldA.unlock(ctx); err != nil {
		<-ch
		return 0, fmt.Errorf("holder unlock: %w", err)
	}
	g := <-ch
	if g.err != nil {
		return 0, fmt.Errorf("waiter: %w", g.err)
	}
	if err := g.h.unlock(ctx); err != nil {
		return 0, fmt.Errorf("waiter unlock: %w", err)
	}
	return g.at.Sub(t0), nil
}
