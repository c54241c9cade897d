package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"
)

var allWorkloads = []string{"uncontended", "parallel", "contended", "handoff", wlElection, "scale", wlSemaphore, wlReadMostly}

// wlElection is the election workload: a leader resigns, a candidate
// blocked in its campaign is elected (the handoff of a leadership).
const wlElection = "election"

func main() {
	registerVariants()
	var cfg config
	var workloads, stores, peers string
	var redisAddr, redisNodes, etcdAddr, zkAddr string
	flag.StringVar(&workloads, "workload", strings.Join(allWorkloads, ","), "workloads to run, comma separated: "+strings.Join(allWorkloads, ", "))
	flag.StringVar(&stores, "store", "", "stores to run, comma separated (default all): "+strings.Join(storeOrder, ", "))
	flag.StringVar(&peers, "peer", "", "peers to run, comma separated (default all; each store's reference always runs): "+peerList())
	flag.IntVar(&cfg.rounds, "rounds", 5, "rounds of the uncontended, parallel and handoff workloads; peers alternate within each (at least 3 for a median)")
	flag.DurationVar(&cfg.slice, "slice", 600*time.Millisecond, "time per peer per round (uncontended, parallel)")
	flag.DurationVar(&cfg.warmup, "warmup", 300*time.Millisecond, "warm-up per peer before the rounds")
	flag.BoolVar(&cfg.pin, "pin", true, "pin the uncontended workload's client and server threads to one CPU (-cpu)")
	flag.IntVar(&cfg.cpu, "cpu", 0, "the CPU -pin uses")
	flag.IntVar(&cfg.parallel, "goroutines", 16, "goroutines of the parallel workload, each on its own key")
	flag.IntVar(&cfg.instances, "instances", 3, "contended: instances (processes), each with its own clients")
	flag.IntVar(&cfg.workers, "workers", 4, "contended: goroutines per instance")
	flag.IntVar(&cfg.longAttempts, "attempts-long", 10, "contended, wait 3s / hold 20ms: attempts per goroutine (the seed: 400)")
	flag.IntVar(&cfg.shortAttempts, "attempts-short", 50, "contended, wait 200ms / hold 1ms: attempts per goroutine (the seed: 400)")
	flag.IntVar(&cfg.contendedRounds, "contended-rounds", 1, "rounds of the contended workload")
	flag.IntVar(&cfg.handoffs, "handoffs", 200, "handoff: repetitions per peer over all rounds")
	flag.DurationVar(&cfg.handoffBudget, "handoff-budget", 10*time.Second, "handoff: time per peer over all rounds; a slow peer stops early (its n says so)")
	flag.DurationVar(&cfg.settle, "settle", 2*time.Millisecond, "handoff: least pause between the waiter's first attempt (for etcd and ZooKeeper: its key queued) and the release")
	flag.DurationVar(&cfg.jitter, "jitter", 10*time.Millisecond, "handoff: random extra pause in [0, jitter) before the release, so that it falls at any phase of a waiter's retry timer")
	flag.IntVar(&cfg.scaleLocks, "scale-locks", 10000, "scale: locks held at once by one process (the scale target: 100000)")
	flag.IntVar(&cfg.scaleRounds, "scale-rounds", 1, "scale: rounds of the many-locks-held run; peers alternate order round by round, and the acquire ratio is the median over rounds")
	flag.DurationVar(&cfg.scaleTTL, "scale-ttl", 6*time.Second, "scale: TTL of the held locks (auto-renew extends them every TTL/3)")
	flag.DurationVar(&cfg.scaleWindow, "scale-window", 4*time.Second, "scale: how long the locks are held while the renewal load is counted")
	flag.IntVar(&cfg.scaleGoroutines, "scale-goroutines", 1000, "scale: goroutines contending for one key with the hotspot handler")
	flag.DurationVar(&cfg.ttl, "ttl", 10*time.Second, "lock TTL (uncontended, parallel, contended, handoff)")
	flag.DurationVar(&cfg.retry, "retry", 10*time.Millisecond, "retry interval of the floor and redislock while waiting")
	kindsFlags(&cfg.kinds)
	flag.StringVar(&cfg.out, "out", "", "write the results as markdown to this file (e.g. RESULTS.md)")
	flag.StringVar(&cfg.svg, "svg", "", "write the chart of ratios to this SVG file")
	flag.BoolVar(&cfg.quiet, "q", false, "no progress on stderr")
	flag.StringVar(&redisAddr, "redis", "", "use this Redis (host:port) instead of starting one (sets DISTLOCK_TEST_REDIS)")
	flag.StringVar(&redisNodes, "redis-nodes", "", "use these Redis nodes (host:port,...) for the extra nodes of multi-node peers (sets DISTLOCK_TEST_REDIS_NODES)")
	flag.StringVar(&etcdAddr, "etcd", "", "use this etcd (http://host:port,...) instead of starting one (sets DISTLOCK_TEST_ETCD_CLUSTER)")
	flag.StringVar(&zkAddr, "zookeeper", "", "use this ZooKeeper (host:port) instead of starting one (sets DISTLOCK_TEST_ZOOKEEPER)")
	flag.Parse()

	for env, v := range map[string]string{
		"DISTLOCK_TEST_REDIS": redisAddr, "DISTLOCK_TEST_REDIS_NODES": redisNodes,
		"DISTLOCK_TEST_ETCD_CLUSTER": etcdAddr, "DISTLOCK_TEST_ZOOKEEPER": zkAddr,
	} {
		if v != "" {
			os.Setenv(env, v)
		}
	}
	cfg.workloads = splitFlag(workloads)
	cfg.stores = splitFlag(stores)
	cfg.peers = splitFlag(peers)
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func splitFlag(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func (c config) validate() error {
	for _, w := range c.workloads {
		found := false
		for _, a := range allWorkloads {
			found = found || a == w
		}
		if !found {
			return fmt.Errorf("unknown workload %q; known: %s", w, strings.Join(allWorkloads, ", "))
		}
	}
	switch {
	case c.rounds < 1 || c.contendedRounds < 1:
		return fmt.Errorf("-rounds %d and -contended-rounds %d must be >= 1", c.rounds, c.contendedRounds)
	case c.slice <= 0 || c.warmup < 0:
		return fmt.Errorf("-slice %v must be > 0 and -warmup %v >= 0", c.slice, c.warmup)
	case c.parallel < 1 || c.instances < 1 || c.workers < 1:
		return fmt.Errorf("-goroutines %d, -instances %d and -workers %d must be >= 1", c.parallel, c.instances, c.workers)
	case c.longAttempts < 0 || c.shortAttempts < 0 || c.handoffs < 1:
		return fmt.Errorf("-attempts-long %d, -attempts-short %d must be >= 0, -handoffs %d >= 1", c.longAttempts, c.shortAttempts, c.handoffs)
	case c.ttl <= 0 || c.retry <= 0 || c.settle < 0 || c.jitter < 0:
		return fmt.Errorf("-ttl %v and -retry %v must be > 0, -settle %v and -jitter %v >= 0", c.ttl, c.retry, c.settle, c.jitter)
	case c.scaleLocks < 1 || c.scaleRounds < 1 || c.scaleGoroutines < 1 || c.scaleTTL <= 0 || c.scaleWindow <= 0:
		return fmt.Errorf("-scale-locks, -scale-rounds, -scale-goroutines, -scale-ttl and -scale-window must be > 0")
	case c.cpu < 0 || c.cpu >= 1024:
		return fmt.Errorf("-cpu %d out of range", c.cpu)
	}
	if c.has(wlSemaphore) || c.has(wlReadMostly) {
		return c.kinds.validate()
	}
	return nil
}

func (c config) has(w string) bool {
	for _, x := range c.workloads {
		if x == w {
			return true
		}
	}
	return false
}

func run(cfg config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	ps, err := selectPeers(cfg.stores, cfg.peers)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	// The peers' calls get a context that cannot be cancelled, as a job's
	// or context.Background() is: an interrupt stops the run between
	// stores. A caller's context that can be cancelled (a request's) is
	// the distlock-cancellable peer's.
	work := context.WithoutCancel(ctx)
	s := newServers()
	defer s.close()
	log := logger{quiet: cfg.quiet}
	rep := newReport(cfg)

	// Start every server first, so that a missing one is known before the
	// measurements, and its peers are reported as left out.
	var live []*peer
	for _, p := range ps {
		if _, err := p.counters(ctx, s); err != nil {
			rep.missing(p, err)
			log.printf("%s/%s left out: %v", p.store, p.name, err)
			continue
		}
		live = append(live, p)
	}
	groups := byStore(live)

	for _, w := range allWorkloads {
		if !cfg.has(w) {
			continue
		}
		for _, g := range groups {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if isKindsWorkload(w) {
				// Every store's group runs: the workload picks its own
				// peers (kindsPeers), memory included.
				log.printf("%s: %s, at %v", w, g[0].store, time.Since(rep.start).Round(time.Second))
				rep.kinds(runKinds(work, cfg, s, w, g, log))
				continue
			}
			if g = runningIn(g, w); len(g) == 0 {
				continue
			}
			log.printf("%s: %s (%s), at %v", w, g[0].store, peerNames(g), time.Since(rep.start).Round(time.Second))
			switch w {
			case "uncontended", "parallel":
				n := 1
				if w == "parallel" {
					n = cfg.parallel
				}
				cyc := withoutHotspot(g)
				rs, pinned, err := runCycles(work, cfg, s, cyc, n, log)
				if err != nil {
					return err
				}
				rep.cycles(w, g[0].store, rs, pinned)
			case "contended":
				rep.contended(g[0].store, runContendedAll(work, cfg, s, g, log))
			case "handoff":
				rep.handoff(g[0].store, runHandoff(work, cfg, s, withoutHotspot(g), log, openOpts{ttl: cfg.ttl, retry: cfg.retry}))
			case wlElection:
				rep.election(g[0].store, runHandoff(work, cfg, s, withoutHotspot(g), log, openOpts{ttl: cfg.ttl, retry: cfg.retry, election: true}))
			case "scale":
				if g[0].store == "postgres" {
					if err := s.enablePGStatements(ctx); err != nil {
						log.printf("  postgres: no pg_stat_statements (%v): requests counted by the clients", err)
					}
				}
				rep.held(g[0].store, runHeldRounds(work, cfg, s, withoutHotspot(g), log))
				var hot []contendedResult
				for _, p := range g {
					if p.hotspot {
						h := runHotKey(work, cfg, s, p)
						log.printf("  %s: %d/%d held, %.2f round trips per success, %v", p.label(), h.successes, h.attempts, per(h.c.rt, h.successes), h.wall.Round(time.Millisecond))
						hot = append(hot, h)
					}
				}
				if g[0].store != "memory" { // in process: nothing to spare the store
					rep.hotKey(g[0].store, hot)
				}
			}
		}
	}
	rep.serverVersions(ctx, s)
	return rep.write(os.Stdout)
}

func peerNames(ps []*peer) string {
	var ns []string
	for _, p := range ps {
		ns = append(ns, p.name)
	}
	return strings.Join(ns, ", ")
}

// runningIn keeps the peers that run in workload w.
func runningIn(ps []*peer, w string) []*peer {
	var out []*peer
	for _, p := range ps {
		if p.runs(w) {
			out = append(out, p)
		}
	}
	return out
}

// withoutHotspot drops the hotspot variants: a hot-key handler does nothing
// for one goroutine or for distinct keys.
func withoutHotspot(ps []*peer) []*peer {
	var out []*peer
	for _, p := range ps {
		if !p.hotspot {
			out = append(out, p)
		}
	}
	return out
}
