package distlock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
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
// the caller's own Done, the one end the deadline does not tell
// ([backend.BoundedContext]). Only Done makes something: a context of its
// own (inner: the caller's context, with the bound as deadline too,
// cancelled by Close), whose Done is the acqCtx's and which Value hands
// the context package as the nearest cancel context, so that
// context.WithCancel and context.AfterFunc over an acqCtx, or over a
// context that wraps it with values (gRPC's metadata, etcd's), register
// with inner instead of starting a goroutine that waits on Done. Done
// closes when the acquisition ends, too: nothing may outlive it on its
// context, and nothing of it stays registered with the caller's.
//
// context.Cause of an acqCtx is the caller's context's cause once it ended
// the acquisition, context.Canceled for Close and context.DeadlineExceeded
// for the bound; the facade classifies an acquisition's end itself.
type acqCtx struct {
	parent context.Context
	d      *DistributeLock // nil: Close does not end it (a single attempt)
	bound  time.Time       // zero until needed, for a single attempt: attemptBound from then

	inner atomic.Pointer[innerCtx] // made by Done

	mu        sync.Mutex
	err       error
	stopClose func() bool
}

// acqCtxKey finds an acquisition's context through the contexts a handler
// derives from it (IsContention).
type acqCtxKey struct{}

// innerCtx is the context behind an acqCtx's Done: ctx has the bound as
// its deadline and derives from the caller's context through a cancel
// context, which cancel ends with a cause; release ends ctx and frees its
// timer.
type innerCtx struct {
	ctx     context.Context
	cancel  context.CancelCauseFunc
	release context.CancelFunc
}

var _ backend.BoundedContext = (*acqCtx)(nil)

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

// Value returns the caller's context's values, and, once Done was made,
// inner as the cancel context the context package looks for (inner
// derives from the caller's context: its other values are the caller's).
func (c *acqCtx) Value(key any) any {
	if _, ok := key.(acqCtxKey); ok {
		return c
	}
	if in := c.inner.Load(); in != nil {
		return in.ctx.Value(key)
	}
	return c.parent.Value(key)
}

// Err returns why the context ended, or nil: the caller's context's
// error (its deadline's passing is its), context.Canceled once Close ran
// (for an acquisition that may wait), context.DeadlineExceeded once the
// bound has passed. Err ends the context when it finds it ended, closing
// Done if it was made.
func (c *acqCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		switch {
		case c.parent.Err() != nil:
			c.endLocked(c.parent.Err(), context.Cause(c.parent))
		case c.d != nil && c.d.isClosed():
			c.endLocked(context.Canceled, context.Canceled)
		case !time.Now().Before(c.boundLocked()):
			c.endLocked(context.DeadlineExceeded, context.DeadlineExceeded)
		}
	}
	return c.err
}

// Cancelled implements [backend.BoundedContext]: the caller's context's
// Done, the one way the acquisition's context ends that its deadline does
// not tell (Close is seen by Err); nil when the caller's cannot end.
func (c *acqCtx) Cancelled() <-chan struct{} { return c.parent.Done() }

// Done returns a channel closed when the context ends, making inner on
// the first call.
func (c *acqCtx) Done() <-chan struct{} {
	if in := c.inner.Load(); in != nil {
		return in.ctx.Done()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if in := c.inner.Load(); in != nil {
		return in.ctx.Done()
	}
	// The caller's deadline ends base, with the caller's error and cause;
	// the bound ends ctx.
	in := new(innerCtx)
	var base context.Context
	base, in.cancel = context.WithCancelCause(c.parent)
	in.ctx, in.release = context.WithDeadline(base, c.boundLocked())
	c.inner.Store(in)
	if c.err != nil {
		in.cancel(c.err)
	} else if c.d != nil {
		c.stopClose = context.AfterFunc(c.d.closing, func() { c.end(context.Canceled) })
	}
	return in.ctx.Done()
}

func (c *acqCtx) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.endLocked(err, err)
	}
}

// endLocked ends the context with err (and cause, for inner, which also
// ends at the bound and with the caller's context by itself).
func (c *acqCtx) endLocked(err, cause error) {
	c.err = err
	if in := c.inner.Load(); in != nil {
		in.cancel(cause)
	}
}

// stop ends what Done made, once the acquisition is over: inner's timer,
// and its registration with the caller's context (a context the caller
// keeps for long, a server's, would otherwise keep one per acquisition).
func (c *acqCtx) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopClose != nil {
		c.stopClose()
		c.stopClose = nil
	}
	if in := c.inner.Load(); in != nil {
		in.release()
		in.cancel(errAcquisitionOver)
	}
}

// errAcquisitionOver is the cause of an acquisition's context that ended
// because the acquisition returned.
var errAcquisitionOver = errors.New("distlock: the acquisition is over")

// pastBound reports whether the bound has passed.
func (c *acqCtx) pastBound() bool {
	c.mu.Lock()
	b := c.boundLocked()
	c.mu.Unlock()
	return !time.Now().Before(b)
}

func (c *acqCtx) String() string { return "distlock.acquisition" }
