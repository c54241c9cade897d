//go:build !race

// TestRandomizedStalls runs without the race detector: it makes
// go-zookeeper reconnect with watches set many times, and go-zookeeper
// v1.0.4 (the latest) races with itself on every such reconnect
// (Conn.lastZxid, written by recvLoop while sendSetWatches reads it:
// go-zookeeper/zk pull request #35, open since 2020). make test runs it in
// a pass of its own without -race; every other test of the module runs
// with it.

package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/testsuite"
)

// TestRandomizedStalls freezes the server at random (SIGSTOP, from 20ms
// to past go-zookeeper's receive timeout) while clients acquire, refresh
// and release with contexts that end at random moments, so that requests
// are abandoned in flight at every step: the create, the listing, the
// watch, the stat, the delete. Invariants: every call returns by its
// context's end (plus testsuite.StallSlack); no grant while another
// holder of the key has neither released nor seen its Lost closed; tokens
// rise per key;
// an abandoned attempt fills nothing in its lease; once the server
// answers again, every abandoned attempt's Cleanup returns nil, after
// which no znode and no watch is left.
func TestRandomizedStalls(t *testing.T) {
	zs := testserver.ZooKeeper(t)
	addrs := []string{zs.Addr}
	seed := randomSeed(t)
	t.Logf("seed %d (DISTLOCK_SEED=%d reruns it)", seed, seed)
	rnd := rand.New(rand.NewPCG(seed, 0))
	var rmu sync.Mutex
	intn := func(n int) int {
		rmu.Lock()
		defer rmu.Unlock()
		return rnd.IntN(n)
	}
	between := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(intn(int(hi-lo)))
	}

	const session = 3 * time.Second // receive timeout 2s
	type client struct {
		r    *Resource
		conn *zk.Conn
	}
	var clients []client
	for i := range 3 {
		conn := connectWith(t, addrs, connOpts{timeout: session})
		var opts []Option
		if i > 0 {
			opts = append(opts, WithSessionTimeout(negotiated(t, conn)))
		}
		r := mustNew(t, conn, opts...)
		t.Cleanup(func() { _ = r.Close() })
		clients = append(clients, client{r, conn})
	}
	admin := connectWith(t, addrs, connOpts{timeout: session})
	probe := mustNew(t, admin) // for parentPath only
	keys := []string{uniqueKey(t), uniqueKey(t)}

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
		if late := time.Since(end); late > testsuite.StallSlack {
			fail("%s returned %v after its context ended: %v", what, late, err)
		}
		return err
	}
	var grants, notAcquired, abandoned, ctxErrs, storeErrs, releaseTimeouts atomic.Int64

	run, stop := context.WithTimeout(t.Context(), 15*time.Second)
	defer stop()
	var wg sync.WaitGroup
	for ci, c := range clients {
		for g := range 3 {
			wg.Go(func() {
				for run.Err() == nil {
					key := keys[intn(len(keys))]
					l := lease(key, time.Minute)
					deadline := time.Time{}
					if intn(4) > 0 {
						deadline = time.Now().Add(between(time.Millisecond, 500*time.Millisecond))
					}
					err := bounded("Acquire", 600*time.Millisecond, func(ctx context.Context) error {
						return c.r.Acquire(ctx, l, deadline)
					})
					var ab *backend.AbandonedError
					if errors.As(err, &ab) {
						abandoned.Add(1)
						mu.Lock()
						cleanups = append(cleanups, ab.Cleanup)
						mu.Unlock()
					}
					if err != nil {
						if l.Handle != nil || l.Lost != nil || l.Token != 0 {
							fail("a failed Acquire (%v) filled its lease: %+v", err, l)
						}
						switch {
						case errors.Is(err, backend.ErrNotAcquired):
							notAcquired.Add(1)
						case errors.Is(err, context.DeadlineExceeded):
							ctxErrs.Add(1)
						default:
							storeErrs.Add(1) // the connection failed
						}
						continue
					}
					grants.Add(1)
					mu.Lock()
					if o := owner[key]; o != nil && !closed(o.Lost) {
						fail("double grant of %s: %s (client %d/%d) while %s held", key, pathOf(l), ci, g, pathOf(o))
					}
					if l.Token <= lastToken[key] {
						fail("token of %s did not rise: %d after %d", key, l.Token, lastToken[key])
					}
					owner[key], lastToken[key] = l, l.Token
					mu.Unlock()

					if intn(2) == 0 { // hold a while, refreshing once
						select {
						case <-time.After(between(0, 300*time.Millisecond)):
						case <-l.Lost:
						}
						_ = bounded("Refresh", 300*time.Millisecond, func(ctx context.Context) error {
							return c.r.Refresh(ctx, l)
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
							return c.r.Release(ctx, l)
						})
						if err == nil || errors.Is(err, backend.ErrNotHeld) {
							break
						}
						if errors.Is(err, context.DeadlineExceeded) {
							releaseTimeouts.Add(1)
						}
						if run.Err() != nil {
							break // deleted in the background
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
			length = between(2*time.Second, 2500*time.Millisecond) // past the receive timeout
		}
		stalls = append(stalls, length)
		zs.Pause()
		time.Sleep(length) // the fault's length
		zs.Resume()
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

	for i, c := range clients {
		waitFor(t, 30*time.Second, fmt.Sprintf("client %d back in session", i), func() bool { return c.conn.State() == zk.StateHasSession })
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, clean := range cleanups {
		if err := clean(ctx); err != nil {
			t.Errorf("Cleanup of an abandoned attempt = %v; want nil", err)
		}
	}
	for _, key := range keys {
		// The released locks whose delete was cut go in the background.
		waitFor(t, 20*time.Second, "no znode left for "+key, func() bool {
			cs, err := children(admin, probe, key)
			return err == nil && len(cs) == 0
		})
	}
	for i, c := range clients {
		waitFor(t, 10*time.Second, fmt.Sprintf("client %d's watches to fire", i), func() bool { return clientWatchers(t, c.conn) == 0 })
	}
}
