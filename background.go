package distlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/distlock/distlock/backend"
)

// background runs the work a DistributeLock owns after the caller that
// caused it has gone: rolling back acquisitions that were overtaken, and
// cleaning up attempts abandoned while their request was in flight
// ([backend.AbandonedError]). Close waits for it, within its bound, and
// reports what did not finish.
type background struct {
	ctx    context.Context // ended by Close once its bound has passed
	cancel context.CancelFunc

	mu     sync.Mutex
	n      int           // tasks running
	idle   chan struct{} // closed when n drops to 0; nil while n == 0
	failed []error       // tasks that gave up, reported by Close
}

func newBackground() *background {
	ctx, cancel := context.WithCancel(context.Background())
	return &background{ctx: ctx, cancel: cancel}
}

// goRun runs fn in its own goroutine with the background's context and
// returns a channel closed when it ends. An error from fn is kept for
// Close's report. After stop, fn runs with an ended context.
func (b *background) goRun(what string, fn func(ctx context.Context) error) <-chan struct{} {
	done := make(chan struct{})
	b.mu.Lock()
	b.n++
	if b.idle == nil {
		b.idle = make(chan struct{})
	}
	b.mu.Unlock()
	go func() {
		defer close(done)
		err := fn(b.ctx)
		b.mu.Lock()
		defer b.mu.Unlock()
		if err != nil {
			b.failed = append(b.failed, fmt.Errorf("%s: %w", what, err))
		}
		if b.n--; b.n == 0 {
			close(b.idle)
			b.idle = nil
		}
	}()
	return done
}

// wait waits for the tasks running until they end or the bound passes,
// then ends the context of those still running and returns the errors of
// the tasks that failed.
func (b *background) wait(bound time.Time) error {
	b.mu.Lock()
	idle := b.idle
	b.mu.Unlock()
	if idle != nil {
		t := time.NewTimer(time.Until(bound))
		defer t.Stop()
		select {
		case <-idle:
		case <-t.C:
			// The tasks still running end with the context now: they
			// are reported as one, not each with the error it ends with.
			b.mu.Lock()
			errs := append(slices.Clip(b.failed), fmt.Errorf("distlock: close: %d clean-ups still running at the bound; their keys expire with their TTL", b.n))
			b.mu.Unlock()
			b.cancel()
			return errors.Join(errs...)
		}
	}
	b.cancel()
	b.mu.Lock()
	defer b.mu.Unlock()
	return errors.Join(b.failed...)
}

// retry calls fn until it returns nil or an error wrapping ErrNotHeld
// (nothing left to clean), or ctx ends, backing off from 10ms to 1s.
func retry(ctx context.Context, fn func(ctx context.Context) error) error {
	backoff := 10 * time.Millisecond
	for {
		err := fn(ctx)
		if err == nil || errors.Is(err, backend.ErrNotHeld) {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		backoff = min(2*backoff, time.Second)
	}
}
