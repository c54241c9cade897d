package hotspot_test

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/distlock/distlock"
)

// counter is a Handler that counts what the hotspot tests look at, the
// way metrics.Handler does. The tests cannot use package metrics: it is a
// module of its own (OpenTelemetry), and the root module, hotspot's,
// requires nothing, tests included.
type counter struct {
	acquired, notAcquired, failed, remoteAttempts atomic.Uint64
	held, waiting                                 atomic.Int64
}

// counterStats is a snapshot of a counter, named as metrics.Stats.
type counterStats struct {
	Acquired       uint64 // acquisitions that got the lock
	NotAcquired    uint64 // contention: ErrNotAcquired, or the context ended
	Failed         uint64 // acquisitions that failed otherwise
	RemoteAttempts uint64 // calls that reached the backend's acquire
	Held           int64  // locks held now
	Waiting        int64  // acquisitions under way now
}

func newCounter() *counter { return &counter{} }

func (c *counter) Stats() counterStats {
	return counterStats{
		Acquired:       c.acquired.Load(),
		NotAcquired:    c.notAcquired.Load(),
		Failed:         c.failed.Load(),
		RemoteAttempts: c.remoteAttempts.Load(),
		Held:           c.held.Load(),
		Waiting:        c.waiting.Load(),
	}
}

func (c *counter) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	c.waiting.Add(1)
	err := next(ctx, r)
	c.waiting.Add(-1)
	c.remoteAttempts.Add(uint64(r.RemoteAttempts))
	switch {
	case err == nil:
		c.acquired.Add(1)
		c.held.Add(1)
	case errors.Is(err, distlock.ErrNotAcquired), ctx.Err() != nil && errors.Is(err, ctx.Err()):
		c.notAcquired.Add(1)
	default:
		c.failed.Add(1)
	}
	return err
}

func (c *counter) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	err := next(ctx, r)
	if err == nil || errors.Is(err, distlock.ErrNotHeld) {
		c.held.Add(-1)
	}
	return err
}
