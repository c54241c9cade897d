package distlock

import (
	"context"
	"time"
)

// Semaphore is a handle to the semaphore of a key: at most limit holders at
// once across every process using the store. Each permit is a [*Lock] like
// any other, with its own owner value, TTL, renewal ([WithAutoRenew]),
// token (strictly increasing across the permits granted), Done, Deadline
// and Unlock; a holder that dies loses its permit when its TTL runs out.
// Get one with [DistributeLock.Semaphore]; it holds no state and costs
// nothing to make.
//
// Every caller of one semaphore must use one limit: an acquire while
// holders took it with another limit fails with [ErrLimitMismatch]. When it
// has no holder, the next acquire sets the limit anew.
type Semaphore struct {
	d     *DistributeLock
	key   string
	limit int
}

// Semaphore returns a handle to key's semaphore of limit holders. A limit
// below 1 or above 2^31-1 (math.MaxInt32, the largest every store holds)
// makes its methods fail with [ErrInvalid].
func (d *DistributeLock) Semaphore(key string, limit int) *Semaphore {
	return &Semaphore{d: d, key: key, limit: limit}
}

// TryAcquire takes a permit of the semaphore, waiting at most wait for a
// holder to let one go, as [DistributeLock.TryLock] does for a mutex: the
// same TTL, bounds, errors and reentrancy (a context carrying a permit of
// this semaphore reenters it). Errors as TryLock's, and [ErrLimitMismatch]
// when the holders use another limit, [ErrUnsupported] when the store holds
// no semaphores (Redlock), [ErrInvalid] for a limit below 1 or above
// 2^31-1 (no I/O).
func (s *Semaphore) TryAcquire(ctx context.Context, wait time.Duration) (*Lock, error) {
	return s.d.tryLock(ctx, s.key, wait, KindSemaphore, s.limit)
}

// Do runs fn while holding a permit, as [DistributeLock.Do] does.
func (s *Semaphore) Do(ctx context.Context, wait time.Duration, fn func(ctx context.Context, lk *Lock) error) error {
	return s.d.do(ctx, s.key, wait, KindSemaphore, s.limit, fn)
}
