package hotspot

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/distlock/distlock"
)

// gate is the local lock of a hot key's semaphore or read/write lock: a
// weighted semaphore served in order of arrival, as
// golang.org/x/sync/semaphore is. A semaphore's gate has the semaphore's
// limit, each holder weighs one: as many goroutines of this process reach
// the store as it could grant, no more. A read/write lock's gate has
// rwSize; a reader weighs one and a writer rwSize: readers share it, a
// writer has it alone, and readers arriving after a waiting writer wait for
// it, as they do in the store.
type gate struct {
	mu      sync.Mutex
	size    int64
	cur     int64
	waiters list.List // of *gateWaiter, in arrival order
	refs    int       // goroutines waiting for or holding it; guarded by Handler.mu
}

type gateWaiter struct {
	n     int64
	ready chan struct{} // closed when granted
}

// rwSize is a read/write gate's size: more readers than a process runs.
const rwSize = 1 << 30

// gateID names a gate: one per key, kind family and semaphore limit.
type gateID struct {
	key   string
	rw    bool
	limit int
}

func gateOf(r *distlock.Request) (gateID, int64) {
	switch r.Kind {
	case distlock.KindRead:
		return gateID{key: r.Key, rw: true}, 1
	case distlock.KindWrite:
		return gateID{key: r.Key, rw: true}, rwSize
	}
	return gateID{key: r.Key, limit: r.Limit}, 1
}

// acquire takes n of the gate, waiting until deadline (zero: no waiting)
// or until ctx ends.
func (g *gate) acquire(ctx context.Context, n int64, deadline time.Time, key string) error {
	if err := ctx.Err(); err != nil {
		return errors.Join(distlock.ErrNotAcquired, err)
	}
	g.mu.Lock()
	if g.size-g.cur >= n && g.waiters.Len() == 0 {
		g.cur += n
		g.mu.Unlock()
		return nil
	}
	d := time.Until(deadline)
	if deadline.IsZero() || d <= 0 {
		g.mu.Unlock()
		return fmt.Errorf("%w: %q is held in this process", distlock.ErrNotAcquired, key)
	}
	w := &gateWaiter{n: n, ready: make(chan struct{})}
	elem := g.waiters.PushBack(w)
	g.mu.Unlock()

	t := time.NewTimer(d)
	defer t.Stop()
	var err error
	select {
	case <-w.ready:
		return nil
	case <-t.C:
		err = fmt.Errorf("%w: %q was held in this process for the whole wait", distlock.ErrNotAcquired, key)
	case <-ctx.Done():
		err = errors.Join(distlock.ErrNotAcquired, ctx.Err())
	}
	g.mu.Lock()
	select {
	case <-w.ready:
		// Granted as we gave up: give it back, as x/sync/semaphore does.
		g.cur -= n
		g.notifyLocked()
	default:
		front := g.waiters.Front() == elem
		g.waiters.Remove(elem)
		if front && g.size > g.cur { // we may have held back smaller waiters
			g.notifyLocked()
		}
	}
	g.mu.Unlock()
	return err
}

// release gives n back.
func (g *gate) release(n int64) {
	g.mu.Lock()
	g.cur -= n
	g.notifyLocked()
	g.mu.Unlock()
}

// notifyLocked grants waiters in order while they fit.
func (g *gate) notifyLocked() {
	for {
		e := g.waiters.Front()
		if e == nil {
			return
		}
		w := e.Value.(*gateWaiter)
		if g.size-g.cur < w.n {
			return
		}
		g.cur += w.n
		g.waiters.Remove(e)
		close(w.ready)
	}
}
