package distlock

import (
	"fmt"
	"time"

	"github.com/distlock/distlock/backend"
)

type config struct {
	ttl           time.Duration
	spinMin       time.Duration
	spinRandom    time.Duration
	handlers      []Handler
	autoRenew     bool
	valueFunc     func() string
	maxReentrancy int
	closeTimeout  time.Duration
	label         string
	err           error // a bad value an option could not store
}

func defaultConfig() config {
	return config{ttl: 10 * time.Second, spinMin: 10 * time.Millisecond, spinRandom: 10 * time.Millisecond, closeTimeout: 5 * time.Second}
}

func (c *config) validate() error {
	switch {
	case c.err != nil:
		return c.err
	case c.ttl <= 0:
		return fmt.Errorf("%w: default TTL %v must be > 0", ErrInvalid, c.ttl)
	case c.spinMin < 0 || c.spinRandom < 0:
		return fmt.Errorf("%w: spin (%v, %v) must not be negative", ErrInvalid, c.spinMin, c.spinRandom)
	case c.spinMin+c.spinRandom <= 0:
		return fmt.Errorf("%w: spin min+random must be > 0, or waiters hammer the store", ErrInvalid)
	case c.maxReentrancy < 0:
		return fmt.Errorf("%w: max reentrancy %d must be >= 0", ErrInvalid, c.maxReentrancy)
	case c.closeTimeout <= 0:
		return fmt.Errorf("%w: close timeout %v must be > 0", ErrInvalid, c.closeTimeout)
	case len(c.handlers) > maxHandlers:
		return fmt.Errorf("%w: %d handlers; at most %d", ErrInvalid, len(c.handlers), maxHandlers)
	}
	for i, h := range c.handlers {
		if h == nil {
			return fmt.Errorf("%w: handler %d is nil", ErrInvalid, i)
		}
	}
	return nil
}

// Option configures a [DistributeLock]. Options are applied in order by
// [New], which returns an [ErrInvalid] error for a bad value.
type Option func(*config)

// WithDefaultTTL sets the lease time of locks whose context carries no TTL
// ([ContextWithTTL]). Default 10s. ttl <= 0 makes New fail.
func WithDefaultTTL(ttl time.Duration) Option {
	return func(c *config) { c.ttl = ttl }
}

// WithSpin sets how pull backends wait between attempts: a sleep drawn
// uniformly from [min, min+random), cut short by the deadline, by the
// holder's remaining TTL when the store reports it, and by a release notice
// when the store sends them. Random sleeps keep many waiters from waking
// together. A waiter subscribed to release notices sleeps 4 times as long
// (40-80ms by default): the notices wake it, and the sleep is only the
// fallback for a lost one. The waiters of one key in a DistributeLock
// share one subscription, and each notice wakes one of them, the one
// waiting longest: only one could take the key. Default 10ms, 10ms. Negative values, or min+random == 0, make
// New fail. Push backends (etcd, ZooKeeper) do not spin.
func WithSpin(min, random time.Duration) Option {
	return func(c *config) { c.spinMin, c.spinRandom = min, random }
}

// WithHandlers installs handlers around every acquisition and release, the
// first outermost (see [Handler]). A nil handler makes New fail. Given
// twice, the lists are appended.
func WithHandlers(h ...Handler) Option {
	return func(c *config) { c.handlers = append(c.handlers, h...) }
}

// WithAutoRenew makes every lock extend itself at a third of its TTL while
// held (a compare-and-expire: it never extends another owner's lock). When
// an extension finds the lock gone, or the store fails until the lease has
// run out, the lock's Done channel closes and Unlock returns [ErrNotHeld].
// New fails with ErrInvalid when the backend cannot extend locks.
func WithAutoRenew() Option {
	return func(c *config) { c.autoRenew = true }
}

// WithValueFunc replaces the owner value, by default 128 random bits in hex
// made fresh per acquisition. f must return a value that is unique across
// processes and acquisitions, or one owner could release another's lock.
// A nil f makes New fail; an empty value makes TryLock fail.
func WithValueFunc(f func() string) Option {
	return func(c *config) {
		if f == nil {
			c.err = fmt.Errorf("%w: nil value func", ErrInvalid)
			return
		}
		c.valueFunc = f
	}
}

// WithMaxReentrancy limits how many times one context may hold a key at
// once through nested TryLock or Do calls ([ContextWithLock]). n == 1 makes
// locks non-reentrant: a nested attempt returns [ErrReentrancy] at once
// instead of waiting on itself. Default 0: unlimited. n < 0 makes New fail.
func WithMaxReentrancy(n int) Option {
	return func(c *config) { c.maxReentrancy = n }
}

// WithCloseTimeout bounds [DistributeLock.Close]: it returns within d (plus
// a few milliseconds) even when the store stops answering, reporting the
// releases and clean-ups it could not finish (those locks expire with their
// TTL). Default 5s. d <= 0 makes New fail.
func WithCloseTimeout(d time.Duration) Option {
	return func(c *config) { c.closeTimeout = d }
}

// WithLabel sets the label stored with every lock taken through the
// DistributeLock, which inspection shows ([DistributeLock.Inspect]): a
// host name, a pid, a job's name. It is not part of the owner value, which
// stays unique. At most 256 bytes; longer makes New fail. Default empty.
func WithLabel(label string) Option {
	return func(c *config) {
		if len(label) > backend.MaxLabelLen {
			c.err = fmt.Errorf("%w: label of %d bytes; at most %d", ErrInvalid, len(label), backend.MaxLabelLen)
			return
		}
		c.label = label
	}
}
