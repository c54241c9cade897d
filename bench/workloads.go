package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// config is the command line.
type config struct {
	workloads []string
	stores    []string
	peers     []string

	rounds int           // rounds of the alternating workloads
	slice  time.Duration // time per peer per round (uncontended, parallel)
	warmup time.Duration
	pin    bool
	cpu    int

	parallel int // goroutines of the parallel workload

	instances, workers int
	longAttempts       int // per worker, variant wait 3s / hold 20ms
	shortAttempts      int // per worker, variant wait 200ms / hold 1ms
	contendedRounds    int

	handoffs      int           // repetitions per peer, over all rounds
	handoffBudget time.Duration // per peer: stop early when spent
	settle        time.Duration // after the waiter waits, before the release
	jitter        time.Duration // random extra before the release

	scaleLocks      int
	scaleRounds     int
	scaleTTL        time.Duration
	scaleWindow     time.Duration
	scaleGoroutines int

	ttl   time.Duration
	retry time.Duration

	kinds kindsConfig // semaphore, read-mostly

	out   string // RESULTS.md path, "" for none
	svg   string
	quiet bool
}

// uncontendedSample is one peer's measurement in one round.
type uncontendedSample struct {
	cycles  int
	elapsed time.Duration
	lat     []time.Duration
	mallocs uint64
	bytes   uint64
	c       counts
	// CPU time used during the slice by this program (the client) and by
	// the store's server processes: see cpuTimes.
	clientCPU, serverCPU time.Duration
}

// cycleResult is a peer's row in the uncontended or parallel table.
type cycleResult struct {
	p       *peer
	err     error
	rounds  []float64 // cycles/s per round
	ratios  []float64 // cycles/s / the reference's, per round
	lat     []time.Duration
	cycles  int
	mallocs uint64
	bytes   uint64
	c       counts
	// CPU time used during the slice by this program (the client) and by
	// the store's server processes: see cpuTimes.
	clientCPU, serverCPU time.Duration
}

func (r *cycleResult) rate() float64  { return median(r.rounds) }
func (r *cycleResult) ratio() float64 { return median(r.ratios) }

type logger struct{ quiet bool }

func (l logger) printf(format string, args ...any) {
	if !l.quiet {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
	}
}

// keyName makes a key from parts: letters, digits and '-' only, so that
// every store keeps it as is (the probes find it under its plain name).
func keyName(parts ...string) string {
	s := strings.Join(parts, "-")
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-':
			return r
		}
		return '-'
	}, s)
}

var runID = fmt.Sprintf("%x", time.Now().UnixNano()&0xffffffff)

// openAll opens one instance of each peer; a peer that fails to open is
// reported in its row and left out.
func openAll(ctx context.Context, s *servers, ps []*peer, o openOpts) (map[*peer]instance, map[*peer]error) {
	insts, errs := map[*peer]instance{}, map[*peer]error{}
	for _, p := range ps {
		in, err := p.open(ctx, s, o)
		if err != nil {
			errs[p] = err
			continue
		}
		insts[p] = in
	}
	return insts, errs
}

func closeAll(insts map[*peer]instance) {
	for _, in := range insts {
		_ = in.close()
	}
}

// order is the peers' order in round r: forward in even rounds, reversed
// in odd ones (A B C, C B A, ...), so that drift over a round hits all alike.
func order[T any](xs []T, r int) []T {
	if r%2 == 0 {
		return xs
	}
	ys := slices.Clone(xs)
	slices.Reverse(ys)
	return ys
}

// runCycles runs the uncontended (goroutines == 1) or parallel workload on
// one store's peers: every round gives each peer one slice of time, the
// peers alternating.
func runCycles(ctx context.Context, cfg config, s *servers, ps []*peer, goroutines int, log logger) ([]*cycleResult, string, error) {
	o := openOpts{ttl: cfg.ttl, retry: cfg.retry}
	insts, errs := openAll(ctx, s, ps, o)
	defer closeAll(insts)
	res := map[*peer]*cycleResult{}
	var live []*peer
	for _, p := range ps {
		res[p] = &cycleResult{p: p, err: errs[p]}
		if errs[p] == nil {
			live = append(live, p)
		}
	}
	keys := func(p *peer) []string {
		ks := make([]string, goroutines)
		for g := range ks {
			ks[g] = keyName("bench", runID, p.name, fmt.Sprint(goroutines), fmt.Sprint(g))
		}
		return ks
	}
	// Warm up every peer (connections, scripts loaded, JIT of the server).
	for _, p := range live {
		if _, err := measureCycles(ctx, insts[p], p, s, keys(p), cfg.warmup, false); err != nil {
			res[p].err = fmt.Errorf("warm-up: %w", err)
		}
	}
	pinned := "unpinned"
	if goroutines == 1 && cfg.pin && len(live) > 0 {
		pn, err := pin(s.pids(live[0].store), cfg.cpu)
		if err != nil {
			return nil, "", err
		}
		defer pn.unpin()
		pinned = fmt.Sprintf("pinned: client and server threads on CPU %d, GOMAXPROCS 1", cfg.cpu)
	}
	for r := range cfg.rounds {
		rates := map[*peer]float64{}
		for _, p := range order(live, r) {
			cr := res[p]
			if cr.err != nil {
				continue
			}
			smp, err := measureCycles(ctx, insts[p], p, s, keys(p), cfg.slice, goroutines == 1)
			if err != nil {
				cr.err = err
				continue
			}
			rate := float64(smp.cycles) / smp.elapsed.Seconds()
			rates[p] = rate
			cr.rounds = append(cr.rounds, rate)
			cr.lat = append(cr.lat, smp.lat...)
			cr.cycles += smp.cycles
			cr.mallocs += smp.mallocs
			cr.bytes += smp.bytes
			cr.c.rt += smp.c.rt
			cr.c.cmds += smp.c.cmds
			cr.clientCPU += smp.clientCPU
			cr.serverCPU += smp.serverCPU
		}
		ref := ps[0]
		for p, rate := range rates {
			if rr, ok := rates[ref]; ok && rr > 0 {
				res[p].ratios = append(res[p].ratios, rate/rr)
			}
		}
		var parts []string
		for _, p := range live {
			parts = append(parts, fmt.Sprintf("%s %.0f/s", p.name, rates[p]))
		}
		log.printf("  round %d: %s", r+1, strings.Join(parts, ", "))
	}
	out := make([]*cycleResult, 0, len(ps))
	for _, p := range ps {
		slices.Sort(res[p].lat)
		out = append(out, res[p])
	}
	return out, pinned, nil
}

// maxSamples bounds the latencies kept per slice; the slice is
// preallocated so that recording never allocates.
const maxSamples = 1 << 18

// measureCycles runs lock+unlock cycles on keys (one goroutine per key)
// for d. With lat it records each cycle's latency (one goroutine only).
func measureCycles(ctx context.Context, in instance, p *peer, s *servers, keys []string, d time.Duration, lat bool) (uncontendedSample, error) {
	var smp uncontendedSample
	if lat {
		smp.lat = make([]time.Duration, 0, maxSamples)
	}
	c0, err := p.counters(ctx, s)
	if err != nil {
		return smp, err
	}
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	procs, self := serverProcs(s, p.store), []int{os.Getpid()}
	srv0, cli0 := cpuTimes(procs), cpuTimes(self)
	start := time.Now()
	end := start.Add(d)
	if len(keys) == 1 {
		key := keys[0]
		for {
			t0 := time.Now()
			if !t0.Before(end) || len(smp.lat) == maxSamples && lat {
				break
			}
			if err := in.cycle(ctx, key); err != nil {
				return smp, fmt.Errorf("cycle: %w", err)
			}
			smp.cycles++
			if lat {
				smp.lat = append(smp.lat, time.Since(t0))
			}
		}
	} else {
		var n atomic.Int64
		var wg sync.WaitGroup
		errc := make(chan error, len(keys))
		for _, key := range keys {
			wg.Go(func() {
				for time.Now().Before(end) {
					if err := in.cycle(ctx, key); err != nil {
						errc <- fmt.Errorf("cycle: %w", err)
						return
					}
					n.Add(1)
				}
			})
		}
		wg.Wait()
		close(errc)
		if err := <-errc; err != nil {
			return smp, err
		}
		smp.cycles = int(n.Load())
	}
	smp.elapsed = time.Since(start)
	smp.clientCPU, smp.serverCPU = cpuSpent(cli0, cpuTimes(self)), cpuSpent(srv0, cpuTimes(procs))
	runtime.ReadMemStats(&m1)
	smp.mallocs = m1.Mallocs - m0.Mallocs
	smp.bytes = m1.TotalAlloc - m0.TotalAlloc
	c1, err := p.counters(ctx, s)
	if err != nil {
		return smp, err
	}
	smp.c = c1.sub(c0)
	if smp.cycles == 0 {
		return smp, errors.New("no cycle completed")
	}
	return smp, nil
}
