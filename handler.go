package distlock

import (
	"context"
	"time"
)

// Request describes one lock as it passes through the handler chain: the
// same *Request is given to the handlers on acquire and, if it was acquired,
// on release. Handlers may read every field; they should not change them,
// and must not keep the pointer after Release returns.
type Request struct {
	// Key is the lock's name, already validated; for a lock of several
	// keys ([DistributeLock.TryLockAll]), the first in canonical order.
	Key string
	// Keys lists the keys of a lock of several keys, in canonical order;
	// nil for a lock of one key.
	Keys []string
	// Kind is the kind of lock: a mutex ([DistributeLock.TryLock]), a
	// semaphore's permit ([Semaphore]), a read or write grant of a
	// read/write lock ([RWMutex]), or an election's leadership
	// ([Election.Campaign]; its Key is the election's mutex,
	// backend.ElectionPrefix + the election's name).
	Kind Kind
	// Limit is the semaphore's limit; 0 for the other kinds.
	Limit int
	// Value is the owner value of this acquisition.
	Value string
	// TTL is the lease time resolved for this call (ContextWithTTL or the
	// default).
	TTL time.Duration
	// Wait is the wait the caller gave TryLock.
	Wait time.Duration
	// Deadline is when the wait ends; zero when Wait is 0 (one attempt).
	Deadline time.Time

	// RemoteAttempts counts the calls that reached the backend's acquire
	// for this request. Set by the innermost step.
	RemoteAttempts int
	// Token is the fencing token, set once acquired (0 if the backend has
	// none).
	Token uint64
	// Acquired is when the successful attempt started (for a push store,
	// when its wait ended); zero until the lock is held. The lock's TTL is
	// counted from here, so it errs early, never late.
	Acquired time.Time

	// RolledBack is true during the Release that gives back an
	// acquisition TryLock did not return (a handler outside failed, Close
	// ran, or the lock's validity ended first): the lock was never held by
	// the caller.
	RolledBack bool

	g        *grant // the grant this request belongs to
	label    string // the label the store keeps with the grant (WithLabel; an election's also its value)
	acquired uint64 // bit i: depth i's Acquire returned nil (see chain)
	answered int    // store calls that answered (spin stores)
}

// AcquireFunc is the next step of the chain on acquire: the next handler,
// or at the end the backend (spin loop or watch).
type AcquireFunc func(ctx context.Context, r *Request) error

// ReleaseFunc is the next step of the chain on release.
type ReleaseFunc func(ctx context.Context, r *Request) error

// Handler intercepts acquisitions and releases, like a gRPC interceptor.
// Handlers are installed with [WithHandlers] and composed once in [New];
// the first handler is the outermost:
//
//	acquire: h1 start -> h2 start -> backend -> h2 end -> h1 end
//	release: h1 start -> h2 start -> backend -> h2 end -> h1 end
//
// So a handler that acts before calling next on acquire (a local lock taken
// before the store is reached) acts after next returns on release (the
// local lock is freed only after the store released), and woken goroutines
// never find the key still held remotely.
//
// Acquire may short-circuit by returning without calling next; it must
// then return an error (typically wrapping [ErrNotAcquired]). It sees the
// outcome as next's error: nil (held), [ErrNotAcquired] possibly joined
// with a context error (contention), or a store error; r.RemoteAttempts
// tells how many backend calls were made.
//
// Acquire's ctx is the caller's, ended also by [DistributeLock.Close] and
// by the end of the wait (with a little grace for the last attempt): a
// handler that waits must watch it.
//
// Release is called exactly once for each Acquire that returned nil: when
// the last handle is unlocked (its error is [Lock.Unlock]'s), when Close
// releases the lock, or when the acquisition is rolled back before TryLock
// returns it (a handler outside failed, Close ran, or the lock's validity
// ended first). A Release that returns a store error is called again when
// the caller retries Unlock. The lock is committed (counted as held,
// renewed, visible to Close) only once the whole chain returned nil.
//
// Reentrant acquisitions ([ContextWithLock]) do not pass through the chain:
// they do no I/O.
type Handler interface {
	Acquire(ctx context.Context, r *Request, next AcquireFunc) error
	Release(ctx context.Context, r *Request, next ReleaseFunc) error
}

// LossObserver is an optional interface of a [Handler]: LockLost is called
// once when a held lock is known lost before its release began (its
// validity ended without renewal while someone watched [Lock.Done] or
// renewal was on, a renewal found it gone or failed until its validity
// ended, a nested TryLock found its validity ended, the backend reported the
// loss of a session or lease, or Close could not release it). cause says
// which. It is called before Done closes, never for a lock whose release
// has begun, and never for an acquisition rolled back before TryLock
// returned it. It must not block.
type LossObserver interface {
	LockLost(r *Request, cause error)
}

// maxHandlers is how many handlers [WithHandlers] accepts: the chain
// records which of its steps acquired in one machine word.
const maxHandlers = 62

// chain is the handler chain composed once by [New]: depth i < n is
// handler i, depth n the store. Each Request records in acquired which
// depths' Acquire returned nil, so that its release reaches exactly those
// handlers, nested as usual, and each of them once: after a full
// acquisition every depth; after a handler failed once the steps inside it
// had acquired, the steps inside it; after a handler returned nil without
// calling next (a bug), the handlers down to it and not the store.
type chain struct {
	acquire     AcquireFunc   // from depth 0
	releaseFrom []ReleaseFunc // releaseFrom[i]: the release chain from the first depth >= i that acquired
}

func newChain(hs []Handler, acquire AcquireFunc, release ReleaseFunc) *chain {
	n := len(hs)
	c := &chain{releaseFrom: make([]ReleaseFunc, n+2)}
	c.releaseFrom[n+1] = func(context.Context, *Request) error { return nil }
	for i := n; i >= 0; i-- {
		bit := uint64(1) << i
		if i == n {
			c.releaseFrom[i] = func(ctx context.Context, r *Request) error {
				if r.acquired&bit == 0 {
					return nil
				}
				return release(ctx, r)
			}
			continue
		}
		h, next := hs[i], c.releaseFrom[i+1]
		c.releaseFrom[i] = func(ctx context.Context, r *Request) error {
			if r.acquired&bit == 0 {
				return next(ctx, r)
			}
			return h.Release(ctx, r, next)
		}
	}
	bit := uint64(1) << n
	inner := func(ctx context.Context, r *Request) error {
		err := acquire(ctx, r)
		if err == nil {
			r.acquired |= bit
		}
		return err
	}
	for i := n - 1; i >= 0; i-- {
		h, next, bit := hs[i], inner, uint64(1)<<i
		inner = func(ctx context.Context, r *Request) error {
			err := h.Acquire(ctx, r, next)
			if err == nil {
				r.acquired |= bit
			}
			return err
		}
	}
	c.acquire = inner
	return c
}

// storeAcquired reports whether the store granted r's lock.
func (c *chain) storeAcquired(r *Request) bool {
	return r.acquired&(uint64(1)<<(len(c.releaseFrom)-2)) != 0
}

// release runs r's release through the depths that acquired.
func (c *chain) release(ctx context.Context, r *Request) error {
	return c.releaseFrom[0](ctx, r)
}
