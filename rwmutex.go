package distlock

import (
	"context"
	"time"
)

// RWMutex is a handle to the read/write lock of a key: any number of
// readers at once, or one writer. A writer that waits keeps new readers
// out, as sync.RWMutex does, so a stream of readers cannot starve it. Each
// grant is a [*Lock] with its own TTL, renewal, Done and Unlock; tokens
// increase across the grants, so a write grant's token is larger than
// every earlier grant's and a read grant's larger than every earlier write
// grant's: a fenced resource can refuse a stale writer. Get one with
// [DistributeLock.RWMutex]; it holds no state.
//
// Reentrancy: a context carrying a read (write) grant of this lock reenters
// it for another read (write); asking for the other side with it fails with
// [ErrReentrancy] at once (no upgrade or downgrade: it would wait on
// itself).
type RWMutex struct {
	d   *DistributeLock
	key string
}

// RWMutex returns a handle to key's read/write lock.
func (d *DistributeLock) RWMutex(key string) *RWMutex {
	return &RWMutex{d: d, key: key}
}

// TryLock takes the write side, waiting at most wait, as
// [DistributeLock.TryLock] does; [ErrUnsupported] when the store holds no
// read/write locks.
func (rw *RWMutex) TryLock(ctx context.Context, wait time.Duration) (*Lock, error) {
	return rw.d.tryLock(ctx, rw.key, wait, KindWrite, 0)
}

// TryRLock takes the read side, waiting at most wait (also while a writer
// waits), as [DistributeLock.TryLock] does.
func (rw *RWMutex) TryRLock(ctx context.Context, wait time.Duration) (*Lock, error) {
	return rw.d.tryLock(ctx, rw.key, wait, KindRead, 0)
}

// Do runs fn while holding the write side, as [DistributeLock.Do] does.
func (rw *RWMutex) Do(ctx context.Context, wait time.Duration, fn func(ctx context.Context, lk *Lock) error) error {
	return rw.d.do(ctx, rw.key, wait, KindWrite, 0, fn)
}

// RDo runs fn while holding the read side, as [DistributeLock.Do] does.
func (rw *RWMutex) RDo(ctx context.Context, wait time.Duration, fn func(ctx context.Context, lk *Lock) error) error {
	return rw.d.do(ctx, rw.key, wait, KindRead, 0, fn)
}
