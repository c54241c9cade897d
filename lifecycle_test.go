package distlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/hotspot"
)

// The tests below are the races of the lock lifecycle found in review, one
// each, on the in-process store; faults a real store cannot give on demand
// (a slow reply, a release that fails) come from faultStore.

// faultStore wraps the memory store with hooks for the faults.
type faultStore struct {
	*memory.Store
	afterAcquire  func(l *backend.Lease) // after a successful attempt, before it returns
	beforeRefresh func()                 // before each Refresh
	afterRefresh  func()                 // after each Refresh
	afterRelease  func()                 // after each successful Release
	failRelease   atomic.Bool            // Release fails with a store error
	calls         atomic.Int64           // every call that reaches the store
}

func (s *faultStore) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	s.calls.Add(1)
	ok, ttl, err := s.Store.TryAcquire(ctx, l)
	if ok && s.afterAcquire != nil {
		s.afterAcquire(l)
	}
	return ok, ttl, err
}

func (s *faultStore) Refresh(ctx context.Context, l *backend.Lease) error {
	s.calls.Add(1)
	if s.beforeRefresh != nil {
		s.beforeRefresh()
	}
	err := s.Store.Refresh(ctx, l)
	if s.afterRefresh != nil {
		s.afterRefresh()
	}
	return err
}

func (s *faultStore) Release(ctx context.Context, l *backend.Lease) error {
	s.calls.Add(1)
	if s.failRelease.Load() {
		return errors.New("fault: store unreachable")
	}
	err := s.Store.Release(ctx, l)
	if err == nil && s.afterRelease != nil {
		s.afterRelease()
	}
	return err
}

// tally counts a handler's Acquires that returned nil and its Releases,
// and the losses it was told of.
type tally struct {
	acquired, released, lost atomic.Int64
	gate                     chan struct{} // when set, Acquire blocks on it after next returned nil
	returned                 chan struct{} // when set, signalled when next returned nil
	only                     string        // when set, gate and returned apply to this key only
}

func (h *tally) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	err := next(ctx, r)
	if err == nil && (h.only == "" || h.only == r.Key) {
		if h.returned != nil {
			h.returned <- struct{}{}
		}
		if h.gate != nil {
			<-h.gate
		}
	}
	if err == nil {
		h.acquired.Add(1)
	}
	return err
}

func (h *tally) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	h.released.Add(1)
	return next(ctx, r)
}

func (h *tally) LockLost(*distlock.Request, error) { h.lost.Add(1) }

func (h *tally) balanced(t *testing.T) {
	t.Helper()
	if a, r := h.acquired.Load(), h.released.Load(); a != r {
		t.Errorf("handler saw %d Acquires return nil and %d Releases; want equal", a, r)
	}
}

func mustNew(t *testing.T, r backend.RemoteResource, opts ...distlock.Option) *distlock.DistributeLock {
	t.Helper()
	d, err := distlock.New(r, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// within fails t unless ch delivers before a generous bound: the bound
// only keeps a broken build from hanging the run.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: not within 20s", what)
		panic("unreachable")
	}
}

// 1. A nested TryLock of a lock whose validity ended fails with ErrNotHeld
// and does no I/O, even when nobody noticed the loss: otherwise two owners
// hold the key.
func TestReenterExpiredLockFails(t *testing.T) {
	store := &faultStore{Store: memory.New()}
	a, b := mustNew(t, store), mustNew(t, store.Store)
	ctx := t.Context()
	lk, err := a.TryLock(distlock.ContextWithTTL(ctx, 50*time.Millisecond), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	// Another owner takes the key once the TTL ran out.
	other, err := b.TryLock(ctx, "k", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Unlock(ctx)
	calls := store.calls.Load()
	nested, err := a.TryLock(distlock.ContextWithLock(ctx, lk), "k", 0)
	if nested != nil || !errors.Is(err, distlock.ErrNotHeld) {
		t.Fatalf("nested TryLock of an expired lock = %v, %v; want nil, ErrNotHeld", nested, err)
	}
	if n := store.calls.Load() - calls; n != 0 {
		t.Errorf("nested TryLock made %d store calls; want none", n)
	}
	select {
	case <-lk.Done():
	default:
		t.Errorf("Done still open after the reentry found the validity ended")
	}
}

// 2. Close while an acquisition is still returning through the handlers:
// the acquisition is rolled back through exactly the handlers that
// acquired, so the hotspot's local lock is freed for the next DistributeLock
// sharing it.
func TestCloseDuringChainReturnFreesLocalLock(t *testing.T) {
	store := memory.New()
	hot := hotspot.New("k")
	slow := &tally{gate: make(chan struct{}), returned: make(chan struct{}, 1), only: "k"}
	d, err := distlock.New(store, distlock.WithHandlers(hot, slow))
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		_, err := d.TryLock(context.Background(), "k", time.Minute)
		res <- err
	}()
	within(t, slow.returned, "the store granted")
	closed := make(chan error, 1)
	go func() { closed <- d.Close() }()
	for { // Close has begun when TryLock refuses at once
		if _, err := d.TryLock(context.Background(), "other", 0); errors.Is(err, distlock.ErrClosed) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(slow.gate) // the slow handler returns now
	if err := within(t, res, "TryLock"); !errors.Is(err, distlock.ErrClosed) {
		t.Errorf("TryLock overtaken by Close = %v; want ErrClosed", err)
	}
	if err := within(t, closed, "Close"); err != nil {
		t.Errorf("Close = %v", err)
	}
	slow.balanced(t)
	d2 := mustNew(t, store, distlock.WithHandlers(hot))
	lk, err := d2.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatalf("TryLock after the rolled-back acquisition = %v; want the key (local lock and store free)", err)
	}
	lk.Unlock(t.Context())
}

// 3. A loss while the chain returns (the validity ran out, or the backend
// reported the lease lost): TryLock fails with ErrNotHeld, and every handler
// that acquired sees its Release.
func TestLossDuringChainReturnRollsBack(t *testing.T) {
	t.Run("validity", func(t *testing.T) {
		store := memory.New()
		outer, inner := &tally{gate: make(chan struct{})}, &tally{}
		d := mustNew(t, store, distlock.WithHandlers(outer, inner), distlock.WithAutoRenew(),
			distlock.WithDefaultTTL(30*time.Millisecond))
		res := make(chan error, 1)
		go func() {
			_, err := d.TryLock(context.Background(), "k", 0)
			res <- err
		}()
		// The outer handler holds the chain until the TTL has run out.
		for _, _, ok := store.Holder("k"); ok || inner.acquired.Load() == 0; _, _, ok = store.Holder("k") {
			time.Sleep(time.Millisecond)
		}
		close(outer.gate)
		if err := within(t, res, "TryLock"); !errors.Is(err, distlock.ErrNotHeld) {
			t.Fatalf("TryLock whose validity ended in the chain = %v; want ErrNotHeld", err)
		}
		outer.balanced(t)
		inner.balanced(t)
		if store.Len() != 0 {
			t.Errorf("store holds %d keys", store.Len())
		}
	})
	t.Run("backend", func(t *testing.T) {
		lost := make(chan struct{})
		store := &lostOnAcquire{Store: memory.New(), lost: lost}
		outer, inner := &tally{}, &tally{}
		inner.returned = make(chan struct{}, 1)
		inner.gate = make(chan struct{})
		d := mustNew(t, store, distlock.WithHandlers(outer, inner))
		res := make(chan error, 1)
		go func() {
			_, err := d.TryLock(context.Background(), "k", 0)
			res <- err
		}()
		within(t, inner.returned, "the store granted")
		close(lost) // the backend reports the lease lost
		close(inner.gate)
		if err := within(t, res, "TryLock"); !errors.Is(err, distlock.ErrNotHeld) {
			t.Fatalf("TryLock lost in the chain = %v; want ErrNotHeld", err)
		}
		outer.balanced(t)
		inner.balanced(t)
		if outer.lost.Load()+inner.lost.Load() != 0 {
			t.Errorf("a lock never returned was reported lost to the observers")
		}
	})
}

type lostOnAcquire struct {
	*memory.Store
	lost chan struct{}
}

func (s *lostOnAcquire) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	ok, ttl, err := s.Store.TryAcquire(ctx, l)
	if ok {
		l.Handle = backend.LostChan(s.lost)
	}
	return ok, ttl, err
}

// 4. A renewal in flight when Unlock runs finds the key our own release
// just deleted: that is not a loss. The renewal answers while the release
// is still returning through the facade.
func TestUnlockDuringRenewalIsNoLoss(t *testing.T) {
	entered, proceed, refreshed := make(chan struct{}, 1), make(chan struct{}), make(chan struct{}, 1)
	deleted, releaseGo := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	store := &faultStore{Store: memory.New()}
	store.beforeRefresh = func() {
		once.Do(func() {
			entered <- struct{}{}
			<-proceed
		})
	}
	store.afterRefresh = func() {
		select {
		case refreshed <- struct{}{}:
		default:
		}
	}
	store.afterRelease = func() {
		deleted <- struct{}{}
		<-releaseGo
	}
	h := &tally{}
	d := mustNew(t, store, distlock.WithHandlers(h), distlock.WithAutoRenew(), distlock.WithDefaultTTL(150*time.Millisecond))
	lk, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	done := lk.Done()
	within(t, entered, "the first renewal")
	unlocked := make(chan error, 1)
	go func() { unlocked <- lk.Unlock(context.Background()) }()
	within(t, deleted, "the release's delete")
	close(proceed) // the renewal now finds the key gone
	within(t, refreshed, "the renewal's answer")
	// Give a wrong loss the time to be reported (a negative check: the
	// window bounds it, nothing waits on it).
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end) && h.lost.Load() == 0; {
		time.Sleep(5 * time.Millisecond)
	}
	close(releaseGo)
	if err := within(t, unlocked, "Unlock"); err != nil {
		t.Fatalf("Unlock = %v", err)
	}
	<-done
	if n := h.lost.Load(); n != 0 {
		t.Errorf("a clean Unlock was reported as a loss (%d LockLost calls)", n)
	}
	h.balanced(t)
}

// 5. Close fails to release (the store is unreachable): the lock stays
// held, and a later Unlock releases it.
func TestUnlockAfterFailedClose(t *testing.T) {
	store := &faultStore{Store: memory.New()}
	d, err := distlock.New(store, distlock.WithDefaultTTL(time.Minute), distlock.WithCloseTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	lk, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	store.failRelease.Store(true)
	if err := d.Close(); err == nil {
		t.Fatalf("Close = nil; want the release's error")
	}
	store.failRelease.Store(false)
	if err := lk.Unlock(t.Context()); err != nil {
		t.Fatalf("Unlock after Close failed to release = %v; want nil", err)
	}
	if _, _, ok := store.Holder("k"); ok {
		t.Errorf("the store still holds the key")
	}
}

// 6. Close ends the waits in flight at once, a handler's wait included: a
// TryLock queued on a hotspot local lock held through another
// DistributeLock.
func TestCloseEndsHandlerWait(t *testing.T) {
	store := memory.New()
	hot := hotspot.New("k")
	d1 := mustNew(t, store, distlock.WithHandlers(hot))
	d2, err := distlock.New(store, distlock.WithHandlers(hot))
	if err != nil {
		t.Fatal(err)
	}
	lk, err := d1.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(t.Context())
	res := make(chan error, 1)
	go func() {
		_, err := d2.TryLock(context.Background(), "k", time.Hour)
		res <- err
	}()
	// Close returns with the waiter's wait ended, not an hour later.
	closed := make(chan error, 1)
	go func() { closed <- d2.Close() }()
	if err := within(t, closed, "Close"); err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := within(t, res, "the waiting TryLock"); !errors.Is(err, distlock.ErrClosed) {
		t.Errorf("TryLock ended by Close = %v; want ErrClosed", err)
	}
}

// 7. Renewal is scheduled by the validity left, counted from the start of
// the attempt, not from when TryLock returned: a reply that took most of
// the TTL must not let the lock expire before its first renewal.
func TestFirstRenewalCountsFromAttemptStart(t *testing.T) {
	store := &faultStore{Store: memory.New()}
	var slow atomic.Bool
	slow.Store(true)
	store.afterAcquire = func(*backend.Lease) {
		if slow.Swap(false) {
			time.Sleep(70 * time.Millisecond) // the reply is slow: fault injected, not synchronisation
		}
	}
	h := &tally{}
	d := mustNew(t, store, distlock.WithHandlers(h), distlock.WithAutoRenew(), distlock.WithDefaultTTL(100*time.Millisecond))
	lk, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	// For 5 TTLs the store must keep our value and Done stay open.
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if _, _, ok := store.Holder("k"); !ok {
			t.Fatalf("the store let the key expire: the first renewal came too late")
		}
	}
	select {
	case <-lk.Done():
		t.Fatalf("Done closed while renewal kept the lock")
	default:
	}
	if err := lk.Unlock(t.Context()); err != nil {
		t.Errorf("Unlock = %v", err)
	}
}

// A Lock not returned by TryLock is refused, without a panic.
func TestZeroLock(t *testing.T) {
	d := mustNew(t, memory.New())
	var zero distlock.Lock
	lk, err := d.TryLock(distlock.ContextWithLock(t.Context(), &zero), "k", 0)
	if err != nil {
		t.Fatalf("TryLock with a zero Lock in the context = %v; want a fresh lock", err)
	}
	lk.Unlock(t.Context())
	if err := zero.Unlock(t.Context()); !errors.Is(err, distlock.ErrInvalid) {
		t.Errorf("zero Lock's Unlock = %v; want ErrInvalid", err)
	}
	if zero.Key() != "" || zero.Token() != 0 || !zero.Deadline().IsZero() {
		t.Errorf("zero Lock: key %q, token %d, deadline %v; want empty", zero.Key(), zero.Token(), zero.Deadline())
	}
	select {
	case <-zero.Done():
	default:
		t.Errorf("zero Lock's Done is open")
	}
}

// TryLock after Close returns ErrClosed itself, and one ended by Close
// says so once, not ErrClosed joined with itself.
func TestTryLockAfterCloseError(t *testing.T) {
	store := memory.New()
	holder := mustNew(t, store)
	lk, err := holder.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(t.Context())
	fs := &faultStore{Store: store}
	d, err := distlock.New(fs, distlock.WithSpin(time.Millisecond, 0))
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		_, err := d.TryLock(context.Background(), "k", time.Hour)
		res <- err
	}()
	for fs.calls.Load() < 2 { // the waiter spins on the held key
		time.Sleep(time.Millisecond)
	}
	d.Close()
	err = within(t, res, "the waiting TryLock")
	if !errors.Is(err, distlock.ErrClosed) || strings.Count(err.Error(), distlock.ErrClosed.Error()) != 1 {
		t.Errorf("TryLock ended by Close = %q; want ErrClosed, said once", err)
	}
	_, err = d.TryLock(t.Context(), "k", time.Second)
	if err != distlock.ErrClosed {
		t.Errorf("TryLock after Close = %q; want %q", err, distlock.ErrClosed)
	}
}

// slowObserver holds LockLost until let go, and records whether a Release
// came while it was in it.
type slowObserver struct {
	in, out      chan struct{}
	inLost       atomic.Bool
	releaseEarly atomic.Bool
}

func (h *slowObserver) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	return next(ctx, r)
}

func (h *slowObserver) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	if h.inLost.Load() {
		h.releaseEarly.Store(true)
	}
	return next(ctx, r)
}

func (h *slowObserver) LockLost(*distlock.Request, error) {
	h.inLost.Store(true)
	h.in <- struct{}{}
	<-h.out
	h.inLost.Store(false)
}

// An Unlock that races a loss's report waits for the observers: none hears
// of the loss once a release has begun.
func TestLossToldBeforeRelease(t *testing.T) {
	lost := make(chan struct{})
	store := &lostOnAcquire{Store: memory.New(), lost: lost}
	h := &slowObserver{in: make(chan struct{}), out: make(chan struct{})}
	d := mustNew(t, store, distlock.WithHandlers(h))
	lk, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	close(lost)
	within(t, h.in, "LockLost")
	unlocked := make(chan error, 1)
	go func() { unlocked <- lk.Unlock(context.Background()) }()
	select { // a negative check: Unlock must not get through meanwhile
	case err := <-unlocked:
		t.Fatalf("Unlock returned (%v) while the loss was being reported", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(h.out)
	within(t, unlocked, "Unlock")
	if h.releaseEarly.Load() {
		t.Errorf("Release ran while LockLost was reporting the loss")
	}
}

// blockingRelease holds each Release until let go, then fails it.
type blockingRelease struct {
	*memory.Store
	entered chan struct{}
	gate    chan struct{}
}

func (b *blockingRelease) Release(ctx context.Context, l *backend.Lease) error {
	b.entered <- struct{}{}
	<-b.gate
	return errors.New("fault: release failed")
}

// A release that was in flight past Close's bound and then fails leaves
// the lock lost, not held with nothing of the closed DistributeLock
// watching it.
func TestReleaseFailingAfterCloseIsLoss(t *testing.T) {
	store := &blockingRelease{Store: memory.New(), entered: make(chan struct{}, 2), gate: make(chan struct{})}
	d, err := distlock.New(store, distlock.WithCloseTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	lk, err := d.TryLock(distlock.ContextWithTTL(t.Context(), time.Minute), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	done := lk.Done()
	unlocked := make(chan error, 1)
	go func() { unlocked <- lk.Unlock(context.Background()) }()
	within(t, store.entered, "the release")
	if err := d.Close(); err == nil {
		t.Errorf("Close with a release still in flight at its bound = nil; want an error")
	}
	close(store.gate) // the release fails now, after Close
	if err := within(t, unlocked, "Unlock"); err == nil {
		t.Errorf("Unlock whose release failed = nil")
	}
	within(t, done, "Done of the lock whose release failed after Close")
}

// timerNotFired is a caller's context whose deadline has passed while its
// timer has not fired yet: Err is still nil.
type timerNotFired struct {
	context.Context
	dl time.Time
}

func (c timerNotFired) Deadline() (time.Time, bool) { return c.dl, true }

// ioTimeoutAtDeadline fails an attempt as a client whose I/O deadline is
// the context's does once that deadline has passed (go-redis with
// ContextTimeoutEnabled: "i/o timeout").
type ioTimeoutAtDeadline struct{ *memory.Store }

func (s ioTimeoutAtDeadline) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return false, 0, fmt.Errorf("fake: read: %w", os.ErrDeadlineExceeded)
	}
	return s.Store.TryAcquire(ctx, l)
}

// A store's own timeout at the caller's deadline, before the caller's
// context says it ended, is the caller's end: ErrNotAcquired joined with
// context.DeadlineExceeded, not the store's error (a CI run saw "i/o
// timeout" from TryLock under load).
func TestStoreTimeoutAtCallersDeadline(t *testing.T) {
	d := mustNew(t, ioTimeoutAtDeadline{memory.New()})
	ctx := timerNotFired{context.Background(), time.Now().Add(-time.Millisecond)}
	_, err := d.TryLock(ctx, "k", time.Second)
	if !errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("TryLock past the caller's deadline, the store timing out = %v; want ErrNotAcquired joined with context.DeadlineExceeded", err)
	}
}
