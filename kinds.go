package distlock

import (
	"fmt"
	"math"

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
