package zookeeper

import (
	"context"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"
)

// pollInterval is how often the session watcher samples the connection
// while locks are held or waits are in progress.
const pollInterval = 25 * time.Millisecond

// With [WithSessionTimeout](d), the session watcher asks the server for
// something while locks are held or waits are in progress once no request sent in the last
// d/probeDivisor was answered (go-zookeeper pings as often), and reports
// them lost once no request sent in the last d - d/marginDivisor -
// pollInterval was answered (see lossDeadline).
const (
	probeDivisor  = 3
	marginDivisor = 10
)

// scanEvery is how many poll intervals pass between two looks at the
// watches of the locks the session keeps alive.
const scanEvery = 4

// hear records that the server answered a request sent at sent: it had
// heard from this client's session at sent or later.
func (r *Resource) hear(sent time.Time) {
	t := int64(sent.Sub(r.epoch))
	for {
		old := r.heard.Load()
		if t <= old || r.heard.CompareAndSwap(old, t) {
			return
		}
	}
}

// lossDeadline is when the held locks must be reported lost, with
// [WithSessionTimeout](d): the server cannot expire the session before d
// after it last heard from the client, which is at or after r.heard. The
// watcher looks every poll interval, so it closes Lost by 0.9 x d after
// r.heard; the last tenth of d is the margin for its lateness and for
// the two clocks' rates.
func (r *Resource) lossDeadline() time.Time {
	d := r.cfg.tolerance
	return r.epoch.Add(time.Duration(r.heard.Load()) + d - d/marginDivisor - pollInterval)
}

// sessionPoll is how often awaitSession looks at the connection's state.
const sessionPoll = 5 * time.Millisecond

// awaitSession returns once the connection has a session, or is in a
// state where a request fails at once (closed, expired), or with an error
// when ctx ends first. go-zookeeper keeps a request made while it is
// connecting in its queue and sends it once it has a session: a create
// queued so and abandoned could still be applied later, and would need a
// clean-up. Made only with a session, a create that ctx cut short before
// one came was never sent: against a server that refuses connections an
// attempt fails with nothing to undo. go-zookeeper has no event for the
// session but the caller's channel: this polls its state, within ctx.
func (r *Resource) awaitSession(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var t *time.Ticker
	for {
		switch st := r.conn.State(); st {
		case zk.StateConnecting, zk.StateConnected:
			if t == nil {
				t = time.NewTicker(sessionPoll)
				defer t.Stop()
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				return fmt.Errorf("%w: no session with %s yet (the client is %v; it logs why): %w", zk.ErrNoServer, r.conn.Server(), st, ctx.Err())
			}
		default:
			return nil
		}
	}
}

// startPollLocked starts the session watcher unless it runs; r.mu is
// held.
func (r *Resource) startPollLocked() {
	if !r.polling {
		r.polling = true
		r.wg.Add(1)
		go r.poll()
	}
}

// waitBegins records a wait in progress, with [WithSessionTimeout]: the
// session watcher then probes the server as it does while locks are held
// (see poll), so that when the wait is granted (by an event, with no
// request of its own) the loss deadline counts from a request answered
// less than a third of the session timeout before, not from the listing
// made before the wait began. The returned function ends the wait.
func (r *Resource) waitBegins() (ends func()) {
	if r.cfg.tolerance <= 0 {
		return func() {}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return func() {}
	}
	r.waiting++
	r.startPollLocked()
	return func() {
		r.mu.Lock()
		r.waiting--
		r.mu.Unlock()
	}
}

// poll watches the connection while locks are held or waits are in
// progress (waitBegins): a changed session id
// means the old session expired with our znodes. Without
// [WithSessionTimeout] any disconnection may have lost them; with it, it
// probes the server (see probe) and reports the locks lost at
// lossDeadline, when the server has not answered for most of the session
// timeout, whether the connection looks up or not. It also looks at the
// watches of the locks the session keeps alive (see onWatch).
func (r *Resource) poll() {
	defer r.wg.Done()
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	d := r.cfg.tolerance
	var probing chan struct{} // closed when the probe in flight returns
	type event struct {
		h  *held
		ev zk.Event
	}
	var events []event
	for tick := 1; ; tick++ {
		select {
		case <-t.C:
		case <-r.stop:
			return
		}
		sid, state, now := r.conn.SessionID(), r.conn.State(), time.Now()
		if d > 0 && state == zk.StateHasSession && (probing == nil || isClosedChan(probing)) &&
			now.Sub(r.epoch.Add(time.Duration(r.heard.Load()))) >= d/probeDivisor {
			probing = make(chan struct{})
			// Not counted in r.wg: Close does not wait for a server
			// that does not answer. It ends when the client gives up.
			go r.probe(probing)
		}
		var lost []*held
		events = events[:0]
		r.mu.Lock()
		// Read under r.mu: track records heard before it adds a lock.
		down := state != zk.StateHasSession
		if d > 0 {
			down = !now.Before(r.lossDeadline())
		}
		if down || sid != r.sidSeen || r.recheck {
			// Backwards: finishLocked moves the last lock, already
			// seen, into the place of the one it drops.
			for i := len(r.held) - 1; i >= 0; i-- {
				if h := r.held[i]; down || h.sid != sid {
					r.finishLocked(h)
					lost = append(lost, h)
				}
			}
			r.sidSeen, r.recheck = sid, false
		}
		if tick%scanEvery == 0 {
			for h, ch := range r.lossWatch {
				if ch == nil {
					continue
				}
				select {
				case ev := <-ch:
					r.lossWatch[h] = nil
					events = append(events, event{h, ev})
				default:
				}
			}
		}
		last := len(r.held) == 0 && r.waiting == 0
		if last {
			r.polling = false
		}
		r.mu.Unlock()
		for _, h := range lost {
			h.fire()
			if h.sid == sid {
				// The session may live on: free the lock for others.
				r.later(cleanup{path: h.path()})
			}
		}
		for _, e := range events {
			r.onWatch(e.h, e.ev)
		}
		if last {
			return
		}
	}
}

// probe sends the server a small read and records when it was sent if
// the server answers: any answer counts, the server heard from the
// session (go-zookeeper's own pings are answered out of our sight).
func (r *Resource) probe(done chan struct{}) {
	defer close(done)
	sent := time.Now()
	if _, _, err := r.conn.Exists(r.cfg.root); err == nil {
		r.hear(sent)
	}
}
