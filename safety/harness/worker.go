package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/safety/history"
	"github.com/distlock/distlock/safety/resource"
)

// workerEnv carries a worker's [Config] to the re-executed test binary.
const workerEnv = "DISTLOCK_SAFETY_WORKER"

// Config is what one worker process does.
type Config struct {
	// Name names the process in the history ("w1").
	Name    string
	Backend Backend
	// Key is the lock's key.
	Key string
	// TTL is the lock's lease time; AutoRenew turns on distlock.WithAutoRenew.
	TTL       time.Duration
	AutoRenew bool
	// Wait is TryLock's wait.
	Wait time.Duration
	// Seed seeds the worker's random choices.
	Seed uint64
	// History is the worker's history file; Resource the protected
	// resource's socket.
	History  string
	Resource string
	// Cycles is how many acquisitions to attempt; 0: until told to stop
	// (its stdin closed), which also ends a holding early.
	Cycles int
	// Ops is how many fenced writes and counter increments to make per
	// holding, spread over Hold. Default 1.
	Ops  int
	Hold time.Duration
	// Think is the longest random pause between holdings.
	Think time.Duration
	// Netns, when set, runs the worker in that network namespace (see
	// [NewNetns]).
	Netns string
	// Zombie makes the worker write once more with its old token after it
	// saw the lock lost, as a client that did not look at Done would.
	Zombie bool
	// Lock is the kind of lock the worker takes: "" (the mutex),
	// "semaphore" (of Limit holders), "read" or "write" (the two sides of
	// the read/write lock), or "election" (the leadership of the
	// election named Key, campaigned for within Wait, its term the
	// token; the leader writes and increments as a mutex's holder). A
	// reader neither writes to the fenced register nor increments the
	// counter (it reads); a semaphore's holder writes to the register,
	// and does not increment the counter, which its fellow holders would
	// race.
	Lock  string
	Limit int
	// Fence, when its Kind is set, takes the fenced writes instead of the
	// run's register: the public helpers of package fence on a real
	// store (see [Fence]); the counter stays the register's.
	Fence Fence
}

// MaybeRunWorker runs the worker and exits when this process is a worker
// started by [StartWorker]; otherwise it returns at once. Call it first
// thing in TestMain.
func MaybeRunWorker() {
	js := os.Getenv(workerEnv)
	if js == "" {
		return
	}
	var cfg Config
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "worker: %v\n", err)
		os.Exit(2)
	}
	if err := runWorker(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "worker %s: %v\n", cfg.Name, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// say tells the controller something, one line on stdout.
func say(format string, args ...any) {
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

func runWorker(cfg Config) error {
	rec, err := history.Create(cfg.History, cfg.Name)
	if err != nil {
		return err
	}
	defer rec.Close()
	store, err := resource.Dial(cfg.Resource)
	if err != nil {
		return err
	}
	defer store.Close()
	var fw *FenceWriter
	if cfg.Fence.Kind != "" {
		if fw, err = OpenFence(context.Background(), cfg.Fence); err != nil {
			return err
		}
		defer fw.Close()
	}

	// Closing stdin asks the worker to stop after the current holding.
	var stopping atomic.Bool
	stop := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
		}
		stopping.Store(true)
		close(stop)
	}()

	octx, ocancel := context.WithTimeout(ctx, 30*time.Second)
	res, closeRes, err := cfg.Backend.Open(octx)
	ocancel()
	if err != nil {
		return err
	}
	defer closeRes()
	opts := []distlock.Option{distlock.WithDefaultTTL(cfg.TTL), distlock.WithSpin(cfg.TTL/50+time.Millisecond, cfg.TTL/20+time.Millisecond)}
	if cfg.AutoRenew {
		opts = append(opts, distlock.WithAutoRenew())
	}
	d, err := distlock.New(res, opts...)
	if err != nil {
		return err
	}
	defer d.Close()

	w := &worker{cfg: cfg, rec: rec, store: store, fence: fw, d: d, stop: stop, rnd: rand.New(rand.NewPCG(cfg.Seed, 0x5afe))}
	say("ready")
	for cycle := 0; cfg.Cycles == 0 || cycle < cfg.Cycles; cycle++ {
		if stopping.Load() {
			break
		}
		if err := w.cycle(ctx, fmt.Sprintf("%s-%d", cfg.Name, cycle)); err != nil {
			return err
		}
	}
	say("exit")
	return nil
}

type worker struct {
	cfg   Config
	rec   *history.Recorder
	store *resource.Client
	fence *FenceWriter // nil: fenced writes go to the register
	d     *distlock.DistributeLock
	stop  <-chan struct{} // closed when the controller asks the worker to stop
	rnd   *rand.Rand
}

// errString classifies an acquire or release error for the history.
func errString(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, distlock.ErrNotAcquired):
		return "not acquired"
	case errors.Is(err, distlock.ErrNotHeld):
		return "not held"
	}
	return err.Error()
}

// cycle makes one acquisition as owner, holds it for cfg.Hold doing
// cfg.Ops writes and increments, and releases it.
func (w *worker) cycle(ctx context.Context, owner string) error {
	call := history.Now()
	lk, err := w.acquire(ctx)
	ret := history.Now()
	ev := history.Event{Kind: history.Acquire, Owner: owner, Call: call, Return: ret, Err: errString(err), Lock: w.cfg.Lock}
	if err == nil {
		ev.Token = lk.Token()
	}
	if err := w.rec.Add(ev); err != nil {
		return err
	}
	if err != nil {
		w.think()
		return nil
	}
	say("acquired %s %d", owner, lk.Token())

	// doneAt is when this process learnt that the lock ended.
	var doneAt atomic.Int64
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		<-lk.Done()
		doneAt.Store(history.Now())
	}()

	ops := max(w.cfg.Ops, 1)
	step := w.cfg.Hold / time.Duration(ops)
	lost := false
	for i := 0; i < ops && !lost; i++ {
		select {
		case <-lk.Done():
			lost = true
			continue
		default:
		}
		if w.cfg.Lock != "read" {
			if err := w.write(ctx, owner, lk.Token()); err != nil {
				return err
			}
		}
		if w.cfg.Lock == "" || w.cfg.Lock == "write" || w.cfg.Lock == "election" {
			if err := w.increment(ctx, owner, step/2, lk.Done()); err != nil {
				return err
			}
		} else if _, err := w.store.Get(ctx); err != nil { // the read
			return err
		}
		select {
		case <-lk.Done():
			lost = true
		case <-w.stop:
			i = ops // end the holding early, normally
		case <-time.After(step / 2):
		}
	}
	if lost {
		<-watched
		if err := w.rec.Add(history.Event{Kind: history.Lost, Owner: owner, At: doneAt.Load()}); err != nil {
			return err
		}
		say("lost %s", owner)
		if w.cfg.Zombie && w.cfg.Lock != "read" {
			if err := w.write(ctx, owner, lk.Token()); err != nil {
				return err
			}
		}
	}
	rcall := history.Now()
	uctx, cancel := context.WithTimeout(ctx, 2*w.cfg.TTL+5*time.Second)
	err = lk.Unlock(uctx)
	cancel()
	rret := history.Now()
	<-watched
	if !lost && doneAt.Load() < rcall {
		// Done closed before Unlock was called, after the last look.
		if err := w.rec.Add(history.Event{Kind: history.Lost, Owner: owner, At: doneAt.Load()}); err != nil {
			return err
		}
	}
	if err := w.rec.Add(history.Event{Kind: history.Release, Owner: owner, Call: rcall, Return: rret, Err: errString(err)}); err != nil {
		return err
	}
	say("released %s %s", owner, errString(err))
	w.think()
	return nil
}

// acquire takes the worker's kind of lock.
func (w *worker) acquire(ctx context.Context) (*distlock.Lock, error) {
	switch w.cfg.Lock {
	case "semaphore":
		return w.d.Semaphore(w.cfg.Key, w.cfg.Limit).TryAcquire(ctx, w.cfg.Wait)
	case "read":
		return w.d.RWMutex(w.cfg.Key).TryRLock(ctx, w.cfg.Wait)
	case "write":
		return w.d.RWMutex(w.cfg.Key).TryLock(ctx, w.cfg.Wait)
	case "election":
		ctx, cancel := context.WithTimeout(ctx, w.cfg.Wait)
		defer cancel()
		return w.d.Election(w.cfg.Key).Campaign(ctx, w.cfg.Name)
	}
	return w.d.TryLock(ctx, w.cfg.Key, w.cfg.Wait)
}

// write makes one fenced write and records it: to the register, which
// records the write as it saw it, or to the Fence, whose view the worker
// records too (the store's sequence and time). The resource is the lock's
// key. A lock without a token (Redlock) cannot fence: no write then.
func (w *worker) write(ctx context.Context, owner string, token uint64) error {
	if token == 0 {
		return nil
	}
	call := history.Now()
	var accepted bool
	var seq int64
	var err error
	if w.fence != nil {
		var sw history.Event
		sw, err = w.fence.Write(ctx, w.cfg.Key, owner, token)
		if err == nil {
			accepted, seq = sw.Accepted, sw.Seq
			err = w.rec.Add(sw)
		}
	} else {
		accepted, seq, err = w.store.Write(ctx, owner, token)
	}
	ret := history.Now()
	if err != nil {
		return err
	}
	return w.rec.Add(history.Event{Kind: history.Write, Owner: owner, Token: token, Call: call, Return: ret, Accepted: accepted, Seq: seq})
}

// increment reads the counter, waits gap, and writes it back plus one,
// unless done closed meanwhile: a holder that learnt of its loss writes
// no more (its holding ended then, in the history), as a client that looks
// at Done before it writes.
func (w *worker) increment(ctx context.Context, owner string, gap time.Duration, done <-chan struct{}) error {
	v, err := w.store.Get(ctx)
	if err != nil {
		return err
	}
	if gap > 0 {
		time.Sleep(gap) // the read-modify-write's window, on purpose
	}
	select {
	case <-done:
		return nil
	default:
	}
	return w.store.Set(ctx, owner, v, v+1)
}

func (w *worker) think() {
	if w.cfg.Think > 0 {
		time.Sleep(time.Duration(w.rnd.Int64N(int64(w.cfg.Think))))
	}
}
