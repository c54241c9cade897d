package distlock

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/spin"
)

// TryLockAll acquires every key of keys, or none, as one lock: one wait
// budget for all (wait as TryLock's), one [Lock] whose Done closes when any
// key is lost, whose Unlock releases them all, whose Extend and renewal
// extend them all, and whose Deadline is the earliest key's. [Lock.Keys]
// lists the keys in canonical order, [Lock.Tokens] their tokens (one per
// key; [Lock.Key] and [Lock.Token] are the first key's).
//
// Keys are taken in a canonical order (sorted, duplicates dropped), so
// processes that lock overlapping sets in any order cannot deadlock. A pull
// store takes them in one request where it can ([backend.MultiSpinner]:
// Redis keys of one hash slot in one script), otherwise one by one within
// each attempt, giving back the ones it took when a later one is held; a
// push store queues for them in order.
//
// Reentrancy follows the context as for TryLock, for every key of a set
// alike: when ctx carries a lock (of one key or several) that holds every
// key of keys, TryLockAll reenters it (a new handle of that lock, no I/O),
// and a TryLock of any one key of a set the context carries reenters the
// set. When ctx carries locks of some of the keys but no one lock holds
// them all, TryLockAll fails at once with [ErrReentrancy]: it would wait on
// itself.
//
// Errors as TryLock's; an [ErrInvalid] error for an empty list or any key
// TryLock would refuse, with no I/O.
func (d *DistributeLock) TryLockAll(ctx context.Context, keys []string, wait time.Duration) (*Lock, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no keys", ErrInvalid)
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	if len(sorted) == 1 {
		return d.TryLock(ctx, sorted[0], wait)
	}
	var ttl time.Duration
	for _, k := range sorted {
		var err error
		if ttl, err = d.checkCall(ctx, k, wait); err != nil {
			return nil, err
		}
		if err := d.checkKey(k); err != nil {
			return nil, err
		}
		if err := checkNotElection(k); err != nil {
			return nil, err
		}
	}
	if g, all := heldAll(ctx, d, sorted); g != nil {
		if !all {
			return nil, fmt.Errorf("%w: the context holds %s, but not with all of the %d keys asked", ErrReentrancy, quote(g.lease.Key), len(sorted))
		}
		if lk, err := d.reenter(g); lk != nil || err != nil {
			return lk, err
		}
	}
	return d.acquireNew(ctx, sorted[0], sorted, wait, ttl, KindMutex, 0, d.cfg.label)
}

// heldAll returns the grant of a lock ctx carries on d that holds every
// key of keys (all true), or else of one that holds some of them (all
// false), or nil.
func heldAll(ctx context.Context, d *DistributeLock, keys []string) (g *grant, all bool) {
	for _, k := range keys {
		h := heldIn(ctx, d, k, KindMutex, 0)
		if h == nil {
			continue
		}
		all = true
		for _, k := range keys {
			all = all && h.hasKey(k)
		}
		if all {
			return h, true
		}
		g = h
	}
	return g, false
}

// setSubs records the leases of a lock of several keys, before the
// commit.
func (g *grant) setSubs(subs []*backend.Lease) {
	g.mu.Lock()
	g.extrasLocked().subs = subs
	g.mu.Unlock()
}

// acquireAll is the innermost acquire step of a lock of several keys.
func (d *DistributeLock) acquireAll(ctx context.Context, r *Request) (time.Time, error) {
	g := r.g
	subs := make([]*backend.Lease, len(r.Keys))
	subs[0] = &g.lease
	for i, k := range r.Keys[1:] {
		l := g.lease
		l.Key = k
		subs[i+1] = &l
	}
	if d.waiter != nil {
		return d.waitAll(ctx, r, subs)
	}
	var st spin.Stats
	start, err := spin.Acquire(ctx, &multiSpinner{d: d, subs: subs}, d.notifier, d.policy, subs[0], r.Deadline, spin.Unqueued, &st)
	r.RemoteAttempts += st.Attempts
	r.answered += st.Answered
	if err != nil {
		return start, err
	}
	g.setSubs(subs)
	return start, nil
}

// multiSpinner makes one attempt at every lease of a lock of several keys,
// for the spin loop: in one request where the store can, otherwise key by
// key, giving back what it took when a key is held. It names the key an
// attempt found held (spin.WaitKeyer), so that the wait is woken by that
// key's release, not by the notices of the keys it gave back.
type multiSpinner struct {
	d       *DistributeLock
	subs    []*backend.Lease
	blocked string // the key the last attempt found held; "": the first
}

func (m *multiSpinner) Release(ctx context.Context, l *backend.Lease) error {
	return m.d.res.Release(ctx, l)
}

func (m *multiSpinner) WaitKey() string {
	if m.blocked == "" {
		return m.subs[0].Key
	}
	return m.blocked
}

func (m *multiSpinner) TryAcquire(ctx context.Context, _ *backend.Lease) (bool, time.Duration, error) {
	if ms, ok := m.d.res.(backend.MultiSpinner); ok {
		ok, ttl, err := ms.TryAcquireAll(ctx, m.subs)
		if !errors.Is(err, errors.ErrUnsupported) {
			return ok, ttl, err
		}
	}
	for i, l := range m.subs {
		ok, ttl, err := m.d.spinner.TryAcquire(ctx, l)
		if ok && err == nil {
			continue
		}
		if err == nil {
			m.blocked = l.Key // a store error ends the wait instead
		}
		// Give back what this attempt took, in the background if the
		// store does not answer: a wait never holds some keys of a set.
		// Both errors are kept: each may carry a clean-up.
		if gerr := m.giveBack(ctx, m.subs[:i]); gerr != nil {
			return false, 0, errors.Join(err, gerr)
		}
		return false, ttl, err
	}
	return true, 0, nil
}

// giveBack releases the leases an attempt took before a key was held.
func (m *multiSpinner) giveBack(ctx context.Context, taken []*backend.Lease) error {
	var left []*backend.Lease
	for _, l := range taken {
		if err := m.d.res.Release(ctx, l); err != nil && !errors.Is(err, backend.ErrNotHeld) {
			left = append(left, l)
		}
	}
	if len(left) == 0 {
		return nil
	}
	return &backend.AbandonedError{
		Err: fmt.Errorf("distlock: giving back %d keys of a set: %w", len(left), context.Cause(ctx)),
		Cleanup: func(ctx context.Context) error {
			var errs []error
			for _, l := range left {
				if err := m.d.res.Release(ctx, l); err != nil && !errors.Is(err, backend.ErrNotHeld) {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		},
	}
}

// waitAll queues for every key of a lock of several keys, in order, on a
// push store, giving back the ones it holds when one is not had.
func (d *DistributeLock) waitAll(ctx context.Context, r *Request, subs []*backend.Lease) (time.Time, error) {
	var first time.Time
	for i, l := range subs {
		r.RemoteAttempts++
		err := d.waiter.Acquire(ctx, l, r.Deadline)
		if i == 0 {
			first = time.Now()
		}
		if err != nil {
			// Within the acquisition's bound; what the store does not
			// answer by then is given back in the background.
			m := &multiSpinner{d: d, subs: subs}
			return time.Time{}, errors.Join(err, m.giveBack(ctx, subs[:i]))
		}
	}
	r.g.setSubs(subs)
	// A push store counts validity from Acquire's return: the first key's,
	// whose lease has run the longest.
	return first, nil
}

// releaseAll releases every lease of a lock. It returns nil when every key
// was released, an error wrapping ErrNotHeld when every key answered and
// some were no longer held, and otherwise the store's errors, never
// wrapping ErrNotHeld (a key that failed is still held, whatever the
// others did), as a *partialRelease when some keys are gone.
func (d *DistributeLock) releaseAll(ctx context.Context, subs []*backend.Lease) error {
	var failed, gone []error
	for _, l := range subs {
		switch err := d.res.Release(ctx, l); {
		case err == nil:
		case errors.Is(err, ErrNotHeld):
			gone = append(gone, err)
		default:
			failed = append(failed, err)
		}
	}
	switch {
	case len(failed) == 0:
		return errors.Join(gone...)
	case len(failed) < len(subs):
		// Some keys are gone (released now, or earlier): the lock is
		// no longer whole, and the failed keys are still to release.
		return &partialRelease{errors.Join(failed...)}
	}
	return errors.Join(failed...)
}

// partialRelease is the error of a release of a lock of several keys that
// failed on some keys while others are gone. It never wraps ErrNotHeld:
// the keys that failed are still held, and Unlock may be retried.
type partialRelease struct{ err error }

func (e *partialRelease) Error() string {
	return "distlock: release of a lock of several keys failed on some: " + e.err.Error()
}

func (e *partialRelease) Unwrap() error { return e.err }

// watchLostAll reports the first loss signal of any lease to step.
func (g *grant) watchLostAll(subs []*backend.Lease, stop <-chan struct{}) {
	cases := []reflect.SelectCase{{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(stop)}}
	for _, l := range subs {
		if lost := l.Lost(); lost != nil {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(lost.Done())})
		}
	}
	if i, _, _ := reflect.Select(cases); i > 0 {
		g.apply(g.step(event{kind: evLose, watcher: true, cause: fmt.Errorf("%w: %s: the backend reported a key of the lock lost", ErrNotHeld, quote(g.lease.Key))}))
	}
}
