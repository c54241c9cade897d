package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
)

// randomSeed is DISTLOCK_SEED when set (to rerun a failure), else a fresh
// one; the test logs it.
func randomSeed(t *testing.T) uint64 {
	if v := os.Getenv("DISTLOCK_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("DISTLOCK_SEED=%q: %v", v, err)
		}
		return n
	}
	return rand.Uint64()
}

// TestRandomized runs clients that take turns on a few keys with random
// waits, cancellations and holding times while their networks fail at
// random: refused and reset connections, silences shorter than the
// session, and silences long enough for the server to expire it. Some
// resources know the session timeout (WithSessionTimeout), one does not.
// Half the locks are kept alive by the session (AutoRenew), half by their
// TTL. Invariants: no grant while another holder of the key has neither
// released nor seen its Lost closed; tokens rise per key; once everyone
// stopped and the network healed, no znode and no watch is left.
func TestRandomized(t *testing.T) {
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

	timeout := negotiated(t, connect(t, addrs))
	type client struct {
		r    *Resource
		conn *zk.Conn
		fd   *faultDialer
	}
	var clients []client
	for i := range 4 {
		var opts []Option
		if i > 0 {
			opts = append(opts, WithSessionTimeout(timeout))
		}
		r, conn, fd := faultyResource(t, addrs, opts...)
		clients = append(clients, client{r, conn, fd})
	}
	_, admin := newResource(t, addrs)
	keys := []string{uniqueKey(t), uniqueKey(t)}
	probe := mustNew(t, admin) // for parentPath only

	var (
		mu        sync.Mutex
		owner     = map[string]*backend.Lease{}
		ownerOf   = map[string]int{} // key -> client of owner[key]
		lastToken = map[string]uint64{}
		failures  []string
	)
	var grants, notAcquired, cancelled, storeErrs, lost atomic.Int64

	ctx, stop := context.WithTimeout(t.Context(), 12*time.Second)
	defer stop()
	var wg sync.WaitGroup
	for ci, c := range clients {
		for g := range 3 {
			wg.Go(func() {
				for ctx.Err() == nil {
					key := keys[intn(len(keys))]
					l := lease(key, time.Minute)
					l.AutoRenew = intn(2) == 0 // kept alive by the session, or by its TTL
					actx, cancel := context.WithCancel(ctx)
					if intn(4) == 0 {
						time.AfterFunc(between(0, 200*time.Millisecond), cancel)
					}
					deadline := time.Time{}
					if intn(5) > 0 {
						deadline = time.Now().Add(between(time.Millisecond, 400*time.Millisecond))
					}
					err := c.r.Acquire(actx, l, deadline)
					cancel()
					switch {
					case errors.Is(err, backend.ErrNotAcquired):
						notAcquired.Add(1)
						continue
					case errors.Is(err, context.Canceled):
						cancelled.Add(1)
						continue
					case err != nil:
						storeErrs.Add(1) // the network failed: try again
						continue
					}
					grants.Add(1)
					mu.Lock()
					if o := owner[key]; o != nil && !o.Lost().Closed() {
						failures = append(failures, fmt.Sprintf("double grant of %s: %s (client %d/%d) while %s held",
							key, pathOf(l), ci, g, pathOf(o)))
					}
					if l.Token <= lastToken[key] {
						failures = append(failures, fmt.Sprintf("token of %s did not rise: %d after %d", key, l.Token, lastToken[key]))
					}
					owner[key], lastToken[key], ownerOf[key] = l, l.Token, ci
					mu.Unlock()

					hold := between(0, 50*time.Millisecond)
					if intn(3) == 0 {
						hold = between(0, 2*timeout)
					}
					select { // the critical section
					case <-time.After(hold):
					case <-l.Lost().Done():
					}

					mu.Lock()
					if owner[key] == l {
						owner[key] = nil
					}
					mu.Unlock()
					if l.Lost().Closed() {
						lost.Add(1)
					}
					err = c.r.Release(context.Background(), l)
					if err != nil && !errors.Is(err, backend.ErrNotHeld) {
						storeErrs.Add(1) // deleted in the background
					}
				}
			})
		}
	}

	// The network fails at random, one client at a time.
	var faults []string
	for ctx.Err() == nil {
		select {
		case <-time.After(between(100*time.Millisecond, 600*time.Millisecond)):
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		ci := intn(len(clients))
		if intn(2) == 0 { // strike a holder
			mu.Lock()
			if key := keys[intn(len(keys))]; owner[key] != nil {
				ci = ownerOf[key]
				faults = append(faults, "holder:")
			}
			mu.Unlock()
		}
		fd := clients[ci].fd
		var length time.Duration
		switch intn(10) {
		case 0, 1, 2:
			length = between(10*time.Millisecond, 300*time.Millisecond)
			faults = append(faults, fmt.Sprintf("client %d blocked %v", ci, length))
			fd.block()
			time.Sleep(length) // the fault's length
			fd.unblock()
		case 3, 4, 5, 6:
			length = between(10*time.Millisecond, timeout/2)
			faults = append(faults, fmt.Sprintf("client %d silent %v", ci, length))
			fd.silence()
			time.Sleep(length) // the fault's length
			fd.speak()
		default:
			length = timeout + between(0, timeout/2)
			faults = append(faults, fmt.Sprintf("client %d silent %v (session expires)", ci, length))
			fd.silence()
			time.Sleep(length) // the fault's length
			fd.speak()
		}
	}
	wg.Wait()
	t.Logf("%d grants (%d lost), %d not acquired, %d cancelled, %d store errors; faults: %v",
		grants.Load(), lost.Load(), notAcquired.Load(), cancelled.Load(), storeErrs.Load(), faults)
	for _, f := range failures {
		t.Error(f)
	}
	if grants.Load() == 0 {
		t.Error("no grants: the run measured nothing")
	}

	for _, c := range clients {
		waitFor(t, 20*time.Second, "the clients back in session", func() bool { return c.conn.State() == zk.StateHasSession })
	}
	for _, key := range keys {
		waitFor(t, 20*time.Second, "no znode left for "+key, func() bool {
			cs, _, err := admin.Children(probe.parentPath(key))
			return errors.Is(err, zk.ErrNoNode) || err == nil && len(cs) == 0
		})
	}
	for i, c := range clients {
		waitFor(t, 10*time.Second, fmt.Sprintf("client %d's watches to fire", i), func() bool { return clientWatchers(t, c.conn) == 0 })
	}
}
