package hotspot_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/hotspot"
)

// newLock returns a DistributeLock over store with handlers, closed at the
// end of the test.
func newLock(t *testing.T, store backend.RemoteResource, h ...distlock.Handler) *distlock.DistributeLock {
	t.Helper()
	d, err := distlock.New(store, distlock.WithDefaultTTL(5*time.Second), distlock.WithHandlers(h...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// poll waits until cond holds, failing the test after a few seconds.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// contend runs goroutines x n acquisitions of key, each held for hold,
// and returns the successes. A guarded counter checks mutual exclusion.
func contend(t *testing.T, d *distlock.DistributeLock, key string, goroutines, n int, hold time.Duration) int {
	t.Helper()
	var (
		wg       sync.WaitGroup
		ok       atomic.Int64
		counter  atomic.Int64
		failures = make(chan error, goroutines*n)
	)
	for range goroutines {
		wg.Go(func() {
			for range n {
				lk, err := d.TryLock(t.Context(), key, 10*time.Second)
				if err != nil {
					failures <- err
					continue
				}
				v := counter.Load()
				time.Sleep(hold) // the work under the lock
				counter.Store(v + 1)
				ok.Add(1)
				if err := lk.Unlock(t.Context()); err != nil {
					failures <- err
				}
			}
		})
	}
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Errorf("contend %q: %v", key, err)
	}
	if got, want := counter.Load(), ok.Load(); got != want {
		t.Errorf("guarded counter = %d; want %d (two holders overlapped)", got, want)
	}
	return int(ok.Load())
}

func TestHotspotCutsRemoteAttempts(t *testing.T) {
	const goroutines, n = 8, 30
	store := memory.New()
	key := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	hot := hotspot.New(key + "-hot")

	metHot, metCold := newCounter(), newCounter()
	dHot := newLock(t, store, metHot, hot)
	dCold := newLock(t, store, metCold, hot)

	okHot := contend(t, dHot, key+"-hot", goroutines, n, time.Millisecond)
	okCold := contend(t, dCold, key+"-cold", goroutines, n, time.Millisecond)
	if okHot != goroutines*n || okCold != goroutines*n {
		t.Fatalf("successes hot %d, cold %d; want %d each", okHot, okCold, goroutines*n)
	}
	hotRatio := float64(metHot.Stats().RemoteAttempts) / float64(okHot)
	coldRatio := float64(metCold.Stats().RemoteAttempts) / float64(okCold)
	t.Logf("remote attempts per success: registered %.2f, unregistered %.2f", hotRatio, coldRatio)
	if hotRatio > 1.5 {
		t.Errorf("registered key: %.2f remote attempts per success; want <= 1.5", hotRatio)
	}
	// Without the hotspot the facade already wakes one waiter per release
	// notice (its waiters share a subscription), but a goroutine that just
	// unlocked races the woken one, and the spin timers fire: about 1.9
	// attempts per success here, against the hotspot's 1.
	if hotRatio >= coldRatio {
		t.Errorf("registered key: %.2f remote attempts per success; want fewer than the unregistered key's %.2f", hotRatio, coldRatio)
	}
}

// TestHotspotSeveralProcesses runs the seed workload in miniature: three
// DistributeLocks, each with its own hotspot handler, over one store.
func TestHotspotSeveralProcesses(t *testing.T) {
	const instances, goroutines, n = 3, 4, 10
	store := memory.New()
	key := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	met := newCounter()
	var wg sync.WaitGroup
	var total atomic.Int64
	var counter atomic.Int64
	for range instances {
		d := newLock(t, store, met, hotspot.New(key))
		wg.Go(func() {
			for range goroutines {
				wg.Go(func() {
					for range n {
						lk, err := d.TryLock(t.Context(), key, 10*time.Second)
						if err != nil {
							t.Error(err)
							continue
						}
						v := counter.Load()
						time.Sleep(time.Millisecond)
						counter.Store(v + 1)
						total.Add(1)
						if err := lk.Unlock(t.Context()); err != nil {
							t.Error(err)
						}
					}
				})
			}
		})
	}
	wg.Wait()
	if got, want := total.Load(), int64(instances*goroutines*n); got != want {
		t.Fatalf("successes = %d; want %d", got, want)
	}
	if got, want := counter.Load(), total.Load(); got != want {
		t.Errorf("guarded counter = %d; want %d", got, want)
	}
	if s := met.Stats(); s.Held != 0 || s.Waiting != 0 {
		t.Errorf("held %d, waiting %d after the run; want 0, 0", s.Held, s.Waiting)
	}
}

func TestHotspotLocalWaitHonoursBudget(t *testing.T) {
	store := memory.New()
	key := t.Name()
	met := newCounter()
	d := newLock(t, store, met, hotspot.New(key))

	lk, err := d.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	base := met.Stats().RemoteAttempts

	// wait 0: one local attempt, no remote one.
	if _, err := d.TryLock(t.Context(), key, 0); !errors.Is(err, distlock.ErrNotAcquired) {
		t.Errorf("TryLock(wait 0) = %v; want ErrNotAcquired", err)
	}
	// wait > 0: times out locally.
	if _, err := d.TryLock(t.Context(), key, 20*time.Millisecond); !errors.Is(err, distlock.ErrNotAcquired) {
		t.Errorf("TryLock(wait 20ms) = %v; want ErrNotAcquired", err)
	}
	// ctx ends while waiting locally.
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := d.TryLock(ctx, key, time.Minute)
		errc <- err
	}()
	poll(t, "the third caller waits", func() bool { return met.Stats().Waiting == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Errorf("TryLock(cancelled) = %v; want ErrNotAcquired joined with context.Canceled", err)
	}
	// an already ended ctx
	if _, err := d.TryLock(ctx, key, time.Minute); !errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Errorf("TryLock(ended ctx) = %v; want ErrNotAcquired joined with context.Canceled", err)
	}

	if got := met.Stats().RemoteAttempts; got != base {
		t.Errorf("remote attempts grew from %d to %d; local timeouts must not reach the store", base, got)
	}
	if s := met.Stats(); s.NotAcquired != 4 || s.Failed != 0 {
		t.Errorf("NotAcquired %d, Failed %d; want 4, 0", s.NotAcquired, s.Failed)
	}
	if err := lk.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	lk, err = d.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatalf("TryLock after Unlock = %v; the local lock was not freed", err)
	}
	lk.Unlock(t.Context())
}

// faulty fails TryAcquire with errStore on its failAt-th call.
type faulty struct {
	*memory.Store
	calls, failAt atomic.Int64
}

var errStore = errors.New("store unreachable")

func (f *faulty) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	if f.calls.Add(1) == f.failAt.Load() {
		return false, 0, fmt.Errorf("faulty: acquire %q: %w", l.Key, errStore)
	}
	return f.Store.TryAcquire(ctx, l)
}

func TestHotspotFreesLocalLockWhenRemoteFails(t *testing.T) {
	store := memory.New()
	key := t.Name()
	other := newLock(t, store) // another process, no hotspot
	f := &faulty{Store: store}
	f.failAt.Store(-1)
	d := newLock(t, f, hotspot.New(key))

	// contention: the remote acquire times out, and the local lock is freed.
	theirs, err := other.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryLock(t.Context(), key, 30*time.Millisecond); !errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("TryLock while another process holds it = %v; want ErrNotAcquired", err)
	}
	if err := theirs.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	lk, err := d.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatalf("TryLock after a remote timeout = %v; the local lock was kept", err)
	}
	if err := lk.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}

	// a store error: returned as is, and the local lock is freed.
	f.failAt.Store(f.calls.Load() + 1)
	if _, err := d.TryLock(t.Context(), key, time.Second); !errors.Is(err, errStore) || errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("TryLock with a failing store = %v; want the store's error, not ErrNotAcquired", err)
	}
	lk, err = d.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatalf("TryLock after a store error = %v; the local lock was kept", err)
	}
	lk.Unlock(t.Context())
}

// probe is a handler that runs a function after the inner release.
type probe struct {
	afterRelease func()
}

func (p *probe) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	return next(ctx, r)
}

func (p *probe) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	err := next(ctx, r)
	if p.afterRelease != nil {
		p.afterRelease()
	}
	return err
}

func TestHotspotReleasesLocalAfterRemote(t *testing.T) {
	store := memory.New()
	key := t.Name()
	p := &probe{}
	met := newCounter()
	d := newLock(t, store, met, hotspot.New(key), p)

	var during error
	var remoteFree bool
	p.afterRelease = func() {
		// The store has released; the local lock must still be held.
		_, ok := func() (string, bool) { v, _, ok := store.Holder(key); return v, ok }()
		remoteFree = !ok
		_, during = d.TryLock(context.Background(), key, 0)
	}
	lk, err := d.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	before := met.Stats().RemoteAttempts
	if err := lk.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !remoteFree {
		t.Errorf("the store still held %q after the inner release", key)
	}
	if !errors.Is(during, distlock.ErrNotAcquired) {
		t.Errorf("TryLock between the remote and the local release = %v; want ErrNotAcquired (local lock still held)", during)
	}
	if got := met.Stats().RemoteAttempts; got != before {
		t.Errorf("the attempt between the releases reached the store (%d -> %d attempts)", before, got)
	}
	p.afterRelease = nil
	lk, err = d.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatalf("TryLock after Unlock = %v", err)
	}
	lk.Unlock(t.Context())
}

func TestHotspotUnregisterWhileHeld(t *testing.T) {
	store := memory.New()
	key := t.Name()
	hot := hotspot.New(key)
	met := newCounter()
	d := newLock(t, store, met, hot)

	lk, err := d.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A waiter queued on the local lock before Unregister.
	got := make(chan *distlock.Lock, 1)
	go func() {
		l, err := d.TryLock(t.Context(), key, 10*time.Second)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	poll(t, "the waiter queues", func() bool { return met.Stats().Waiting == 1 })
	before := met.Stats().RemoteAttempts

	hot.Unregister(key)
	if h := hot.Hot(); len(h) != 0 {
		t.Errorf("Hot() after Unregister = %v; want none", h)
	}
	// A new caller goes straight to the store.
	if _, err := d.TryLock(t.Context(), key, 0); !errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("TryLock after Unregister = %v; want ErrNotAcquired", err)
	}
	if got := met.Stats().RemoteAttempts; got != before+1 {
		t.Errorf("remote attempts %d -> %d; want one more: an unregistered key reaches the store", before, got)
	}
	if err := lk.Unlock(t.Context()); err != nil {
		t.Fatalf("Unlock after Unregister = %v", err)
	}
	l := <-got
	if l == nil {
		t.Fatal("the queued waiter did not get the lock")
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Registering again works.
	hot.Register(key)
	if h := hot.Hot(); len(h) != 1 || h[0] != key {
		t.Errorf("Hot() = %v; want [%s]", h, key)
	}
}

func TestNewWithOptionsRejectsBadValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  hotspot.Option
	}{
		{"nil", nil},
		{"threshold 0", hotspot.WithAutoDetect(0, 1)},
		{"capacity 0", hotspot.WithAutoDetect(2, 0)},
		{"idle 0", hotspot.WithIdleAfter(0)},
	} {
		if h, err := hotspot.NewWithOptions(tc.opt); err == nil || h != nil {
			t.Errorf("%s: NewWithOptions = %v, %v; want an error", tc.name, h, err)
		}
	}
}

// failRelease fails the next Release with errStore when armed.
type failRelease struct {
	*memory.Store
	armed atomic.Bool
}

func (f *failRelease) Release(ctx context.Context, l *backend.Lease) error {
	if f.armed.CompareAndSwap(true, false) {
		return fmt.Errorf("failRelease: release %q: %w", l.Key, errStore)
	}
	return f.Store.Release(ctx, l)
}

// TestHotspotReleaseErrorFreesLocalLock: a release the store failed still
// frees the local lock (the remote lock ends with its TTL at the latest),
// and a second Unlock releases the store without touching the local lock
// another goroutine took meanwhile.
func TestHotspotReleaseErrorFreesLocalLock(t *testing.T) {
	f := &failRelease{Store: memory.New()}
	key := t.Name()
	met := newCounter()
	d := newLock(t, f, met, hotspot.New(key))
	lk, err := d.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.armed.Store(true)
	if err := lk.Unlock(t.Context()); !errors.Is(err, errStore) {
		t.Fatalf("Unlock = %v; want the store's error", err)
	}
	// The local lock is free: this attempt reaches the store, where the
	// key is still held.
	before := met.Stats().RemoteAttempts
	if _, err := d.TryLock(t.Context(), key, 0); !errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("TryLock while the store still holds it = %v; want ErrNotAcquired", err)
	}
	if got := met.Stats().RemoteAttempts; got != before+1 {
		t.Errorf("remote attempts %d -> %d; want one more (the local lock was free)", before, got)
	}
	if err := lk.Unlock(t.Context()); err != nil {
		t.Fatalf("second Unlock = %v", err)
	}
	lk2, err := d.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatalf("TryLock after the second Unlock = %v", err)
	}
	// A stale release must not free lk2's local lock.
	if err := lk.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Fatalf("third Unlock = %v; want ErrNotHeld", err)
	}
	if _, err := d.TryLock(t.Context(), key, 0); !errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("TryLock while lk2 holds it = %v; want ErrNotAcquired", err)
	}
	lk2.Unlock(t.Context())
}
