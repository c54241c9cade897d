package distlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distlock/distlock/backend"
)

// Lock is a handle of a held lock, returned by [DistributeLock.TryLock].
// Its methods are safe for concurrent use.
type Lock struct {
	s        *lockState
	unlocked atomic.Bool
}

// Key returns the lock's key.
func (l *Lock) Key() string { return l.s.req.Key }

// Token returns the fencing token: a number that strictly increases with
// every new holder of the key on one store. Pass it to the resource the lock
// protects and have it refuse writes with a token lower than one it has
// seen: that keeps a holder whose lock expired while it was paused from
// doing harm. 0 if the backend has no tokens (Redlock).
func (l *Lock) Token() uint64 { return l.s.lease.Token }

// Done returns a channel that is closed when the lock ends: on Unlock, when
// its TTL runs out without renewal, when a renewal finds it gone, or when
// the backend reports the loss of its session or lease. All handles of a
// reentered lock share it.
func (l *Lock) Done() <-chan struct{} { return l.s.doneChan() }

// Unlock releases this handle. When it is the last live handle of the lock
// (see [ContextWithLock]), the lock is deleted from the store if, and only
// if, the store still holds it for this owner.
//
// Errors: [ErrNotHeld] when the store no longer held the lock (it expired or
// another owner took it), when this handle was already unlocked, or when a
// nested handle's lock was lost; nothing is touched then. A store error is
// returned wrapped; the lock may then still be held: Unlock may be called
// again, and renewal has stopped, so the TTL frees it at the latest.
func (l *Lock) Unlock(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", ErrInvalid)
	}
	if !l.unlocked.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: %s already unlocked", ErrNotHeld, quote(l.s.req.Key))
	}
	s := l.s
	s.mu.Lock()
	if s.releasing || s.state == stateReleased {
		s.mu.Unlock()
		return fmt.Errorf("%w: %s already released", ErrNotHeld, quote(s.req.Key))
	}
	s.refs--
	if s.refs > 0 {
		lost := s.state == stateLost
		s.mu.Unlock()
		if lost {
			return fmt.Errorf("%w: %s was lost", ErrNotHeld, quote(s.req.Key))
		}
		return nil
	}
	s.releasing = true
	s.stopLocked()
	s.mu.Unlock()

	err := s.release(ctx)
	if err != nil && !errors.Is(err, ErrNotHeld) {
		s.mu.Lock()
		s.refs++
		s.releasing = false
		s.mu.Unlock()
		l.unlocked.Store(false)
	}
	return err
}

const (
	stateNew = iota
	stateHeld
	stateLost
	stateReleased
)

// lockState is one acquisition, shared by all its handles.
type lockState struct {
	d     *DistributeLock
	req   Request
	lease backend.Lease

	mu        sync.Mutex
	state     uint8
	refs      int           // live handles
	releasing bool          // the final release is under way
	expiry    time.Time     // when the lock ends unless renewed
	done      chan struct{} // made on first Done call
	timer     *time.Timer   // fires at expiry; armed with done
	stop      chan struct{} // stops renewal and the loss watch; nil if none run
	stopped   bool
	renewal   *time.Timer // runs renew; nil without WithAutoRenew
}

// held records a successful acquisition whose attempt started at start.
func (s *lockState) held(start time.Time) {
	validity := safeValidity(s.lease)
	s.mu.Lock()
	s.state = stateHeld
	s.expiry = start.Add(validity)
	if s.d.cfg.autoRenew || s.lease.Lost != nil {
		s.stop = make(chan struct{})
	}
	if s.d.cfg.autoRenew {
		interval := max(s.lease.TTL/3, time.Millisecond)
		s.renewal = time.AfterFunc(interval, func() { s.renew(validity, interval) })
	}
	s.mu.Unlock()

	s.d.mu.Lock()
	s.d.held[s] = struct{}{}
	s.d.mu.Unlock()

	if s.lease.Lost != nil {
		go s.watchLost(s.lease.Lost, s.stop)
	}
}

// safeValidity is how long after the start of its successful attempt a
// lock is known held: the backend's validity (or the TTL), less an allowance
// for timer lateness and clock drift between this process and the store
// (1% + 2ms, as Redlock's drift, and at most half), so that Done closes
// before the store can hand the key to someone else.
func safeValidity(l backend.Lease) time.Duration {
	v := l.Validity
	if v <= 0 {
		v = l.TTL
	}
	return v - min(v/100+2*time.Millisecond, v/2)
}

func (s *lockState) doneChan() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done == nil {
		s.done = make(chan struct{})
		if s.state != stateHeld {
			close(s.done)
		} else {
			s.timer = time.AfterFunc(time.Until(s.expiry), s.expire)
		}
	}
	return s.done
}

// expire runs when the expiry timer fires.
func (s *lockState) expire() {
	s.mu.Lock()
	if s.state == stateHeld {
		if left := time.Until(s.expiry); left > 0 { // renewed meanwhile
			s.timer.Reset(left)
			s.mu.Unlock()
			return
		}
	}
	s.mu.Unlock()
	s.lose(fmt.Errorf("%w: %s: TTL %v ran out", ErrNotHeld, quote(s.req.Key), s.lease.TTL))
}

// extend moves the expiry after a successful renewal.
func (s *lockState) extend(expiry time.Time) {
	s.mu.Lock()
	if s.state == stateHeld && expiry.After(s.expiry) {
		s.expiry = expiry
	}
	s.mu.Unlock()
}

// lose marks the lock lost, closes Done and tells the observers.
func (s *lockState) lose(cause error) {
	s.mu.Lock()
	if s.state != stateHeld {
		s.mu.Unlock()
		return
	}
	s.leaveHeldLocked(stateLost)
	s.mu.Unlock()
	s.d.mu.Lock()
	delete(s.d.held, s)
	s.d.mu.Unlock()
	s.d.lockLost(&s.req, cause)
}

// leaveHeldLocked moves from held to state, closing what held opened.
func (s *lockState) leaveHeldLocked(state uint8) {
	s.state = state
	if s.done != nil {
		close(s.done)
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	s.stopLocked()
}

func (s *lockState) stopLocked() {
	if s.stop != nil && !s.stopped {
		close(s.stop)
		s.stopped = true
		if s.renewal != nil {
			s.renewal.Stop()
		}
	}
}

// release runs the final release through the handler chain. On success or
// ErrNotHeld the lock is released for good; on a store error it stays held.
func (s *lockState) release(ctx context.Context) error {
	err := s.d.releaseAt[0](ctx, &s.req)
	if err != nil && !errors.Is(err, ErrNotHeld) {
		return err
	}
	s.released()
	return err
}

// released records that the lock is gone from the store for good.
func (s *lockState) released() {
	s.mu.Lock()
	if s.state == stateHeld {
		s.leaveHeldLocked(stateReleased)
	} else {
		s.state = stateReleased
	}
	s.releasing = false
	s.mu.Unlock()
	s.d.mu.Lock()
	delete(s.d.held, s)
	s.d.mu.Unlock()
}

// abandon gives back a lock the store granted but a handler then failed:
// through the handlers inside the one that failed, which saw it acquired.
func (s *lockState) abandon(ctx context.Context) error {
	if !s.isHeld() {
		return nil
	}
	s.mu.Lock()
	s.releasing = true
	s.stopLocked()
	s.mu.Unlock()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.lease.TTL)
	defer cancel()
	err := s.d.releaseAt[s.req.granted](rctx, &s.req)
	s.released()
	if err != nil && !errors.Is(err, ErrNotHeld) {
		return err
	}
	return nil
}

func (s *lockState) isHeld() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state == stateHeld
}

// releaseAll releases the lock whatever its handles say (Close).
func (s *lockState) releaseAll(ctx context.Context) error {
	s.mu.Lock()
	if s.releasing || s.state != stateHeld {
		s.mu.Unlock()
		return nil
	}
	s.releasing = true
	s.refs = 0
	s.stopLocked()
	s.mu.Unlock()
	return s.release(ctx)
}

// reenter returns a new handle when the lock is held with live handles, an
// error when it is lost or the limit is reached, and (nil, nil) when it was
// released, so that the caller acquires anew.
func (s *lockState) reenter(max int) (*Lock, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.state == stateLost:
		return nil, fmt.Errorf("%w: reentering %s, which was lost", ErrNotHeld, quote(s.req.Key))
	case s.state != stateHeld || s.releasing || s.refs == 0:
		return nil, nil
	case max > 0 && s.refs >= max:
		return nil, fmt.Errorf("%w: %s is held %d times", ErrReentrancy, quote(s.req.Key), s.refs)
	}
	s.refs++
	return &Lock{s: s}, nil
}

// renew runs on the renewal timer, at a third of the TTL: it extends the
// lock and arms the timer again, until stopped. A renewal that finds the
// lock gone loses it at once; store errors are retried more often until the
// lock's expiry has passed, then it is lost. A timer, not a goroutine per
// lock, so that thousands of held locks cost little memory.
func (s *lockState) renew(validity, interval time.Duration) {
	if s.isStopped() {
		return
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), interval)
	err := s.d.refresher.Refresh(ctx, &s.lease)
	cancel()
	next := interval
	switch {
	case err == nil:
		s.extend(start.Add(validity))
	case errors.Is(err, ErrNotHeld):
		s.lose(fmt.Errorf("renewing %s: %w", quote(s.req.Key), err))
		return
	default:
		s.mu.Lock()
		left := time.Until(s.expiry)
		s.mu.Unlock()
		if left <= 0 {
			s.lose(fmt.Errorf("%w: renewing %s failed until its TTL ran out: %w", ErrNotHeld, quote(s.req.Key), err))
			return
		}
		next = min(interval/4, left)
	}
	s.mu.Lock()
	if !s.stopped {
		s.renewal.Reset(next)
	}
	s.mu.Unlock()
}

func (s *lockState) isStopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped
}

// watchLost closes Done when the backend reports the loss.
func (s *lockState) watchLost(lost <-chan struct{}, stop <-chan struct{}) {
	select {
	case <-lost:
		s.lose(fmt.Errorf("%w: %s: the backend reported the lock lost", ErrNotHeld, quote(s.req.Key)))
	case <-stop:
	}
}
