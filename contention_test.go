package distlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
)

// stallFrom is a memory store that stops answering from its from-th
// acquire on: the call returns only when its ctx ends (a store that
// hangs); with failNow it answers every acquire with an error instead.
type stallFrom struct {
	*memory.Store
	calls   atomic.Int64
	from    int64
	failNow bool
}

func (s *stallFrom) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	if s.failNow {
		return false, 0, errors.New("stall: the store is broken")
	}
	if s.calls.Add(1) >= s.from {
		<-ctx.Done()
		return false, 0, fmt.Errorf("stall: acquire %q: %w", l.Key, ctx.Err())
	}
	return s.Store.TryAcquire(ctx, l)
}

// judge records what IsContention says of the error its next returned.
type judge struct{ contention atomic.Int32 } // 0 not called, 1 false, 2 true

func (j *judge) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	err := next(ctx, r)
	if err != nil {
		v := int32(1)
		if distlock.IsContention(ctx, r, err) {
			v = 2
		}
		j.contention.Store(v)
	}
	return err
}

func (j *judge) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	return next(ctx, r)
}

// TestIsContentionAgreesWithTryLock: a handler's IsContention says
// contention exactly when TryLock's error wraps ErrNotAcquired: the key
// held (one attempt, or a wait whose bound cut an attempt after answers),
// the caller's context ended; and failure for a store that never answered
// within the wait or answered with an error.
func TestIsContentionAgreesWithTryLock(t *testing.T) {
	for _, c := range []struct {
		name       string
		from       int64
		failNow    bool
		wait       time.Duration
		cancel     bool
		contention bool
	}{
		{name: "HeldOneAttempt", from: 1 << 30, contention: true},
		{name: "BoundAfterAnswers", from: 2, wait: 30 * time.Millisecond, contention: true},
		{name: "NoAnswer", from: 1, wait: 30 * time.Millisecond},
		{name: "StoreError", failNow: true, wait: 30 * time.Millisecond},
		{name: "CallerCancels", from: 2, wait: time.Minute, cancel: true, contention: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := memory.New()
			key := t.Name()
			holder := newLock(t, store)
			if _, err := holder.TryLock(t.Context(), key, 0); err != nil {
				t.Fatal(err)
			}
			j := &judge{}
			d, err := distlock.New(&stallFrom{Store: store, from: c.from, failNow: c.failNow}, distlock.WithHandlers(j))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Close() })
			ctx := t.Context()
			if c.cancel {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
				defer cancel()
			}
			_, err = d.TryLock(ctx, key, c.wait)
			if err == nil {
				t.Fatal("TryLock = nil; want an error")
			}
			got := j.contention.Load()
			if got == 0 {
				t.Fatalf("the handler saw no error (TryLock = %v)", err)
			}
			if contended := errors.Is(err, distlock.ErrNotAcquired); contended != c.contention {
				t.Fatalf("TryLock = %v: contention %v; want %v", err, contended, c.contention)
			}
			if (got == 2) != c.contention {
				t.Fatalf("IsContention = %v for TryLock = %v; want %v", got == 2, err, c.contention)
			}
		})
	}
}
