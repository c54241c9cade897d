package distlock

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/distlock/distlock/backend"
)

// Kind is the kind of a lock: a mutex, a semaphore's permit, or the read
// or write side of a read/write lock. A key's locks of different kinds are
// distinct locks: the mutex "k", the semaphore "k" and the read/write lock
// "k" do not exclude one another.
type Kind = backend.Kind

// The kinds of lock.
const (
	KindMutex     = backend.KindMutex
	KindSemaphore = backend.KindSemaphore
	KindRead      = backend.KindRead
	KindWrite     = backend.KindWrite
	// KindElection is the kind of an election's leadership, as handlers
	// see it ([Election]); the store holds it as a mutex.
	KindElection = backend.KindElection
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

// maxLimit is the largest semaphore limit: a 32-bit signed integer, what
// the SQL stores keep it in (PostgreSQL int, MariaDB INT). One rule for
// every store, so that a program behaves the same on each.
const maxLimit = math.MaxInt32

// checkKind refuses, before any I/O, a kind the store does not hold and a
// semaphore's bad limit (below 1, above maxLimit).
func (d *DistributeLock) checkKind(key string, kind Kind, limit int) error {
	if kind == KindSemaphore && (limit < 1 || limit > maxLimit) {
		return fmt.Errorf("%w: semaphore %s: limit %d must be in [1, %d]", ErrInvalid, quote(key), limit, maxLimit)
	}
	if kind == KindMutex || kind == KindElection {
		return nil
	}
	if d.kinds == nil {
		return fmt.Errorf("%w: %T holds mutexes only, not a %v lock", ErrUnsupported, d.res, kind)
	}
	if err := d.kinds.CheckKind(kind); err != nil {
		return fmt.Errorf("%w: %v lock of %s: %w", ErrUnsupported, kind, quote(key), err)
	}
	return nil
}
