package testsuite

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
)

// Exercise runs a short workload over a and b, two resources over one store
// as two processes would have them, that starts every kind of goroutine the
// facade and a backend run: auto-renewal (when the backend can extend),
// Done's expiry timer, a waiter woken by a release (subscriptions,
// watches), a cancelled wait, Do, and a lock still held when Close is
// called. It then closes both DistributeLocks, which closes a and b when
// they implement io.Closer.
//
// A backend's goroutine-leak test starts its server, takes a snapshot of
// the goroutines (goleak.IgnoreCurrent), runs Exercise, closes its
// clients, and checks that no goroutine outlived them:
//
//	srv := testserver.Redis(t)
//	before := goleak.IgnoreCurrent()
//	c1, c2 := newClient(srv.Addr), newClient(srv.Addr)
//	testsuite.Exercise(t, mustNew(t, c1), mustNew(t, c2), 300*time.Millisecond)
//	c1.Close(); c2.Close()
//	goleak.VerifyNone(t, before)
//
// ttl is the lock TTL; the workload lasts a few of them.
func Exercise(t *testing.T, a, b backend.RemoteResource, ttl time.Duration) {
	t.Helper()
	opts := []distlock.Option{distlock.WithDefaultTTL(ttl), distlock.WithSpin(5*time.Millisecond, 5*time.Millisecond)}
	_, ra := a.(backend.Refresher)
	_, rb := b.(backend.Refresher)
	if ra && rb {
		opts = append(opts, distlock.WithAutoRenew())
	}
	sig := &signal{entered: make(chan struct{}, 1)}
	da := newManual(t, a, opts...)
	db := newManual(t, b, append(opts, distlock.WithHandlers(sig))...)
	closed := false
	defer func() {
		if !closed { // a failed check: still close, so the next test starts clean
			_ = da.Close()
			_ = db.Close()
		}
	}()
	ctx := t.Context()
	key := Key(t)

	// A held lock, watched, and a waiter woken by its release.
	lk := mustLock(t, da, ctx, key, 0)
	_ = lk.Done()
	type result struct {
		lk  *distlock.Lock
		err error
	}
	res := make(chan result, 1)
	go func() {
		lk, err := db.TryLock(ctx, key, 30*time.Second)
		res <- result{lk, err}
	}()
	select {
	case <-sig.entered:
	case <-time.After(hangLimit):
		t.Fatalf("the waiter's TryLock did not reach the handler chain")
	}
	time.Sleep(ttl) // the waiter queues or subscribes; the holder renews
	mustUnlock(t, lk)
	var got result
	select {
	case got = <-res:
	case <-time.After(hangLimit):
		t.Fatalf("the waiter did not get %q within %v of its release", key, hangLimit)
	}
	if got.err != nil {
		t.Fatalf("waiter: TryLock = %v; want the lock once released", got.err)
	}
	_ = got.lk.Done()

	// A wait cancelled while the lock is held.
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(ttl/4, cancel)
	if lk, err := da.TryLock(cctx, key, time.Minute); lk != nil || !errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("cancelled wait = %v, %v; want ErrNotAcquired", lk, err)
	}
	cancel()
	mustUnlock(t, got.lk)

	// Do, nested.
	err := db.Do(ctx, key, time.Second, func(ctx context.Context, _ *distlock.Lock) error {
		return db.Do(ctx, key, 0, func(context.Context, *distlock.Lock) error { return nil })
	})
	if err != nil {
		t.Fatalf("Do = %v", err)
	}

	// Locks left held, with renewal running: Close releases them.
	held := mustLock(t, da, ctx, key, 0)
	_ = held.Done()
	_ = mustLock(t, db, ctx, Key(t), 0)
	closed = true
	if err := da.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	waitClosed(t, held.Done(), time.Second, "Close")
}
