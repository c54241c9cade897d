package testsuite

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock/backend"
)

// Rand is a seeded source of random numbers, safe for concurrent use: one
// seed drives a randomized test's choices, its proxies' delays and its
// freezes, so that the seed the test logs names the run.
type Rand struct {
	mu sync.Mutex
	r  *rand.Rand
}

// NewRand returns a Rand seeded with seed.
func NewRand(seed uint64) *Rand {
	return &Rand{r: rand.New(rand.NewPCG(seed, 0))}
}

// IntN returns a number in [0, n); n must be > 0.
func (r *Rand) IntN(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.r.IntN(n)
}

// Duration returns a duration in [0, d); d must be > 0.
func (r *Rand) Duration(d time.Duration) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return time.Duration(r.r.Int64N(int64(d)))
}

// StallingWaiter is a push store's resource as RunRandomStalls drives it.
type StallingWaiter interface {
	backend.Waiter
	backend.Refresher
}

// RandomStalls is what RunRandomStalls needs of a push store: its
// clients and how to freeze its server.
type RandomStalls struct {
	// Clients are the resources the workers go through; Goroutines
	// workers share each (default 2).
	Clients    []StallingWaiter
	Goroutines int
	// Run is how long the workers run (default 12s).
	Run time.Duration
	// Seed seeds the random choices; the test logs it.
	Seed uint64
	// Pause freezes the store's server (SIGSTOP) and Resume continues it.
	Pause, Resume func()
	// Lease, if not nil, changes a fresh lease of a minute before its
	// acquisition (etcd: another TTL now and then, auto-renewed or not),
	// with the test's random numbers.
	Lease func(l *backend.Lease, intn func(n int) int)
	// Name names a held lease in messages: its queue entry.
	Name func(l *backend.Lease) string
	// ReleaseInBackground: a Release cut by its context finishes in the
	// background, so that a worker stops retrying it once the run is over.
	ReleaseInBackground bool
	// Settle, if not nil, waits until every client can reach the store
	// again once the stalls are over (ZooKeeper: back in session), before
	// the abandoned attempts' clean-ups run.
	Settle func(t *testing.T)
	// Empty waits until the store keeps no entry of key (nor anything
	// else of it), and fails the test if that does not come.
	Empty func(t *testing.T, key string)
}

// RunRandomStalls freezes the store's server at random (from 20ms to
// 2.5s, a fifth of the stalls 2s or more) while workers acquire,
// refresh and release with contexts that end at random moments, so that
// requests are abandoned in flight at every step. Invariants: every call
// returns by its context's end (plus StallSlack); no grant while another
// holder of the key has neither released nor seen its Lost closed;
// tokens rise per key; a failed Acquire fills nothing in its lease; once
// the server answers again, every abandoned attempt's Cleanup returns
// nil, after which nothing of any key is left (Empty).
func RunRandomStalls(t *testing.T, rs RandomStalls) {
	if len(rs.Clients) == 0 || rs.Pause == nil || rs.Resume == nil || rs.Name == nil || rs.Empty == nil {
		t.Fatal("testsuite: RandomStalls needs Clients, Pause, Resume, Name and Empty")
	}
	goroutines := rs.Goroutines
	if goroutines <= 0 {
		goroutines = 2
	}
	runFor := rs.Run
	if runFor <= 0 {
		runFor = 12 * time.Second
	}
	t.Logf("seed %d", rs.Seed)
	intn := NewRand(rs.Seed).IntN
	between := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(intn(int(hi-lo)+1))
	}
	keys := []string{Key(t), Key(t)}

	var (
		mu        sync.Mutex
		owner     = map[string]*backend.Lease{}
		lastToken = map[string]uint64{}
		failures  []string
		cleanups  []func(context.Context) error
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	// bounded runs fn under a context that ends after between(0, max)
	// and checks that it returns by then.
	bounded := func(what string, max time.Duration, fn func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.Background(), between(0, max))
		defer cancel()
		err := fn(ctx)
		end, _ := ctx.Deadline()
		if late := time.Since(end); late > StallSlack {
			fail("%s returned %v after its context ended: %v", what, late, err)
		}
		return err
	}
	var grants, notAcquired, abandoned, ctxErrs, storeErrs, releaseTimeouts, owners atomic.Int64

	run, stop := context.WithTimeout(t.Context(), runFor)
	defer stop()
	var wg sync.WaitGroup
	for ci, c := range rs.Clients {
		for g := range goroutines {
			wg.Go(func() {
				for run.Err() == nil {
					key := keys[intn(len(keys))]
					l := &backend.Lease{Key: key, Value: fmt.Sprintf("owner-%d-%d", rs.Seed, owners.Add(1)), TTL: time.Minute}
					if rs.Lease != nil {
						rs.Lease(l, intn)
					}
					deadline := time.Time{}
					if intn(4) > 0 {
						deadline = time.Now().Add(between(time.Millisecond, 500*time.Millisecond))
					}
					err := bounded("Acquire", 600*time.Millisecond, func(ctx context.Context) error {
						return c.Acquire(ctx, l, deadline)
					})
					var ab *backend.AbandonedError
					if errors.As(err, &ab) {
						abandoned.Add(1)
						mu.Lock()
						cleanups = append(cleanups, ab.Cleanup)
						mu.Unlock()
					}
					if err != nil {
						if l.Handle != nil || l.Lost() != nil || l.Token != 0 {
							fail("a failed Acquire (%v) filled its lease: %+v", err, l)
						}
						switch {
						case errors.Is(err, backend.ErrNotAcquired):
							notAcquired.Add(1)
						case errors.Is(err, context.DeadlineExceeded):
							ctxErrs.Add(1)
						default:
							storeErrs.Add(1)
						}
						continue
					}
					grants.Add(1)
					mu.Lock()
					if o := owner[key]; o != nil && (o.Lost() == nil || !o.Lost().Closed()) {
						fail("double grant of %s: %s (client %d/%d) while %s held", key, rs.Name(l), ci, g, rs.Name(o))
					}
					if l.Token <= lastToken[key] {
						fail("token of %s did not rise: %d after %d", key, l.Token, lastToken[key])
					}
					owner[key], lastToken[key] = l, l.Token
					mu.Unlock()

					if intn(2) == 0 { // hold a while, refreshing once
						var lost <-chan struct{}
						if l.Lost() != nil {
							lost = l.Lost().Done()
						}
						select {
						case <-time.After(between(0, 300*time.Millisecond)):
						case <-lost:
						}
						_ = bounded("Refresh", 300*time.Millisecond, func(ctx context.Context) error {
							return c.Refresh(ctx, l)
						})
					}
					mu.Lock()
					if owner[key] == l {
						owner[key] = nil
					}
					mu.Unlock()
					// Release until it is answered, as a caller retrying
					// Unlock would: a lock left held blocks the others.
					for {
						err := bounded("Release", 300*time.Millisecond, func(ctx context.Context) error {
							return c.Release(ctx, l)
						})
						if err == nil || errors.Is(err, backend.ErrNotHeld) {
							break
						}
						if errors.Is(err, context.DeadlineExceeded) {
							releaseTimeouts.Add(1)
						}
						if rs.ReleaseInBackground && run.Err() != nil {
							break
						}
					}
				}
			})
		}
	}

	var stalls []time.Duration
	for run.Err() == nil {
		select {
		case <-time.After(between(100*time.Millisecond, 800*time.Millisecond)):
		case <-run.Done():
		}
		if run.Err() != nil {
			break
		}
		length := between(20*time.Millisecond, time.Second)
		if intn(5) == 0 {
			length = between(2*time.Second, 2500*time.Millisecond)
		}
		stalls = append(stalls, length)
		rs.Pause()
		time.Sleep(length) // the fault's length
		rs.Resume()
	}
	wg.Wait()
	t.Logf("%d grants, %d not acquired, %d ended by their context (%d abandoned in flight), %d store errors, %d releases cut by their context; stalls %v",
		grants.Load(), notAcquired.Load(), ctxErrs.Load(), abandoned.Load(), storeErrs.Load(), releaseTimeouts.Load(), stalls)
	for _, f := range failures {
		t.Error(f)
	}
	if grants.Load() == 0 || abandoned.Load() == 0 {
		t.Errorf("%d grants, %d abandoned attempts: the run tested nothing", grants.Load(), abandoned.Load())
	}
	if rs.Settle != nil {
		rs.Settle(t)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, clean := range cleanups {
		if err := clean(ctx); err != nil {
			t.Errorf("Cleanup of an abandoned attempt = %v; want nil", err)
		}
	}
	for _, key := range keys {
		rs.Empty(t, key)
	}
}
