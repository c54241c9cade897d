package distlock

import (
	"container/heap"
	"math/bits"
	"sync"
	"time"
)

// scheduler keeps a DistributeLock's committed grants, from the commit
// until released (Close releases what it holds), ordered by their next
// timed event: a renewal or an expiry, or none (never) for a grant without
// renewal that nobody watches, one the store keeps alive, or one lost or
// being released. It runs the events from one timer armed for the
// earliest, instead of a timer per lock. A grant tells it when it is next
// due ([grant.scheduleLocked]); when the time comes the scheduler calls
// [grant.takeDue], which decides what is due through [grant.step].
//
// One slice entry per held lock is all it costs: the grant carries its
// own place in the heap, its due time and slack.
//
// Lock order: a grant's mutex may be held while calling the scheduler;
// the scheduler never takes a grant's mutex while holding its own.
type scheduler struct {
	mu    sync.Mutex
	q     grantHeap
	timer *time.Timer // armed for q[0].due while it is planned
	armed int64       // when timer fires, on the facade's monotonic clock; 0: stopped
}

// schedule makes g due at at (never: no event planned), adding it or
// moving it; it may be taken up to slack earlier (rounded down to a power
// of two), with grants due before it.
func (s *scheduler) schedule(g *grant, at, slack int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g.due, g.slack = at, slackBits(slack)
	if g.index >= 0 {
		heap.Fix(&s.q, int(g.index))
	} else {
		heap.Push(&s.q, g)
	}
	s.armLocked()
}

// unschedule plans no event for g, which stays registered; nothing if g is
// not registered (an acquisition rolled back).
func (s *scheduler) unschedule(g *grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.index >= 0 && g.due != never {
		g.due, g.slack = never, 0
		heap.Fix(&s.q, int(g.index))
		s.armLocked()
	}
}

// remove forgets g (released), if registered.
func (s *scheduler) remove(g *grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.index >= 0 {
		heap.Remove(&s.q, int(g.index))
		s.armLocked()
	}
}

// grants returns the registered grants.
func (s *scheduler) grants() []*grant {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*grant(nil), s.q...)
}

// armLocked arms the timer for the earliest due grant, or stops it.
func (s *scheduler) armLocked() {
	if len(s.q) == 0 || s.q[0].due == never {
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
// early, applies the expiries and hands the renewals to the DistributeLock
// together. A grant taken stays registered, with no event planned until
// it says its next.
func (s *scheduler) run() {
	now := monoNow()
	var due []*grant
	s.mu.Lock()
	for len(s.q) > 0 && s.q[0].due != never && s.q[0].due <= now+slackOf(s.q[0].slack) {
		g := s.q[0]
		g.due, g.slack = never, 0
		heap.Fix(&s.q, 0)
		due = append(due, g)
	}
	s.armed = 0
	s.armLocked()
	s.mu.Unlock()
	var renew []*grant
	for _, g := range due {
		if g.takeDue(now) {
			renew = append(renew, g)
		}
	}
	if len(renew) > 0 {
		renew[0].d.renewGrants(renew)
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
	h[i].index, h[j].index = int32(i), int32(j)
}
func (h *grantHeap) Push(x any) {
	g := x.(*grant)
	g.index = int32(len(*h))
	*h = append(*h, g)
}
func (h *grantHeap) Pop() any {
	old := *h
	g := old[len(old)-1]
	old[len(old)-1] = nil
	g.index = -1
	*h = old[:len(old)-1]
	return g
}
