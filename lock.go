package distlock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/owner"
	"github.com/distlock/distlock/internal/spin"
)

// DistributeLock is the facade over one backend. Build it once with [New]
// and share it: it is safe for concurrent use.
type DistributeLock struct {
	res       backend.RemoteResource
	spinner   backend.Spinner
	waiter    backend.Waiter
	notifier  backend.Notifier
	refresher backend.Refresher
	validator backend.KeyValidator
	cfg       config
	policy    spin.Policy
	acquire   AcquireFunc
	releaseAt []ReleaseFunc // releaseAt[i]: the release chain from handler i inward
	observers []LossObserver

	closed  atomic.Bool
	closing chan struct{} // closed by Close: ends the waits in flight
	gate    sync.RWMutex  // read-held by acquisitions in flight; Close waits for them
	mu      sync.Mutex    // guards held
	held    map[*lockState]struct{}
}

// New returns a DistributeLock over r, configured by opts. r must implement
// [backend.Spinner] (a pull store) or [backend.Waiter] (a push store).
//
// New returns an error wrapping [ErrInvalid] when r is nil, implements
// neither, or an option has a bad value, and when [WithAutoRenew] is given
// for a backend that cannot extend locks.
func New(r backend.RemoteResource, opts ...Option) (*DistributeLock, error) {
	if r == nil {
		return nil, fmt.Errorf("%w: nil resource", ErrInvalid)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", ErrInvalid)
		}
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d := &DistributeLock{
		res:     r,
		cfg:     cfg,
		policy:  spin.Policy{Min: cfg.spinMin, Random: cfg.spinRandom},
		held:    make(map[*lockState]struct{}),
		closing: make(chan struct{}),
	}
	if w, ok := r.(backend.Waiter); ok {
		d.waiter = w
	} else if s, ok := r.(backend.Spinner); ok {
		d.spinner = s
		if n, ok := r.(backend.Notifier); ok {
			// Waiters of one key share one subscription: a release
			// wakes one of them, not all (see spin.Share).
			d.notifier = spin.Share(n)
		}
	} else {
		return nil, fmt.Errorf("%w: %T implements neither backend.Spinner nor backend.Waiter", ErrInvalid, r)
	}
	d.refresher, _ = r.(backend.Refresher)
	d.validator, _ = r.(backend.KeyValidator)
	if cfg.autoRenew && d.refresher == nil {
		return nil, fmt.Errorf("%w: WithAutoRenew: %T cannot extend locks", ErrInvalid, r)
	}
	for _, h := range cfg.handlers {
		if o, ok := h.(LossObserver); ok {
			d.observers = append(d.observers, o)
		}
	}
	d.acquire, d.releaseAt = chain(cfg.handlers, d.remoteAcquire, d.remoteRelease)
	return d, nil
}

// TryLock acquires key, waiting at most wait for another owner to let go:
// wait == 0 makes exactly one attempt. The lease time is the context's
// ([ContextWithTTL]) or the default ([WithDefaultTTL]).
//
// When ctx carries a live lock of key on d ([ContextWithLock], [Do]), TryLock
// reenters it at once, with no I/O: the new handle shares the token and Done
// channel, and the store is released when the last handle is unlocked.
//
// Errors: [ErrNotAcquired] when another owner held key for the whole wait;
// errors.Join(ErrNotAcquired, ctx.Err()) when ctx ended first; an
// [ErrInvalid] error for bad input (empty key, a key the backend rejects,
// negative wait, TTL <= 0, nil ctx), with no I/O; [ErrClosed] after Close;
// [ErrReentrancy] or [ErrNotHeld] for a nested attempt over the limit or of
// a lost lock; otherwise the store's error, wrapped with the operation and
// key.
func (d *DistributeLock) TryLock(ctx context.Context, key string, wait time.Duration) (*Lock, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", ErrInvalid)
	}
	ttl, ok := TTLFromContext(ctx)
	if !ok {
		ttl = d.cfg.ttl
	}
	switch {
	case key == "":
		return nil, fmt.Errorf("%w: empty key", ErrInvalid)
	case wait < 0:
		return nil, fmt.Errorf("%w: negative wait %v for %s", ErrInvalid, wait, quote(key))
	case ttl <= 0:
		return nil, fmt.Errorf("%w: TTL %v for %s must be > 0", ErrInvalid, ttl, quote(key))
	}
	if d.validator != nil {
		if err := d.validator.ValidateKey(key); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	if s := heldIn(ctx, d, key); s != nil {
		if lk, err := s.reenter(d.cfg.maxReentrancy); lk != nil || err != nil {
			return lk, err
		}
	}
	value := owner.New()
	if d.cfg.valueFunc != nil {
		if value = d.cfg.valueFunc(); value == "" {
			return nil, fmt.Errorf("%w: value func returned an empty owner value", ErrInvalid)
		}
	}

	s := &lockState{d: d, refs: 1}
	s.req = Request{Key: key, Value: value, TTL: ttl, Wait: wait, s: s}
	if wait > 0 {
		s.req.Deadline = time.Now().Add(wait)
	}
	d.gate.RLock()
	if d.closed.Load() {
		d.gate.RUnlock()
		return nil, ErrClosed
	}
	err := d.acquire(ctx, &s.req)
	if err == nil && !s.isHeld() {
		err = fmt.Errorf("distlock: a handler returned nil without acquiring %s", quote(key))
	}
	if err != nil {
		if rerr := s.abandon(ctx); rerr != nil {
			err = errors.Join(err, rerr)
		}
	} else if d.closed.Load() { // Close ran meanwhile: it may have missed this lock
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl)
		_ = s.releaseAll(rctx)
		cancel()
		err = ErrClosed
	}
	d.gate.RUnlock()
	if err != nil {
		if d.closed.Load() && !errors.Is(err, ErrInvalid) {
			return nil, errors.Join(ErrClosed, err)
		}
		if cerr := ctx.Err(); cerr != nil && (errors.Is(err, ErrNotAcquired) || errors.Is(err, cerr)) {
			err = errors.Join(ErrNotAcquired, cerr)
		}
		return nil, err
	}
	return &Lock{s: s}, nil
}

// quote returns key quoted for an error message, cut short when long: a
// key of a megabyte must not make a megabyte error.
func quote(key string) string {
	const max = 64
	if len(key) <= max {
		return strconv.Quote(key)
	}
	return fmt.Sprintf("%q... (%d bytes)", key[:max], len(key))
}

// remoteAcquire is the innermost acquire step: the spin loop or the watch.
func (d *DistributeLock) remoteAcquire(ctx context.Context, r *Request) error {
	if err := ctx.Err(); err != nil { // ended before any I/O
		return err
	}
	s := r.s
	s.lease = backend.Lease{Key: r.Key, Value: r.Value, TTL: r.TTL, AutoRenew: d.cfg.autoRenew}
	var start time.Time
	var err error
	if d.waiter != nil {
		r.RemoteAttempts++
		wctx := ctx
		if !r.Deadline.IsZero() { // a wait that Close must be able to end
			var cancel context.CancelFunc
			wctx, cancel = context.WithCancel(ctx)
			stop := make(chan struct{})
			go func() {
				select {
				case <-d.closing:
					cancel()
				case <-stop:
				}
			}()
			defer func() { close(stop); cancel() }()
		}
		err = d.waiter.Acquire(wctx, &s.lease, r.Deadline)
		start = time.Now()
		if err != nil && ctx.Err() == nil && d.closed.Load() {
			err = ErrClosed
		}
	} else {
		start, err = spin.Acquire(ctx, d.spinner, d.notifier, d.policy, &s.lease, r.Deadline, &r.RemoteAttempts, d.closing)
		if errors.Is(err, spin.ErrStopped) {
			err = ErrClosed
		}
	}
	if err != nil {
		return err
	}
	r.Token = s.lease.Token
	r.Acquired = start
	s.held(start)
	return nil
}

// remoteRelease is the innermost release step.
func (d *DistributeLock) remoteRelease(ctx context.Context, r *Request) error {
	return d.res.Release(ctx, &r.s.lease)
}

// Do runs fn while holding key, acquired as by TryLock(ctx, key, wait).
// fn's context carries the lock (nested Do and TryLock calls of key reenter
// it) and is cancelled, with cause [ErrNotHeld], when the lock is known
// lost. The lock is always released when fn returns or panics, with a
// context that outlives ctx's cancellation for at most the lock's TTL.
//
// Do returns TryLock's error without calling fn, or else fn's error joined
// with Unlock's (ErrNotHeld if the lock was lost before the release).
func (d *DistributeLock) Do(ctx context.Context, key string, wait time.Duration,
	fn func(ctx context.Context, lk *Lock) error) (err error) {
	if fn == nil {
		return fmt.Errorf("%w: nil function for %s", ErrInvalid, quote(key))
	}
	lk, err := d.TryLock(ctx, key, wait)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ContextWithLock(ctx, lk))
	stop := make(chan struct{})
	go func() {
		select {
		case <-lk.Done():
			cancel(fmt.Errorf("%w: lock %s lost", ErrNotHeld, quote(key)))
		case <-stop:
		}
	}()
	defer func() {
		close(stop)
		cancel(nil)
		uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), lk.s.req.TTL)
		defer ucancel()
		err = errors.Join(err, lk.Unlock(uctx))
	}()
	return fn(fctx, lk)
}

// Close releases every lock still held through d (stopping their renewal
// and closing their Done channels), then closes the backend if it
// implements io.Closer. The backend's client stays open: the caller owns it.
// After Close, TryLock returns [ErrClosed]. Close returns the errors of the
// releases and of the backend's Close, joined.
func (d *DistributeLock) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	close(d.closing)
	// Release what is held first: hotspot waiters queue behind holders.
	errs := d.releaseHeld()
	// Wait for the acquisitions in flight: the closing channel ends their
	// waits, and one that won meanwhile releases its lock itself.
	d.gate.Lock()
	d.gate.Unlock() //nolint:staticcheck // an empty critical section: a barrier
	errs = append(errs, d.releaseHeld()...)
	if c, ok := d.res.(io.Closer); ok {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// releaseHeld releases every lock held through d.
func (d *DistributeLock) releaseHeld() []error {
	d.mu.Lock()
	held := make([]*lockState, 0, len(d.held))
	for s := range d.held {
		held = append(held, s)
	}
	d.mu.Unlock()
	var errs []error
	for _, s := range held {
		ctx, cancel := context.WithTimeout(context.Background(), s.req.TTL)
		if err := s.releaseAll(ctx); err != nil && !errors.Is(err, ErrNotHeld) {
			errs = append(errs, err)
		}
		cancel()
	}
	return errs
}

// lockLost tells the loss observers.
func (d *DistributeLock) lockLost(r *Request, cause error) {
	for _, o := range d.observers {
		o.LockLost(r, cause)
	}
}
