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
	// Key is the lock's name, already validated.
	Key string
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

	s       *lockState // the lock this request belongs to
	granted int        // the outermost chain depth whose acquire succeeded
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
// Release is called once for each acquisition that succeeded, when its last
// handle is unlocked; its error is [Lock.Unlock]'s.
//
// Reentrant acquisitions ([ContextWithLock]) do not pass through the chain:
// they do no I/O.
type Handler interface {
	Acquire(ctx context.Context, r *Request, next AcquireFunc) error
	Release(ctx context.Context, r *Request, next ReleaseFunc) error
}

// LossObserver is an optional interface of a [Handler]: LockLost is called
// once when a held lock is known lost before its Unlock (its TTL ran out
// without renewal while someone watched [Lock.Done], a renewal failed, or
// the backend reported the loss of a session or lease). cause says which.
// It must not block.
type LossObserver interface {
	LockLost(r *Request, cause error)
}

// chain composes handlers around the innermost steps, first outermost. It
// returns the acquire chain and, for each depth i, the release chain from
// handler i inward (releaseAt[len(hs)] is the store alone). An acquire that
// a handler fails after the steps inside it succeeded is given back from
// the depth of that handler's next step, so the handlers that acquired see
// their release and the one that failed does not.
func chain(hs []Handler, acquire AcquireFunc, release ReleaseFunc) (AcquireFunc, []ReleaseFunc) {
	n := len(hs)
	releaseAt := make([]ReleaseFunc, n+1)
	releaseAt[n] = release
	inner := acquire
	acquire = func(ctx context.Context, r *Request) error {
		err := inner(ctx, r)
		if err == nil {
			r.granted = n
		}
		return err
	}
	for i := n - 1; i >= 0; i-- {
		h, nextA, nextR := hs[i], acquire, releaseAt[i+1]
		acquire = func(ctx context.Context, r *Request) error {
			err := h.Acquire(ctx, r, nextA)
			if err == nil && r.granted == i+1 {
				r.granted = i
			}
			return err
		}
		releaseAt[i] = func(ctx context.Context, r *Request) error { return h.Release(ctx, r, nextR) }
	}
	return acquire, releaseAt
}
