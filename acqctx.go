package distlock

import (
	"context"
	"sync"
	"time"

	"github.com/distlock/distlock/backend"
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
// It costs nothing for what nobody asks: Deadline reports the bound, so
// clients that set I/O deadlines from the context (go-redis with
// ContextTimeoutEnabled, gRPC) stop at it; Err reports the caller's
// context's end, Close and the bound's passing as soon as asked (it reads
// the clock); Cancelled hands a store that bounds its I/O by the deadline
// the caller's own Done, the one end the deadline does not cover
// ([backend.BoundedContext]). Only Done makes a channel, with the timer
// and callbacks that close it, on its first call; AfterFunc registers
// with it, so that context.WithCancel and context.AfterFunc over an
// acqCtx start no goroutine.
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
	afters     []*afterFunc // AfterFunc's callbacks, run when it ends
}

// afterFunc is a callback registered by AfterFunc.
type afterFunc struct{ f func() }

var (
	_ backend.BoundedContext = (*acqCtx)(nil)
	// The context package's afterFuncer, which context.WithCancel and
	// context.AfterFunc use instead of a goroutine waiting on Done.
	_ interface {
		AfterFunc(func()) func() bool
	} = (*acqCtx)(nil)
)

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

// Err returns why the context ended, or nil: the caller's context's
// error, context.Canceled once Close ran (for an acquisition that may
// wait), context.DeadlineExceeded once the bound has passed. Err ends the
// context when it finds it ended, closing Done if it was made.
func (c *acqCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		switch {
		case c.parent.Err() != nil:
			c.endLocked(c.parent.Err())
		case c.d != nil && c.d.isClosed():
			c.endLocked(context.Canceled)
		case !time.Now().Before(c.boundLocked()):
			c.endLocked(context.DeadlineExceeded)
		}
	}
	return c.err
}

// Cancelled implements [backend.BoundedContext]: the caller's context's
// Done, the one way the acquisition's context ends that its deadline does
// not tell (Close is seen by Err); nil when the caller's cannot end.
func (c *acqCtx) Cancelled() <-chan struct{} { return c.parent.Done() }

// AfterFunc arranges for f to run in its own goroutine once the context
// ends (at once if it has), as context.AfterFunc does, and returns a
// function that stops that, reporting whether it did.
func (c *acqCtx) AfterFunc(f func()) (stop func() bool) {
	c.Done() // arms what ends it
	a := &afterFunc{f: f}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	c.afters = append(c.afters, a)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, x := range c.afters {
			if x == a {
				c.afters = append(c.afters[:i], c.afters[i+1:]...)
				return true
			}
		}
		return false
	}
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
	for _, a := range c.afters {
		go a.f()
	}
	c.afters = nil
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
