package distlock

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// Lock is a handle of a held lock, returned by [DistributeLock.TryLock].
// Its methods are safe for concurrent use. The zero Lock, and a nil *Lock
// (what TryLock returns with an error), hold nothing: their getters return
// zero values, Done a closed channel, and Extend and Unlock an [ErrInvalid]
// error; none panics.
type Lock struct {
	g        *grant
	unlocked atomic.Bool
}

// Key returns the lock's key.
func (l *Lock) Key() string {
	if l == nil || l.g == nil {
		return ""
	}
	return l.g.lease.Key
}

// Token returns the fencing token: a number that strictly increases with
// every new holder of the key on one store. Pass it to the resource the lock
// protects and have it refuse writes with a token lower than one it has
// seen: that keeps a holder whose lock expired while it was paused from
// doing harm. 0 if the backend has no tokens (Redlock).
func (l *Lock) Token() uint64 {
	if l == nil || l.g == nil {
		return 0
	}
	return l.g.lease.Token
}

// Keys returns the keys of a lock of several keys
// ([DistributeLock.TryLockAll]) in canonical order, or the one key.
func (l *Lock) Keys() []string {
	if l == nil || l.g == nil {
		return nil
	}
	subs := l.g.subLeases()
	keys := make([]string, len(subs))
	for i, s := range subs {
		keys[i] = s.Key
	}
	return keys
}

// Tokens returns the fencing token of each key, in the order of
// [Lock.Keys].
func (l *Lock) Tokens() []uint64 {
	if l == nil || l.g == nil {
		return nil
	}
	subs := l.g.subLeases()
	out := make([]uint64, len(subs))
	for i, s := range subs {
		out[i] = s.Token
	}
	return out
}

// Extend extends the lock to ttl from now, if the store still holds it for
// this owner (compare-and-extend; every key of a lock of several), with or
// without [WithAutoRenew], which then keeps the new TTL. Deadline moves.
//
// A lock has one renewal or extension in flight at a time: Extend first
// waits for a renewal in flight to end. The request is bounded by the
// lock's validity as well as ctx (an answer after it would come too late),
// and the new validity counts from the request's send time. When the store
// fails or does not answer, it may still apply the request: until a later
// one succeeds, the lock's validity counts with the shorter of the TTLs.
//
// Errors: [ErrNotHeld] when the lock is gone (Done closes: it is lost),
// expired, or released, and nothing is touched then; an [ErrInvalid] error
// for ttl <= 0 or a Lock not returned by TryLock (a nil *Lock among
// them), with no I/O;
// [ErrUnsupported] when the store cannot extend locks or change a lock's
// TTL; otherwise the store's error, the lock unchanged.
func (l *Lock) Extend(ctx context.Context, ttl time.Duration) error {
	switch {
	case l == nil:
		return fmt.Errorf("%w: Extend of a nil *Lock (TryLock returned an error?)", ErrInvalid)
	case ctx == nil:
		return fmt.Errorf("%w: nil context", ErrInvalid)
	case l.g == nil:
		return fmt.Errorf("%w: a Lock not returned by TryLock", ErrInvalid)
	case ttl <= 0:
		return fmt.Errorf("%w: TTL %v for %s must be > 0", ErrInvalid, ttl, quote(l.g.lease.Key))
	}
	return l.g.extend(ctx, ttl)
}

// Done returns a channel that is closed when the lock ends: on Unlock (or
// Close), when its validity ends without renewal ([Lock.Deadline]), when a
// renewal finds it gone or fails until its validity ends, or when the
// backend reports the loss of its session or lease. All handles of a
// reentered lock share it.
func (l *Lock) Done() <-chan struct{} {
	if l == nil || l.g == nil {
		return closedChan
	}
	return l.g.doneChan()
}

var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// Deadline returns when the lock's validity ends by this process's clock:
// the start of the attempt that acquired it (or of the last successful
// renewal) plus the TTL (Redlock: its validity), less an allowance for
// clock drift and timer lateness (1% + 2ms). Done closes then unless the
// lock was renewed; renewals move it. The zero time once the lock is lost
// or released.
func (l *Lock) Deadline() time.Time {
	if l == nil || l.g == nil {
		return time.Time{}
	}
	return l.g.deadline()
}

// Unlock releases this handle. When it is the last live handle of the lock
// (see [ContextWithLock]), the lock is deleted from the store if, and only
// if, the store still holds it for this owner.
//
// Errors: [ErrNotHeld] when the store no longer held the lock (it expired or
// another owner took it), when this handle was already unlocked, when Close
// released the lock, or for a handle that is not the last of a lock known
// lost; nothing is touched then. The last handle of a lock known lost
// (Done closed) still deletes it if the store still holds it, and then
// returns nil. An [ErrInvalid] error for a nil ctx or a Lock not
// returned by TryLock (a nil *Lock among them). A store error is returned wrapped; the lock is then
// still held: Unlock may be called again, and renewal has stopped, so the
// TTL frees it at the latest. A lock the store keeps alive itself (etcd's
// shared lease, ZooKeeper's session: no TTL runs) is released again in the
// background until the store answers, the lock is lost, or Close's bound;
// Done closes then, and an Unlock called meanwhile waits for the attempt
// in flight. Unlock returns when ctx ends.
func (l *Lock) Unlock(ctx context.Context) error {
	switch {
	case l == nil:
		return fmt.Errorf("%w: Unlock of a nil *Lock (TryLock returned an error?)", ErrInvalid)
	case ctx == nil:
		return fmt.Errorf("%w: nil context", ErrInvalid)
	case l.g == nil:
		return fmt.Errorf("%w: a Lock not returned by TryLock", ErrInvalid)
	case !l.unlocked.CompareAndSwap(false, true):
		return fmt.Errorf("%w: %s already unlocked", ErrNotHeld, quote(l.g.lease.Key))
	}
	err := l.g.release(ctx, true)
	if err != nil && !isFinal(err) {
		l.unlocked.Store(false) // still held: Unlock may be retried
	}
	return err
}
