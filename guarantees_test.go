package distlock_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
)

// The tests below guard, one each, what must hold where two
// features meet (renewal and Extend, release and loss, TryLockAll and an
// attempt cut short, reentry and the last Unlock or Close, refused
// read/write requests). Those that depend on time run in a synctest bubble:
// the store's clock and the facade's are one virtual clock, so "the store
// freed the key while Done was open" is exact. testsuite's adversarial
// model drives the same features together at random.

// hooked is the memory store with hooks; a nil hook does nothing.
type hooked struct {
	*memory.Store
	acquired func(l *backend.Lease)                            // after a successful TryAcquire
	release  func(ctx context.Context, l *backend.Lease) error // replaces Release when set
	refresh  func(ctx context.Context, l *backend.Lease) error // before Refresh; an error replaces it
	applied  func(l *backend.Lease)                            // after Refresh applied, before it returns
}

func (h *hooked) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	ok, ttl, err := h.Store.TryAcquire(ctx, l)
	if ok && h.acquired != nil {
		h.acquired(l)
	}
	return ok, ttl, err
}

func (h *hooked) Release(ctx context.Context, l *backend.Lease) error {
	if h.release != nil {
		return h.release(ctx, l)
	}
	return h.Store.Release(ctx, l)
}

func (h *hooked) Refresh(ctx context.Context, l *backend.Lease) error {
	if h.refresh != nil {
		if err := h.refresh(ctx, l); err != nil {
			return err
		}
	}
	err := h.Store.Refresh(ctx, l)
	if h.applied != nil {
		h.applied(l)
	}
	return err
}

// held reports whether the store holds key for lk's owner: the same token.
func heldBy(s *memory.Store, key string, lk *distlock.Lock) bool {
	info, err := s.Inspect(context.Background(), key, backend.KindMutex)
	return err == nil && len(info.Holders) == 1 && info.Holders[0].Token == lk.Token()
}

func isDone(lk *distlock.Lock) bool {
	select {
	case <-lk.Done():
		return true
	default:
		return false
	}
}

// 1. A loss the store reports while a release is in flight, which then
// fails, is taken in: Done closes, and a nested TryLock does not reenter
// while a rival holds the key.
func TestLossDuringFailedReleaseTakenIn(t *testing.T) {
	lost := make(chan struct{})
	var fail atomic.Bool
	fail.Store(true)
	store := &hooked{Store: memory.New()}
	store.acquired = func(l *backend.Lease) { l.Handle = backend.LostChan(lost) }
	store.release = func(ctx context.Context, l *backend.Lease) error {
		if fail.CompareAndSwap(true, false) {
			close(lost) // lost while released; the watch sees it now
			store.Evict(l.Key)
			runtime.Gosched()
			time.Sleep(10 * time.Millisecond)
			return errors.New("fault: release failed")
		}
		return store.Store.Release(ctx, l)
	}
	d := mustNew(t, store)
	lk, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	done := lk.Done() // a watch runs
	if err := lk.Unlock(t.Context()); err == nil {
		t.Fatal("Unlock with a failing release = nil")
	}
	rival, err := mustNew(t, store.Store).TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatalf("rival TryLock of a freed key: %v", err)
	}
	defer rival.Unlock(context.Background())
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Done stays open after the store reported the lock lost during a release that failed")
	}
	if n, err := d.TryLock(distlock.ContextWithLock(t.Context(), lk), "k", 0); err == nil {
		n.Unlock(context.Background())
		t.Fatal("a nested TryLock reentered a lock the store reported lost")
	}
}

// 2. A renewal sent with the old TTL that the store applies after an
// Extend to a longer one: the facade counts the validity of the request
// applied last, so Done closes before the store frees the key.
func TestRenewalLandingAfterExtend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &hooked{Store: memory.New()}
		var slow atomic.Bool
		store.refresh = func(ctx context.Context, l *backend.Lease) error {
			if slow.Load() && l.TTL == 200*time.Millisecond {
				time.Sleep(50 * time.Millisecond) // the old TTL's renewal lands late
			}
			return nil
		}
		d, _ := distlock.New(store, distlock.WithAutoRenew(), distlock.WithDefaultTTL(200*time.Millisecond))
		defer d.Close()
		lk, err := d.TryLock(context.Background(), "k", 0)
		if err != nil {
			t.Fatal(err)
		}
		slow.Store(true)
		time.Sleep(70 * time.Millisecond) // the renewal (at ~66ms) is in flight
		if err := lk.Extend(context.Background(), 30*time.Second); err != nil {
			t.Fatal(err)
		}
		slow.Store(false)
		for range 20 {
			time.Sleep(50 * time.Millisecond)
			if !heldBy(store.Store, "k", lk) && !isDone(lk) {
				t.Fatalf("the store freed the key after the Extend; Done is open, Deadline %v ahead", time.Until(lk.Deadline()))
			}
		}
		lk.Unlock(context.Background())
	})
}

// 2b. Two overlapping Extends: the longer one is applied first and
// answered last, the shorter one applied last: the facade counts the
// validity of the request applied last.
func TestOverlappingExtends(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &hooked{Store: memory.New()}
		store.applied = func(l *backend.Lease) {
			if l.TTL == time.Minute {
				time.Sleep(20 * time.Millisecond) // its reply comes late
			}
		}
		d, _ := distlock.New(store, distlock.WithDefaultTTL(time.Minute))
		defer d.Close()
		lk, err := d.TryLock(context.Background(), "k", 0)
		if err != nil {
			t.Fatal(err)
		}
		lk.Done()
		var wg sync.WaitGroup
		wg.Go(func() { lk.Extend(context.Background(), time.Minute) })
		time.Sleep(time.Millisecond)
		wg.Go(func() { lk.Extend(context.Background(), 100*time.Millisecond) })
		wg.Wait()
		for range 10 {
			time.Sleep(50 * time.Millisecond)
			if !heldBy(store.Store, "k", lk) && !isDone(lk) {
				t.Fatalf("the store freed the key; Done is open, Deadline %v ahead", time.Until(lk.Deadline()))
			}
		}
		lk.Unlock(context.Background())
	})
}

// hungBatches fails no lease, but holds the renewal of every lease whose
// TTL is 10s until its context ends: four such batches take every slot.
type hungBatches struct {
	*memory.Store
	hung atomic.Int64
}

func (h *hungBatches) RefreshAll(ctx context.Context, ls []*backend.Lease) []error {
	if ls[0].TTL == 10*time.Second {
		h.hung.Add(1)
		<-ctx.Done()
		errs := make([]error, len(ls))
		for i := range errs {
			errs[i] = ctx.Err()
		}
		return errs
	}
	return h.Store.RefreshAll(ctx, ls)
}

// 3. A renewal waiting for a free slot is bounded by its lock's validity,
// and the lock's expiry stays armed meanwhile: Done closes before the
// store frees the key.
func TestRenewalWaitingForSlotBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &hungBatches{Store: memory.New()}
		d, _ := distlock.New(store, distlock.WithAutoRenew(), distlock.WithCloseTimeout(time.Second))
		defer d.Close()
		ctx := distlock.ContextWithTTL(context.Background(), 10*time.Second)
		keys := make([]string, 4*backend.MaxRefreshBatch)
		for i := range keys {
			keys[i] = fmt.Sprint("hung", i)
			if _, err := d.TryLock(ctx, keys[i], 0); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(3400 * time.Millisecond) // their renewals hang in 4 batches
		synctest.Wait()
		if n := store.hung.Load(); n != 4 {
			t.Fatalf("%d hung batches; want 4", n)
		}
		lk, err := d.TryLock(distlock.ContextWithTTL(context.Background(), 150*time.Millisecond), "healthy", 0)
		if err != nil {
			t.Fatal(err)
		}
		for range 30 {
			time.Sleep(10 * time.Millisecond)
			if !heldBy(store.Store, "healthy", lk) && !isDone(lk) {
				t.Fatalf("the store freed the key; Done is open, %v past its Deadline", -time.Until(lk.Deadline()))
			}
		}
		if !isDone(lk) {
			t.Fatal("a lock whose renewal found no slot is still held after its TTL")
		}
	})
}

// lossyOneByOne is the memory store without TryAcquireAll: TryLockAll takes
// its keys one by one. TryAcquire of "b" applies, then loses its reply
// until the context ends; the first Release of "a" fails.
type lossyOneByOne struct {
	s         *memory.Store
	failFirst atomic.Bool
}

func (o *lossyOneByOne) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	ok, ttl, err := o.s.TryAcquire(ctx, l)
	if l.Key != "b" || !ok {
		return ok, ttl, err
	}
	<-ctx.Done()
	v := *l
	return false, 0, &backend.AbandonedError{Err: ctx.Err(), Cleanup: func(ctx context.Context) error {
		return o.s.Release(ctx, &v)
	}}
}

func (o *lossyOneByOne) Release(ctx context.Context, l *backend.Lease) error {
	if l.Key == "a" && o.failFirst.CompareAndSwap(true, false) {
		return errors.New("fault: release failed")
	}
	return o.s.Release(ctx, l)
}

// 4. TryLockAll cut short while a key's reply is lost and giving back
// the keys taken fails: every clean-up runs, the store is left empty.
func TestTryLockAllCutShortCleansEveryKey(t *testing.T) {
	store := &lossyOneByOne{s: memory.New()}
	store.failFirst.Store(true)
	d, err := distlock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := d.TryLockAll(ctx, []string{"a", "b"}, time.Second); err == nil {
		t.Fatal("TryLockAll whose reply was lost = nil")
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, k := range []string{"a", "b"} {
		if v, _, ok := store.s.Holder(k); ok {
			t.Errorf("the store still holds %q (%s) after TryLockAll gave up and Close waited for its clean-ups", k, v)
		}
	}
}

// waiter is a push store over the memory store: Acquire polls every 10ms
// until the deadline. Acquire of "b" takes 1.5s.
type waiter struct{ s *memory.Store }

func (w *waiter) Acquire(ctx context.Context, l *backend.Lease, deadline time.Time) error {
	if l.Key == "b" {
		time.Sleep(1500 * time.Millisecond)
	}
	for {
		ok, _, err := w.s.TryAcquire(ctx, l)
		if err != nil || ok {
			return err
		}
		if !time.Now().Before(deadline) {
			return backend.ErrNotAcquired
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (w *waiter) Release(ctx context.Context, l *backend.Lease) error { return w.s.Release(ctx, l) }

// 5. A lock of several keys on a push store counts its validity from the
// first key's grant, whose lease has run the longest.
func TestTryLockAllValidityFromFirstKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &waiter{s: memory.New()}
		d, _ := distlock.New(store, distlock.WithDefaultTTL(2*time.Second))
		defer d.Close()
		start := time.Now()
		lk, err := d.TryLockAll(context.Background(), []string{"a", "b"}, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if dl := lk.Deadline(); dl.After(start.Add(2 * time.Second)) {
			t.Errorf("Deadline %v after the call began; the first key's lease ends 2s after it", dl.Sub(start))
		}
		lk.Unlock(context.Background())
	})
}

// 6. A nested TryLock racing the last Unlock never returns a handle of a
// lock being released: it reenters before the release begins (then the
// Unlock was not the last), or acquires anew.
func TestReenterRacingLastUnlock(t *testing.T) {
	store := memory.New()
	d := mustNew(t, store)
	for i := range 2000 {
		key := fmt.Sprint("k", i%8)
		lk, err := d.TryLock(t.Context(), key, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		ctx := distlock.ContextWithLock(t.Context(), lk)
		var nested *distlock.Lock
		var nerr error
		var wg sync.WaitGroup
		wg.Go(func() { nested, nerr = d.TryLock(ctx, key, time.Second) })
		wg.Go(func() { lk.Unlock(context.Background()) })
		wg.Wait()
		if nerr != nil {
			t.Fatal(nerr)
		}
		if nested.Token() == lk.Token() && isDone(nested) {
			t.Fatalf("round %d: a nested TryLock returned the outer lock's handle (token %d) with Done closed", i, lk.Token())
		}
		if err := nested.Unlock(context.Background()); err != nil {
			t.Fatalf("round %d: Unlock of the nested handle: %v", i, err)
		}
		if _, _, ok := store.Holder(key); ok {
			t.Fatalf("round %d: the store still holds %q after every handle was unlocked", i, key)
		}
	}
}

// 7. An Extend while a renewal is in flight does not spin the scheduler
// when the renewal outlasts the next renewal's time.
func TestExtendDuringRenewalNoSpin(t *testing.T) {
	store := &hooked{Store: memory.New()}
	var inFlight atomic.Bool
	store.refresh = func(ctx context.Context, l *backend.Lease) error {
		if inFlight.CompareAndSwap(false, true) {
			time.Sleep(150 * time.Millisecond)
		}
		return nil
	}
	d := mustNew(t, store, distlock.WithAutoRenew(), distlock.WithDefaultTTL(300*time.Millisecond))
	lk, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	for !inFlight.Load() {
		time.Sleep(time.Millisecond)
	}
	created := func() uint64 {
		s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	before := created()
	extended := make(chan error, 1)
	go func() { extended <- lk.Extend(t.Context(), 300*time.Millisecond) }()
	time.Sleep(200 * time.Millisecond)
	if n := created() - before; n > 100 {
		t.Fatalf("%d goroutines created in 200ms while one lock was extended during its renewal", n)
	}
	if err := within(t, extended, "Extend"); err != nil {
		t.Fatal(err)
	}
	lk.Unlock(t.Context())
}

// 8. A release Close retries, which succeeds, is no loss.
func TestCloseRetrySucceedsIsNoLoss(t *testing.T) {
	var failed atomic.Bool
	store := &hooked{Store: memory.New()}
	store.release = func(ctx context.Context, l *backend.Lease) error {
		if failed.CompareAndSwap(false, true) {
			return errors.New("fault: release failed once")
		}
		return store.Store.Release(ctx, l)
	}
	h := &tally{}
	d, err := distlock.New(store, distlock.WithHandlers(h))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryLock(t.Context(), "k", 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close whose retry succeeded: %v", err)
	}
	if n := h.lost.Load(); n != 0 {
		t.Errorf("a release Close retried with success was reported as %d losses", n)
	}
}

// 9. A nested TryLock during Close fails with ErrClosed.
func TestReenterDuringCloseFails(t *testing.T) {
	entered, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	store := &hooked{Store: memory.New()}
	store.release = func(ctx context.Context, l *backend.Lease) error {
		once.Do(func() { close(entered) })
		<-gate
		return store.Store.Release(ctx, l)
	}
	d, err := distlock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	a, err := d.TryLock(t.Context(), "a", 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.TryLock(t.Context(), "b", 0)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- d.Close() }()
	<-entered // Close is releasing one of them
	for _, lk := range []*distlock.Lock{a, b} {
		if n, err := d.TryLock(distlock.ContextWithLock(t.Context(), lk), lk.Key(), 0); !errors.Is(err, distlock.ErrClosed) {
			if err == nil {
				n.Unlock(context.Background())
			}
			t.Errorf("nested TryLock of %q during Close = %v; want ErrClosed", lk.Key(), err)
		}
	}
	close(gate)
	within(t, closed, "Close")
}

// largestBatch records the most leases one RefreshAll carried.
type largestBatch struct {
	*memory.Store
	requests, largest atomic.Int64
}

func (b *largestBatch) RefreshAll(ctx context.Context, ls []*backend.Lease) []error {
	b.requests.Add(1)
	for n := int64(len(ls)); ; {
		m := b.largest.Load()
		if n <= m || b.largest.CompareAndSwap(m, n) {
			break
		}
	}
	return b.Store.RefreshAll(ctx, ls)
}

// 10. A lock of more keys than a batch holds is renewed in several
// requests of at most MaxRefreshBatch leases.
func TestBatchRenewalSplitsLargeLock(t *testing.T) {
	store := &largestBatch{Store: memory.New()}
	d := mustNew(t, store, distlock.WithAutoRenew(), distlock.WithDefaultTTL(300*time.Millisecond))
	keys := make([]string, backend.MaxRefreshBatch+100)
	for i := range keys {
		keys[i] = fmt.Sprint("big", i)
	}
	big, err := d.TryLockAll(t.Context(), keys, 0)
	if err != nil {
		t.Fatal(err)
	}
	small, err := d.TryLock(t.Context(), "small", 0)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // a few renewals
	if isDone(big) || isDone(small) {
		t.Fatal("a lock was lost")
	}
	if n := store.largest.Load(); n > backend.MaxRefreshBatch {
		t.Errorf("a batch renewal carried %d leases; at most %d", n, backend.MaxRefreshBatch)
	}
	if store.requests.Load() == 0 {
		t.Error("no batch renewal")
	}
	big.Unlock(t.Context())
	small.Unlock(t.Context())
}

// 11. Every key of a set reenters the set; a set asked again reenters it;
// a set only partly held by the context fails at once.
func TestSetReentryEveryKey(t *testing.T) {
	store := &hooked{Store: memory.New()}
	var acquires atomic.Int64
	store.acquired = func(*backend.Lease) { acquires.Add(1) }
	d := mustNew(t, store)
	set, err := d.TryLockAll(t.Context(), []string{"a", "b"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(distlock.ContextWithLock(t.Context(), set), 5*time.Second)
	defer cancel()
	before := acquires.Load()
	for _, k := range []string{"a", "b"} {
		lk, err := d.TryLock(ctx, k, distlock.WaitForever)
		if err != nil {
			t.Fatalf("nested TryLock(%q) of a set's key: %v", k, err)
		}
		if lk.Token() != set.Token() {
			t.Errorf("nested TryLock(%q): token %d; want the set's %d", k, lk.Token(), set.Token())
		}
		lk.Unlock(t.Context())
	}
	lk, err := d.TryLockAll(ctx, []string{"b", "a"}, 0)
	if err != nil || lk.Token() != set.Token() {
		t.Fatalf("nested TryLockAll of the set = %v (token %v); want the set reentered", err, lk)
	}
	lk.Unlock(t.Context())
	if _, err := d.TryLockAll(ctx, []string{"a", "c"}, distlock.WaitForever); !errors.Is(err, distlock.ErrReentrancy) {
		t.Errorf("nested TryLockAll of a key of the set and another = %v; want ErrReentrancy", err)
	}
	if n := acquires.Load() - before; n != 0 {
		t.Errorf("%d store acquisitions by nested calls; want none", n)
	}
	if err := set.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// 12. A refused read or write request leaves nothing that refuses the
// next one, from any process, once TryLock has returned.
func TestRefusedRWRequestLeavesNothing(t *testing.T) {
	store := memory.New()
	a, b := mustNew(t, store), mustNew(t, store)
	ctx := t.Context()
	for i := range 20 {
		w, err := a.RWMutex("rw").TryLock(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.RWMutex("rw").TryRLock(ctx, 0); !errors.Is(err, distlock.ErrNotAcquired) {
			t.Fatalf("TryRLock beside a writer = %v", err)
		}
		if _, err := b.RWMutex("rw").TryLock(ctx, 0); !errors.Is(err, distlock.ErrNotAcquired) {
			t.Fatalf("TryLock beside a writer = %v", err)
		}
		if err := w.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		w2, err := a.RWMutex("rw").TryLock(ctx, 0)
		if err != nil {
			t.Fatalf("round %d: TryLock of a free read/write lock after refused requests: %v", i, err)
		}
		w2.Unlock(ctx)
		r, err := b.RWMutex("rw").TryRLock(ctx, 0)
		if err != nil {
			t.Fatalf("round %d: TryRLock of a free read/write lock: %v", i, err)
		}
		r.Unlock(ctx)
	}
}

// 13. A waiting writer keeps its place in line however long the spin and
// short the TTL: the writer that arrived first is served first.
func TestWaitingWriterKeepsPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.New()
		opts := []distlock.Option{distlock.WithSpin(200*time.Millisecond, 0), distlock.WithDefaultTTL(50 * time.Millisecond)}
		holder, _ := distlock.New(store, opts...)
		first, _ := distlock.New(store, opts...)
		second, _ := distlock.New(store, opts...)
		defer holder.Close()
		defer first.Close()
		defer second.Close()
		ctx := context.Background()
		h, err := holder.RWMutex("rw").TryLock(distlock.ContextWithTTL(ctx, time.Minute), 0)
		if err != nil {
			t.Fatal(err)
		}
		order := make(chan string, 2)
		var wg sync.WaitGroup
		for _, w := range []struct {
			name string
			d    *distlock.DistributeLock
		}{{"first", first}, {"second", second}} {
			wg.Go(func() {
				lk, err := w.d.RWMutex("rw").TryLock(ctx, 5*time.Second)
				if err != nil {
					t.Errorf("%s: %v", w.name, err)
					return
				}
				order <- w.name
				time.Sleep(10 * time.Millisecond)
				lk.Unlock(ctx)
			})
			time.Sleep(30 * time.Millisecond) // first arrives 30ms before second
		}
		time.Sleep(300 * time.Millisecond)
		h.Unlock(ctx)
		wg.Wait()
		close(order)
		if got := <-order; got != "first" {
			t.Errorf("the writer served first is %q; want the one that arrived first", got)
		}
	})
}

// The cases below come from the adversarial model
// (testsuite.TestLifecycleModel).

// blockingWaiter is a push store over the memory store whose Acquire of
// "b" never succeeds and whose Release blocks until its context ends.
type blockingWaiter struct{ s *memory.Store }

func (w *blockingWaiter) Acquire(ctx context.Context, l *backend.Lease, deadline time.Time) error {
	if l.Key == "b" {
		select {
		case <-time.After(time.Until(deadline)):
			return backend.ErrNotAcquired
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	_, _, err := w.s.TryAcquire(ctx, l)
	return err
}

func (w *blockingWaiter) Release(ctx context.Context, l *backend.Lease) error {
	<-ctx.Done()
	return ctx.Err()
}

// E2. TryLockAll on a push store returns within its bound even when giving
// back the keys it took does not answer: the give-back goes on in the
// background.
func TestTryLockAllGiveBackWithinBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, _ := distlock.New(&blockingWaiter{s: memory.New()}, distlock.WithCloseTimeout(100*time.Millisecond))
		start := time.Now()
		if _, err := d.TryLockAll(context.Background(), []string{"a", "b"}, 100*time.Millisecond); !errors.Is(err, distlock.ErrNotAcquired) {
			t.Errorf("TryLockAll = %v; want ErrNotAcquired", err)
		}
		if el := time.Since(start); el > 150*time.Millisecond {
			t.Errorf("TryLockAll with a wait of 100ms returned after %v", el)
		}
		d.Close()
	})
}

// spinNotify is the memory store without TryAcquireAll, with notices.
type spinNotify struct {
	s     *memory.Store
	calls atomic.Int64
}

func (n *spinNotify) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	n.calls.Add(1)
	return n.s.TryAcquire(ctx, l)
}
func (n *spinNotify) Release(ctx context.Context, l *backend.Lease) error { return n.s.Release(ctx, l) }
func (n *spinNotify) Subscribe(key string) (<-chan struct{}, func())      { return n.s.Subscribe(key) }

// E3. A set taken key by key is not woken by the notices of its own
// give-back: while a later key is held, it sleeps between attempts.
func TestTryLockAllNotWokenByItsGiveBack(t *testing.T) {
	store := &spinNotify{s: memory.New()}
	d := mustNew(t, store)
	rival := mustNew(t, store.s)
	held, err := rival.TryLock(t.Context(), "b", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(context.Background())
	before := store.calls.Load()
	if _, err := d.TryLockAll(t.Context(), []string{"a", "b"}, 300*time.Millisecond); !errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("TryLockAll = %v; want ErrNotAcquired", err)
	}
	// The default spin, stretched 4x once subscribed: a handful of
	// attempts in 300ms, two store calls each.
	if n := store.calls.Load() - before; n > 40 {
		t.Errorf("%d store calls in a 300ms wait for a held key", n)
	}
}

// E3 again, when the key found held changes: a set waiting on "a" is
// woken by a's release, takes it, finds "b" held and gives "a" back. It
// must then wait on "b", not on "a", whose notices its own give-back sends
// (it spun at once before; the lifecycle model found it at schedule 667 of
// 9000).
func TestTryLockAllWaitsOnTheKeyNowHeld(t *testing.T) {
	store := &spinNotify{s: memory.New()}
	d := mustNew(t, store)
	rival := mustNew(t, store.s)
	a, err := rival.TryLock(t.Context(), "a", 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := rival.TryLock(t.Context(), "b", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Unlock(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := d.TryLockAll(t.Context(), []string{"a", "b"}, 400*time.Millisecond)
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for store.calls.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	before := store.calls.Load()
	if err := a.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("TryLockAll = %v; want ErrNotAcquired", err)
	}
	if n := store.calls.Load() - before; n > 40 {
		t.Errorf("%d store calls in under 400ms of waiting for b once a was free", n)
	}
}

// failKey is the memory store whose Release of one key fails.
type failKey struct {
	*memory.Store
	key  string
	fail atomic.Bool
}

func (f *failKey) Release(ctx context.Context, l *backend.Lease) error {
	if l.Key == f.key && f.fail.Load() {
		return errors.New("fault: release failed")
	}
	return f.Store.Release(ctx, l)
}

// E4, E5. A set whose release fails on one key while another is gone is
// lost (Done closes), its Unlock returns the store's error (not
// ErrNotHeld, which would hide the key still held), and a retry releases
// what is left.
func TestSetPartialReleaseIsLoss(t *testing.T) {
	for _, gone := range []string{"released", "evicted"} {
		t.Run(gone, func(t *testing.T) {
			store := &failKey{Store: memory.New(), key: "b"}
			d := mustNew(t, store)
			set, err := d.TryLockAll(t.Context(), []string{"a", "b"}, 0)
			if err != nil {
				t.Fatal(err)
			}
			done := set.Done()
			if gone == "evicted" {
				store.Evict("a")
			}
			store.fail.Store(true)
			err = set.Unlock(t.Context())
			if err == nil || errors.Is(err, distlock.ErrNotHeld) {
				t.Fatalf("Unlock of a set whose key b failed = %v; want the store's error", err)
			}
			if !isClosed(done) {
				t.Error("Done of a set with a key gone and a key still held is open")
			}
			store.fail.Store(false)
			if err := set.Unlock(t.Context()); err != nil && !errors.Is(err, distlock.ErrNotHeld) {
				t.Fatalf("Unlock again: %v", err)
			}
			if _, _, ok := store.Holder("b"); ok {
				t.Error("the store still holds b after the retried Unlock")
			}
		})
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// E6. An Extend to a shorter TTL that the store applies while its reply is
// still on the way: Done closes before the store frees the key.
func TestShorterExtendAppliedInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &hooked{Store: memory.New()}
		store.applied = func(l *backend.Lease) {
			if l.TTL == 100*time.Millisecond {
				time.Sleep(150 * time.Millisecond) // the reply comes after the store's expiry
			}
		}
		d, _ := distlock.New(store, distlock.WithDefaultTTL(time.Minute))
		defer d.Close()
		lk, err := d.TryLock(context.Background(), "k", 0)
		if err != nil {
			t.Fatal(err)
		}
		lk.Done()
		extended := make(chan error, 1)
		go func() { extended <- lk.Extend(context.Background(), 100*time.Millisecond) }()
		for range 20 {
			time.Sleep(10 * time.Millisecond)
			if !heldBy(store.Store, "k", lk) && !isDone(lk) {
				t.Fatalf("the store freed the key; Done is open, Deadline %v ahead", time.Until(lk.Deadline()))
			}
		}
		<-extended
	})
}

// E9. After a failed Unlock of a lock the store keeps alive, a nested
// TryLock does not reenter it: the release in the background would
// release the new handle's lock.
func TestNoReentryAfterFailedUnlock(t *testing.T) {
	var fails atomic.Int64
	fails.Store(1)
	store := &hooked{Store: memory.New()}
	store.acquired = func(l *backend.Lease) { l.KeptAlive = l.AutoRenew }
	store.release = func(ctx context.Context, l *backend.Lease) error {
		if fails.Add(-1) >= 0 {
			return errors.New("fault: release failed")
		}
		return store.Store.Release(ctx, l)
	}
	d := mustNew(t, store, distlock.WithAutoRenew(), distlock.WithDefaultTTL(time.Minute))
	lk, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(t.Context()); err == nil {
		t.Fatal("Unlock with a failing release = nil")
	}
	nested, err := d.TryLock(distlock.ContextWithLock(t.Context(), lk), "k", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nested.Unlock(context.Background())
	if nested.Token() == lk.Token() {
		t.Fatal("a nested TryLock reentered a lock whose last Unlock had begun")
	}
	if !heldBy(store.Store, "k", nested) {
		t.Fatal("the store does not hold the nested TryLock's lock")
	}
}
