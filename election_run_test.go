package distlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
)

// flakyStore is one process's view of a shared memory store whose
// renewals can be made to fail (a store error: the lock's validity then
// runs out, and Done closes before the store frees the key).
type flakyStore struct {
	*memory.Store
	failing atomic.Bool
}

var errFlaky = errors.New("flaky: the store did not answer")

func (f *flakyStore) Refresh(ctx context.Context, l *backend.Lease) error {
	if f.failing.Load() {
		return errFlaky
	}
	return f.Store.Refresh(ctx, l)
}

func (f *flakyStore) RefreshAll(ctx context.Context, ls []*backend.Lease) []error {
	errs := make([]error, len(ls))
	for i, l := range ls {
		errs[i] = f.Refresh(ctx, l)
	}
	return errs
}

// runTrace is what the candidates of the randomized run-loop test record.
type runTrace struct {
	mu      sync.Mutex
	open    map[*distlock.Lock]int // leaderships whose fn runs, by candidate
	evicted uint64                 // terms below it may have been evicted: a rival may overlap them
	terms   []uint64               // terms in the order fn started
	errs    []string
}

func (tr *runTrace) fail(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.errs = append(tr.errs, fmt.Sprintf(format, args...))
}

// TestRunRandomized drives Election.Run on three processes of two
// candidates each over one store, with random function lengths, random
// failures of the renewals (losses), evictions and resignations, and
// checks: each candidate runs its function once at a time; a function's
// context ends when its leadership is lost; two leaderships open (Done
// open, deadline to come) never overlap (but across an eviction); terms
// grow; every
// OnStarted has one OnStopped after the function returned; nothing of Run
// is left running once its context ended. DISTLOCK_RUN_SEED replays a
// seed; DISTLOCK_RUN_ROUNDS sets the number of rounds.
func TestRunRandomized(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("DISTLOCK_RUN_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	rounds := 3
	if s := os.Getenv("DISTLOCK_RUN_ROUNDS"); s != "" {
		rounds, _ = strconv.Atoi(s)
	}
	t.Logf("seed %d (DISTLOCK_RUN_SEED=%d replays it)", seed, seed)
	var leaderships int64
	for round := range rounds {
		leaderships += runRound(t, rand.New(rand.NewPCG(seed, uint64(round))))
		if t.Failed() {
			return
		}
	}
	// A round whose first leader waits for its loss and whose process no
	// fault hits has one leadership: the rounds together must have had
	// several each.
	if leaderships < int64(3*rounds) {
		t.Errorf("%d leaderships in %d rounds: the run exercised too little", leaderships, rounds)
	}
}

// runRound runs one round and returns the leaderships it started.
func runRound(t *testing.T, rnd *rand.Rand) int64 {
	before := runtime.NumGoroutine()
	store := memory.New()
	const procs, candidates = 3, 2
	const ttl = 150 * time.Millisecond
	tr := &runTrace{open: map[*distlock.Lock]int{}}
	fl := make([]*flakyStore, procs)
	ds := make([]*distlock.DistributeLock, procs)
	for p := range procs {
		fl[p] = &flakyStore{Store: store}
		d, err := distlock.New(fl[p], distlock.WithAutoRenew(), distlock.WithDefaultTTL(ttl),
			distlock.WithSpin(2*time.Millisecond, 3*time.Millisecond), distlock.WithLabel("p"+strconv.Itoa(p)))
		if err != nil {
			t.Fatal(err)
		}
		ds[p] = d
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var started, stopped, leaders atomic.Int64
	for p := range procs {
		for c := range candidates {
			id := p*candidates + c
			crnd := rand.New(rand.NewPCG(rnd.Uint64(), uint64(id)))
			var cmu sync.Mutex // crnd is the candidate's fn's, one at a time
			var running atomic.Int32
			var pending atomic.Pointer[distlock.Lock] // started, stop not seen yet
			fn := func(fctx context.Context, lead *distlock.Lock) error {
				if running.Add(1) != 1 {
					tr.fail("candidate %d: two runs at once", id)
				}
				defer running.Add(-1)
				if pending.Load() != lead {
					tr.fail("candidate %d: fn of term %d without OnStarted before", id, lead.Token())
				}
				tr.mu.Lock()
				for other, oc := range tr.open {
					// Open: Done not closed and its deadline to come (a
					// timer late by more than the deadline's margin may
					// close Done after the store freed the key).
					if !isDone(other) && time.Now().Before(other.Deadline()) && other.Token() >= tr.evicted {
						tr.errs = append(tr.errs, fmt.Sprintf("candidate %d elected (term %d) while candidate %d (term %d) still leads (its deadline in %v)", id, lead.Token(), oc, other.Token(), time.Until(other.Deadline())))
					}
				}
				if n := len(tr.terms); n > 0 && lead.Token() <= tr.terms[n-1] {
					tr.errs = append(tr.errs, fmt.Sprintf("term %d after term %d", lead.Token(), tr.terms[n-1]))
				}
				tr.terms = append(tr.terms, lead.Token())
				tr.open[lead] = id
				tr.mu.Unlock()
				defer func() {
					tr.mu.Lock()
					delete(tr.open, lead)
					tr.mu.Unlock()
				}()
				cmu.Lock()
				hold := time.Duration(crnd.Int64N(int64(3 * ttl)))
				mode := crnd.IntN(4)
				cmu.Unlock()
				timer := time.NewTimer(hold)
				defer timer.Stop()
				select {
				case <-fctx.Done():
					return nil
				case <-lead.Done():
					// Lost: the function's context must end too.
					select {
					case <-fctx.Done():
						if !errors.Is(context.Cause(fctx), distlock.ErrNotHeld) && ctx.Err() == nil {
							tr.fail("candidate %d: fn's context ended with %v after a loss; want ErrNotHeld", id, context.Cause(fctx))
						}
					case <-time.After(time.Second):
						tr.fail("candidate %d: leadership %d lost, fn's context still open after 1s", id, lead.Token())
					}
					return nil
				case <-timer.C:
				}
				switch mode {
				case 0:
					return errors.New("fn failed")
				case 1: // wait for the loss or the end
					<-fctx.Done()
				}
				return nil
			}
			wg.Go(func() {
				err := ds[p].Election("run").Run(ctx, "c"+strconv.Itoa(id), fn,
					distlock.WithRunBackoff(time.Millisecond, 20*time.Millisecond),
					distlock.OnStarted(func(lead *distlock.Lock) {
						started.Add(1)
						if !pending.CompareAndSwap(nil, lead) {
							tr.fail("candidate %d: OnStarted twice without OnStopped", id)
						}
					}),
					distlock.OnStopped(func(lead *distlock.Lock, err error) {
						stopped.Add(1)
						if running.Load() != 0 {
							tr.fail("candidate %d: OnStopped while fn runs", id)
						}
						if !pending.CompareAndSwap(lead, nil) {
							tr.fail("candidate %d: OnStopped of term %d without its OnStarted", id, lead.Token())
						}
						if !isDone(lead) {
							tr.fail("candidate %d: OnStopped with Done open: not resigned", id)
						}
					}),
					distlock.OnNewLeader(func(distlock.Leader) { leaders.Add(1) }))
				if !errors.Is(err, context.Canceled) {
					tr.fail("candidate %d: Run = %v; want context.Canceled", id, err)
				}
			})
		}
	}
	// Faults: renewals of a process fail for a while (its leadership runs
	// out), an eviction, time passing.
	end := time.Now().Add(2 * time.Second)
	for time.Now().Before(end) {
		switch rnd.IntN(6) {
		case 0, 1:
			p := rnd.IntN(procs)
			fl[p].failing.Store(true)
			time.Sleep(time.Duration(rnd.Int64N(int64(2 * ttl))))
			fl[p].failing.Store(false)
		case 2:
			// Under tr.mu: a candidate elected after the eviction checks
			// the others once the new mark is set. The store's one
			// counter: a token taken after the eviction is above every
			// term granted before it.
			tr.mu.Lock()
			store.Evict(backend.ElectionPrefix + "run")
			probe := backend.Lease{Key: "probe", Value: "probe", TTL: time.Second}
			if ok, _, err := store.TryAcquire(ctx, &probe); !ok || err != nil {
				t.Fatalf("probe: %v, %v", ok, err)
			}
			_ = store.Release(ctx, &probe)
			tr.evicted = probe.Token
			tr.mu.Unlock()
		default:
			time.Sleep(time.Duration(rnd.Int64N(int64(ttl))))
		}
	}
	cancel()
	wg.Wait()
	for _, d := range ds {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	tr.mu.Lock()
	for _, e := range tr.errs {
		t.Error(e)
	}
	tr.mu.Unlock()
	if started.Load() != stopped.Load() {
		t.Errorf("%d OnStarted, %d OnStopped; want as many", started.Load(), stopped.Load())
	}
	if started.Load() == 0 || leaders.Load() == 0 {
		t.Errorf("%d leaderships, %d leaders observed: the round exercised nothing", started.Load(), leaders.Load())
	}
	if n := store.Len(); n != 0 {
		t.Errorf("the store holds %d grants after every Run returned and Close", n)
	}
	waitGoroutines(t, before)
	t.Logf("round: %d leaderships, %d leaders observed", started.Load(), leaders.Load())
	return started.Load()
}

// waitGoroutines waits until no more goroutines run than before, and
// fails with a dump if that does not happen within 10s.
func waitGoroutines(t *testing.T, before int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if runtime.NumGoroutine() <= before {
			return
		}
		if time.Now().After(end) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after the round; %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
	}
}
