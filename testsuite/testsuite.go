// Package testsuite is the conformance suite every distlock backend runs,
// like gocloud's drivertest: one [Run] call exercises the backend through
// [distlock.New], with one subtest per behaviour the facade promises.
//
// A backend's test starts a real server, then:
//
//	testsuite.Run(t, testsuite.Harness{
//		NewResource: func(t *testing.T) backend.RemoteResource { return newResource(t, client) },
//		Leftovers:   func(ctx context.Context, key string) ([]string, error) { ... },
//		Evict:       func(ctx context.Context, key string) error { ... },
//	})
//
// The harness declares what the store cannot do (coarse TTLs, no fencing
// tokens, keys with NUL bytes) instead of the suite skipping silently.
package testsuite

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
)

// Harness adapts one backend to the suite.
type Harness struct {
	// NewResource returns a fresh resource over the store under test, as
	// one process would have it; the suite calls it several times to
	// simulate several processes. It registers its own cleanup with
	// t.Cleanup. Required.
	NewResource func(t *testing.T) backend.RemoteResource
	// Leftovers lists what the store still holds for key (keys, znodes,
	// rows, leases, fence counters excluded) so the suite can assert that
	// releases and cancelled waits leave nothing behind. Required.
	Leftovers func(ctx context.Context, key string) ([]string, error)
	// Evict deletes key's lock from the store behind its owner's back, as
	// an operator, a failover or an expired session would. Required.
	Evict func(ctx context.Context, key string) error

	// TTL is the short TTL used by the tests of expiry and renewal. Default 600ms:
	// renewal runs at TTL/3, and a loaded 2-core machine can delay a
	// goroutine by 100ms or more.
	// Stores with a coarse TTL set a multiple of their granularity (etcd:
	// time.Second).
	TTL time.Duration
	// NoToken declares that the store cannot make fencing tokens (Redlock):
	// the suite then expects Token() == 0.
	NoToken bool
	// MaxKeyLen, when > 0, is the longest key in bytes the store accepts;
	// the suite checks a longer one fails with ErrInvalid and no I/O.
	MaxKeyLen int
	// RejectsNUL declares that the store cannot hold keys with NUL bytes;
	// the suite then expects ErrInvalid, with no I/O, for them.
	RejectsNUL bool
	// RejectsInvalidUTF8 declares that the store cannot hold keys that are
	// not valid UTF-8 (a text column); the suite then expects ErrInvalid,
	// with no I/O, for them. Default false: any bytes are a key.
	RejectsInvalidUTF8 bool
	// NewClosedResource, when set, returns a fresh resource built over a
	// client that was then closed, as when an application shuts its client
	// down while a DistributeLock still uses it. The suite expects TryLock
	// over it to fail with a store error (neither ErrNotAcquired nor
	// ErrInvalid), without a panic or a hang, leaving nothing behind.
	// Default nil: the store has no client to close (backend/memory), and
	// the BadInputMatrix/ClosedClient case is skipped saying so.
	NewClosedResource func(t *testing.T) backend.RemoteResource
	// Stall makes the store stop answering the resources NewResource made,
	// as a frozen server (SIGSTOP), a table locked by another session or a
	// proxy that stops forwarding does, until the returned resume is
	// called (the suite calls it once; Stall registers it with t.Cleanup
	// as well). The StalledStore case needs it, or NoStall.
	Stall func(t *testing.T) (resume func())
	// NoStall says why the store cannot be stalled (an in-process store);
	// the StalledStore and OneAttemptOnStalledStore cases then skip with it.
	NoStall string
	// NewRefusedResource returns a fresh resource, as NewResource makes
	// them, whose client's connections are refused (nothing listens at
	// its address: see RefusingAddr), with the client options the
	// store's documentation gives for a refused connection to be
	// reported within the bound of one attempt. The RefusedConnection
	// case needs it, or NoRefuse.
	NewRefusedResource func(t *testing.T) backend.RemoteResource
	// RefusedCause is what the error of an attempt on the refused
	// resource must say of its cause ("connection refused"); empty when
	// the client does not report it.
	RefusedCause string
	// NoRefuse says why the store cannot be given a refusing client (an
	// in-process store); the RefusedConnection case then skips with it.
	NoRefuse string
	// Unsupported declares the kinds of lock the store does not hold, each
	// with the reason (Redlock: a semaphore cannot be bounded by
	// majorities). The suite then expects ErrUnsupported, with no I/O, for
	// them; every other kind it tests in full.
	Unsupported map[backend.Kind]string
	// FixedTTL says why the store cannot change a held lock's TTL (an etcd
	// lease keeps the TTL it was granted with): Extend to another TTL must
	// then fail with ErrUnsupported, touching nothing, and Extend to the
	// same TTL must work.
	FixedTTL string
	// NoInspect says why the store cannot tell who holds a lock; the
	// suite then expects ErrUnsupported from Inspect, with no I/O.
	NoInspect string
	// Requests returns how many requests the store keeps for key's lock
	// of kind (KindMutex or KindSemaphore): its holders and its queued
	// waiters; an error wrapping errors.ErrUnsupported for a kind it
	// cannot count (that part of the case is skipped, saying so). The
	// ArrivalOrder case needs it, to know that a waiter queued before the
	// next one comes, or NoLine.
	Requests func(ctx context.Context, key string, kind backend.Kind) (int, error)
	// NoLine says, per kind (KindMutex, KindSemaphore), why the store
	// grants the waiters of that kind in no particular order (Redlock:
	// independent nodes keep no common line; MySQL: semaphore waiters
	// queue, mutex waiters race); the ArrivalOrder case skips that kind
	// with it. Requests may then return an error wrapping
	// errors.ErrUnsupported for it.
	NoLine map[backend.Kind]string
}

func (h *Harness) ttl() time.Duration {
	if h.TTL > 0 {
		return h.TTL
	}
	return 600 * time.Millisecond
}

// Run runs the conformance suite against h. Run it under the race detector.
func Run(t *testing.T, h Harness) {
	if h.NewResource == nil || h.Leftovers == nil || h.Evict == nil {
		t.Fatal("testsuite: Harness needs NewResource, Leftovers and Evict")
	}
	tests := []struct {
		name string
		fn   func(*testing.T, *Harness)
	}{
		{"AcquireRelease", testAcquireRelease},
		{"ContenderNotAcquired", testContender},
		{"ZeroWaitIsOneAttempt", testZeroWait},
		{"WaitBoundsSpin", testWaitBounds},
		{"TTLExpiryLetsNextOwnerIn", testTTLExpiry},
		{"UnlockAfterExpiry", testUnlockAfterExpiry},
		{"ContextTTLBeatsDefault", testContextTTL},
		{"DoubleUnlock", testDoubleUnlock},
		{"TokensIncrease", testTokens},
		{"NoOverlap", testNoOverlap},
		{"CancelledWaitLeavesNothing", testCancelledWait},
		{"AutoRenew", testAutoRenew},
		{"DoneOnUnlock", testDoneOnUnlock},
		{"DoneOnExpiry", testDoneOnExpiry},
		{"DoneOnFailedRenewal", testDoneOnFailedRenewal},
		{"DoCancelsOnLoss", testDoCancelsOnLoss},
		{"OddKeys", testOddKeys},
		{"BadInput", testBadInput},
		{"BadInputMatrix", testBadInputMatrix},
		{"Reentrancy", testReentrancy},
		{"Semaphore", testSemaphore},
		{"RWMutex", testRWMutex},
		{"Extend", testExtend},
		{"WaitForever", testWaitForever},
		{"Inspect", testInspect},
		{"TryLockAll", testTryLockAll},
		{"StalledStore", testStalledStore},
		{"OneAttemptOnStalledStore", testOneAttemptStalled},
		{"RefusedConnection", testRefusedConnection},
		{"Election", testElection},
		{"ArrivalOrder", testArrivalOrder},
		{"DeadHeadPassedOver", testDeadHeadPassedOver},
		{"CancelledHeadLeaves", testCancelledHeadLeaves},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, &h) })
	}
}

// Key returns a key unique to the test and this run.
func Key(t testing.TB) string {
	var b [6]byte
	rand.Read(b[:])
	return strings.ReplaceAll(t.Name(), "/", ".") + "-" + hex.EncodeToString(b[:])
}

// newLock returns a DistributeLock over a fresh resource: one "process".
// The default TTL is long, so only tests about expiry see one.
func newLock(t *testing.T, h *Harness, opts ...distlock.Option) *distlock.DistributeLock {
	t.Helper()
	return newLockOver(t, h.NewResource(t), opts...)
}

func newLockOver(t *testing.T, r backend.RemoteResource, opts ...distlock.Option) *distlock.DistributeLock {
	t.Helper()
	opts = append([]distlock.Option{distlock.WithDefaultTTL(time.Minute), distlock.WithSpin(5*time.Millisecond, 5*time.Millisecond)}, opts...)
	d, err := distlock.New(r, opts...)
	if err != nil {
		t.Fatalf("distlock.New: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}

func mustLock(t *testing.T, d *distlock.DistributeLock, ctx context.Context, key string, wait time.Duration) *distlock.Lock {
	t.Helper()
	lk, err := d.TryLock(ctx, key, wait)
	if err != nil {
		t.Fatalf("TryLock(%q, %v) = %v; want a lock", key, wait, err)
	}
	return lk
}

func mustUnlock(t *testing.T, lk *distlock.Lock) {
	t.Helper()
	if err := lk.Unlock(context.Background()); err != nil {
		t.Fatalf("Unlock(%q) = %v; want nil", lk.Key(), err)
	}
}

func wantNotAcquired(t *testing.T, lk *distlock.Lock, err error) {
	t.Helper()
	if !errors.Is(err, distlock.ErrNotAcquired) || lk != nil {
		t.Fatalf("TryLock = %v, %v; want nil, ErrNotAcquired", lk, err)
	}
}

// noLeftovers asserts the store holds nothing for key, polling briefly for
// stores whose cleanup lands asynchronously (ephemeral nodes, revoked leases).
func noLeftovers(t *testing.T, h *Harness, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var left []string
	var err error
	for {
		left, err = h.Leftovers(ctx, key)
		if err == nil && len(left) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("store still holds for %q: %q (err %v)", key, left, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitClosed waits for ch to close within d.
func waitClosed(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: Done not closed within %v", what, d)
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

// recorder is a handler that keeps the last request it saw on acquire.
type recorder struct {
	mu   sync.Mutex
	last distlock.Request
	n    int
}

func (r *recorder) Acquire(ctx context.Context, req *distlock.Request, next distlock.AcquireFunc) error {
	err := next(ctx, req)
	r.mu.Lock()
	r.last, r.n = *req, r.n+1
	r.mu.Unlock()
	return err
}

func (r *recorder) Release(ctx context.Context, req *distlock.Request, next distlock.ReleaseFunc) error {
	return next(ctx, req)
}

func (r *recorder) get() distlock.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// counting wraps a resource and counts every call that could reach the
// store, to prove that bad input and reentry do no I/O.
type counting struct {
	backend.RemoteResource
	calls   atomic.Int64
	lastTTL atomic.Int64 // Lease.TTL after the last successful acquire: the effective TTL
}

func (c *counting) Release(ctx context.Context, l *backend.Lease) error {
	c.calls.Add(1)
	return c.RemoteResource.Release(ctx, l)
}

// CheckKind forwards the store's answer, so that a kind it does not hold
// is refused by the facade before any call reaches the store.
func (c *counting) CheckKind(k backend.Kind) error {
	if kc, ok := c.RemoteResource.(backend.KindChecker); ok {
		return kc.CheckKind(k)
	}
	return errors.New("the store holds mutexes only")
}

func (c *counting) ValidateKey(key string) error {
	if v, ok := c.RemoteResource.(backend.KeyValidator); ok {
		return v.ValidateKey(key)
	}
	return nil
}

type countingSpinner struct{ *counting }

func (c countingSpinner) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	c.calls.Add(1)
	ok, holderTTL, err := c.RemoteResource.(backend.Spinner).TryAcquire(ctx, l)
	if ok && err == nil {
		c.lastTTL.Store(int64(l.TTL))
	}
	return ok, holderTTL, err
}

type countingWaiter struct{ *counting }

func (c countingWaiter) Acquire(ctx context.Context, l *backend.Lease, deadline time.Time) error {
	c.calls.Add(1)
	err := c.RemoteResource.(backend.Waiter).Acquire(ctx, l, deadline)
	if err == nil {
		c.lastTTL.Store(int64(l.TTL))
	}
	return err
}

// newCounting wraps r; the result implements the same family as r.
func newCounting(t *testing.T, r backend.RemoteResource) (backend.RemoteResource, *atomic.Int64) {
	w, c := wrapCounting(t, r)
	return w, &c.calls
}

func wrapCounting(t *testing.T, r backend.RemoteResource) (backend.RemoteResource, *counting) {
	c := &counting{RemoteResource: r}
	switch r.(type) {
	case backend.Waiter:
		return countingWaiter{c}, c
	case backend.Spinner:
		return countingSpinner{c}, c
	}
	t.Fatalf("%T is neither a Spinner nor a Waiter", r)
	return nil, nil
}

// Contend is the contended benchmark loop every backend shares: b.N
// successful TryLock + Unlock cycles of key, shared out among workers
// goroutines that use the DistributeLocks ds in turn (one per "process").
// Only the cycles are timed.
func Contend(b *testing.B, ds []*distlock.DistributeLock, key string, workers int) {
	b.Helper()
	var (
		left atomic.Int64
		wg   sync.WaitGroup
	)
	left.Store(int64(b.N))
	ctx := context.Background()
	b.ResetTimer()
	for i := range workers {
		d := ds[i%len(ds)]
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				lk, err := d.TryLock(ctx, key, time.Minute)
				if err != nil {
					b.Error(err)
					return
				}
				if err := lk.Unlock(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
}
