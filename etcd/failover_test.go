package etcd

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

// testFailover holds a lock with waiters queued behind it, stops the
// leader, and checks that the lock is never granted twice at once, that
// tokens keep increasing and that the store serves locks again after the
// election. restart brings the stopped member back.
func testFailover(t *testing.T, endpoints []string, stopLeader func() (restart func())) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			const waiters = 3
			key := uniqueKey(t)
			rs := make([]*Resource, waiters+1)
			for i := range rs {
				rs[i] = newResource(t, endpoints, m.opts...)
			}
			first := lease(key, 5*time.Second)
			if err := rs[0].Acquire(t.Context(), first, time.Time{}); err != nil {
				t.Fatal(err)
			}
			var (
				inside atomic.Int32
				mu     sync.Mutex
				tokens = []uint64{first.Token}
				errs   []error
				wg     sync.WaitGroup
			)
			for i := 1; i <= waiters; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					l := lease(key, 5*time.Second)
					if err := rs[i].Acquire(t.Context(), l, time.Now().Add(time.Minute)); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						return
					}
					if n := inside.Add(1); n != 1 {
						t.Errorf("%d holders at once", n)
					}
					mu.Lock()
					tokens = append(tokens, l.Token)
					mu.Unlock()
					time.Sleep(20 * time.Millisecond) // widen the window a second holder would use
					inside.Add(-1)
					release(t, rs[i], l)
				}()
				waitKeys(t, rs[0], key, i+1)
			}
			restart := stopLeader()
			defer restart()
			release(t, rs[0], first)
			wg.Wait()
			for i := 1; i < len(tokens); i++ {
				if tokens[i] <= tokens[i-1] {
					t.Errorf("tokens in grant order %v do not increase", tokens)
				}
			}
			t.Logf("granted %d of %d waiters; errors: %v", len(tokens)-1, waiters, errs)
			if len(errs) > 0 {
				t.Errorf("%d waiters failed across the election: %v", len(errs), errs)
			}
			// New locks work after the election.
			l := lease(uniqueKey(t), 5*time.Second)
			if err := retry(t, func(ctx context.Context) error { return rs[0].Acquire(ctx, l, time.Time{}) }); err != nil {
				t.Fatalf("acquire after the election: %v", err)
			}
			release(t, rs[0], l)
			waitKeys(t, rs[0], key, 0)
		})
	}
}

// release releases l, retrying store errors while a leader is elected.
func release(t *testing.T, r *Resource, l *backend.Lease) {
	t.Helper()
	err := retry(t, func(ctx context.Context) error { return r.Release(ctx, l) })
	if err != nil && !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release: %v", err)
	}
}

// retry calls f until it succeeds or returns ErrNotHeld, for 30s at most.
func retry(t *testing.T, f func(context.Context) error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		err := f(ctx)
		cancel()
		if err == nil || errors.Is(err, backend.ErrNotHeld) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond) // polling with a deadline
	}
}

// TestFailover runs on a three-member cluster whose leader is killed
// (SIGKILL: no graceful leadership transfer) while a lock is held and
// waiters queue.
func TestFailover(t *testing.T) {
	c := testserver.EtcdCluster(t, 3)
	testFailover(t, c.Endpoints(), func() (restart func()) {
		leader, err := c.Leader()
		if err != nil {
			t.Fatal(err)
		}
		c.Members[leader].Kill()
		return c.Members[leader].Start
	})
}
