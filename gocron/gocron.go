// Package gocron runs the jobs of several gocron v2 schedulers
// (github.com/go-co-op/gocron/v2) once across them, over any distlock
// store. It is a module of its own, so that only its users download
// gocron.
//
// gocron takes either of two ways to keep replicas from running a job
// twice, and this package gives both:
//
//   - an [Elector] (gocron.WithDistributedElector): one scheduler, the
//     leader of a distlock election, runs every job; the others skip
//     them until they are elected. The leadership's term fences the
//     jobs' writes ([Elector.Leadership]).
//
//   - a [Locker] (gocron.WithDistributedLocker, or per job with
//     gocron.WithDistributedJobLocker): each run of a job holds the
//     job's key for the run, and a replica that finds it held skips that
//     run at once. [WithMinHold] keeps the key past a short run, so that a
//     replica whose tick comes a little later finds it still held.
//
//     d, err := distlock.New(res, distlock.WithAutoRenew()) // res: any store
//     el, err := gocron.NewElector(d.Election("reports"), hostname)
//     defer el.Close()
//     s, err := gc.NewScheduler(gc.WithDistributedElector(el))
//
// (gc is github.com/go-co-op/gocron/v2; this package's name is the same.)
package gocron

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	gc "github.com/go-co-op/gocron/v2"

	"github.com/distlock/distlock"
)

var (
	_ gc.Elector = (*Elector)(nil)
	_ gc.Locker  = (*Locker)(nil)
	_ gc.Lock    = (*lock)(nil)
)

// ErrNotLeader is what [Elector.IsLeader] returns (wrapped) while this
// process does not lead: gocron then skips the run.
var ErrNotLeader = errors.New("distlock/gocron: not the leader")

// Elector is a gocron.Elector over a distlock election: it campaigns in
// the background from [NewElector] until [Elector.Close], holding the
// leadership while elected, and campaigns again when it loses it (an
// [distlock.Election.Run] loop).
type Elector struct {
	lead   atomic.Pointer[distlock.Lock] // the leadership while held
	cancel context.CancelFunc
	done   chan struct{} // closed when the Run loop returned
	err    error         // Run's error, once done is closed
}

// NewElector starts campaigning for e with value published (an address,
// a host name: [distlock.Election.Leader] shows it), and returns at once.
// opts are [distlock.Election.Run]'s (its backoff, callbacks). Close ends
// the campaign and resigns.
//
// Bad input (a bad election name or value, a bad option) is not reported
// here: [Elector.IsLeader] and [Elector.Close] return it.
func NewElector(e *distlock.Election, value string, opts ...distlock.RunOption) (*Elector, error) {
	if e == nil {
		return nil, fmt.Errorf("%w: nil election", distlock.ErrInvalid)
	}
	ctx, cancel := context.WithCancel(context.Background())
	el := &Elector{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(el.done)
		el.err = e.Run(ctx, value, func(ctx context.Context, lead *distlock.Lock) error {
			el.lead.Store(lead)
			defer el.lead.Store(nil)
			<-ctx.Done() // lead until lost or closed
			return nil
		}, opts...)
	}()
	return el, nil
}

// IsLeader implements gocron.Elector: nil while this process leads the
// election (it holds the leadership, its Done is open and its deadline,
// when the store gives one, to come), otherwise an error wrapping
// [ErrNotLeader] (and the campaign's error, if it ended).
func (el *Elector) IsLeader(context.Context) error {
	select {
	case <-el.done:
		if el.err != nil && !errors.Is(el.err, context.Canceled) {
			return fmt.Errorf("%w: the campaign ended: %w", ErrNotLeader, el.err)
		}
		return fmt.Errorf("%w: the elector is closed", ErrNotLeader)
	default:
	}
	lead := el.lead.Load()
	if lead == nil {
		return ErrNotLeader
	}
	select {
	case <-lead.Done():
		return fmt.Errorf("%w: the leadership was lost", ErrNotLeader)
	default:
	}
	if dl := lead.Deadline(); !dl.IsZero() && !time.Now().Before(dl) {
		return fmt.Errorf("%w: the leadership's validity ended", ErrNotLeader)
	}
	return nil
}

// Leadership returns the leadership this process holds, or nil: its Token
// is the term, which the jobs give to the resources they write so that a
// leader that was paused past its TTL cannot write over its successor.
func (el *Elector) Leadership() *distlock.Lock {
	return el.lead.Load()
}

// Close stops campaigning, resigns the leadership if held, and returns
// once done: nil, or the campaign's error if it ended before (bad input,
// the DistributeLock closed).
func (el *Elector) Close() error {
	el.cancel()
	<-el.done
	if errors.Is(el.err, context.Canceled) {
		return nil
	}
	return el.err
}

// Locker is a gocron.Locker: a job's run holds the distlock mutex of the
// job's name (with the prefix, [WithKeyPrefix]), taken with one attempt,
// so that a replica whose scheduler runs the job while another holds it
// skips that run at once. The key is released when the run ends, or
// later with [WithMinHold]. Runs longer than the DistributeLock's TTL
// need its [distlock.WithAutoRenew].
type Locker struct {
	d       *distlock.DistributeLock
	prefix  string
	minHold time.Duration
}

// LockerOption configures a [Locker].
type LockerOption func(*Locker) error

// WithKeyPrefix sets what the keys of the jobs' mutexes start with, before
// the job's name (gocron's key). Default "gocron:".
func WithKeyPrefix(prefix string) LockerOption {
	return func(l *Locker) error {
		l.prefix = prefix
		return nil
	}
}

// WithMinHold keeps each run's key held until d after it was taken, when
// the run is shorter, as ShedLock's lockAtLeastFor does: replicas whose
// ticks come up to d apart (clock splay, scheduling) then run a tick's
// run once between them. Take d below the job's interval, and below the
// TTL unless renewal is on. Default 0: released when the run ends. d < 0
// makes NewLocker fail.
func WithMinHold(d time.Duration) LockerOption {
	return func(l *Locker) error {
		if d < 0 {
			return fmt.Errorf("%w: min hold %v must not be negative", distlock.ErrInvalid, d)
		}
		l.minHold = d
		return nil
	}
}

// NewLocker returns a Locker over d. It returns an error wrapping
// [distlock.ErrInvalid] for a nil d or a bad option.
func NewLocker(d *distlock.DistributeLock, opts ...LockerOption) (*Locker, error) {
	if d == nil {
		return nil, fmt.Errorf("%w: nil DistributeLock", distlock.ErrInvalid)
	}
	l := &Locker{d: d, prefix: "gocron:"}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", distlock.ErrInvalid)
		}
		if err := o(l); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Lock implements gocron.Locker: one attempt to take the job's key. It
// returns an error wrapping [distlock.ErrNotAcquired] when another
// replica holds it (gocron skips the run), and the store's error
// otherwise.
func (l *Locker) Lock(ctx context.Context, key string) (gc.Lock, error) {
	lk, err := l.d.TryLock(ctx, l.prefix+key, 0)
	if err != nil {
		return nil, fmt.Errorf("distlock/gocron: lock %q: %w", key, err)
	}
	return &lock{lk: lk, until: time.Now().Add(l.minHold)}, nil
}

// lock is a run's hold of its job's key.
type lock struct {
	lk    *distlock.Lock
	until time.Time // held at least until then (WithMinHold)
	once  sync.Once
}

// Unlock implements gocron.Lock: it releases the key, at once or, with
// [WithMinHold], once the minimum hold has passed (in the background: it
// returns nil at once then). It returns [distlock.ErrNotHeld] when the
// key was lost during the run.
func (k *lock) Unlock(ctx context.Context) error {
	err := errors.New("distlock/gocron: unlocked twice")
	k.once.Do(func() {
		if wait := time.Until(k.until); wait > 0 {
			time.AfterFunc(wait, func() {
				uctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = k.lk.Unlock(uctx) // ErrNotHeld if lost meanwhile, or released by Close
			})
			err = nil
			return
		}
		err = k.lk.Unlock(ctx)
	})
	return err
}
