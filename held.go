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
		return fmt.Errorf("%w: %q already unlocked", ErrNotHeld, l.s.req.Key)
	}
	s := l.s
	s.mu.Lock()
	if s.releasing || s.state == stateReleased {
		s.mu.Unlock()
		return fmt.Errorf("%w: %q already released", ErrNotHeld, s.req.Key)
	}
	s.refs--
	if s.refs > 0 {
		lost := s.state == stateLost
		s.mu.Unlock()
		if lost {
			return fmt.Errorf("%w: %q was lost", ErrNotHeld, s.req.Key)
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
}

// held records a successful acquisition whose attempt started at start.
func (s *lockState) held(start time.Time) {
	validity := s.lease.Validity
	if validity <= 0 {
		validity = s.lease.TTL
	}
	s.mu.Lock()
	s.state = stateHeld
	s.expiry = start.Add(validity)
	if s.d.cfg.autoRenew || s.lease.Lost != nil {
		s.stop = make(chan struct{})
	}
	s.mu.Unlock()

	s.d.mu.Lock()
	s.d.held[s] = struct{}{}
	s.d.mu.Unlock()

	if s.d.cfg.autoRenew {
		go s.renew(validity)
	}
	if s.lease.Lost != nil {
		go s.watchLost(s.lease.Lost, s.stop)
	}
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
	s.lose(fmt.Errorf("%w: %q: TTL %v ran out", ErrNotHeld, s.req.Key, s.lease.TTL))
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
	}
}

// release runs the final release through the handler chain. On success or
// ErrNotHeld the lock is released for good; on a store error it stays held.
func (s *lockState) release(ctx context.Context) error {
	err := s.d.release(ctx, &s.req)
	if err != nil && !errors.Is(err, ErrNotHeld) {
		return err
	}
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
	return err
}

// abandon gives back a lock the store granted but a handler then failed,
// straight to the store: the handlers saw a failed acquisition.
func (s *lockState) abandon(ctx context.Context) error {
	s.mu.Lock()
	if s.state != stateHeld {
		s.mu.Unlock()
		return nil
	}
	s.leaveHeldLocked(stateReleased)
	s.mu.Unlock()
	s.d.mu.Lock()
	delete(s.d.held, s)
	s.d.mu.Unlock()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.lease.TTL)
	defer cancel()
	if err := s.d.res.Release(rctx, &s.lease); err != nil && !errors.Is(err, ErrNotHeld) {
		return err
	}
	return nil
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
		return nil, fmt.Errorf("%w: reentering %q, which was lost", ErrNotHeld, s.req.Key)
	case s.state != stateHeld || s.releasing || s.refs == 0:
		return nil, nil
	case max > 0 && s.refs >= max:
		return nil, fmt.Errorf("%w: %q is held %d times", ErrReentrancy, s.req.Key, s.refs)
	}
	s.refs++
	return &Lock{s: s}, nil
}

// renew extends the lock at a third of its TTL until stopped. A renewal
// that finds the lock gone loses it at once; store errors are retried more
// often until the lock's expiry has passed, then it is lost.
func (s *lockState) renew(validity time.Duration) {
	interval := s.lease.TTL / 3
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-s.stop:
			return
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), interval)
		err := s.d.refresher.Refresh(ctx, &s.lease)
		cancel()
		switch {
		case err == nil:
			s.extend(start.Add(validity))
			t.Reset(interval)
		case errors.Is(err, ErrNotHeld):
			s.lose(fmt.Errorf("renewing %q: %w", s.req.Key, err))
			return
		default:
			s.mu.Lock()
			left := time.Until(s.expiry)
			s.mu.Unlock()
			if left <= 0 {
				s.lose(fmt.Errorf("%w: renewing %q failed until its TTL ran out: %w", ErrNotHeld, s.req.Key, err))
				return
			}
			t.Reset(min(interval/4, left))
		}
	}
}

// watchLost closes Done when the backend reports the loss.
func (s *lockState) watchLost(lost <-chan struct{}, stop <-chan struct{}) {
	select {
	case <-lost:
		s.lose(fmt.Errorf("%w: %q: the backend reported the lock lost", ErrNotHeld, s.req.Key))
	case <-stop:
	}
}
