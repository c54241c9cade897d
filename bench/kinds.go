package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/distlock/distlock"
)

// The workloads of the kinds of lock: a semaphore of cfg.instances
// x cfg.workers goroutines on one key, and a read/write lock that sees
// mostly reads. Each runs distlock (every distlock peer of the store: its
// semaphore or read/write lock through the facade) against a floor: a bare
// script or statement, polled every cfg.retry, that keeps the same rule
// with nothing of distlock (kinds_redis.go, kinds_postgres.go).
const (
	wlSemaphore  = "semaphore"
	wlReadMostly = "read-mostly"
)

// isKindsWorkload reports whether w is one of the kinds workloads, which
// choose their own peers per store (kindsPeers) rather than the
// registry's mutex peers.
func isKindsWorkload(w string) bool { return w == wlSemaphore || w == wlReadMostly }

// kindsConfig is the command line of the kinds workloads; they also use
// cfg.instances, cfg.workers, cfg.ttl, cfg.retry and cfg.warmup.
type kindsConfig struct {
	rounds    int
	slice     time.Duration // time per peer per round
	hold      time.Duration // each grant is held this long
	wait      time.Duration // each acquire waits at most this long
	limit     int           // the semaphore's
	readShare float64       // read-mostly: the share of reads
}

// kindsFlags registers the kinds workloads' flags into kc.
func kindsFlags(kc *kindsConfig) {
	flag.IntVar(&kc.rounds, "kinds-rounds", 5, "semaphore, read-mostly: rounds; peers alternate within each")
	flag.DurationVar(&kc.slice, "kinds-slice", 2*time.Second, "semaphore, read-mostly: time per peer per round")
	flag.DurationVar(&kc.hold, "kinds-hold", 5*time.Millisecond, "semaphore, read-mostly: how long each grant is held")
	flag.DurationVar(&kc.wait, "kinds-wait", 5*time.Second, "semaphore, read-mostly: the wait of each acquire")
	flag.IntVar(&kc.limit, "sem-limit", 3, "semaphore: the limit (holders at once)")
	flag.Float64Var(&kc.readShare, "read-share", 0.9, "read-mostly: the share of acquires that are reads (0..1)")
}

func (kc kindsConfig) validate() error {
	switch {
	case kc.rounds < 1:
		return fmt.Errorf("-kinds-rounds %d must be >= 1", kc.rounds)
	case kc.slice <= 0 || kc.hold < 0 || kc.wait <= 0:
		return fmt.Errorf("-kinds-slice %v and -kinds-wait %v must be > 0, -kinds-hold %v >= 0", kc.slice, kc.wait, kc.hold)
	case kc.limit < 1:
		return fmt.Errorf("-sem-limit %d must be >= 1", kc.limit)
	case !(kc.readShare >= 0 && kc.readShare <= 1):
		return fmt.Errorf("-read-share %v must be in [0, 1]", kc.readShare)
	}
	return nil
}

// kindsLocker takes a semaphore's permit (kind KindSemaphore, with limit)
// or a read/write lock's read or write side, waiting at most wait:
// errNotAcquired when the wait ran out.
type kindsLocker interface {
	acquireKind(ctx context.Context, key string, kind distlock.Kind, limit int, wait time.Duration) (held, error)
}

// kindsInstance is one process's client of semaphores or read/write
// locks over a store.
type kindsInstance interface {
	kindsLocker
	close() error
}

// kindsPeer is a row of a kinds table: distlock through the facade, or a
// floor.
type kindsPeer struct {
	name  string
	store string
	ref   bool // the floor: ratios are against it
	note  string
	// serverRequests: the store counts requests at the server (counts.cmds
	// are its requests); else counts.rt, the clients' count (Redis).
	serverRequests bool
	// open returns one instance, as one process would have it; key is the
	// workload's key (the hotspot variants register it).
	open     func(ctx context.Context, s *servers, o openOpts, key string) (kindsInstance, error)
	counters func(ctx context.Context, s *servers) (counts, error)
}

// kindsFloors are the floors, per workload and store, registered by the
// stores' kinds files. A store without one has no floor row (its table
// says so).
var kindsFloors = map[string]map[string]*kindsPeer{wlSemaphore: {}, wlReadMostly: {}}

func registerKindsFloor(w string, p *kindsPeer) { kindsFloors[w][p.store] = p }

// kindsNoFloor says, per store, why it has no floor.
var kindsNoFloor = map[string]string{
	"memory":    "in process: a floor would measure a Go map, not a store",
	"etcd":      "etcd's form is a queue of keys and a watch on the predecessor, not a polled script",
	"zookeeper": "ZooKeeper's form is a queue of znodes and a watch on the predecessor, not a polled script",
}

// kindsPeers returns the peers of workload w on the store of g (the
// registry's peers of one store, as selected): its floor, then every
// distlock peer of g (each one checked by opening an instance: a peer
// whose instances hold no semaphores or read/write locks, another library
// of mutexes, is listed in notRun); on memory, distlock over one store
// shared by the instances.
func kindsPeers(ctx context.Context, s *servers, w string, g []*peer) (ps []*kindsPeer, notRun []string) {
	store := g[0].store
	if f := kindsFloors[w][store]; f != nil {
		ps = append(ps, f)
	}
	if store == "memory" {
		return append(ps, memoryKindsPeer()), nil
	}
	base := ""
	for _, p := range g {
		if p.name == "distlock" {
			base = p.note
		}
	}
	for _, p := range g {
		in, err := p.open(ctx, s, openOpts{ttl: time.Second, retry: 10 * time.Millisecond})
		if err != nil {
			ps = append(ps, &kindsPeer{name: p.name, store: store, note: "open failed: " + oneLine(err.Error()),
				open: func(context.Context, *servers, openOpts, string) (kindsInstance, error) { return nil, err }, counters: p.counters})
			continue
		}
		_, ok := in.(kindsInstance)
		_ = in.close()
		if !ok {
			if !p.ref {
				notRun = append(notRun, p.name)
			}
			continue
		}
		note := p.note
		switch {
		case p.name == "distlock" && kindsNotes[store] != "":
			note = kindsNotes[store]
		case p.hotspot && base != "":
			note = "distlock as above" + strings.TrimPrefix(p.note, base)
		}
		ps = append(ps, &kindsPeer{
			name: p.name, store: store, note: note, serverRequests: p.serverRequests,
			open: func(ctx context.Context, s *servers, o openOpts, key string) (kindsInstance, error) {
				in, err := p.openHot(ctx, s, o, key)
				if err != nil {
					return nil, err
				}
				ki, ok := in.(kindsInstance)
				if !ok {
					_ = in.close()
					return nil, fmt.Errorf("%s: no semaphores or read/write locks", p.name)
				}
				return ki, nil
			},
			counters: p.counters,
		})
	}
	return ps, notRun
}

// kindsNotes says how distlock takes semaphores and read/write locks on
// each store, for the tables' footnotes.
var kindsNotes = map[string]string{
	"redis":     "redis.New, defaults: one script per attempt (a semaphore's holders in a sorted set scored by their expiry on the server's clock; a read/write lock's holders and arrival-ordered intents, so new readers wait behind a waiting writer; a token per grant), one script per release that PUBLISHes a notice waking the waiters, WithSpin 10ms+[0,10ms)",
	"postgres":  "sqldb.NewPostgres, defaults: one upsert of the lock's row per attempt (holders, and the arrival-ordered intents of a read/write lock's requests and of a semaphore's waiters that wait 1s or more, in jsonb; a token per grant drawn under an advisory lock), one statement per release (a second when a concurrent release left the row empty), NOTIFY to a semaphore's first waiters in line, or to the waiters that marked the row, LISTEN for wake-up",
	"etcd":      "etcd.New: the queue of keys the mutex keeps, a waiter watching the entry it waits for",
	"zookeeper": "zookeeper.New: the queue of znodes the mutex keeps, a waiter watching the entry it waits for",
}

// kindsSample is one peer's run of one slice (or, summed, of all rounds).
type kindsSample struct {
	grants, reads, writes int
	timeouts, failures    int
	// violations counts grants that broke the rule, as the workload saw
	// them: a permit while limit others held, a writer with a reader or
	// another writer, a reader with a writer. Must stay 0.
	violations int
	// most is the most holders at once (semaphore) or readers at once
	// (read-mostly): the limit is reached, readers do share.
	most  int
	c     counts
	wall  time.Duration
	waits []time.Duration // every grant's wait (semaphore) or the writers' (read-mostly)
	rwait []time.Duration // read-mostly: the readers'
	err   error           // the first error
}

func (k *kindsSample) add(o kindsSample) {
	k.grants += o.grants
	k.reads += o.reads
	k.writes += o.writes
	k.timeouts += o.timeouts
	k.failures += o.failures
	k.violations += o.violations
	k.most = max(k.most, o.most)
	k.c.rt += o.c.rt
	k.c.cmds += o.c.cmds
	k.wall += o.wall
	k.waits = append(k.waits, o.waits...)
	k.rwait = append(k.rwait, o.rwait...)
	if k.err == nil {
		k.err = o.err
	}
}

// requests is the count of store requests the peer's store counts best
// (see kindsPeer.serverRequests).
func (p *kindsPeer) requests(c counts) int64 {
	if p.serverRequests {
		return c.cmds
	}
	return c.rt
}

// kindsResult is one peer's row.
type kindsResult struct {
	p *kindsPeer
	// skipped says why the peer did not run: its store refuses the kind
	// (distlock.ErrUnsupported), or it could not open.
	skipped string
	rates   []float64 // grants/s per round
	ratios  []float64 // / the floor's in the same round
	reqs    []float64 // requests per grant per round
	reqRat  []float64 // / the floor's in the same round
	total   kindsSample
}

// kindsRun is a kinds workload's result on one store.
type kindsRun struct {
	w, store string
	rows     []*kindsResult
	notRun   []string // the store's peers without these kinds
	pgNote   string   // how PostgreSQL's requests were counted, when not by the server
}

// guard counts, in the workload, who holds: it checks every grant
// against the rule (never more than limit holders; never a writer with
// anyone, never a reader with a writer).
type guard struct {
	mu                        sync.Mutex
	limit                     int
	holders, readers, writers int
	violations, most          int
}

func (g *guard) enter(kind distlock.Kind) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch kind {
	case distlock.KindSemaphore:
		g.holders++
		if g.holders > g.limit {
			g.violations++
		}
		g.most = max(g.most, g.holders)
	case distlock.KindRead:
		if g.writers > 0 {
			g.violations++
		}
		g.readers++
		g.most = max(g.most, g.readers)
	case distlock.KindWrite:
		if g.writers > 0 || g.readers > 0 {
			g.violations++
		}
		g.writers++
	}
}

func (g *guard) leave(kind distlock.Kind) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch kind {
	case distlock.KindSemaphore:
		g.holders--
	case distlock.KindRead:
		g.readers--
	case distlock.KindWrite:
		g.writers--
	}
}

// kindsSlice runs workload w on key for d with one goroutine per locker:
// each acquires (a permit; or, read-mostly, a read with probability
// readShare, else a write), holds kc.hold, releases, and again, until d
// has passed; then the goroutines finish the acquire they are in. It
// counts the store's requests over the whole run.
func kindsSlice(ctx context.Context, kc kindsConfig, w string, lockers []kindsLocker, p *kindsPeer, s *servers, key string, d time.Duration) kindsSample {
	var smp kindsSample
	c0, err := p.counters(ctx, s)
	if err != nil {
		smp.err = err
		return smp
	}
	g := &guard{limit: kc.limit}
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		start   = make(chan struct{})
		t0, end time.Time
	)
	for _, l := range lockers {
		wg.Go(func() {
			var my kindsSample
			defer func() {
				mu.Lock()
				smp.add(my)
				mu.Unlock()
			}()
			<-start
			for time.Now().Before(end) && ctx.Err() == nil {
				kind := distlock.KindSemaphore
				if w == wlReadMostly {
					kind = distlock.KindWrite
					if rand.Float64() < kc.readShare {
						kind = distlock.KindRead
					}
				}
				a := time.Now()
				h, err := l.acquireKind(ctx, key, kind, kc.limit, kc.wait)
				waited := time.Since(a)
				switch {
				case errors.Is(err, errNotAcquired):
					my.timeouts++
					continue
				case err != nil:
					my.failures++
					if my.err == nil {
						my.err = err
					}
					if errors.Is(err, distlock.ErrUnsupported) || ctx.Err() != nil {
						return
					}
					continue
				}
				g.enter(kind)
				if kc.hold > 0 {
					time.Sleep(kc.hold)
				}
				g.leave(kind)
				if err := h.unlock(ctx); err != nil {
					my.failures++
					if my.err == nil {
						my.err = fmt.Errorf("release: %w", err)
					}
				}
				my.grants++
				switch kind {
				case distlock.KindRead:
					my.reads++
					my.rwait = append(my.rwait, waited)
				case distlock.KindWrite:
					my.writes++
					my.waits = append(my.waits, waited)
				default:
					my.waits = append(my.waits, waited)
				}
			}
		})
	}
	t0 = time.Now()
	end = t0.Add(d)
	close(start)
	wg.Wait()
	smp.wall = time.Since(t0)
	smp.violations, smp.most = g.violations, g.most
	c1, err := p.counters(ctx, s)
	if err != nil && smp.err == nil {
		smp.err = err
	}
	smp.c = c1.sub(c0)
	return smp
}

// runKinds runs workload w on one store's peers: each opens cfg.instances
// instances (each with its own clients, as a process would; all in this
// program) of cfg.workers goroutines, warms up, then every round gives
// each peer one slice, the peers alternating.
func runKinds(ctx context.Context, cfg config, s *servers, w string, g []*peer, log logger) *kindsRun {
	kc := cfg.kinds
	store := g[0].store
	run := &kindsRun{w: w, store: store}
	if store == "postgres" {
		if err := s.enablePGStatements(ctx); err != nil {
			run.pgNote = fmt.Sprintf("no pg_stat_statements (%v): requests are the statements the clients sent", oneLine(err.Error()))
			log.printf("  postgres: %s", run.pgNote)
		}
	}
	ps, notRun := kindsPeers(ctx, s, w, g)
	run.notRun = notRun
	o := openOpts{ttl: cfg.ttl, retry: cfg.retry}
	insts := map[*kindsPeer][]kindsInstance{}
	defer func() {
		for _, ins := range insts {
			for _, in := range ins {
				_ = in.close()
			}
		}
	}()
	res := map[*kindsPeer]*kindsResult{}
	lockersOf := map[*kindsPeer][]kindsLocker{}
	var live []*kindsPeer
	for _, p := range ps {
		r := &kindsResult{p: p}
		res[p] = r
		run.rows = append(run.rows, r)
		key := keyName(w, runID, p.name)
		var lockers []kindsLocker
		for range cfg.instances {
			in, err := p.open(ctx, s, o, key)
			if err != nil {
				r.skipped = "open: " + oneLine(err.Error())
				break
			}
			insts[p] = append(insts[p], in)
			for range cfg.workers {
				lockers = append(lockers, in)
			}
		}
		if r.skipped != "" {
			continue
		}
		// Warm up (connections, scripts, statements); a store that
		// refuses the kind says so here.
		warm := kindsSlice(ctx, kc, w, lockers, p, s, keyName(w, "warm", runID, p.name), max(cfg.warmup, time.Millisecond))
		if errors.Is(warm.err, distlock.ErrUnsupported) {
			r.skipped = "the store refuses it: " + oneLine(warm.err.Error())
			log.printf("  %s: skipped: %s", p.name, r.skipped)
			continue
		}
		live = append(live, p)
		lockersOf[p] = lockers
	}
	var ref *kindsPeer
	if len(live) > 0 && live[0].ref {
		ref = live[0]
	}
	for r := range kc.rounds {
		rates, reqs := map[*kindsPeer]float64{}, map[*kindsPeer]float64{}
		for _, p := range order(live, r) {
			if ctx.Err() != nil {
				break
			}
			smp := kindsSlice(ctx, kc, w, lockersOf[p], p, s, keyName(w, runID, p.name), kc.slice)
			kr := res[p]
			kr.total.add(smp)
			if smp.grants > 0 && smp.wall > 0 {
				rates[p] = float64(smp.grants) / smp.wall.Seconds()
				reqs[p] = float64(p.requests(smp.c)) / float64(smp.grants)
				kr.rates = append(kr.rates, rates[p])
				kr.reqs = append(kr.reqs, reqs[p])
			}
		}
		var parts []string
		for _, p := range live {
			if ref != nil && p != ref && rates[ref] > 0 && rates[p] > 0 {
				res[p].ratios = append(res[p].ratios, rates[p]/rates[ref])
				res[p].reqRat = append(res[p].reqRat, reqs[p]/reqs[ref])
			}
			parts = append(parts, fmt.Sprintf("%s %.0f/s %.2f req/grant", p.name, rates[p], reqs[p]))
		}
		log.printf("  round %d: %s", r+1, strings.Join(parts, ", "))
	}
	for _, kr := range run.rows {
		slices.Sort(kr.total.waits)
		slices.Sort(kr.total.rwait)
	}
	return run
}

// kinds adds the table of a kinds workload on one store.
func (r *report) kinds(run *kindsRun) {
	kc := r.cfg.kinds
	var s *section
	if run.w == wlSemaphore {
		s = r.section(run.w, fmt.Sprintf("Semaphore: %s (limit %d, %d instances x %d goroutines)", run.store, kc.limit, r.cfg.instances, r.cfg.workers))
		fmt.Fprintf(&s.b, "One key's semaphore of limit %d: %d instances (each with its own clients, as a process) x %d goroutines, each acquiring a permit (wait %v), holding it %v, releasing it, and again.",
			kc.limit, r.cfg.instances, r.cfg.workers, kc.wait, kc.hold)
	} else {
		s = r.section(run.w, fmt.Sprintf("Read-mostly: %s (%.0f%% reads, %d instances x %d goroutines)", run.store, 100*kc.readShare, r.cfg.instances, r.cfg.workers))
		fmt.Fprintf(&s.b, "One key's read/write lock: %d instances (each with its own clients, as a process) x %d goroutines, each taking the read side with probability %.2f, else the write side (wait %v), holding it %v, releasing it, and again.",
			r.cfg.instances, r.cfg.workers, kc.readShare, kc.wait, kc.hold)
	}
	ref := "the floor"
	if len(run.rows) > 0 && run.rows[0].p.ref {
		ref = run.rows[0].p.name
	}
	fmt.Fprintf(&s.b, " %d rounds of %v per peer, alternating. Grants/s and requests per grant are the medians over rounds; \"vs %s\" the median over rounds of the ratio to %s in the same round, with the rounds' range. Requests: %s Violations (a grant that broke the rule, as the goroutines counted holders) must be 0.\n\n",
		kc.rounds, kc.slice, ref, ref, kindsCountNote[run.store])
	if run.w == wlSemaphore {
		fmt.Fprintf(&s.b, "| peer | grants/s | vs %s | rounds' range | requests/grant | vs %s | rounds' range | timeouts | errors | violations | most at once | wait p50 ms | wait p99 ms |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", ref, ref)
	} else {
		fmt.Fprintf(&s.b, "| peer | grants/s | vs %s | rounds' range | requests/grant | vs %s | rounds' range | reads/writes | timeouts | errors | violations | most readers at once | read wait p50 ms | write wait p50 ms | write wait p99 ms |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", ref, ref)
	}
	for _, kr := range run.rows {
		if kr.skipped != "" {
			fmt.Fprintf(&s.b, "| %s | not run: %s |\n", kr.p.name, oneLine(kr.skipped))
			continue
		}
		t := kr.total
		vs, vsRange, rq, rqRange := "1.00", "1.00-1.00", "1.00", "1.00-1.00"
		if !kr.p.ref {
			vs, vsRange, rq, rqRange = f2(median(kr.ratios)), spread(kr.ratios), f2(median(kr.reqRat)), spread(kr.reqRat)
		}
		errs := fmt.Sprint(t.failures)
		if t.err != nil {
			errs += " (" + oneLine(t.err.Error()) + ")"
		}
		row := fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s |", kr.p.name, f0(median(kr.rates)), vs, vsRange, f2(median(kr.reqs)), rq, rqRange)
		if run.w == wlSemaphore {
			row += fmt.Sprintf(" %d | %s | %d | %d | %s | %s |", t.timeouts, errs, t.violations, t.most,
				f2(ms(quantile(t.waits, 0.5))), f2(ms(quantile(t.waits, 0.99))))
		} else {
			row += fmt.Sprintf(" %d/%d | %d | %s | %d | %d | %s | %s | %s |", t.reads, t.writes, t.timeouts, errs, t.violations, t.most,
				f2(ms(quantile(t.rwait, 0.5))), f2(ms(quantile(t.waits, 0.5))), f2(ms(quantile(t.waits, 0.99))))
		}
		fmt.Fprintln(&s.b, row)
		if !kr.p.ref && len(kr.ratios) > 0 {
			r.bars = append(r.bars,
				bar{group: run.w + " grants/s", label: run.store + ": " + kr.p.name + " / " + ref, ratio: median(kr.ratios)},
				bar{group: run.w + ": reference's requests per grant / peer's", label: run.store + ": " + kr.p.name + " / " + ref, ratio: 1 / median(kr.reqRat)})
		}
	}
	fmt.Fprintln(&s.b)
	for _, kr := range run.rows {
		fmt.Fprintf(&s.b, "- %s: %s\n", kr.p.name, kr.p.note)
	}
	if f := kindsFloors[run.w][run.store]; f == nil {
		if why := kindsNoFloor[run.store]; why != "" {
			fmt.Fprintf(&s.b, "- No floor: %s.\n", why)
		}
	}
	if len(run.notRun) > 0 {
		fmt.Fprintf(&s.b, "- Not run (mutexes only): %s.\n", strings.Join(run.notRun, ", "))
	}
	if run.pgNote != "" {
		fmt.Fprintf(&s.b, "- PostgreSQL: %s.\n", run.pgNote)
	}
	fmt.Fprintln(&s.b)
}

// kindsCountNote says, per store, what the kinds tables count as a
// request to the store.
var kindsCountNote = map[string]string{
	"memory":    "calls into the store, counted in process (acquire attempts, releases, withdrawals of intents).",
	"redis":     "commands and pipelines the clients sent (a go-redis hook; a script is one), with the subscription commands the server counted.",
	"etcd":      "gRPC messages the server received (grpc_server_msg_received_total).",
	"zookeeper": "packets the server received (zk_packets_received in mntr).",
	"postgres":  "statements the server executed (pg_stat_statements, which the bench enables on the server it starts; else the statements the clients sent).",
}
