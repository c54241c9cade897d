package distlock_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
)

// batchCounter counts the renewal requests that reach the store and the
// leases each carries.
type batchCounter struct {
	*memory.Store
	requests, leases atomic.Int64
	largest          atomic.Int64
	inFlight, most   atomic.Int64 // RefreshAll calls running, and the most at once
	fail             sync.Map     // keys whose renewal fails with a store error
}

func (b *batchCounter) RefreshAll(ctx context.Context, ls []*backend.Lease) []error {
	for n := b.inFlight.Add(1); ; {
		m := b.most.Load()
		if n <= m || b.most.CompareAndSwap(m, n) {
			break
		}
	}
	defer b.inFlight.Add(-1)
	time.Sleep(time.Millisecond) // a store's round trip, so that batches can overlap
	b.requests.Add(1)
	b.leases.Add(int64(len(ls)))
	for n := int64(len(ls)); ; {
		m := b.largest.Load()
		if n <= m || b.largest.CompareAndSwap(m, n) {
			break
		}
	}
	errs := b.Store.RefreshAll(ctx, ls)
	for i, l := range ls {
		if _, ok := b.fail.Load(l.Key); ok {
			errs[i] = errors.New("fault: renewal failed")
		}
	}
	return errs
}

func (b *batchCounter) Refresh(context.Context, *backend.Lease) error {
	return errors.New("the batch path must be used")
}

// Many locks renewed by one scheduler go to the store in batches, and none
// is lost; a lock whose renewal fails in a batch is lost on its own.
func TestRenewalBatches(t *testing.T) {
	store := &batchCounter{Store: memory.New()}
	// The TTL leaves a renewal 800 ms late before a lock is lost: 600 ms
	// lost one of 3000 under -race beside another package's tests.
	const n, ttl = 3000, 1200 * time.Millisecond
	d := mustNew(t, store, distlock.WithAutoRenew(), distlock.WithDefaultTTL(ttl))
	ctx := t.Context()
	locks := make([]*distlock.Lock, n)
	for i := range locks {
		lk, err := d.TryLock(ctx, "k"+string(rune('a'+i%26))+itoa(i), 0)
		if err != nil {
			t.Fatal(err)
		}
		locks[i] = lk
	}
	store.fail.Store(locks[7].Key(), true)
	// Two TTLs: every lock renewed several times (every third of one).
	time.Sleep(2 * ttl) // the renewals' time: what is measured, not synchronisation
	for i, lk := range locks {
		select {
		case <-lk.Done():
			if i != 7 {
				t.Fatalf("lock %d lost", i)
			}
		default:
			if i == 7 {
				t.Errorf("lock 7, whose renewal failed until its validity ended, was not lost")
			}
		}
	}
	reqs, leases := store.requests.Load(), store.leases.Load()
	t.Logf("%d locks, %d renewal requests carrying %d leases (largest %d)", n, reqs, leases, store.largest.Load())
	if reqs == 0 || leases/reqs < 50 {
		t.Errorf("%d requests for %d leases: want batches of many locks", reqs, leases)
	}
	if store.largest.Load() > backend.MaxRefreshBatch {
		t.Errorf("a batch of %d leases; at most %d", store.largest.Load(), backend.MaxRefreshBatch)
	}
	// 3000 locks due together make 6 batches or more: a few at once,
	// not a connection's worth each.
	if m := store.most.Load(); m > 4 {
		t.Errorf("%d batch renewals in flight at once; want at most 4", m)
	}
	for _, lk := range locks {
		lk.Unlock(ctx)
	}
}

func itoa(i int) string {
	const digits = "0123456789"
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{digits[i%10]}, b...)
	}
	return string(b)
}

// keptAlive marks every lease kept alive by the store, with a Lost channel
// the test closes.
type keptAlive struct {
	*memory.Store
	lost      chan struct{}
	refreshes atomic.Int64
}

func (k *keptAlive) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	ok, ttl, err := k.Store.TryAcquire(ctx, l)
	if ok && l.AutoRenew {
		l.KeptAlive, l.Handle = true, backend.LostChan(k.lost)
	}
	return ok, ttl, err
}

func (k *keptAlive) Refresh(ctx context.Context, l *backend.Lease) error {
	k.refreshes.Add(1)
	return k.Store.Refresh(ctx, l)
}

// A lock the store keeps alive itself costs no renewal and no timer; its
// loss comes from the store.
func TestKeptAliveNoRenewal(t *testing.T) {
	store := &keptAlive{Store: memory.New(), lost: make(chan struct{})}
	d := mustNew(t, store, distlock.WithAutoRenew(), distlock.WithDefaultTTL(60*time.Millisecond))
	lk, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	if dl := lk.Deadline(); !dl.IsZero() {
		t.Errorf("Deadline = %v; want zero (the store keeps the lock alive)", dl)
	}
	time.Sleep(200 * time.Millisecond) // three TTLs pass: what is checked, not synchronisation
	if n := store.refreshes.Load(); n != 0 {
		t.Errorf("%d renewals of a lock the store keeps alive", n)
	}
	select {
	case <-lk.Done():
		t.Fatal("Done closed without a loss")
	default:
	}
	close(store.lost)
	within(t, lk.Done(), "Done after the store's loss")
	if err := lk.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		// The memory store's key expired (60ms): the lock is gone.
		t.Errorf("Unlock after the loss = %v; want ErrNotHeld", err)
	}
}

// signalling gives every lock a Lost channel of its own, which the test
// closes through lose.
type signalling struct {
	*memory.Store
	mu   sync.Mutex
	lost map[string]chan struct{}
}

func (s *signalling) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	ok, ttl, err := s.Store.TryAcquire(ctx, l)
	if ok {
		ch := make(chan struct{})
		s.mu.Lock()
		s.lost[l.Key] = ch
		s.mu.Unlock()
		l.KeptAlive, l.Handle = l.AutoRenew, backend.LostChan(ch)
	}
	return ok, ttl, err
}

func (s *signalling) lose(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.lost[key])
}

// A store's loss signal costs no goroutine per held lock until someone
// waits on Done (or loss observers must hear of it); a loss nobody watched
// is taken in by the next call that asks: Deadline, Done, a nested TryLock.
func TestLossSignalWatchedOnlyWhenAsked(t *testing.T) {
	store := &signalling{Store: memory.New(), lost: map[string]chan struct{}{}}
	d := mustNew(t, store, distlock.WithAutoRenew(), distlock.WithDefaultTTL(time.Minute))
	ctx := t.Context()
	const n = 200
	before := runtime.NumGoroutine()
	locks := make([]*distlock.Lock, n)
	for i := range locks {
		lk, err := d.TryLock(ctx, "k"+itoa(i), 0)
		if err != nil {
			t.Fatal(err)
		}
		locks[i] = lk
	}
	if grown := runtime.NumGoroutine() - before; grown >= n/2 {
		t.Errorf("%d goroutines more for %d held locks; want no goroutine per lock", grown, n)
	}

	// Nobody watched: the next Deadline, Done or nested TryLock sees the loss.
	store.lose("k0")
	if dl := locks[0].Deadline(); !dl.IsZero() {
		t.Errorf("Deadline after the loss = %v; want zero", dl)
	}
	select {
	case <-locks[0].Done():
	default:
		t.Error("Done of a lock lost before it was asked for is open")
	}
	store.lose("k1")
	if _, err := d.TryLock(distlock.ContextWithLock(ctx, locks[1]), "k1", 0); !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("nested TryLock of a lost lock = %v; want ErrNotHeld", err)
	}

	// Done asked for first: the loss closes it when it comes.
	done := locks[2].Done()
	store.lose("k2")
	within(t, done, "Done after the loss")

	// Loss observers hear of a loss nobody asks about.
	obs := &lossCount{lost: make(chan struct{}, 1)}
	d2 := mustNew(t, store, distlock.WithAutoRenew(), distlock.WithHandlers(obs))
	lk, err := d2.TryLock(ctx, "observed", 0)
	if err != nil {
		t.Fatal(err)
	}
	store.lose("observed")
	within(t, obs.lost, "LockLost")
	if err := lk.Unlock(ctx); err != nil && !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("Unlock of the lost lock = %v", err)
	}
	for _, lk := range locks {
		if err := lk.Unlock(ctx); err != nil && !errors.Is(err, distlock.ErrNotHeld) {
			t.Errorf("Unlock(%s) = %v", lk.Key(), err)
		}
	}
}

// lossCount is a pass-through handler that signals every loss.
type lossCount struct{ lost chan struct{} }

func (h *lossCount) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	return next(ctx, r)
}

func (h *lossCount) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	return next(ctx, r)
}

func (h *lossCount) LockLost(*distlock.Request, error) { h.lost <- struct{}{} }

// Extend of a lock the store keeps alive leaves it kept: no deadline, no
// renewal, and a nested TryLock after the new TTL still reenters it.
func TestExtendKeptAliveStaysKept(t *testing.T) {
	store := &keptAlive{Store: memory.New(), lost: make(chan struct{})}
	d := mustNew(t, store, distlock.WithAutoRenew(), distlock.WithDefaultTTL(time.Minute))
	lk, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Extend(t.Context(), 30*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	extends := store.refreshes.Load() // the Extend's own
	if dl := lk.Deadline(); !dl.IsZero() {
		t.Errorf("Deadline after Extend = %v; want zero (the store keeps the lock alive)", dl)
	}
	time.Sleep(100 * time.Millisecond) // three of the new TTLs pass: what is checked, not synchronisation
	if n := store.refreshes.Load() - extends; n != 0 {
		t.Errorf("%d renewals after Extend of a lock the store keeps alive", n)
	}
	inner, err := d.TryLock(distlock.ContextWithLock(t.Context(), lk), "k", 0)
	if err != nil {
		t.Fatalf("nested TryLock after the extended TTL = %v; want the kept lock", err)
	}
	if err := inner.Unlock(t.Context()); err != nil {
		t.Error(err)
	}
	select {
	case <-lk.Done():
		t.Fatal("Done closed without a loss")
	default:
	}
}

// failingRelease is keptAlive whose Release fails while fail is set.
type failingRelease struct {
	keptAlive
	fail     atomic.Bool
	releases atomic.Int64
}

func (f *failingRelease) Release(ctx context.Context, l *backend.Lease) error {
	f.releases.Add(1)
	if f.fail.Load() {
		return errors.New("fault: the store did not answer the release")
	}
	return f.keptAlive.Release(ctx, l)
}

// A lock the store keeps alive whose release fails is released again in
// the background: no TTL would free it while the process lives (an etcd
// shared lease's locks during a leader's failover).
func TestFailedReleaseOfKeptLockRetried(t *testing.T) {
	store := &failingRelease{keptAlive: keptAlive{Store: memory.New(), lost: make(chan struct{})}}
	store.fail.Store(true)
	d := mustNew(t, store, distlock.WithAutoRenew(), distlock.WithDefaultTTL(time.Minute))
	lk, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(t.Context()); err == nil || errors.Is(err, distlock.ErrNotHeld) {
		t.Fatalf("Unlock with the store failing = %v; want the store's error", err)
	}
	select {
	case <-lk.Done():
		t.Fatal("Done closed although the release failed")
	default:
	}
	// The retries go on while the store fails ...
	deadline := time.Now().Add(10 * time.Second)
	for store.releases.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d release attempts in 10s; want it released again in the background", store.releases.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// ... and end once it answers: the lock is released, the key free.
	store.fail.Store(false)
	within(t, lk.Done(), "Done once a background release succeeded")
	other := mustNew(t, store.Store, distlock.WithDefaultTTL(time.Minute))
	if lk2, err := other.TryLock(t.Context(), "k", 0); err != nil {
		t.Errorf("TryLock after the background release = %v; want the key free", err)
	} else {
		_ = lk2.Unlock(t.Context())
	}
}

// unbatched is a store that renews one lease per call (no RefreshAll), and
// counts the renewals in flight at once.
type unbatched struct {
	s              *memory.Store
	inFlight, most atomic.Int64
	renewals       atomic.Int64
}

func (o *unbatched) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	return o.s.TryAcquire(ctx, l)
}

func (o *unbatched) Release(ctx context.Context, l *backend.Lease) error { return o.s.Release(ctx, l) }

func (o *unbatched) Refresh(ctx context.Context, l *backend.Lease) error {
	for n := o.inFlight.Add(1); ; {
		m := o.most.Load()
		if n <= m || o.most.CompareAndSwap(m, n) {
			break
		}
	}
	defer o.inFlight.Add(-1)
	time.Sleep(time.Millisecond) // a store's round trip, so that renewals can overlap
	o.renewals.Add(1)
	return o.s.Refresh(ctx, l)
}

// Renewals due together on a store without batches go a few at a time,
// not one goroutine (and connection) per 32 locks.
func TestRenewalsOneByOneBounded(t *testing.T) {
	store := &unbatched{s: memory.New()}
	const n, ttl = 2000, 2 * time.Second
	d := mustNew(t, store, distlock.WithAutoRenew(), distlock.WithDefaultTTL(ttl))
	for i := range n {
		if _, err := d.TryLock(t.Context(), "k"+itoa(i), 0); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for store.renewals.Load() < 2*n {
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals of %d locks in 30s", store.renewals.Load(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if m := store.most.Load(); m > 32 {
		t.Errorf("%d renewals in flight at once; want at most 32", m)
	}
}
