package zookeeper

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/internal/testserver"
)

// stallSlack is how far past its bound a call may return here: the
// promise is a few milliseconds; the slack is for a loaded 2-core machine
// under the race detector (as testsuite's StalledStore case allows).
const stallSlack = time.Second

// stallWatchdog ends a stall that a call did not return from: code that
// waits for the server would otherwise wait as long as the test.
const stallWatchdog = 5 * time.Second

// stalled freezes the server (SIGSTOP) and returns a function that
// continues it (SIGCONT), once; the watchdog continues it on its own
// after stallWatchdog, and the test's cleanup at the latest.
func stalled(t *testing.T, zs *testserver.ZooKeeperServer) (resume func()) {
	t.Helper()
	zs.Pause()
	var once sync.Once
	cont := func() { once.Do(zs.Resume) }
	dog := time.AfterFunc(stallWatchdog, cont)
	resume = func() { dog.Stop(); cont() }
	t.Cleanup(resume)
	return resume
}

// TestStalledServer reproduces issue 26's table for ZooKeeper: with the
// server frozen (SIGSTOP), a TryLock with a 300ms context and a 5s wait, a
// TryLock with a 500ms wait, an Unlock with a 300ms context and a Close
// bounded to 500ms each return at their bound, whatever the server does;
// once it answers again, the abandoned attempts, whose creates land then
// (their keys were used before: the parent znode exists), are never
// granted the key and leave no znode, the lock Unlock could not release is released
// by the next Unlock, and the one Close gave up is gone.
//
// The session timeout is 10s, so go-zookeeper notices nothing during a
// stall (its receive timeout is 2/3 of it): what returns is the
// resource's doing, not the client's. Each call has a stall of its own,
// which the watchdog ends after 5s if the call does not return.
func TestStalledServer(t *testing.T) {
	zs := testserver.ZooKeeper(t)
	addrs := []string{zs.Addr}
	const session = 10 * time.Second
	var conns []*zk.Conn
	newLock := func() *distlock.DistributeLock {
		conn := connectWith(t, addrs, connOpts{timeout: session})
		conns = append(conns, conn)
		r := mustNew(t, conn, WithSessionTimeout(negotiated(t, conn)))
		d, err := distlock.New(r, distlock.WithCloseTimeout(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d
	}
	d, other := newLock(), newLock()
	admin := connectWith(t, addrs, connOpts{timeout: session})
	probe := mustNew(t, admin)
	ctx := t.Context()

	timed := func(t *testing.T, what string, bound time.Duration, fn func() error) error {
		t.Helper()
		start := time.Now()
		err := fn()
		el := time.Since(start)
		t.Logf("%s: returned after %v: %v", what, el.Round(time.Millisecond), err)
		if el > bound+stallSlack {
			t.Errorf("%s returned after %v; its bound was %v", what, el, bound)
		}
		return err
	}
	// settled waits for key's znodes to go, then checks that another
	// owner takes the key at once and that nothing is left after. A
	// request answered on each connection first: a connection's requests
	// are applied in order, so a create sent during the stall has landed
	// by then, if it lands at all, and the listing cannot miss it.
	settled := func(t *testing.T, key string) {
		t.Helper()
		start := time.Now()
		for _, c := range conns {
			if _, err := c.Sync("/"); err != nil {
				t.Fatalf("sync once the server answers: %v", err)
			}
		}
		waitFor(t, 10*time.Second, "no znode left for "+key, func() bool {
			cs, err := children(admin, probe, key)
			return err == nil && len(cs) == 0
		})
		t.Logf("%s: no znode left %v after SIGCONT", key, time.Since(start).Round(time.Millisecond))
		lk, err := other.TryLock(ctx, key, 0)
		if err != nil {
			t.Fatalf("TryLock of %s once the server answers = %v; want a lock (an abandoned attempt holds it?)", key, err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if cs := mustChildren(t, admin, probe, key); len(cs) != 0 {
			t.Errorf("znodes of %s after the last Unlock: %v", key, cs)
		}
	}

	// warm takes key once and lets it go: its parent znode exists then,
	// so a create sent during a stall lands once the server answers.
	warm := func(t *testing.T, key string) {
		t.Helper()
		lk, err := other.TryLock(ctx, key, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("TryLockContext", func(t *testing.T) {
		key := uniqueKey(t)
		warm(t, key)
		resume := stalled(t, zs)
		err := timed(t, "TryLock with a 300ms context and a 5s wait", 300*time.Millisecond, func() error {
			cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			lk, err := d.TryLock(cctx, key, 5*time.Second)
			if lk != nil {
				t.Errorf("TryLock on a frozen server returned a lock")
				defer lk.Unlock(ctx)
			}
			return err
		})
		resume()
		if !errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("TryLock = %v; want ErrNotAcquired joined with context.DeadlineExceeded", err)
		}
		settled(t, key)
	})

	t.Run("TryLockWait", func(t *testing.T) {
		key := uniqueKey(t)
		warm(t, key)
		resume := stalled(t, zs)
		err := timed(t, "TryLock with a 500ms wait", 500*time.Millisecond, func() error {
			lk, err := d.TryLock(ctx, key, 500*time.Millisecond)
			if lk != nil {
				t.Errorf("TryLock on a frozen server returned a lock")
				defer lk.Unlock(ctx)
			}
			return err
		})
		resume()
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, distlock.ErrNotAcquired) {
			t.Errorf("TryLock = %v; want a store error wrapping context.DeadlineExceeded, not ErrNotAcquired", err)
		}
		settled(t, key)
	})

	t.Run("Unlock", func(t *testing.T) {
		key := uniqueKey(t)
		lk, err := d.TryLock(ctx, key, 0)
		if err != nil {
			t.Fatal(err)
		}
		resume := stalled(t, zs)
		err = timed(t, "Unlock with a 300ms context", 300*time.Millisecond, func() error {
			cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			return lk.Unlock(cctx)
		})
		resume()
		if err == nil {
			t.Errorf("Unlock on a frozen server = nil; want an error")
		}
		if err := lk.Unlock(ctx); err != nil && !errors.Is(err, distlock.ErrNotHeld) {
			t.Errorf("Unlock once the server answers = %v; want nil or ErrNotHeld", err)
		}
		settled(t, key)
	})

	t.Run("Close", func(t *testing.T) {
		key := uniqueKey(t)
		closer := newLock()
		if _, err := closer.TryLock(ctx, key, 0); err != nil {
			t.Fatal(err)
		}
		resume := stalled(t, zs)
		err := timed(t, "Close bounded to 500ms", 500*time.Millisecond, closer.Close)
		resume()
		if err == nil {
			t.Errorf("Close on a frozen server = nil; want the release it could not make")
		}
		settled(t, key)
	})
}
