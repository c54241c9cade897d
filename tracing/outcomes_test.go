package tracing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/tracing"
)

// kit is a store the outcome scenarios run on.
type kit struct {
	name string
	// open returns a resource over the store and a func that deletes a
	// key from it behind its holder's back (as an operator would).
	open func(t *testing.T) (res backend.RemoteResource, evict func(key string))
	// broken returns a resource whose store fails every call.
	broken func(t *testing.T) backend.RemoteResource
	// storeErrType accepts the error.type of the broken store's failure.
	storeErrType func(attribute.Value) bool
}

// newLock returns a DistributeLock over res, closed when t ends.
func newLock(t *testing.T, res backend.RemoteResource, opts ...distlock.Option) *distlock.DistributeLock {
	t.Helper()
	opts = append([]distlock.Option{distlock.WithSpin(time.Millisecond, time.Millisecond)}, opts...)
	d, err := distlock.New(res, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// runOutcomes runs every outcome an acquisition span and a hold span can
// end with on k's store.
func runOutcomes(t *testing.T, k kit) {
	t.Run("HeldReleased", func(t *testing.T) { testHeldReleased(t, k) })
	t.Run("NotAcquired", func(t *testing.T) { testNotAcquired(t, k) })
	t.Run("ContextEnded", func(t *testing.T) { testContextEnded(t, k) })
	t.Run("StoreError", func(t *testing.T) { testStoreError(t, k) })
	t.Run("LostExpired", func(t *testing.T) { testLostExpired(t, k) })
	t.Run("LostRenewal", func(t *testing.T) { testLostRenewal(t, k) })
	t.Run("NotHeldAtRelease", func(t *testing.T) { testNotHeldAtRelease(t, k) })
	t.Run("Close", func(t *testing.T) { testClose(t, k) })
	t.Run("Reentrant", func(t *testing.T) { testReentrant(t, k) })
	t.Run("RolledBack", func(t *testing.T) { testRolledBack(t, k) })
	t.Run("Modes", func(t *testing.T) { testModes(t, k) })
}

func testHeldReleased(t *testing.T, k kit) {
	f := newFixture(t, tracing.WithStore(k.name))
	p := &probe{}
	res, _ := k.open(t)
	d := newLock(t, res, distlock.WithHandlers(f.h, p))
	ctx, caller := f.caller(t.Context(), "request")
	ctx = distlock.ContextWithTTL(ctx, 5*time.Second)
	key := uniqueKey(t)

	lk, err := d.TryLock(ctx, key, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.open(); len(got) != 2 { // the caller's and the hold
		t.Errorf("open spans while held: %v; want request and %s", got, tracing.SpanHold)
	}
	if f.h.Open() != 1 {
		t.Errorf("handler keeps %d hold spans; want 1", f.h.Open())
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	caller.End()

	acq, hold := f.one(t, tracing.SpanAcquire), f.one(t, tracing.SpanHold)
	checkParent(t, acq, caller.SpanContext())
	checkAttrs(t, acq, want{
		tracing.KeyKey:            key,
		tracing.KeyStore:          k.name,
		tracing.KeyWait:           1.0,
		tracing.KeyTTL:            5.0,
		tracing.KeyMode:           "mutex",
		tracing.KeyLimit:          nil,
		tracing.KeyRemoteAttempts: 1,
		tracing.KeyOutcome:        tracing.OutcomeHeld,
		tracing.KeyToken:          lk.Token(),
		semconv.ErrorTypeKey:      nil,
	})
	checkStatus(t, acq, codes.Unset, "")
	if got := p.last(); got.SpanID() != acq.SpanContext().SpanID() {
		t.Errorf("the store's step saw span %v in its ctx; want the acquisition span %v", got.SpanID(), acq.SpanContext().SpanID())
	}

	checkHold(t, hold, acq)
	checkAttrs(t, hold, want{
		tracing.KeyKey:       key,
		tracing.KeyStore:     k.name,
		tracing.KeyTTL:       5.0,
		tracing.KeyToken:     lk.Token(),
		tracing.KeyOutcome:   tracing.OutcomeReleased,
		tracing.KeyWait:      nil,
		semconv.ErrorTypeKey: nil,
	})
	checkStatus(t, hold, codes.Unset, "")
	if f.h.Open() != 0 {
		t.Errorf("handler keeps %d hold spans after Unlock; want 0", f.h.Open())
	}
	if got := f.open(); len(got) != 0 {
		t.Errorf("open spans: %v; want none", got)
	}
}

func testNotAcquired(t *testing.T, k kit) {
	f := newFixture(t, tracing.WithStore(k.name))
	res, _ := k.open(t)
	d := newLock(t, res, distlock.WithHandlers(f.h))
	key := uniqueKey(t)
	holder, err := d.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}

	// One attempt, then a wait of several.
	for _, wait := range []time.Duration{0, 30 * time.Millisecond} {
		ctx, caller := f.caller(t.Context(), "request")
		if _, err := d.TryLock(ctx, key, wait); !errors.Is(err, distlock.ErrNotAcquired) {
			t.Fatalf("TryLock(wait %v) = %v; want ErrNotAcquired", wait, err)
		}
		caller.End()
		spans := f.ended(tracing.SpanAcquire)
		acq := spans[len(spans)-1]
		checkParent(t, acq, caller.SpanContext())
		attempts := any(1)
		if wait > 0 {
			attempts = atLeast(2)
		}
		checkAttrs(t, acq, want{
			tracing.KeyKey:            key,
			tracing.KeyWait:           wait.Seconds(),
			tracing.KeyRemoteAttempts: attempts,
			tracing.KeyOutcome:        tracing.OutcomeNotAcquired,
			tracing.KeyToken:          nil,
			semconv.ErrorTypeKey:      nil,
		})
		// Contention is not failure.
		checkStatus(t, acq, codes.Unset, "")
	}
	if got := f.ended(tracing.SpanHold); len(got) != 0 {
		t.Errorf("%d hold spans ended while the holder holds; want 0", len(got))
	}
	if err := holder.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := len(f.ended(tracing.SpanHold)); got != 1 {
		t.Errorf("%d hold spans; want 1 (the holder's)", got)
	}
}

func testContextEnded(t *testing.T, k kit) {
	f := newFixture(t, tracing.WithStore(k.name))
	p := &probe{}
	res, _ := k.open(t)
	d := newLock(t, res, distlock.WithHandlers(f.h, p))
	key := uniqueKey(t)
	holder, err := d.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Unlock(context.Background())

	t.Run("Deadline", func(t *testing.T) {
		ctx, caller := f.caller(t.Context(), "request")
		ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := d.TryLock(ctx, key, 10*time.Second)
		if !errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("TryLock = %v; want ErrNotAcquired and DeadlineExceeded", err)
		}
		caller.End()
		spans := f.ended(tracing.SpanAcquire)
		acq := spans[len(spans)-1]
		checkParent(t, acq, caller.SpanContext())
		checkAttrs(t, acq, want{
			tracing.KeyOutcome:        tracing.OutcomeContextEnded,
			tracing.KeyRemoteAttempts: positive,
			semconv.ErrorTypeKey:      "context.DeadlineExceeded",
			tracing.KeyToken:          nil,
		})
		checkStatus(t, acq, codes.Error, "")
		if acq.Status().Description == "" {
			t.Errorf("status description empty; want the error")
		}
	})
	t.Run("Cancel", func(t *testing.T) {
		ctx, caller := f.caller(t.Context(), "request")
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		// Cancel once the acquisition reached the store's step.
		go p.cancelAfter(p.count(), cancel)
		_, err := d.TryLock(ctx, key, 10*time.Second)
		if !errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			t.Fatalf("TryLock = %v; want ErrNotAcquired and Canceled", err)
		}
		caller.End()
		spans := f.ended(tracing.SpanAcquire)
		acq := spans[len(spans)-1]
		checkAttrs(t, acq, want{
			tracing.KeyOutcome:   tracing.OutcomeContextEnded,
			semconv.ErrorTypeKey: "context.Canceled",
		})
		checkStatus(t, acq, codes.Error, "")
	})
	if got := f.ended(tracing.SpanHold); len(got) != 0 {
		t.Errorf("%d hold spans ended; want 0", len(got))
	}
}

func testStoreError(t *testing.T, k kit) {
	f := newFixture(t, tracing.WithStore(k.name))
	d := newLock(t, k.broken(t), distlock.WithHandlers(f.h))
	ctx, caller := f.caller(t.Context(), "request")
	_, err := d.TryLock(ctx, uniqueKey(t), 0)
	if err == nil || errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("TryLock on a broken store = %v; want a store error", err)
	}
	caller.End()
	acq := f.one(t, tracing.SpanAcquire)
	checkParent(t, acq, caller.SpanContext())
	checkAttrs(t, acq, want{
		tracing.KeyOutcome:        tracing.OutcomeError,
		tracing.KeyRemoteAttempts: 1,
		semconv.ErrorTypeKey:      k.storeErrType,
		tracing.KeyToken:          nil,
	})
	t.Logf("error.type %s", attrs(acq)[semconv.ErrorTypeKey].String())
	checkStatus(t, acq, codes.Error, "")
	if acq.Status().Description == "" {
		t.Errorf("status description empty; want the error")
	}
	if got := f.ended(tracing.SpanHold); len(got) != 0 {
		t.Errorf("%d hold spans; want 0", len(got))
	}
	if got := f.open(); len(got) != 0 {
		t.Errorf("open spans: %v; want none", got)
	}
}

// testLostExpired: the lock's TTL runs out while Done is watched.
func testLostExpired(t *testing.T, k kit) {
	f := newFixture(t, tracing.WithStore(k.name))
	res, _ := k.open(t)
	d := newLock(t, res, distlock.WithHandlers(f.h))
	ctx, caller := f.caller(t.Context(), "request")
	lk, err := d.TryLock(distlock.ContextWithTTL(ctx, 100*time.Millisecond), uniqueKey(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, lk)
	// LockLost comes before Done closes: the span has ended already.
	hold := f.one(t, tracing.SpanHold)
	checkHold(t, hold, f.one(t, tracing.SpanAcquire))
	checkAttrs(t, hold, want{
		tracing.KeyOutcome:   tracing.OutcomeLost,
		tracing.KeyTTL:       0.1,
		tracing.KeyToken:     lk.Token(),
		semconv.ErrorTypeKey: "distlock.ErrNotHeld",
	})
	checkStatus(t, hold, codes.Error, "TTL")
	if f.h.Open() != 0 {
		t.Errorf("handler keeps %d hold spans after the loss; want 0", f.h.Open())
	}
	// The release that follows changes nothing.
	_ = lk.Unlock(ctx)
	caller.End()
	if got := len(f.ended(tracing.SpanHold)); got != 1 {
		t.Errorf("%d hold spans after Unlock; want 1", got)
	}
	if got := f.open(); len(got) != 0 {
		t.Errorf("open spans: %v; want none", got)
	}
}

// testLostRenewal: renewal finds the key deleted behind the holder's back.
func testLostRenewal(t *testing.T, k kit) {
	f := newFixture(t, tracing.WithStore(k.name))
	res, evict := k.open(t)
	d := newLock(t, res, distlock.WithHandlers(f.h), distlock.WithAutoRenew())
	key := uniqueKey(t)
	lk, err := d.TryLock(distlock.ContextWithTTL(t.Context(), 300*time.Millisecond), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	evict(key)
	waitDone(t, lk)
	hold := f.one(t, tracing.SpanHold)
	checkAttrs(t, hold, want{
		tracing.KeyOutcome:   tracing.OutcomeLost,
		semconv.ErrorTypeKey: "distlock.ErrNotHeld",
	})
	checkStatus(t, hold, codes.Error, "renewing")
	if err := lk.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("Unlock after the loss = %v; want ErrNotHeld", err)
	}
	if got := len(f.ended(tracing.SpanHold)); got != 1 {
		t.Errorf("%d hold spans after Unlock; want 1", got)
	}
}

// testNotHeldAtRelease: the lock was deleted and nobody watched: the
// release finds it gone.
func testNotHeldAtRelease(t *testing.T, k kit) {
	f := newFixture(t, tracing.WithStore(k.name))
	res, evict := k.open(t)
	d := newLock(t, res, distlock.WithHandlers(f.h))
	key := uniqueKey(t)
	lk, err := d.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	evict(key)
	if err := lk.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Fatalf("Unlock = %v; want ErrNotHeld", err)
	}
	hold := f.one(t, tracing.SpanHold)
	checkAttrs(t, hold, want{
		tracing.KeyOutcome:   tracing.OutcomeNotHeld,
		semconv.ErrorTypeKey: "distlock.ErrNotHeld",
	})
	checkStatus(t, hold, codes.Error, "not held")
}

// testClose: Close ends every span: held locks, a lost one not unlocked,
// and a wait in flight.
func testClose(t *testing.T, k kit) {
	f := newFixture(t, tracing.WithStore(k.name))
	p := &probe{}
	res, _ := k.open(t)
	d, err := distlock.New(res, distlock.WithHandlers(f.h, p), distlock.WithSpin(time.Millisecond, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, caller := f.caller(t.Context(), "request")
	defer caller.End()
	held := uniqueKey(t)
	for _, key := range []string{held, uniqueKey(t), uniqueKey(t)} {
		if _, err := d.TryLock(ctx, key, 0); err != nil {
			t.Fatal(err)
		}
	}
	lost, err := d.TryLock(distlock.ContextWithTTL(ctx, 100*time.Millisecond), uniqueKey(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, lost)

	waited := make(chan error, 1)
	seen := p.count()
	go func() {
		_, err := d.TryLock(ctx, held, 10*time.Second)
		waited <- err
	}()
	poll(t, "the wait reached the store", func() bool { return p.count() > seen })
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-waited; !errors.Is(err, distlock.ErrClosed) {
		t.Errorf("the wait ended by Close returned %v; want ErrClosed", err)
	}
	if got := f.open(); len(got) != 1 || got[0] != "request" {
		t.Errorf("open spans after Close: %v; want only the caller's", got)
	}
	if f.h.Open() != 0 {
		t.Errorf("handler keeps %d hold spans after Close; want 0", f.h.Open())
	}
	outcomes := map[string]int{}
	for _, s := range f.ended(tracing.SpanHold) {
		outcomes[attrs(s)[tracing.KeyOutcome].AsString()]++
	}
	if outcomes[tracing.OutcomeReleased] != 3 || outcomes[tracing.OutcomeLost] != 1 {
		t.Errorf("hold outcomes %v; want 3 released, 1 lost", outcomes)
	}
	spans := f.ended(tracing.SpanAcquire)
	last := spans[len(spans)-1]
	checkAttrs(t, last, want{
		tracing.KeyOutcome:   tracing.OutcomeContextEnded,
		semconv.ErrorTypeKey: "context.Canceled",
	})
}

// testReentrant: a nested acquisition makes no span.
func testReentrant(t *testing.T, k kit) {
	f := newFixture(t, tracing.WithStore(k.name))
	res, _ := k.open(t)
	d := newLock(t, res, distlock.WithHandlers(f.h))
	key := uniqueKey(t)
	err := d.Do(t.Context(), key, 0, func(ctx context.Context, _ *distlock.Lock) error {
		inner, err := d.TryLock(ctx, key, 0)
		if err != nil {
			return err
		}
		return inner.Unlock(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	if a, h := len(f.ended(tracing.SpanAcquire)), len(f.ended(tracing.SpanHold)); a != 1 || h != 1 {
		t.Errorf("%d acquisition and %d hold spans; want 1 and 1", a, h)
	}
}

// refuse is a handler outside the tracing handler that fails every
// acquisition after the inner steps acquired: the facade rolls it back.
type refuse struct{}

var errRefused = errors.New("refused by an outer handler")

func (refuse) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	if err := next(ctx, r); err != nil {
		return err
	}
	return errRefused
}

func (refuse) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	return next(ctx, r)
}

// testRolledBack: an acquisition rolled back before TryLock returns ends
// its hold span.
func testRolledBack(t *testing.T, k kit) {
	f := newFixture(t, tracing.WithStore(k.name))
	res, _ := k.open(t)
	d := newLock(t, res, distlock.WithHandlers(refuse{}, f.h))
	if _, err := d.TryLock(t.Context(), uniqueKey(t), 0); !errors.Is(err, errRefused) {
		t.Fatalf("TryLock = %v; want errRefused", err)
	}
	// TryLock waits for the rollback on a healthy store.
	hold := f.one(t, tracing.SpanHold)
	checkAttrs(t, hold, want{tracing.KeyOutcome: tracing.OutcomeReleased})
	if f.h.Open() != 0 {
		t.Errorf("handler keeps %d hold spans; want 0", f.h.Open())
	}
}

// waitDone waits for lk's Done, or fails.
func waitDone(t *testing.T, lk *distlock.Lock) {
	t.Helper()
	select {
	case <-lk.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed")
	}
}

// testModes: a semaphore's permit, the two sides of a read/write lock and
// an election's leadership have their mode on both spans, and a semaphore
// its limit.
func testModes(t *testing.T, k kit) {
	f := newFixture(t, tracing.WithStore(k.name))
	res, _ := k.open(t)
	d := newLock(t, res, distlock.WithHandlers(f.h))
	ctx := t.Context()
	key := uniqueKey(t)
	take := []struct {
		mode  string
		limit any
		lock  func() (*distlock.Lock, error)
	}{
		{"semaphore", 2, func() (*distlock.Lock, error) { return d.Semaphore(key, 2).TryAcquire(ctx, 0) }},
		{"read", nil, func() (*distlock.Lock, error) { return d.RWMutex(key).TryRLock(ctx, 0) }},
		{"write", nil, func() (*distlock.Lock, error) { return d.RWMutex(key+"-w").TryLock(ctx, 0) }},
		{"election", nil, func() (*distlock.Lock, error) { return d.Election(key).Campaign(ctx, "v") }},
	}
	for _, c := range take {
		lk, err := c.lock()
		if err != nil {
			t.Fatalf("%s: %v", c.mode, err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("%s: Unlock: %v", c.mode, err)
		}
		acqs, holds := f.ended(tracing.SpanAcquire), f.ended(tracing.SpanHold)
		for _, s := range []sdktrace.ReadOnlySpan{acqs[len(acqs)-1], holds[len(holds)-1]} {
			checkAttrs(t, s, want{tracing.KeyMode: c.mode, tracing.KeyLimit: c.limit})
		}
	}
}
