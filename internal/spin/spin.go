// Package spin holds the one spin loop every pull backend is driven by.
package spin

import (
	"context"
	"math"
	"math/rand/v2"
	"time"

	"github.com/distlock/distlock/backend"
)

// Policy is how long to sleep between attempts: uniformly in
// [Min, Min+Random). It is a value, safe to share.
type Policy struct {
	Min, Random time.Duration
}

// next returns the sleep before the next attempt: the policy's random draw
// (times NoticeSpinFactor when subscribed to release notices), cut to the
// holder's remaining TTL when known and to the time left.
func (p Policy) next(holderTTL, left time.Duration, subscribed bool) time.Duration {
	d := p.Min
	if p.Random > 0 {
		d += rand.N(p.Random)
	}
	if subscribed && d < math.MaxInt64/NoticeSpinFactor {
		d *= NoticeSpinFactor
	}
	if holderTTL > 0 && holderTTL < d {
		d = holderTTL
	}
	if d > left {
		d = left
	}
	return d
}

// NoticeSpinFactor stretches the sleep between attempts while the waiter
// is subscribed to release notices: the notices wake it when the key is
// released, and the spin is only the fallback for a lost one (and for a
// holder that vanished without releasing, which the holder's TTL hint
// bounds). Waking every 10-20ms anyway, a crowd of waiters would spend an
// attempt per waiter per sleep on a key that is still held.
const NoticeSpinFactor = 4

// WaitKeyer is implemented by a Spinner whose attempts cover several keys
// (a lock of several keys taken key by key): WaitKey names the key its last
// attempt found held, whose release notices the wait subscribes to. The
// keys it took and gave back send notices of their own, which must not
// wake it.
type WaitKeyer interface {
	WaitKey() string
}

// Queue says how the store queues a waiter (see backend.Queuer).
type Queue uint8

const (
	// Unqueued: the store keeps nothing of a refused attempt.
	Unqueued Queue = iota
	// Queued: a refused attempt keeps an intent for l.TTL, which the
	// next attempt renews: the next attempt comes within a third of
	// l.TTL.
	Queued
	// HeadOnly: Queued, and the notifier is a backend.HeadNotifier: the
	// waiter subscribes to the notices addressed to l.Value, and,
	// subscribed, sleeps up to a third of l.TTL, at most
	// backend.HeadPoll, instead of the policy's draw; a sleep that
	// reaches the deadline unwoken ends the wait without a last
	// attempt.
	HeadOnly
)

// Stats counts an acquisition's calls to the store.
type Stats struct {
	Attempts int // calls of TryAcquire
	Answered int // calls that returned without an error: the store answered
}

// Acquire calls s.TryAcquire until it acquires l, the deadline passes, or
// ctx ends. A zero deadline means exactly one attempt. It never sleeps past
// the deadline: the last attempt is made at the deadline (but by a
// HeadOnly waiter that no notice woke). Between attempts
// it sleeps as p says, and wakes at once on a release notice when n is not
// nil (subscribing after the first failed attempt, so an uncontended
// acquire costs one call, and again when the key a WaitKeyer names
// changes); subscribed, it sleeps NoticeSpinFactor times as long. A
// queued request (q, and every read or write request), whose failed
// attempts keep its intent in the store for l.TTL (see
// backend.KindChecker and backend.Queuer), sleeps at most a third of
// l.TTL, so that its intent never lapses while it waits; with q ==
// HeadOnly, subscribed, it sleeps that long (at most backend.HeadPoll,
// and not past the holder's time left): a notice tells it its turn, and
// when its sleep reaches the deadline unwoken it makes no last attempt
// (it is not the head).
//
// It returns the start of the successful attempt. On contention it returns
// backend.ErrNotAcquired; when ctx ends between attempts, ctx.Err(); a
// store error as is (an attempt cut short by ctx returns the store's
// error). st counts the attempts.
func Acquire(ctx context.Context, s backend.Spinner, n backend.Notifier, p Policy,
	l *backend.Lease, deadline time.Time, q Queue, st *Stats) (time.Time, error) {
	var (
		timer      *time.Timer
		wake       <-chan struct{}
		cancel     func()
		subscribed string // the key of the subscription
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		if cancel != nil {
			cancel()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return time.Time{}, err
		}
		start := time.Now()
		st.Attempts++
		ok, holderTTL, err := s.TryAcquire(ctx, l)
		if err != nil {
			return time.Time{}, err
		}
		st.Answered++
		if ok {
			return start, nil
		}
		now := time.Now()
		if deadline.IsZero() || !now.Before(deadline) {
			return time.Time{}, backend.ErrNotAcquired
		}
		if n != nil {
			key := l.Key
			if w, ok := s.(WaitKeyer); ok {
				key = w.WaitKey()
			}
			if cancel == nil || key != subscribed {
				if cancel != nil {
					cancel()
				}
				if hn, ok := n.(backend.HeadNotifier); ok && q == HeadOnly {
					wake, cancel = hn.SubscribeHead(key, l.Value)
				} else {
					wake, cancel = n.Subscribe(key)
				}
				subscribed = key
			}
		}
		left := deadline.Sub(now)
		d := p.next(holderTTL, left, wake != nil)
		headOnly := q == HeadOnly && wake != nil
		if q != Unqueued || l.Kind == backend.KindRead || l.Kind == backend.KindWrite {
			// The attempt recorded an intent that lasts l.TTL and
			// the next attempt renews: come back well before it
			// lapses, or the wait loses its place in line.
			keep := max(l.TTL/3, time.Millisecond)
			if headOnly {
				// Only a notice addressed to this waiter wakes
				// it: it sleeps until then, but to keep its
				// intent (and for a lost notice).
				d = min(keep, backend.HeadPoll, left)
				if holderTTL > 0 {
					d = min(d, holderTTL)
				}
			}
			d = min(d, keep)
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-timer.C:
			if headOnly && d == left {
				// Slept to the deadline unwoken: not the head
				// (the head is told), so a last attempt would
				// find the lock held or kept for another.
				// Skipped: every waiter behind the head would
				// make one as its wait ends, each with only
				// the facade's grace to be answered in.
				return time.Time{}, backend.ErrNotAcquired
			}
		case <-wake:
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}
