package distlock

import (
	"context"
	"time"
)

type ttlKey struct{}

// ContextWithTTL returns a copy of ctx that makes the TryLock calls it is
// passed to use ttl instead of the default set by [WithDefaultTTL]. It
// applies to those calls only. A ttl <= 0 makes TryLock fail with
// [ErrInvalid].
func ContextWithTTL(ctx context.Context, ttl time.Duration) context.Context {
	return context.WithValue(ctx, ttlKey{}, ttl)
}

// TTLFromContext returns the TTL set by [ContextWithTTL], and whether one
// was set.
func TTLFromContext(ctx context.Context) (time.Duration, bool) {
	ttl, ok := ctx.Value(ttlKey{}).(time.Duration)
	return ttl, ok
}

type lockKey struct{}

// heldList is the chain of locks a context carries, innermost first.
type heldList struct {
	lk   *Lock
	next *heldList
}

// ContextWithLock returns a copy of ctx that carries lk, so that a
// [DistributeLock.TryLock] of the same key on the same DistributeLock with
// this context (or one derived from it) reenters lk instead of waiting on
// itself. [DistributeLock.Do] passes such a context to its function.
// A nil lk, or a Lock not returned by TryLock, returns ctx unchanged.
func ContextWithLock(ctx context.Context, lk *Lock) context.Context {
	if lk == nil || lk.g == nil {
		return ctx
	}
	next, _ := ctx.Value(lockKey{}).(*heldList)
	return context.WithValue(ctx, lockKey{}, &heldList{lk: lk, next: next})
}

// heldIn returns the grant of the innermost lock on d that ctx carries
// and that holds key as kind (with a semaphore's limit): a lock of key, or
// a lock of several keys among which key is. nil when there is none.
func heldIn(ctx context.Context, d *DistributeLock, key string, kind Kind, limit int) *grant {
	l, _ := ctx.Value(lockKey{}).(*heldList)
	for ; l != nil; l = l.next {
		if g := l.lk.g; g != nil && g.d == d && g.lease.Kind == kind && int(g.lease.Limit) == limit && g.hasKey(key) {
			return g
		}
	}
	return nil
}

// hasKey reports whether key is one of g's keys.
func (g *grant) hasKey(key string) bool {
	for _, l := range g.subLeases() {
		if l.Key == key {
			return true
		}
	}
	return false
}

// otherSide returns the innermost grant of the other side of key's
// read/write lock on d that ctx carries, or nil.
func otherSide(ctx context.Context, d *DistributeLock, key string, kind Kind) *grant {
	if kind != KindRead && kind != KindWrite {
		return nil
	}
	other := KindRead
	if kind == KindRead {
		other = KindWrite
	}
	if g := heldIn(ctx, d, key, other, 0); g != nil && g.live() {
		return g
	}
	return nil
}
