package main

import (
	"fmt"
	"math"
	"strings"
)

// targets writes the targets next to what this run measured, so
// that a regression shows at the top of RESULTS.md.
func (r *report) targets(b *strings.Builder) {
	type row struct{ target, got string }
	var rows []row
	add := func(target, got string, ok bool, known bool) {
		mark := ""
		switch {
		case !known:
			got, mark = "not measured", ""
		case ok:
			mark = " ✓"
		default:
			mark = " ✗"
		}
		rows = append(rows, row{target, got + mark})
	}
	cyc := func(store, name string) *cycleResult {
		for _, c := range r.cyc["uncontended/"+store] {
			if c.p.name == name && c.err == nil && len(c.rounds) > 0 {
				return c
			}
		}
		return nil
	}
	// vs is the median over rounds of a's rate / b's rate, same round.
	vs := func(a, b *cycleResult) float64 {
		if a == nil || b == nil {
			return math.NaN()
		}
		var rs []float64
		for i := range min(len(a.rounds), len(b.rounds)) {
			rs = append(rs, a.rounds[i]/b.rounds[i])
		}
		return median(rs)
	}
	known := func(x float64) bool { return !math.IsNaN(x) }
	hand := func(store, name string) float64 {
		for _, h := range r.hand[store] {
			if h.p.name == name && len(h.lat) > 0 {
				return ms(quantile(h.lat, 0.5))
			}
		}
		return math.NaN()
	}
	cont := func(store, name string, v string) *contendedResult {
		for _, c := range r.cont[store] {
			if c.p.name == name && c.v.name == v && c.successes > 0 {
				return c
			}
		}
		return nil
	}

	// par is the median ratio of a peer's rate to another's, same round,
	// in the parallel workload with the run's goroutines.
	par := func(store, a, b string) float64 {
		var ra, rb *cycleResult
		for _, c := range r.cyc["parallel/"+store] {
			if c.err != nil || len(c.rounds) == 0 {
				continue
			}
			switch c.p.name {
			case a:
				ra = c
			case b:
				rb = c
			}
		}
		return vs(ra, rb)
	}

	dl, floor := cyc("redis", "distlock"), cyc("redis", "floor")
	x := vs(dl, floor)
	add("Redis cycle >= 0.95x the floor (fenced)", f2(x)+"x", x >= 0.95, known(x))
	for _, peer := range []string{"redislock", "redsync-1"} {
		x := vs(dl, cyc("redis", peer))
		add("Redis cycle >= 1.0x "+peer, f2(x)+"x", x >= 1.0, known(x))
	}
	if x, y := par("redis", "distlock", "floor"), par("redis", "distlock", "rueidislock"); known(x) {
		add(fmt.Sprintf("Redis, %d goroutines on distinct keys: >= 1.0x the floor and >= rueidislock", r.cfg.parallel),
			fmt.Sprintf("%sx the floor, %sx rueidislock", f2(x), f2(y)), x >= 1.0 && y >= 1.0, true)
	}
	if dl != nil && floor != nil {
		a, f := per(int64(dl.mallocs), dl.cycles), per(int64(floor.mallocs), floor.cycles)
		add("Redis allocations per cycle <= the floor's", fmt.Sprintf("%s vs %s", f1(a), f1(f)), a <= f, true)
	} else {
		add("Redis allocations per cycle <= the floor's", "-", false, false)
	}
	h := hand("redis", "distlock")
	add("Redis handoff p50 <= 2ms (with wake-up)", f2(h)+"ms", h <= 2, known(h))
	x = vs(cyc("etcd", "distlock"), cyc("etcd", "concurrency.Mutex"))
	add("etcd cycle >= 1.0x concurrency.Mutex (WithAutoRenew, as the Mutex's Session)", f2(x)+"x", x >= 1.0, known(x))
	if x := vs(cyc("etcd", "distlock-ttl"), cyc("etcd", "concurrency.Mutex")); known(x) {
		rows = append(rows, row{"(distlock without WithAutoRenew: a lease per lock, same run)", f2(x) + "x"})
	}
	h = hand("etcd", "distlock")
	add("etcd handoff p50 <= 5ms", f2(h)+"ms", h <= 5, known(h))
	x = vs(cyc("zookeeper", "distlock"), cyc("zookeeper", "zk.Lock"))
	add("ZooKeeper cycle >= 1.0x zk.Lock", f2(x)+"x", x >= 1.0, known(x))
	x = hand("zookeeper", "distlock") / hand("zookeeper", "zk.Lock")
	add("ZooKeeper handoff p50 within 1.2x of zk.Lock's", f2(x)+"x", x <= 1.2, known(x))
	x = vs(cyc("postgres", "distlock"), cyc("postgres", "floor"))
	add("PostgreSQL cycle >= 0.95x the bare pgx floor", f2(x)+"x", x >= 0.95, known(x))
	// The target is for the hotspot with wake-up across processes: the
	// release notices wake the other instances' waiters, and WithYield
	// makes the releasing instance's next waiter wait for its turn. The
	// plain hotspot variant and the floor are shown beside it, unmarked.
	const short = "wait 200ms, hold 1ms"
	const target = "Redis contended, " + short + ", distlock+hotspot+yield: <= 4 requests per success, 0 timeouts"
	if c := cont("redis", "distlock+hotspot+yield", short); c != nil {
		rt := per(c.c.rt, c.successes)
		add(target, fmt.Sprintf("%s per success, %d timeouts", f2(rt), c.timeouts), rt <= 4 && c.timeouts == 0, true)
	} else {
		add(target, "-", false, false)
	}
	if c, rl := cont("redis", "distlock", short), cont("redis", "redislock", short); c != nil && rl != nil {
		a, b := per(c.c.rt, c.successes), per(rl.c.rt, rl.successes)
		add("Redis contended, "+short+", no hotspot: requests per success <= redislock's",
			fmt.Sprintf("%s vs %s", f2(a), f2(b)), a <= b, true)
	}
	for _, ref := range []struct{ name, label string }{
		{"distlock+hotspot", "(distlock+hotspot without WithYield, same variant)"},
		{"floor", "(the floor, 10ms retry, same variant)"},
	} {
		if c := cont("redis", ref.name, short); c != nil {
			rows = append(rows, row{ref.label, fmt.Sprintf("%s per success, %d timeouts of %d", f2(per(c.c.rt, c.successes)), c.timeouts, c.attempts)})
		}
	}

	measured := false
	for _, r := range rows {
		measured = measured || !strings.HasPrefix(r.got, "not measured")
	}
	if !measured {
		return // a run of other workloads: their tables say
	}
	fmt.Fprintf(b, "## Targets\n\n| target | this run |\n|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(b, "| %s | %s |\n", r.target, r.got)
	}
	fmt.Fprintln(b)
}
