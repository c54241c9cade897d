package distlock

import (
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
