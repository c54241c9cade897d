// Command contention runs the seed framework's contention workload: several
// instances (each one DistributeLock with its own store client, as separate
// processes would have), each with several workers that try, again and
// again, to lock one key, hold it a while and increment a guarded counter.
// It prints what the store was asked to do per success, with and without
// the hotspot handler.
//
//	go run ./examples/contention                       # memory store, hotspot off
//	go run ./examples/contention -hotspot               # hotspot on
//	go run ./examples/contention -compare               # both, side by side
//	go run ./examples/contention -store redis://127.0.0.1:6379 -compare
//
// -store takes "memory" or a URL of the distlock command's syntax
// (redis://, redlock:, etcd://, zk://, postgres://, mysql://: see
// distlock --help).
//
// The guarded counter is read, then written one higher after the hold: if
// two workers ever held the lock at once, an update is lost and the counter
// ends below the number of successes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/hotspot"
	"github.com/distlock/distlock/metrics"
)

// config is the command line.
type config struct {
	store     string // "memory" or a store URL
	instances int
	workers   int
	attempts  int
	wait      time.Duration
	hold      time.Duration
	ttl       time.Duration
	spinMin   time.Duration
	spinRand  time.Duration
	hotspot   bool
	auto      bool
	compare   bool
	notify    bool
	yield     time.Duration
	key       string
	quiet     bool
}

func main() {
	var c config
	flag.StringVar(&c.store, "store", "memory", `store: "memory", or a URL as the distlock command takes it (redis://HOST:PORT, etcd://HOST:PORT, zk://HOST:PORT, postgres://..., mysql://...)`)
	flag.IntVar(&c.instances, "instances", 3, "instances (processes), each with its own store client")
	flag.IntVar(&c.workers, "workers", 4, "workers (threads) per instance")
	flag.IntVar(&c.attempts, "attempts", 400, "lock attempts per worker")
	flag.DurationVar(&c.wait, "wait", 3*time.Second, "wait budget of each attempt")
	flag.DurationVar(&c.hold, "hold", 20*time.Millisecond, "time the lock is held after each success")
	flag.DurationVar(&c.ttl, "ttl", 10*time.Second, "lease time of each lock")
	flag.DurationVar(&c.spinMin, "spin-min", 10*time.Millisecond, "minimum sleep between remote attempts")
	flag.DurationVar(&c.spinRand, "spin-random", 10*time.Millisecond, "random part of the sleep between remote attempts")
	flag.BoolVar(&c.hotspot, "hotspot", false, "register the key with a hotspot handler in each instance")
	flag.BoolVar(&c.auto, "auto", false, "with -hotspot: let the hotspot handler detect the key (threshold 2) instead of registering it")
	flag.BoolVar(&c.compare, "compare", false, "run without and with -hotspot and print both rows")
	flag.BoolVar(&c.notify, "notify", true, "let waiters wake on the store's release notices (Redis pub/sub, memory channels)")
	flag.DurationVar(&c.yield, "yield", 0, "with -hotspot and -notify: after a contended release, the next local waiter waits up to this long for the next release notice before trying (hotspot.WithYield); 0: off")
	flag.StringVar(&c.key, "key", "contention", "key to contend for (a run suffix is added)")
	flag.BoolVar(&c.quiet, "q", false, "no progress line")
	flag.Parse()

	if err := run(c, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "contention:", err)
		os.Exit(1)
	}
}

func run(c config, out, progress io.Writer) error {
	switch {
	case c.instances < 1 || c.workers < 1 || c.attempts < 1:
		return fmt.Errorf("-instances %d, -workers %d and -attempts %d must be >= 1", c.instances, c.workers, c.attempts)
	case c.wait < 0 || c.hold < 0:
		return fmt.Errorf("-wait %v and -hold %v must not be negative", c.wait, c.hold)
	case c.ttl <= c.hold:
		return fmt.Errorf("-ttl %v must exceed -hold %v", c.ttl, c.hold)
	}
	if c.quiet {
		progress = io.Discard
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	s, err := openStore(ctx, c)
	if err != nil {
		return err
	}
	defer s.close()

	modes := []bool{c.hotspot}
	if c.compare {
		modes = []bool{false, true}
	}
	var results []result
	for _, hot := range modes {
		rc := c
		rc.hotspot = hot
		r, err := runOnce(ctx, rc, s, progress)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	printTable(out, c, results)
	for _, r := range results {
		if r.counter != r.successes {
			return fmt.Errorf("guarded counter %d != successes %d: two holders overlapped", r.counter, r.successes)
		}
	}
	return nil
}

// result is one run's row.
type result struct {
	hotspot     bool
	auto        bool
	successes   uint64
	notAcquired uint64
	failed      uint64
	remote      uint64
	commands    map[string]uint64 // store commands during the run; nil if unknown
	counter     uint64
	elapsed     time.Duration
	firstErr    error
}

func runOnce(ctx context.Context, c config, s store, progress io.Writer) (result, error) {
	key := fmt.Sprintf("%s:%d", c.key, time.Now().UnixNano())
	met := metrics.New()
	type instance struct {
		d     *distlock.DistributeLock
		close func() error
	}
	var insts []instance
	defer func() {
		for _, in := range insts {
			in.d.Close()
			in.close()
		}
	}()
	for range c.instances {
		res, closeRes, err := s.resource(ctx, c.notify)
		if err != nil {
			return result{}, err
		}
		hs := []distlock.Handler{met}
		if c.hotspot {
			var opts []hotspot.Option
			if c.auto {
				opts = append(opts, hotspot.WithAutoDetect(2, 16))
			} else {
				opts = append(opts, hotspot.WithKeys(key))
			}
			if n, ok := res.(backend.Notifier); ok && c.notify {
				opts = append(opts, hotspot.WithNotifier(n))
				if c.yield > 0 {
					opts = append(opts, hotspot.WithYield(n, c.yield))
				}
			}
			h, err := hotspot.NewWithOptions(opts...)
			if err != nil {
				closeRes()
				return result{}, err
			}
			hs = append(hs, h)
		}
		d, err := distlock.New(res,
			distlock.WithDefaultTTL(c.ttl),
			distlock.WithSpin(c.spinMin, c.spinRand),
			distlock.WithHandlers(hs...))
		if err != nil {
			closeRes()
			return result{}, err
		}
		insts = append(insts, instance{d, closeRes})
	}

	before, err := s.commands(ctx)
	if err != nil {
		return result{}, err
	}

	var (
		counter  atomic.Uint64 // the guarded resource
		done     atomic.Uint64
		errMu    sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	total := uint64(c.instances * c.workers * c.attempts)
	start := time.Now()
	for _, in := range insts {
		for range c.workers {
			wg.Go(func() {
				for range c.attempts {
					if ctx.Err() != nil {
						return
					}
					err := in.d.Do(ctx, key, c.wait, func(ctx context.Context, lk *distlock.Lock) error {
						v := counter.Load()
						time.Sleep(c.hold) // the work the lock protects
						counter.Store(v + 1)
						return nil
					})
					done.Add(1)
					if err != nil && !errors.Is(err, distlock.ErrNotAcquired) {
						errMu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						errMu.Unlock()
					}
				}
			})
		}
	}

	label := "hotspot off"
	if c.hotspot {
		label = "hotspot on"
	}
	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
			case <-stopProgress:
				fmt.Fprintln(progress)
				return
			}
			st := met.Stats()
			fmt.Fprintf(progress, "\r%s %-11s %5d/%d attempts  %5d ok  %5d not acquired  %5d errors  %6d remote  %5.1fs ",
				storeLabel(c.store), label, done.Load(), total, st.Acquired, st.NotAcquired, st.Failed, st.RemoteAttempts, time.Since(start).Seconds())
		}
	}()
	wg.Wait()
	elapsed := time.Since(start)
	close(stopProgress)
	<-progressDone
	if err := ctx.Err(); err != nil {
		return result{}, err
	}

	after, err := s.commands(ctx)
	if err != nil {
		return result{}, err
	}
	st := met.Stats()
	r := result{
		hotspot:     c.hotspot,
		auto:        c.auto,
		successes:   st.Acquired,
		notAcquired: st.NotAcquired,
		failed:      st.Failed,
		remote:      st.RemoteAttempts,
		counter:     counter.Load(),
		elapsed:     elapsed,
		firstErr:    firstErr,
	}
	if after != nil {
		r.commands = make(map[string]uint64)
		for k, v := range after {
			r.commands[k] = v - before[k]
		}
	}
	return r, nil
}

func printTable(out io.Writer, c config, rs []result) {
	fmt.Fprintf(out, "%s: %d instances x %d workers x %d attempts, wait %v, hold %v, spin %v+%v, notify %v, yield %v\n",
		storeLabel(c.store), c.instances, c.workers, c.attempts, c.wait, c.hold, c.spinMin, c.spinRand, c.notify, c.yield)
	var cmds []string
	seen := map[string]bool{}
	for _, r := range rs {
		for k := range r.commands {
			if !seen[k] {
				seen[k] = true
				cmds = append(cmds, k)
			}
		}
	}
	sort.Strings(cmds)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "hotspot\tsuccesses\tfailures\terrors\tremote attempts\t")
	for _, k := range cmds {
		fmt.Fprintf(tw, "%s\t", k)
	}
	fmt.Fprint(tw, "remote/success\t")
	for _, k := range cmds {
		fmt.Fprintf(tw, "%s/success\t", k)
	}
	fmt.Fprint(tw, "counter\ttime\t\n")
	for _, r := range rs {
		mode := "off"
		if r.hotspot {
			mode = "on"
			if r.auto {
				mode = "auto"
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t", mode, r.successes, r.notAcquired, r.failed, r.remote)
		for _, k := range cmds {
			fmt.Fprintf(tw, "%d\t", r.commands[k])
		}
		fmt.Fprintf(tw, "%s\t", ratio(r.remote, r.successes))
		for _, k := range cmds {
			fmt.Fprintf(tw, "%s\t", ratio(r.commands[k], r.successes))
		}
		fmt.Fprintf(tw, "%d\t%.1fs\t\n", r.counter, r.elapsed.Seconds())
	}
	tw.Flush()
	if len(rs) == 2 {
		off, on := rs[0], rs[1]
		fmt.Fprintf(out, "hotspot cut remote attempts by %s", cut(off.remote, on.remote))
		for _, k := range cmds {
			fmt.Fprintf(out, ", %s commands by %s", k, cut(off.commands[k], on.commands[k]))
		}
		fmt.Fprintln(out)
	}
	for _, r := range rs {
		if r.firstErr != nil {
			fmt.Fprintf(out, "first error (hotspot %v): %v\n", r.hotspot, r.firstErr)
		}
	}
}

func ratio(n, d uint64) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(n)/float64(d))
}

func cut(before, after uint64) string {
	if before == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*(1-float64(after)/float64(before)))
}

// spinOnly hides a store's release notices (and everything but acquire
// and release), for runs with -notify=false.
type spinOnly struct{ backend.Spinner }
