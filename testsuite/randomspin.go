package testsuite

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/distlock/distlock/backend"
)

// SpinSample is one value a pull store holds for a key, as RandomSpinStalls'
// Sample read it.
type SpinSample struct {
	// Where names the place read (a node, a key, a set), for messages.
	Where string
	// Value is a value held there: a lock's value, a holder's or an
	// intent's.
	Value string
	// At is when the read was sent.
	At time.Time
}

// RandomSpinStalls is what RunRandomSpinStalls needs of a pull store: its
// clients, how to freeze it, how to read what it holds, and the pace of
// the workload.
type RandomSpinStalls struct {
	// Clients are the resources the workers go through, one worker each.
	// The client makes no retries of its own: a resent request's late
	// first copy is a case for a test of its own.
	Clients []backend.Spinner
	// Rand drives every random choice; the store's proxies and Freeze
	// draw from it too.
	Rand *Rand
	// Run is how long the workers run; Keys how many keys they share
	// (worker w takes key (w+i) mod Keys at its i-th lease); TTL is every
	// lease's.
	Run  time.Duration
	Keys int
	TTL  time.Duration
	// Context bounds the random contexts of the calls: none, a deadline
	// or a cancel, each after up to Context.
	Context time.Duration
	// Hold bounds how long a worker holds a lock it got, and Backoff how
	// long it sleeps after a refused attempt.
	Hold, Backoff time.Duration
	// Spin: a worker retries a refused attempt with the same lease until
	// the run ends, as the facade's spin loop does, and each attempt's
	// value is Stored's. Otherwise it takes a fresh lease for every
	// attempt, withdrawing a refused reader's or writer's intent first.
	Spin bool
	// Stored, if not nil, returns the value the store holds for l's last
	// attempt (Redlock: one of its own per round); l.Value otherwise. An
	// attempt that leaves it unchanged sent nothing (its context had
	// ended): it has no clean-up of its own.
	Stored func(l *backend.Lease) string
	// Freeze freezes (SIGSTOP) some of the store's servers and returns
	// what resumes them. The first freeze is long (StallSlack + 500ms);
	// long tells it so.
	Freeze func(long bool) (resume func())
	// Sample reads, directly and with a short timeout, the values the
	// store holds for key: a sampler calls it for every key every few
	// milliseconds.
	Sample func(key string) []SpinSample
	// Linger is how long the last delayed requests may take to land
	// once the workers and the clean-ups are done, before the sampler
	// stops.
	Linger time.Duration
	// Empty, if not nil, fails the test if the store keeps anything of
	// key at the end.
	Empty func(t *testing.T, key string)
}

// RunRandomSpinStalls is RunRandomStalls' counterpart for pull stores
// ([backend.Spinner]). It drives the store's Resources directly, as the
// facade does, while Freeze stops its servers now and then (every 300ms
// to 700ms, for 50ms to 250ms; the first time for StallSlack + 500ms, so
// that a call that waited for the store instead of its context returns
// too late), and calls get random deadlines and cancellations. Attempts
// are of every kind the store holds (KindChecker; a semaphore of limit
// 2); a refused reader or writer withdraws its intent (Withdrawer), as
// the facade does when its wait ends; a BatchRefresher refreshes a held
// lock in a batch with a lease that is not held; an Inspector is asked
// before one attempt in eight. Invariants:
//   - every call returns within StallSlack of its context's end;
//   - two acquisitions of a key never hold it at once beyond its kind's
//     rule, where an acquisition holds from the return of the attempt that
//     got it to the first of its release and the end of its validity;
//   - once the clean-up of a failed attempt has succeeded (at once, or
//     the AbandonedError's Cleanup, retried as the facade does), the store
//     never holds that attempt's value again (Sample);
//   - every clean-up succeeds once the store answers; and at the end
//     nothing of any key is left (Empty).
func RunRandomSpinStalls(t *testing.T, rs RandomSpinStalls) {
	if len(rs.Clients) == 0 || rs.Rand == nil || rs.Freeze == nil || rs.Sample == nil ||
		rs.Run <= 0 || rs.Keys <= 0 || rs.TTL <= 0 || rs.Context <= 0 || rs.Hold <= 0 || rs.Backoff <= 0 {
		t.Fatal("testsuite: RandomSpinStalls needs Clients, Rand, Freeze, Sample, and Run, Keys, TTL, Context, Hold and Backoff > 0")
	}
	rnd := rs.Rand
	stored := rs.Stored
	if stored == nil {
		stored = func(l *backend.Lease) string { return l.Value }
	}
	base := Key(t)
	keys := make([]string, rs.Keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%c", base, 'a'+i)
	}

	type interval struct {
		worker     int
		kind       backend.Kind
		limit      int
		from, till time.Time
	}
	var (
		mu        sync.Mutex
		samples   []SpinSample
		cleaned   = map[string]time.Time{} // failed attempt's value -> its clean-up's success
		intervals = map[string][]interval{}
		stats     struct{ attempts, acquired, contended, abandoned, failed int }
	)
	count := func(n *int) {
		mu.Lock()
		*n++
		mu.Unlock()
	}
	clean := func(value string) {
		mu.Lock()
		cleaned[value] = time.Now()
		mu.Unlock()
	}

	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			for _, k := range keys {
				got := rs.Sample(k)
				mu.Lock()
				samples = append(samples, got...)
				mu.Unlock()
			}
		}
	})
	// cleanUp runs a failed attempt's Cleanup as the facade does.
	var cleanups sync.WaitGroup
	cleanUp := func(value string, ab *backend.AbandonedError) {
		cleanups.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			for backoff := 10 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
				err := ab.Cleanup(ctx)
				if err == nil {
					clean(value)
					return
				}
				if ctx.Err() != nil {
					t.Errorf("Cleanup of %s never succeeded: %v", value, err)
					return
				}
				time.Sleep(backoff) // a backoff between tries, as the facade's
			}
		})
	}
	// callCtx returns a random context: none, a deadline, or a cancel,
	// and the latest time a call with it may return.
	callCtx := func() (context.Context, context.CancelFunc, time.Time) {
		switch d := rnd.Duration(rs.Context); rnd.IntN(3) {
		case 0:
			return context.Background(), func() {}, time.Time{}
		case 1:
			ctx, cancel := context.WithTimeout(context.Background(), d)
			return ctx, cancel, time.Now().Add(d + StallSlack)
		default:
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(d, cancel)
			return ctx, cancel, time.Now().Add(d + StallSlack)
		}
	}
	late := func(what string, bound time.Time) {
		if !bound.IsZero() && time.Now().After(bound) {
			t.Errorf("%s returned %v after its context's end plus %v", what, time.Since(bound), StallSlack)
		}
	}

	end := time.Now().Add(rs.Run)
	var ws sync.WaitGroup
	for w, r := range rs.Clients {
		kinds := []backend.Kind{backend.KindMutex}
		if kc, ok := r.(backend.KindChecker); ok {
			kinds = nil
			for _, k := range []backend.Kind{backend.KindMutex, backend.KindSemaphore, backend.KindRead, backend.KindWrite} {
				if kc.CheckKind(k) == nil {
					kinds = append(kinds, k)
				}
			}
		}
		inspector, _ := r.(backend.Inspector)
		withdrawer, _ := r.(backend.Withdrawer)
		refresher, _ := r.(backend.BatchRefresher)
		ws.Go(func() {
			for i := 0; time.Now().Before(end); i++ {
				key := keys[(w+i)%len(keys)]
				l := newSpinLease(key, rs.TTL)
				if l.Kind = kinds[rnd.IntN(len(kinds))]; l.Kind == backend.KindSemaphore {
					l.Limit = 2
				}
				for time.Now().Before(end) {
					if inspector != nil && rnd.IntN(8) == 0 {
						ctx, cancel, bound := callCtx()
						_, _ = inspector.Inspect(ctx, l.Key, l.Kind)
						late("Inspect", bound)
						cancel()
					}
					ctx, cancel, bound := callCtx()
					start := time.Now()
					before := stored(l)
					ok, _, err := r.TryAcquire(ctx, l)
					late("TryAcquire", bound)
					cancel()
					count(&stats.attempts)
					var ab *backend.AbandonedError
					switch {
					case errors.As(err, &ab):
						count(&stats.abandoned)
						cleanUp(stored(l), ab)
					case err != nil && rs.Stored != nil && stored(l) == before:
						// No request of its own: what the store holds
						// is an earlier attempt's, which was refused.
						count(&stats.failed)
					case err != nil:
						count(&stats.failed)
						clean(stored(l)) // cleaned up before it returned
					case !ok:
						count(&stats.contended)
						if rs.Spin {
							time.Sleep(rnd.Duration(rs.Backoff))
							continue
						}
						if withdrawer != nil && (l.Kind == backend.KindRead || l.Kind == backend.KindWrite) {
							// The wait ends: withdraw the intent, as the
							// facade does, until the store answers.
							ctx, cancel, bound := callCtx()
							err := withdrawer.Withdraw(ctx, l)
							late("Withdraw", bound)
							cancel()
							for err != nil {
								err = withdrawer.Withdraw(context.Background(), l)
							}
							clean(stored(l))
						}
						time.Sleep(rnd.Duration(rs.Backoff))
					default:
						count(&stats.acquired)
						validity := l.Validity
						if validity <= 0 {
							validity = l.TTL
						}
						from, validUntil := time.Now(), start.Add(validity)
						time.Sleep(rnd.Duration(rs.Hold))
						if refresher != nil {
							ctx, cancel, bound := callCtx()
							errs := refresher.RefreshAll(ctx, []*backend.Lease{l, newSpinLease(l.Key, rs.TTL)})
							late("RefreshAll", bound)
							cancel()
							if errs[0] != nil && ctx.Err() == nil {
								t.Errorf("RefreshAll of a held %v lock: %v", l.Kind, errs[0])
							}
							if !errors.Is(errs[1], backend.ErrNotHeld) && ctx.Err() == nil {
								t.Errorf("RefreshAll of a lease never acquired: %v; want ErrNotHeld", errs[1])
							}
						}
						till := time.Now()
						if till.After(validUntil) {
							till = validUntil
						}
						ctx, cancel, bound := callCtx()
						err := r.Release(ctx, l)
						late("Release", bound)
						cancel()
						// A release cut short leaves the lock held: release
						// it for good (the facade's Unlock may be called
						// again) while it may be held.
						for err != nil && !errors.Is(err, backend.ErrNotHeld) && time.Now().Before(validUntil) {
							err = r.Release(context.Background(), l)
						}
						mu.Lock()
						intervals[key] = append(intervals[key], interval{w, l.Kind, int(l.Limit), from, till})
						mu.Unlock()
					}
					break
				}
			}
		})
	}
	for long := true; time.Now().Before(end); long = false {
		time.Sleep(300*time.Millisecond + rnd.Duration(400*time.Millisecond)) // the gap between freezes
		freeze := 50*time.Millisecond + rnd.Duration(200*time.Millisecond)
		if long {
			freeze = StallSlack + 500*time.Millisecond
		}
		resume := rs.Freeze(long)
		time.Sleep(freeze) // the fault's length
		resume()
	}
	ws.Wait()
	cleanups.Wait()
	time.Sleep(rs.Linger) // the last delayed requests land
	close(stop)
	bg.Wait()

	t.Logf("%d attempts: %d acquired, %d contended, %d abandoned (cleaned up in the background), %d failed (cleaned up at once); %d samples",
		stats.attempts, stats.acquired, stats.contended, stats.abandoned, stats.failed, len(samples))
	if stats.abandoned == 0 || stats.acquired == 0 {
		t.Errorf("%d attempts abandoned, %d acquired: the run tested little", stats.abandoned, stats.acquired)
	}
	for _, s := range samples {
		if at, ok := cleaned[s.Value]; ok && s.At.After(at) {
			t.Errorf("%s held the value of a failed attempt %v after its clean-up succeeded", s.Where, s.At.Sub(at))
		}
	}
	for key, ivs := range intervals {
		slices.SortFunc(ivs, func(a, b interval) int { return a.from.Compare(b.from) })
		permits := make([]int, len(ivs)) // semaphore holders that began earlier and still held
		for i, a := range ivs {
			for j := i + 1; j < len(ivs) && ivs[j].from.Before(a.till); j++ {
				b := ivs[j]
				if a.kind == backend.KindSemaphore && b.kind == backend.KindSemaphore {
					if permits[j]++; permits[j] >= b.limit {
						t.Errorf("%s: worker %d took a permit of a semaphore of limit %d that %d others held", key, b.worker, b.limit, permits[j])
					}
				} else if exclusive(a.kind, b.kind) {
					t.Errorf("%s: worker %d took a %v lock %v before worker %d's %v lock ended", key, b.worker, b.kind, a.till.Sub(b.from), a.worker, a.kind)
				}
			}
		}
	}
	if rs.Empty != nil {
		for _, k := range keys {
			rs.Empty(t, k)
		}
	}
}

// exclusive reports whether locks of kinds a and b of one key may not be
// held at once: two mutexes, or a writer and a reader or writer.
func exclusive(a, b backend.Kind) bool {
	switch {
	case a == backend.KindMutex && b == backend.KindMutex:
		return true
	case a == backend.KindWrite:
		return b == backend.KindRead || b == backend.KindWrite
	case b == backend.KindWrite:
		return a == backend.KindRead
	}
	return false
}

// newSpinLease is a fresh lease of key for ttl with a random owner value.
func newSpinLease(key string, ttl time.Duration) *backend.Lease {
	return &backend.Lease{Key: key, Value: fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64()), TTL: ttl}
}
