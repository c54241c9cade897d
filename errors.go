package distlock

import (
	"context"
	"errors"

	"github.com/distlock/distlock/backend"
)

// ErrNotAcquired is returned by [DistributeLock.TryLock] when another owner
// held the key for the whole wait. When the context ended first, TryLock
// returns errors.Join(ErrNotAcquired, ctx.Err()), so both errors.Is checks
// hold. A failure of the store is never ErrNotAcquired.
var ErrNotAcquired = backend.ErrNotAcquired

// ErrNotHeld is returned by [Lock.Unlock] when the store no longer holds the
// lock for this owner (it expired, was taken over, or this handle was
// already unlocked), and by nested acquisitions of a lock that was lost.
var ErrNotHeld = backend.ErrNotHeld

// ErrInvalid is wrapped by every error about bad input: an empty key, a key
// the backend cannot hold, a negative wait, a TTL <= 0, a nil resource,
// context or option value, and a store constructor's nil client or bad
// option. Such calls do no I/O. It is the same value as
// [backend.ErrInvalid].
var ErrInvalid = backend.ErrInvalid

// ErrClosed is returned by [DistributeLock.TryLock] after
// [DistributeLock.Close].
var ErrClosed = errors.New("distlock: closed")

// ErrReentrancy is returned by a nested [DistributeLock.TryLock] when the
// context already holds the key as many times as [WithMaxReentrancy] allows.
var ErrReentrancy = errors.New("distlock: reentrancy limit reached")

// ErrLimitMismatch is returned by [Semaphore.TryAcquire] when the
// semaphore's current holders took it with another limit: callers of one
// semaphore must agree on its limit.
var ErrLimitMismatch = backend.ErrLimitMismatch

// ErrUnsupported is returned, before any I/O, for a kind of lock the store
// does not hold (Redlock: semaphores and read/write locks).
var ErrUnsupported = errors.New("distlock: not supported by the store")

// IsContention reports whether err, which the acquisition of r returned
// under ctx (a [Handler]'s next, with the context the handler was given),
// means contention rather than failure, as [DistributeLock.TryLock]
// decides it: the key was held for the whole wait ([ErrNotAcquired]), or
// the wait ended (the caller's context ended, or the wait's bound passed
// after the store had answered an attempt). An error of a store that did
// not answer within the bound, bad input and Close are failures. The
// access log, metrics and tracing handlers classify acquisitions with it.
func IsContention(ctx context.Context, r *Request, err error) bool {
	switch {
	case err == nil || errors.Is(err, ErrInvalid) || errors.Is(err, ErrClosed):
		return false
	case errors.Is(err, ErrNotAcquired):
		return true
	case ctx.Err() == nil:
		return false
	}
	if c, ok := ctx.Value(acqCtxKey{}).(*acqCtx); ok {
		if c.closable && c.d.isClosed() {
			return false
		}
		if c.parent.Err() != nil {
			return true // the caller ended the wait
		}
	}
	return r != nil && r.answered > 0
}
