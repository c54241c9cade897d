//go:build unix

package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
)

var (
	_ backend.KindChecker = (*observed)(nil)
	_ backend.Withdrawer  = (*observed)(nil)
	_ backend.Queuer      = (*observed)(nil)
)

// lossNote is a handler that keeps why the lock was lost, for the message
// distlock prints when Done closes (the facade calls LockLost first).
type lossNote struct {
	mu    sync.Mutex
	cause error
	renew error // the last renewal's error; nil after a success
}

// renewed records how a renewal went.
func (n *lossNote) renewed(err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.renew = err
}

// lastRenewal describes the last renewal's failure.
func (n *lossNote) lastRenewal() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.renew == nil {
		return "the store did not answer"
	}
	return n.renew.Error()
}

var _ distlock.LossObserver = (*lossNote)(nil)

func (n *lossNote) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	return next(ctx, r)
}

func (n *lossNote) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	return next(ctx, r)
}

// LockLost keeps the first cause.
func (n *lossNote) LockLost(_ *distlock.Request, cause error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cause == nil {
		n.cause = cause
	}
}

func (n *lossNote) get() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cause
}

// observed wraps a store to say, with -v, when a renewal succeeded or
// failed: the facade renews without telling. It keeps the store's
// abilities as they are (the facade finds them by type assertion): see
// observe.
type observed struct {
	backend.RemoteResource
	refresher backend.Refresher
	note      *lossNote
	say       func(format string, args ...any)
}

// Refresh renews through the store and says how it went.
func (o *observed) Refresh(ctx context.Context, l *backend.Lease) error {
	start := time.Now()
	err := o.refresher.Refresh(ctx, l)
	o.note.renewed(err)
	if err != nil {
		o.say("renewing %s failed: %v", quoteKey(l.Key), err)
		return err
	}
	o.say("renewed %s for %v (took %v)", quoteKey(l.Key), l.TTL, time.Since(start).Round(time.Millisecond))
	return nil
}

// ValidateKey asks the store, if it has rules.
func (o *observed) ValidateKey(key string) error {
	if v, ok := o.RemoteResource.(backend.KeyValidator); ok {
		return v.ValidateKey(key)
	}
	return nil
}

// CheckKind asks the store, which holds mutexes only if it cannot say:
// the facade finds the store's kinds through the wrapper.
func (o *observed) CheckKind(k backend.Kind) error {
	if kc, ok := o.RemoteResource.(backend.KindChecker); ok {
		return kc.CheckKind(k)
	}
	if k == backend.KindMutex {
		return nil
	}
	return fmt.Errorf("%T holds mutexes only", o.RemoteResource)
}

// Withdraw withdraws a waiting reader's or writer's intent through the
// store, if it records them (the facade calls it only for the kinds
// CheckKind allows): without it, an intent would stay until its TTL and
// hold other waiters back.
func (o *observed) Withdraw(ctx context.Context, l *backend.Lease) error {
	if w, ok := o.RemoteResource.(backend.Withdrawer); ok {
		return w.Withdraw(ctx, l)
	}
	return nil
}

// Queues asks the store whether it queues the waiters of kind k (false
// if it cannot say): the facade finds it through the wrapper.
func (o *observed) Queues(k backend.Kind) bool {
	if q, ok := o.RemoteResource.(backend.Queuer); ok {
		return q.Queues(k)
	}
	return false
}

// Close closes the store, if it closes.
func (o *observed) Close() error {
	if c, ok := o.RemoteResource.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

type observedWaiter struct {
	*observed
	w backend.Waiter
}

func (o observedWaiter) Acquire(ctx context.Context, l *backend.Lease, deadline time.Time) error {
	return o.w.Acquire(ctx, l, deadline)
}

type observedSpinner struct {
	*observed
	s backend.Spinner
}

func (o observedSpinner) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	return o.s.TryAcquire(ctx, l)
}

type observedNotifier struct {
	observedSpinner
	n backend.Notifier
}

func (o observedNotifier) Subscribe(key string) (<-chan struct{}, func()) {
	return o.n.Subscribe(key)
}

type observedHeads struct {
	observedNotifier
	h backend.HeadNotifier
}

func (o observedHeads) SubscribeHead(key, value string) (<-chan struct{}, func()) {
	return o.h.SubscribeHead(key, value)
}

// observe wraps res so that say and note hear of every renewal. A store that
// cannot renew is returned as it is (distlock.New then refuses
// WithAutoRenew). The wrapper is a Waiter or a Spinner as res is, and a
// Notifier (HeadNotifier) only if res is one; it always has CheckKind,
// Queues and Withdraw, which answer as res would without them. The abilities a single lock does not
// use (Inspector, BatchRefresher, MultiSpinner) it does not pass on.
func observe(res backend.RemoteResource, note *lossNote, say func(format string, args ...any)) backend.RemoteResource {
	ref, ok := res.(backend.Refresher)
	if !ok {
		return res
	}
	o := &observed{RemoteResource: res, refresher: ref, note: note, say: say}
	if w, ok := res.(backend.Waiter); ok {
		return observedWaiter{o, w}
	}
	s, ok := res.(backend.Spinner)
	if !ok {
		return res
	}
	if h, ok := res.(backend.HeadNotifier); ok {
		return observedHeads{observedNotifier{observedSpinner{o, s}, h}, h}
	}
	if n, ok := res.(backend.Notifier); ok {
		return observedNotifier{observedSpinner{o, s}, n}
	}
	return observedSpinner{o, s}
}
