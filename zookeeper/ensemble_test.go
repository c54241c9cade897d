package zookeeper

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
)

// TestEnsembleLeaderKilled has several clients take turns on one key of a
// three-node ensemble while the leader is killed. No grant may find
// another holder that has neither released nor been told of its loss, the
// tokens rise across the failover, and nothing is left behind.
func TestEnsembleLeaderKilled(t *testing.T) {
	ens := testserver.ZooKeeperEnsemble(t, 3)
	const (
		clients = 4
		timeout = 6 * time.Second // rides out the election
	)
	key := uniqueKey(t)

	var (
		mu        sync.Mutex
		owner     *backend.Lease
		lastToken uint64
		failures  []string
	)
	var grants, storeErrs, lost atomic.Int64
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	var admin *Resource
	var wg sync.WaitGroup
	for i := range clients {
		conn := connectWith(t, ens.Addrs, connOpts{timeout: timeout})
		r := mustNew(t, conn, WithSessionTimeout(negotiated(t, conn)))
		t.Cleanup(func() { _ = r.Close() })
		if i == 0 {
			admin = r
		}
		wg.Go(func() {
			for ctx.Err() == nil {
				l := lease(key, time.Minute)
				err := r.Acquire(ctx, l, time.Now().Add(2*time.Second))
				switch {
				case errors.Is(err, backend.ErrNotAcquired), errors.Is(err, context.Canceled):
					continue
				case err != nil:
					storeErrs.Add(1) // the election: retry
					continue
				}
				mu.Lock()
				if owner != nil && !owner.Lost().Closed() {
					failures = append(failures, "double grant: "+pathOf(l)+" while "+pathOf(owner)+" held")
				}
				if l.Token <= lastToken {
					failures = append(failures, "token did not rise")
				}
				owner, lastToken = l, l.Token
				mu.Unlock()
				grants.Add(1)

				select { // the critical section
				case <-time.After(5 * time.Millisecond):
				case <-l.Lost().Done():
				}

				mu.Lock()
				if owner == l {
					owner = nil
				}
				mu.Unlock()
				if l.Lost().Closed() {
					lost.Add(1)
				}
				if err := r.Release(context.Background(), l); err != nil && !errors.Is(err, backend.ErrNotHeld) {
					storeErrs.Add(1) // deleted in the background
				}
			}
		})
	}

	// Besides the turns, one lock is held right across the failover.
	longKey := uniqueKey(t)
	long := lease(longKey, time.Minute)
	if err := admin.Acquire(t.Context(), long, time.Time{}); err != nil {
		t.Fatal(err)
	}

	waitFor(t, 20*time.Second, "grants before the failover", func() bool { return grants.Load() >= 20 })
	leader, err := ens.Leader()
	if err != nil {
		t.Fatal(err)
	}
	before := grants.Load()
	ens.Members[leader].Kill()
	waitFor(t, 30*time.Second, "a new leader", func() bool {
		i, err := ens.Leader()
		return err == nil && i != leader
	})
	waitFor(t, 30*time.Second, "grants after the failover", func() bool { return grants.Load() >= before+20 })
	cancel()
	wg.Wait()

	// The session lived through the election: the long lock is still held,
	// and nobody else gets it.
	if long.Lost().Closed() {
		t.Error("the lock held across the failover was reported lost")
	}
	if err := admin.Refresh(t.Context(), long); err != nil {
		t.Errorf("Refresh of the lock held across the failover: %v", err)
	}
	conn := connectWith(t, ens.Addrs, connOpts{timeout: timeout})
	other := mustNew(t, conn)
	t.Cleanup(func() { _ = other.Close() })
	if err := other.Acquire(t.Context(), lease(longKey, time.Minute), time.Time{}); !errors.Is(err, backend.ErrNotAcquired) {
		t.Errorf("another client's Acquire of the lock held across the failover = %v; want ErrNotAcquired", err)
	}
	if err := admin.Release(t.Context(), long); err != nil {
		t.Errorf("Release of the lock held across the failover: %v", err)
	}

	t.Logf("grants %d (%d after the kill), store errors %d, locks lost %d", grants.Load(), grants.Load()-before, storeErrs.Load(), lost.Load())
	for _, f := range failures {
		t.Error(f)
	}
	for _, k := range []string{key, longKey} {
		waitFor(t, 20*time.Second, "no children left", func() bool {
			cs, err := children(conn, admin, k)
			return err == nil && len(cs) == 0
		})
	}
}
