package tracing_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/tracing"
)

// lossCounter counts LockLost calls, and the releases that roll back an
// acquisition TryLock did not return.
type lossCounter struct{ n, rolledBack atomic.Int64 }

func (c *lossCounter) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	return next(ctx, r)
}

func (c *lossCounter) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	if r.RolledBack {
		c.rolledBack.Add(1)
	}
	return next(ctx, r)
}

func (c *lossCounter) LockLost(*distlock.Request, error) { c.n.Add(1) }

// held is what a worker saw of one lock it got.
type held struct {
	token      uint64
	caller     trace.SpanID
	lostBefore bool  // Done was closed before Unlock
	unlocked   bool  // Unlock was called (else Close released it)
	unlockErr  error // Unlock's error
}

// TestRandomized runs workers that acquire, hold, unlock, let expire,
// evict, reenter and cancel at random over a few keys, on two
// DistributeLocks (one renewing) sharing one handler, closes both, and
// checks the spans: every span ended, one hold span per held acquisition
// linked to it, each hold's outcome consistent with what its worker saw.
// DISTLOCK_TRACING_SEED=n reruns one seed.
func TestRandomized(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("DISTLOCK_TRACING_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seed = v
	}
	t.Logf("seed %d (DISTLOCK_TRACING_SEED=%d reruns it)", seed, seed)

	f := newFixture(t)
	losses := &lossCounter{}
	store := memory.New()
	opts := []distlock.Option{distlock.WithHandlers(f.h, losses), distlock.WithSpin(time.Millisecond, time.Millisecond)}
	plain, err := distlock.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	renewing, err := distlock.New(store, append(opts, distlock.WithAutoRenew())...)
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}

	var (
		mu     sync.Mutex
		locks  []*held
		expect = make(map[trace.SpanID]string) // by caller span: the outcome TryLock's error implies
	)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for range 40 {
				d := plain
				if rng.IntN(2) == 0 {
					d = renewing
				}
				key := keys[rng.IntN(len(keys))]
				ctx, caller := f.caller(context.Background(), "op")
				var cancel context.CancelFunc = func() {}
				if rng.IntN(4) == 0 {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(4))*time.Millisecond)
				}
				ttl := time.Duration(20+rng.IntN(100)) * time.Millisecond
				wait := []time.Duration{0, 5 * time.Millisecond, 20 * time.Millisecond}[rng.IntN(3)]
				lk, err := d.TryLock(distlock.ContextWithTTL(ctx, ttl), key, wait)
				mu.Lock()
				expect[caller.SpanContext().SpanID()] = expectedOutcome(err)
				mu.Unlock()
				if err != nil {
					switch {
					case errors.Is(err, distlock.ErrNotAcquired):
					case errors.Is(err, distlock.ErrNotHeld):
						// The validity ended before the chain returned
						// (a short TTL on a loaded machine): rolled back.
						// So may an acquisition whose context ended
						// then: losses counts them all.
					default:
						t.Errorf("TryLock: %v", err)
					}
					cancel()
					caller.End()
					continue
				}
				h := &held{token: lk.Token(), caller: caller.SpanContext().SpanID()}
				switch rng.IntN(6) {
				case 0: // unlock at once
				case 1: // hold a little
					time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
				case 2: // reenter
					if inner, err := d.TryLock(distlock.ContextWithLock(ctx, lk), key, 0); err == nil {
						_ = inner.Unlock(ctx)
					}
				case 3: // watch Done: a plain lock expires, a renewing one does not
					select {
					case <-lk.Done():
					case <-time.After(ttl + 20*time.Millisecond):
					}
				case 4: // delete it behind our back
					store.Evict(key)
					if d == renewing {
						select {
						case <-lk.Done():
						case <-time.After(ttl):
						}
					}
				case 5: // leave it to Close
					cancel()
					caller.End()
					mu.Lock()
					locks = append(locks, h)
					mu.Unlock()
					continue
				}
				select {
				case <-lk.Done():
					h.lostBefore = true
				default:
				}
				h.unlocked = true
				h.unlockErr = lk.Unlock(context.Background())
				cancel()
				caller.End()
				mu.Lock()
				locks = append(locks, h)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, d := range []*distlock.DistributeLock{plain, renewing} {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}

	if got := f.open(); len(got) != 0 {
		t.Errorf("open spans after Close: %v", got)
	}
	if n := f.h.Open(); n != 0 {
		t.Errorf("handler keeps %d hold spans after Close", n)
	}
	ops := make(map[trace.SpanID]bool)
	for _, s := range f.ended("op") {
		ops[s.SpanContext().SpanID()] = true
	}
	acquired := make(map[trace.SpanID]sdktrace.ReadOnlySpan) // held acquisition spans
	outcomes := make(map[string]int)
	for _, s := range f.ended(tracing.SpanAcquire) {
		o := attrs(s)[tracing.KeyOutcome].AsString()
		outcomes[o]++
		if !ops[s.Parent().SpanID()] {
			t.Errorf("acquisition span's parent %v is not a caller's span", s.Parent().SpanID())
		}
		if e := expect[s.Parent().SpanID()]; o != e {
			t.Errorf("acquisition outcome %q (%q, wait %v, attempts %v); TryLock's error says %q", o,
				s.Status().Description, attrs(s)[tracing.KeyWait].String(), attrs(s)[tracing.KeyRemoteAttempts].String(), e)
		}
		switch o {
		case tracing.OutcomeHeld:
			acquired[s.SpanContext().SpanID()] = s
			fallthrough
		case tracing.OutcomeNotAcquired:
			if s.Status().Code != codes.Unset {
				t.Errorf("%s acquisition with status %v", o, s.Status())
			}
		case tracing.OutcomeContextEnded:
			if s.Status().Code != codes.Error {
				t.Errorf("%s acquisition with status %v", o, s.Status())
			}
		default:
			t.Errorf("acquisition outcome %q: %q, wait %v, attempts %v", o, s.Status().Description, attrs(s)[tracing.KeyWait].String(), attrs(s)[tracing.KeyRemoteAttempts].String())
		}
	}
	holds := make(map[uint64]sdktrace.ReadOnlySpan) // by token
	linked := make(map[trace.SpanID]int)
	lost := 0
	for _, s := range f.ended(tracing.SpanHold) {
		a := attrs(s)
		holds[uint64(a[tracing.KeyToken].AsInt64())] = s
		if a[tracing.KeyOutcome].AsString() == tracing.OutcomeLost {
			lost++
		}
		if len(s.Links()) != 1 {
			t.Errorf("hold span with %d links", len(s.Links()))
			continue
		}
		acq, ok := acquired[s.Links()[0].SpanContext.SpanID()]
		if !ok {
			t.Errorf("hold span linked to no held acquisition span")
			continue
		}
		linked[acq.SpanContext().SpanID()]++
		if s.Parent().SpanID() != acq.Parent().SpanID() {
			t.Errorf("hold span's parent is not its acquisition's")
		}
		if s.EndTime().Before(s.StartTime()) {
			t.Errorf("hold span ends before it starts")
		}
	}
	for id := range acquired {
		if linked[id] != 1 {
			t.Errorf("held acquisition span %v has %d hold spans; want 1", id, linked[id])
		}
	}
	if want := len(locks) + int(losses.rolledBack.Load()); len(holds) != want {
		t.Errorf("%d hold spans (by token); want %d, one per lock and per rolled-back acquisition", len(holds), want)
	}
	for _, h := range locks {
		s, ok := holds[h.token]
		if !ok {
			t.Errorf("no hold span of token %d", h.token)
			continue
		}
		if s.Parent().SpanID() != h.caller {
			t.Errorf("hold span of token %d under %v; want its caller's span %v", h.token, s.Parent().SpanID(), h.caller)
		}
		o := attrs(s)[tracing.KeyOutcome].AsString()
		var ok2 bool
		switch {
		case h.lostBefore:
			ok2 = o == tracing.OutcomeLost
		case !h.unlocked: // Close released it
			ok2 = o == tracing.OutcomeReleased || o == tracing.OutcomeNotHeld || o == tracing.OutcomeLost
		case h.unlockErr == nil:
			ok2 = o == tracing.OutcomeReleased || o == tracing.OutcomeLost
		case errors.Is(h.unlockErr, distlock.ErrNotHeld):
			ok2 = o == tracing.OutcomeNotHeld || o == tracing.OutcomeLost
		default:
			t.Errorf("Unlock: %v", h.unlockErr)
		}
		if !ok2 {
			t.Errorf("hold of token %d ended %q; the worker saw lost before Unlock %v, unlocked %v, Unlock error %v",
				h.token, o, h.lostBefore, h.unlocked, h.unlockErr)
		}
		if o == tracing.OutcomeLost && s.Status().Code != codes.Error {
			t.Errorf("lost hold with status %v", s.Status())
		}
	}
	if n := losses.n.Load(); int64(lost) > n {
		t.Errorf("%d hold spans ended lost, %d LockLost calls", lost, n)
	}
	t.Logf("acquisitions %v; %d holds, %d lost (%d LockLost calls)", outcomes, len(holds), lost, losses.n.Load())
}

// expectedOutcome is the acquisition span's outcome TryLock's error
// implies. A rolled-back acquisition (ErrNotHeld: its validity ended
// before the chain returned) was held as far as the handler saw.
func expectedOutcome(err error) string {
	switch {
	case err == nil, errors.Is(err, distlock.ErrNotHeld):
		return tracing.OutcomeHeld
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return tracing.OutcomeContextEnded
	case errors.Is(err, distlock.ErrNotAcquired):
		return tracing.OutcomeNotAcquired
	}
	return tracing.OutcomeError
}
