package tracing_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/tracing"
)

// stall is a memory store that stops answering from its from-th acquire
// on: the call returns only when its ctx ends (fault injection: a store
// that hangs).
type stall struct {
	*memory.Store
	calls atomic.Int64
	from  int64
}

func (s *stall) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	if s.calls.Add(1) >= s.from {
		<-ctx.Done()
		return false, 0, fmt.Errorf("stall: acquire %q: %w", l.Key, ctx.Err())
	}
	return s.Store.TryAcquire(ctx, l)
}

// TestWaitEndsMidAttempt: the end of the wait cuts an attempt short.
// After attempts that found the key held, TryLock reports contention and
// so does the span; when the store never answered, a store error.
func TestWaitEndsMidAttempt(t *testing.T) {
	for _, c := range []struct {
		name    string
		from    int64
		outcome string
	}{
		{"AfterAnswers", 2, tracing.OutcomeNotAcquired},
		{"NoAnswer", 1, tracing.OutcomeError},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := memory.New()
			key := uniqueKey(t)
			holder := newLock(t, store)
			if _, err := holder.TryLock(t.Context(), key, 0); err != nil {
				t.Fatal(err)
			}
			f := newFixture(t)
			d := newLock(t, &stall{Store: store, from: c.from}, distlock.WithHandlers(f.h))
			_, err := d.TryLock(t.Context(), key, 30*time.Millisecond)
			acq := f.one(t, tracing.SpanAcquire)
			if c.outcome == tracing.OutcomeNotAcquired {
				if !errors.Is(err, distlock.ErrNotAcquired) {
					t.Fatalf("TryLock = %v; want ErrNotAcquired", err)
				}
				checkAttrs(t, acq, want{
					tracing.KeyOutcome:        tracing.OutcomeNotAcquired,
					tracing.KeyRemoteAttempts: 2,
					semconv.ErrorTypeKey:      nil,
				})
				checkStatus(t, acq, codes.Unset, "")
				return
			}
			if err == nil || errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("TryLock = %v; want a store error wrapping DeadlineExceeded", err)
			}
			checkAttrs(t, acq, want{
				tracing.KeyOutcome:        tracing.OutcomeError,
				tracing.KeyRemoteAttempts: 1,
				semconv.ErrorTypeKey:      "context.DeadlineExceeded",
			})
			checkStatus(t, acq, codes.Error, "")
		})
	}
}
