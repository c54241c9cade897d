package distlock

import (
	"context"
	"sync"
	"time"
)

// attemptBound bounds a single attempt (wait == 0), and an inspection,
// from when the store is first asked: see TryLock.
const attemptBound = time.Second

// acqCtx is the context an acquisition passes down its handler chain and
// to the store: the caller's context, ended also by the facade's bound (the
// wait's end plus attemptGrace; for a single attempt, attemptBound) and,
// when the acquisition may wait, by Close.
//
// It is allocated with what else the acquisition needs only while it runs
// (see acquisition), not with the grant: a held lock does not keep it.
// It makes its Done channel and timer only when someone asks for Done: a
// store that answers in process never does, a network client does when it
// waits. Deadline reports the bound, so clients that set I/O deadlines
// from the context (go-redis, gRPC) stop at it. Err reports the caller's
// context's end and Close at once, and the bound once Done's timer fired.
//
// context.Cause of an acqCtx is the caller's context's cause; the facade
// classifies an acquisition's end itself (bound, Close, caller).
type acqCtx struct {
	parent context.Context
	d      *DistributeLock // nil: Close does not end it (a single attempt)
	bound  time.Time       // zero until needed, for a single attempt: attemptBound from then

	mu         sync.Mutex
	done       chan struct{}
	err        error
	timer      *time.Timer
	stopParent func() bool
	stopClose  func() bool
}

func (c *acqCtx) init(parent context.Context, d *DistributeLock, r *Request) {
	c.parent = parent
	if r.Wait > 0 {
		c.d, c.bound = d, r.Deadline.Add(attemptGrace)
	}
}

func (c *acqCtx) boundLocked() time.Time {
	if c.bound.IsZero() {
		c.bound = time.Now().Add(attemptBound)
	}
	return c.bound
}

// Deadline returns the earlier of the caller's deadline and the bound.
func (c *acqCtx) Deadline() (time.Time, bool) {
	c.mu.Lock()
	b := c.boundLocked()
	c.mu.Unlock()
	if d, ok := c.parent.Deadline(); ok && d.Before(b) {
		return d, true
	}
	return b, true
}

// Value returns the caller's context's values.
func (c *acqCtx) Value(key any) any { return c.parent.Value(key) }

// Err returns why the context ended, or nil.
func (c *acqCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		switch {
		case c.parent.Err() != nil:
			c.endLocked(c.parent.Err())
		case c.d != nil && c.d.isClosed():
			c.endLocked(context.Canceled)
		}
	}
	return c.err
}

// Done returns a channel closed when the context ends, arming what closes
// it on the first call.
func (c *acqCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.done
	}
	c.done = make(chan struct{})
	if c.err != nil {
		close(c.done)
		return c.done
	}
	c.timer = time.AfterFunc(time.Until(c.boundLocked()), func() { c.end(context.DeadlineExceeded) })
	if c.parent.Done() != nil {
		c.stopParent = context.AfterFunc(c.parent, func() { c.end(c.parent.Err()) })
	}
	if c.d != nil {
		c.stopClose = context.AfterFunc(c.d.closing, func() { c.end(context.Canceled) })
	}
	return c.done
}

func (c *acqCtx) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.endLocked(err)
	}
}

// endLocked ends the context with err.
func (c *acqCtx) endLocked(err error) {
	c.err = err
	if c.done != nil {
		close(c.done)
	}
	c.stopLocked()
}

// stop releases the timer and callbacks once the acquisition is over.
func (c *acqCtx) stop() {
	c.mu.Lock()
	c.stopLocked()
	c.mu.Unlock()
}

func (c *acqCtx) stopLocked() {
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if c.stopParent != nil {
		c.stopParent()
		c.stopParent = nil
	}
	if c.stopClose != nil {
		c.stopClose()
		c.stopClose = nil
	}
}

// pastBound reports whether the bound has passed.
func (c *acqCtx) pastBound() bool {
	c.mu.Lock()
	b := c.boundLocked()
	c.mu.Unlock()
	return !time.Now().Before(b)
}

func (c *acqCtx) String() string { return "distlock.acquisition" }
