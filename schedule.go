package distlock

import (
	"container/heap"
	"sync"
	"time"
)

// scheduler runs the timed events of a DistributeLock's committed grants,
// renewals and expiries, from one timer armed for the earliest of them,
// instead of a timer per lock. A grant tells it when it is next due
// ([grant.scheduleLocked]); when the time comes the scheduler calls
// [grant.fire], which decides what is due through [grant.step].
//
// Lock order: a grant's mutex may be held while calling schedule and
// remove; the scheduler never takes a grant's mutex while holding its own.
type scheduler struct {
	mu    sync.Mutex
	q     grantHeap
	timer *time.Timer // armed for q[0].due while q is not empty
	armed time.Time   // when timer fires; zero: stopped
}

// schedule makes g due at at, adding it or moving it; it may be taken
// up to slack earlier, with grants due before it.
func (s *scheduler) schedule(g *grant, at time.Time, slack time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g.due, g.slack = at, slack
	if g.index >= 0 {
		heap.Fix(&s.q, g.index)
	} else {
		heap.Push(&s.q, g)
	}
	s.armLocked()
}

// remove forgets g, if scheduled.
func (s *scheduler) remove(g *grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.index >= 0 {
		heap.Remove(&s.q, g.index)
		s.armLocked()
	}
}

// armLocked arms the timer for the earliest due grant, or stops it.
func (s *scheduler) armLocked() {
	if len(s.q) == 0 {
		if s.timer != nil && !s.armed.IsZero() {
			s.timer.Stop()
			s.armed = time.Time{}
		}
		return
	}
	at := s.q[0].due
	if at.Equal(s.armed) {
		return
	}
	s.armed = at
	if s.timer == nil {
		s.timer = time.AfterFunc(time.Until(at), s.run)
	} else {
		s.timer.Reset(time.Until(at))
	}
}

// run takes every grant that is due off the queue, with those whose slack
// lets them come early, applies the expiries and hands the renewals to
// the DistributeLock together.
func (s *scheduler) run() {
	now := time.Now()
	var due []*grant
	s.mu.Lock()
	for len(s.q) > 0 && !s.q[0].due.After(now.Add(s.q[0].slack)) {
		due = append(due, heap.Pop(&s.q).(*grant))
	}
	s.armed = time.Time{}
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

// grantHeap orders grants by due time.
type grantHeap []*grant

func (h grantHeap) Len() int           { return len(h) }
func (h grantHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h grantHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *grantHeap) Push(x any) {
	g := x.(*grant)
	g.index = len(*h)
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
