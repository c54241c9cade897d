package distlock

import (
	"container/heap"
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
// ([backend.BoundedContext]).
//
// Only Done makes something, and as little as it can: inner, one cancel
// context over base (a context of the acquisition's own, which only the
// context package sees: see acqBase), whose Done is the acqCtx's and which
// Value hands the context package as the nearest cancel context, so that
// context.WithCancel and context.AfterFunc over an acqCtx, or over a
// context that wraps it with values (gRPC's metadata, etcd's), register
// with inner instead of starting a goroutine that waits on Done. inner is
// ended by the acquisition itself (end), which three things call: the
// facade's registry of acquisitions (acqRegistry: one timer for all their
// bounds, and Close), and, when the caller's context can end, a
// context.AfterFunc on it. Done closes when the acquisition ends, too
// (stop): nothing may outlive it on its context, and nothing of it stays
// registered with the caller's context or the registry.
//
// context.Cause of an acqCtx is the caller's context's cause once it ended
// the acquisition, context.Canceled for Close, context.DeadlineExceeded
// for the bound and errAcquisitionOver once the acquisition returned (its
// Err then context.Canceled); so are the errors and causes of the contexts
// derived from it. The facade classifies an acquisition's end itself.
type acqCtx struct {
	parent   context.Context
	d        *DistributeLock
	closable bool         // Close ends it: an acquisition that may wait
	base     acqBase      // inner's parent
	why      atomic.Int32 // endNone until the context ends, then why

	// made is set once Done made inner; the fields below it are written
	// before, under mu, and read after it without.
	made atomic.Bool
	done <-chan struct{} // inner's Done

	mu         sync.Mutex
	bound      time.Time // zero until needed, for a single attempt: attemptBound from then
	inner      context.Context
	cancel     context.CancelCauseFunc // ends inner, unregistered from base
	onEnd      func()                  // inner's callback on base: ends inner with why
	stopParent func() bool             // unregisters end from the caller's context
	stopped    bool                    // the acquisition is over
	idx        int                     // position in the registry's heap (guarded by its mu); -1: not in it
}

// Why an acquisition's context ended.
const (
	endNone   int32 = iota
	endParent       // the caller's context ended
	endClose        // Close ran (an acquisition that may wait)
	endBound        // the bound passed
	endOver         // the acquisition returned (stop)
)

// acqCtxKey finds an acquisition's context through the contexts a handler
// derives from it (IsContention).
type acqCtxKey struct{}

var _ backend.BoundedContext = (*acqCtx)(nil)

func (c *acqCtx) init(parent context.Context, d *DistributeLock, r *Request) {
	c.parent, c.d, c.base.c, c.idx = parent, d, c, -1
	if r.Wait > 0 {
		c.closable, c.bound = true, r.Deadline.Add(attemptGrace)
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
// derives from base, whose other values are the caller's).
func (c *acqCtx) Value(key any) any {
	if _, ok := key.(acqCtxKey); ok {
		return c
	}
	if c.made.Load() {
		return c.inner.Value(key)
	}
	return c.parent.Value(key)
}

// Err returns why the context ended, or nil: the caller's context's
// error (its deadline's passing is its), context.Canceled once Close ran
// (for an acquisition that may wait) or the acquisition returned,
// context.DeadlineExceeded once the bound has passed. Err ends the context when it finds it ended, closing
// Done if it was made.
func (c *acqCtx) Err() error {
	why := c.why.Load()
	if why == endNone {
		switch {
		case c.parent.Err() != nil:
			c.end(endParent)
		case c.closable && c.d.isClosed():
			c.end(endClose)
		case c.pastBound():
			c.end(endBound)
		}
		why = c.why.Load()
	}
	return c.errOf(why)
}

func (c *acqCtx) errOf(why int32) error {
	switch why {
	case endParent:
		return c.parent.Err()
	case endClose:
		return context.Canceled
	case endBound:
		return context.DeadlineExceeded
	case endOver:
		return context.Canceled
	}
	return nil
}

// Cancelled implements [backend.BoundedContext]: the caller's context's
// Done, the one way the acquisition's context ends that its deadline does
// not tell (Close is seen by Err); nil when the caller's cannot end.
func (c *acqCtx) Cancelled() <-chan struct{} { return c.parent.Done() }

// Done returns a channel closed when the context ends, making inner on
// the first call.
func (c *acqCtx) Done() <-chan struct{} {
	if c.made.Load() {
		return c.done
	}
	c.mu.Lock()
	if !c.made.Load() {
		c.makeLocked()
	}
	c.mu.Unlock()
	if c.why.Load() != endNone {
		c.fire() // it ended while inner was made
	}
	return c.done
}

// makeLocked makes inner and registers what ends it.
func (c *acqCtx) makeLocked() {
	c.boundLocked()
	if c.why.Load() == endOver {
		// Over: inner ends at once, with the stop's cause.
		c.inner, c.cancel = context.WithCancelCause(context.WithoutCancel(c.parent))
		c.cancel(errAcquisitionOver)
		c.done = c.inner.Done()
		c.made.Store(true)
		return
	}
	c.inner, c.cancel = context.WithCancelCause(&c.base) // sets onEnd, or ends inner at once
	c.done = c.inner.Done()
	switch {
	case c.stopped || c.why.Load() != endNone: // ended for another reason before
	default:
		if c.parent.Done() != nil {
			c.stopParent = context.AfterFunc(c.parent, func() { c.end(endParent) })
		}
		if !c.d.acqs.add(c) {
			c.why.CompareAndSwap(endNone, endClose) // Done fires it
		}
	}
	c.made.Store(true)
}

// end ends the context for why, unless it ended already.
func (c *acqCtx) end(why int32) {
	if c.why.CompareAndSwap(endNone, why) {
		c.fire()
	}
}

// fire runs inner's callback on base once: inner ends with base's Err and
// Cause, and so do the contexts derived from it.
func (c *acqCtx) fire() {
	c.mu.Lock()
	f := c.onEnd
	c.onEnd = nil
	c.mu.Unlock()
	if f != nil {
		f()
	}
}

// stop ends what Done made, once the acquisition is over: inner, its
// place in the registry and its registration with the caller's context (a
// context the caller keeps for long, a server's, would otherwise keep one
// per acquisition).
func (c *acqCtx) stop() {
	c.mu.Lock()
	c.why.CompareAndSwap(endNone, endOver) // under mu: see makeLocked
	c.stopped = true
	if !c.made.Load() {
		c.mu.Unlock()
		return
	}
	c.onEnd = nil
	if c.stopParent != nil {
		c.stopParent()
		c.stopParent = nil
	}
	c.d.acqs.remove(c)
	c.mu.Unlock()
	c.cancel(errAcquisitionOver)
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

// acqBase is inner's parent: the context package alone sees it, when
// Done makes inner with context.WithCancelCause. It ends when its
// acquisition's context ends, and tells inner so through the one callback
// inner registers with its AfterFunc method (which makes inner take Err
// and Cause from it: context.DeadlineExceeded for the bound, as a
// deadline's timer would give, without a timer per acquisition). Its Done
// is a channel that is closed once it ended when asked, and otherwise
// one that never closes: the context package asks it only once, while
// making inner, to see whether it ended already.
type acqBase struct{ c *acqCtx }

var (
	neverDone  = make(chan struct{})
	closedDone = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()
)

func (b *acqBase) Deadline() (time.Time, bool) { return b.c.Deadline() }

func (b *acqBase) Done() <-chan struct{} {
	if b.c.why.Load() != endNone {
		return closedDone
	}
	return neverDone
}

func (b *acqBase) Err() error { return b.c.errOf(b.c.why.Load()) }

// Value returns the caller's context's values, except the context
// package's own key for the nearest cancel context once the acquisition
// ended for a reason of its own: context.Cause then falls back to Err
// (the caller's cancel context, asked, has no cause).
func (b *acqBase) Value(key any) any {
	if _, ok := key.(acqCtxKey); ok {
		return b.c
	}
	if isCancelCtxKey(key) && b.c.why.Load() != endParent {
		return nil
	}
	return b.c.parent.Value(key)
}

// AfterFunc registers inner's callback; it is called once, by
// context.WithCancelCause in makeLocked, under the acquisition's mu.
func (b *acqBase) AfterFunc(f func()) func() bool {
	b.c.onEnd = f
	return stopNothing
}

// stopNothing is inner's unregistration from base, which stop does.
func stopNothing() bool { return true }

// cancelKeyProbe recognises the context package's key for the nearest
// cancel context, which a cancel context answers with itself (ended or
// not).
var cancelKeyProbe = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

func isCancelCtxKey(key any) bool {
	if _, ok := key.(*int); !ok {
		return false
	}
	return cancelKeyProbe.Value(key) == cancelKeyProbe
}

// acqRegistry holds a facade's acquisitions whose Done was made, until
// they stop: a heap by bound with one timer armed no later than the
// earliest (it ends those whose bound passed and arms itself for the
// next), and Close ends the closable ones. Lock order: an acquisition's
// mu, then the registry's; the registry ends acquisitions without its own.
type acqRegistry struct {
	mu     sync.Mutex
	q      acqHeap
	timer  *time.Timer
	armed  time.Time // when the timer fires; zero: not armed
	closed bool
}

// add registers c (its bound set), unless Close ran and c is closable:
// then it returns false.
func (r *acqRegistry) add(c *acqCtx) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed && c.closable {
		return false
	}
	heap.Push(&r.q, c)
	if r.armed.IsZero() || c.bound.Before(r.armed) {
		r.armLocked(c.bound)
	}
	return true
}

// remove unregisters c, if it is registered. The timer stays armed: it
// fires for nothing at worst.
func (r *acqRegistry) remove(c *acqCtx) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.idx < 0 {
		return
	}
	heap.Remove(&r.q, c.idx)
	if len(r.q) == 0 && cap(r.q) > 1024 {
		r.q = nil // a burst's array is not kept
	}
}

func (r *acqRegistry) armLocked(at time.Time) {
	r.armed = at
	if r.timer == nil {
		r.timer = time.AfterFunc(time.Until(at), r.expire)
	} else {
		r.timer.Reset(time.Until(at))
	}
}

// expire ends the acquisitions whose bound passed and arms the timer for
// the next.
func (r *acqRegistry) expire() {
	r.mu.Lock()
	r.armed = time.Time{}
	now := time.Now()
	var due []*acqCtx
	for len(r.q) > 0 && !now.Before(r.q[0].bound) {
		due = append(due, heap.Pop(&r.q).(*acqCtx))
	}
	if len(r.q) > 0 {
		r.armLocked(r.q[0].bound)
	}
	r.mu.Unlock()
	for _, c := range due {
		c.end(endBound)
	}
}

// close ends the closable acquisitions and refuses those that come later.
func (r *acqRegistry) close() {
	r.mu.Lock()
	r.closed = true
	var ending []*acqCtx
	for _, c := range r.q {
		if c.closable {
			ending = append(ending, c)
		}
	}
	r.mu.Unlock()
	for _, c := range ending {
		c.end(endClose)
	}
}

// len returns how many acquisitions are registered.
func (r *acqRegistry) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.q)
}

// acqHeap orders the registered acquisitions by bound (container/heap,
// as the scheduler's grantHeap); each keeps its place in idx.
type acqHeap []*acqCtx

func (h acqHeap) Len() int           { return len(h) }
func (h acqHeap) Less(i, j int) bool { return h[i].bound.Before(h[j].bound) }
func (h acqHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *acqHeap) Push(x any) {
	c := x.(*acqCtx)
	c.idx = len(*h)
	*h = append(*h, c)
}
func (h *acqHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	old[len(old)-1] = nil
	c.idx = -1
	*h = old[:len(old)-1]
	return c
}
