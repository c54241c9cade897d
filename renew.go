package distlock

import (
	"container/heap"
	"context"
	"errors"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distlock/distlock/backend"
)

// This file is the renewal engine: the scheduler that times every grant's
// next renewal or expiry, and the workers that send renewals, in batches
// where the store takes them, a bounded number in flight. What a renewal's
// result does to its grant is decided by grant.step (evDue, evRefreshed).

// scheduler keeps a DistributeLock's committed grants, from the commit
// until released (Close releases what it holds), and orders those with a
// timed event, a renewal or an expiry, by when it is next due. A grant
// without one (no renewal and nobody watches its Done, one the store
// keeps alive, one lost or being released) is only registered: one slot
// in an unordered slice, taken and given back in constant time. It runs
// the events from one timer armed for the earliest, instead of a timer
// per lock. A grant tells it when it is next due ([grant.scheduleLocked]);
// when the time comes the scheduler steps it (evDue), and step decides
// what is due: the expiry, or a renewal, which the scheduler sends
// ([DistributeLock.renew]).
//
// One slice entry per held lock is all it costs: the grant carries its
// own place, its due time and slack.
//
// Lock order: a grant's mutex may be held while calling the scheduler;
// the scheduler never takes a grant's mutex while holding its own.
type scheduler struct {
	mu    sync.Mutex
	reg   []*grant    // the registered grants with no timed event, in no order
	q     grantHeap   // the registered grants with a timed event, by due time
	timer *time.Timer // armed for q[0].due while it is planned
	armed int64       // when timer fires, on the facade's monotonic clock; 0: stopped
}

// A registered grant is in exactly one of q (g.due != never) and reg
// (g.due == never), at g.pos; g.pos is -1 when it is not registered.

// schedule registers g, if it is not, and makes it due at at (never: no
// event planned); it may be taken up to slack earlier (rounded down to a
// power of two), with grants due before it.
func (s *scheduler) schedule(g *grant, at, slack int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if at == never {
		if g.pos < 0 {
			s.addLocked(g)
		} else {
			s.untimeLocked(g)
		}
		return
	}
	if g.pos >= 0 && g.due == never {
		s.unregLocked(g)
	}
	timed := g.pos >= 0
	g.due, g.slack = at, slackBits(slack)
	if timed {
		heap.Fix(&s.q, int(g.pos))
	} else {
		heap.Push(&s.q, g)
	}
	s.armLocked()
}

// unschedule plans no event for g, which stays registered (if it was).
func (s *scheduler) unschedule(g *grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.pos >= 0 {
		s.untimeLocked(g)
	}
}

// addLocked registers g with no timed event.
func (s *scheduler) addLocked(g *grant) {
	g.due, g.slack = never, 0
	g.pos = int32(len(s.reg))
	s.reg = append(s.reg, g)
}

// untimeLocked moves the registered g out of the timed events, if it is
// there.
func (s *scheduler) untimeLocked(g *grant) {
	if g.due == never {
		return
	}
	heap.Remove(&s.q, int(g.pos))
	s.addLocked(g)
	s.armLocked()
}

// unregLocked takes g, registered with no timed event, out of reg.
func (s *scheduler) unregLocked(g *grant) {
	i, last := g.pos, len(s.reg)-1
	s.reg[i] = s.reg[last]
	s.reg[i].pos = i
	s.reg[last] = nil
	s.reg = s.reg[:last]
	g.pos = -1
}

// remove forgets g (released), if registered.
func (s *scheduler) remove(g *grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case g.pos < 0:
	case g.due != never:
		heap.Remove(&s.q, int(g.pos))
		g.due, g.slack = never, 0
		s.armLocked()
	default:
		s.unregLocked(g)
	}
}

// grants returns the registered grants.
func (s *scheduler) grants() []*grant {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*grant, 0, len(s.reg)+len(s.q))
	return append(append(out, s.reg...), s.q...)
}

// armLocked arms the timer for the earliest due grant, or stops it.
func (s *scheduler) armLocked() {
	if len(s.q) == 0 {
		if s.timer != nil && s.armed != 0 {
			s.timer.Stop()
			s.armed = 0
		}
		return
	}
	at := s.q[0].due
	if at == s.armed {
		return
	}
	s.armed = at
	if s.timer == nil {
		s.timer = time.AfterFunc(time.Duration(at-monoNow()), s.run)
	} else {
		s.timer.Reset(time.Duration(at - monoNow()))
	}
}

// run takes every grant that is due, with those whose slack lets them come
// early, steps each (an expiry is applied there) and sends the renewals
// that became due together. A grant taken stays registered, with no event
// planned until it says its next.
func (s *scheduler) run() {
	now := monoNow()
	var due []*grant
	s.mu.Lock()
	for len(s.q) > 0 && s.q[0].due <= now+slackOf(s.q[0].slack) {
		g := heap.Pop(&s.q).(*grant)
		s.addLocked(g)
		due = append(due, g)
	}
	s.armed = 0
	s.armLocked()
	s.mu.Unlock()
	var rfs []*refresh
	for _, g := range due {
		out := g.step(event{kind: evDue, at: now})
		g.apply(out)
		if out.rf != nil {
			rfs = append(rfs, out.rf)
		}
	}
	if len(rfs) > 0 {
		rfs[0].g.d.renew(rfs)
	}
}

// slackBits stores a slack in one byte: its bit length, so that it reads
// back (slackOf) rounded down to a power of two. A renewal's slack only
// gathers renewals into batches: a window at least half as wide does that.
func slackBits(slack int64) uint8 {
	return uint8(bits.Len64(uint64(max(slack, 0))))
}

// slackOf reads back a slack stored by slackBits.
func slackOf(n uint8) int64 {
	if n == 0 {
		return 0
	}
	return 1 << (n - 1)
}

// grantHeap orders grants by due time.
type grantHeap []*grant

func (h grantHeap) Len() int           { return len(h) }
func (h grantHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h grantHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].pos, h[j].pos = int32(i), int32(j)
}
func (h *grantHeap) Push(x any) {
	g := x.(*grant)
	g.pos = int32(len(*h))
	*h = append(*h, g)
}
func (h *grantHeap) Pop() any {
	old := *h
	g := old[len(old)-1]
	old[len(old)-1] = nil
	g.pos = -1
	*h = old[:len(old)-1]
	return g
}

// renewInterval is the time between renewals of a lock valid for
// validity: a third of it, so that two may fail before it ends.
func renewInterval(validity time.Duration) time.Duration {
	return max(validity/3, time.Millisecond)
}

// renewSlackLocked is how early a renewal may be taken: half an interval,
// so that the renewals due about the same time go to the store together.
func (g *grant) renewSlackLocked() int64 {
	return int64(renewInterval(g.validityLocked()) / 2)
}

// scheduleLocked tells the scheduler the grant's next event: the renewal,
// or the expiry when someone watches Done or renewal is on (also while a
// refresh is in flight: its answer may come too late).
func (g *grant) scheduleLocked() {
	at, slack := int64(never), int64(0)
	if g.renewAt != never {
		at, slack = g.renewAt, g.renewSlackLocked()
	}
	if (g.flags&doneAsked != 0 || g.d.cfg.autoRenew) && g.expiry < at {
		at, slack = g.expiry, 0
	}
	g.d.sched.schedule(g, at, slack)
}

// wallTime returns the time.Time of t on the facade's monotonic clock.
func wallTime(t int64) time.Time {
	now := time.Now()
	return now.Add(time.Duration(t - mono(now)))
}

// How many renewal requests of a DistributeLock are in flight at once,
// over all scheduler runs: each holds a connection of the client's pool,
// and a burst of hundreds makes the pool dial more (go-redis, pgx) besides
// flooding the server. A batch carries up to MaxRefreshBatch leases, so
// fewer of them.
const (
	maxRenewalsInFlight = 32
	maxBatchesInFlight  = 4
)

// renew sends the renewals due together: in batches where the store takes
// them (backend.BatchRefresher), otherwise one by one, a few goroutines at
// a time, each holding one of d's renewal slots while its request is in
// flight. A renewal waits for a slot no longer than its lock's validity,
// and its request is bounded by it (an answer after the validity ended is
// worthless: the grant's expiry, armed meanwhile, has lost it) and by
// Close, which waits for the workers.
func (d *DistributeLock) renew(rfs []*refresh) {
	br, batch := d.res.(backend.BatchRefresher)
	if !batch || len(rfs) == 1 {
		d.inWorkers(len(rfs), func(i int) {
			rf := rfs[i]
			d.withSlot(rf.expiry, func(ctx context.Context) error {
				at := monoNow()
				err := refreshAll(ctx, d.refresher, rf.leases)
				rf.done(at, err)
				return err
			}, func() { rf.done(monoNow(), errNotSent) })
		})
		return
	}
	// Batches of at most MaxRefreshBatch leases; a lock's leases stay in
	// one batch, unless it has more than a batch holds (refreshBatch
	// splits it).
	var parts [][]*refresh
	var part []*refresh
	n := 0
	for _, rf := range rfs {
		if n > 0 && n+len(rf.leases) > backend.MaxRefreshBatch {
			parts = append(parts, part)
			part, n = nil, 0
		}
		part = append(part, rf)
		n += len(rf.leases)
	}
	parts = append(parts, part)
	d.inWorkers(len(parts), func(i int) {
		part := parts[i]
		deadline := part[0].expiry
		for _, rf := range part[1:] {
			deadline = min(deadline, rf.expiry)
		}
		d.withSlot(deadline, func(ctx context.Context) error {
			refreshBatch(ctx, br, part)
			return nil
		}, func() {
			for _, rf := range part {
				rf.done(monoNow(), errNotSent)
			}
		})
	})
}

// done reports the refresh's result to its grant.
func (rf *refresh) done(at int64, err error) {
	rf.g.apply(rf.g.step(event{kind: evRefreshed, at: at, ttl: rf.ttl, extend: rf.extend, err: err}))
}

// inWorkers runs do(0) .. do(n-1) in the background, on at most as many
// goroutines as d has renewal slots, and returns at once. Close waits for
// them (d.bg).
func (d *DistributeLock) inWorkers(n int, do func(i int)) {
	var next atomic.Int64
	for range min(n, cap(d.renewSlots)) {
		d.bg.goRun("renewing", func(context.Context) error {
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				do(int(i))
			}
			return nil
		})
	}
}

// withSlot runs send holding one of d's renewal slots, with a context
// that ends at deadline (on the facade's clock) or when Close begins; when
// no slot frees up before then, it calls late instead.
func (d *DistributeLock) withSlot(deadline int64, send func(ctx context.Context) error, late func()) {
	ctx := d.closing
	if deadline != never {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, wallTime(deadline))
		defer cancel()
	}
	select {
	case d.renewSlots <- struct{}{}:
	default:
		select {
		case d.renewSlots <- struct{}{}:
		case <-ctx.Done():
			late()
			return
		}
	}
	defer func() { <-d.renewSlots }()
	send(ctx)
}

// refreshBatch renews rfs in as few requests as MaxRefreshBatch allows
// (one, unless a single lock has more keys) and reports each result.
func refreshBatch(ctx context.Context, br backend.BatchRefresher, rfs []*refresh) {
	var ls []*backend.Lease
	for _, rf := range rfs {
		for i := range rf.leases {
			ls = append(ls, &rf.leases[i])
		}
	}
	at := monoNow()
	var errs []error
	for len(ls) > 0 {
		n := min(len(ls), backend.MaxRefreshBatch)
		part := br.RefreshAll(ctx, ls[:n])
		for i := range n {
			err := errors.New("distlock: the store answered a batch renewal short")
			if i < len(part) {
				err = part[i]
			}
			errs = append(errs, err)
		}
		ls = ls[n:]
	}
	for _, rf := range rfs {
		rf.done(at, errors.Join(errs[:len(rf.leases)]...))
		errs = errs[len(rf.leases):]
	}
}

// refreshAll extends every lease of a lock, one request each.
func refreshAll(ctx context.Context, r backend.Refresher, subs []backend.Lease) error {
	var errs []error
	for i := range subs {
		if err := r.Refresh(ctx, &subs[i]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
