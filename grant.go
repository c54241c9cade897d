package distlock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distlock/distlock/backend"
)

// A grant is one acquisition through a [DistributeLock], shared by all the
// handles ([Lock]) of it. Every kind of lock the facade hands out is a grant
// to this state machine, and its whole life is here: the states, and
// [grant.step], the one function that writes the fields that decide its
// fate (state, flags, refs, expiry, renewAt, the leases' TTLs and
// what grantExtras keeps). Callers never check a field, drop the mutex and
// act on it: they step, and the step decides.
//
//	from        event                                          to          effect
//	----------  ---------------------------------------------  ----------  -------------------------------------------------
//	acquiring   commit: the whole chain returned nil, the      held        registered with the DistributeLock (Close sees
//	            store granted, d is open, validity is left,                it); renewal and expiry scheduled (none when the
//	            no Lost closed                                             store keeps it alive: KeptAlive); Lost watched
//	                                                                       when d has loss observers (else from the
//	                                                                       first Done call, and polled)
//	acquiring   rollback: a handler failed after the store     released    Done closed; the handlers that acquired, and only
//	            granted, Close ran, or the validity ended                  they, see Release (the store too, if it granted)
//	held        reenter: d open, validity left, no Lost        held        one more handle (no I/O)
//	            closed, under the limit
//	held        reenter, poll, refresh, release: a Lost        lost        as lose (whoever asks first takes the loss in)
//	            closed
//	held        due: the scheduler finds the validity ended    lost        as lose
//	held        due: a renewal is due and no refresh is in     held        one refresh in flight; the expiry stays armed
//	            flight
//	held        lose: the watch saw Lost close, or Close       lost        Done closed with the cause; loss observers told
//	            could not release it                                       once; renewal stopped
//	held        refresh (Lock.Extend): no refresh in flight    held        one refresh in flight (an Extend finding one
//	                                                                       waits for it: one at a time, so the reply
//	                                                                       processed last is of the request sent last)
//	held        refresh (Election.Proclaim, a relabel): no     held        one refresh in flight, which changes the
//	            refresh in flight, no renewal due                          label only; the renewal planned waits for it
//	                                                                       (a relabel finding one due waits for it, or
//	                                                                       until the grant is released or lost)
//	held        refreshed, a relabel: the store said yes       held        the new label is the lease's (later renewals
//	                                                                       carry it); the renewal planned as before
//	held        refreshed, a relabel: a store error            held        the renewal planned as before; the validity
//	                                                                       is untouched (a relabel moves no TTL)
//	held        refreshed: the store said yes                  held        validity from the request's send time, with its
//	                                                                       TTL (capped by a request whose outcome is
//	                                                                       unknown and carried a shorter one); next
//	                                                                       renewal planned
//	held        refreshed: unknown outcome (a store error)     held        the expiry may only move earlier (the request
//	                                                                       may land); renewal retried sooner
//	held        refreshed: ErrNotHeld, or validity ended       lost        as lose
//	held, lost  release: the last handle's Unlock, or Close    releasing   renewal stopped; the release chain runs (a
//	            (a lost grant's once its loss was announced)               release of a lost grant waits until the
//	                                                                       observers were told and Done closed)
//	held, lost  release of a handle that is not the last       held, lost  one handle less (no I/O)
//	releasing   refreshed (an Extend or a relabel sent while   releasing   the new TTL or label kept aside, applied if the
//	            it was held): the store said yes                           release fails
//	releasing   released: the store said nil or ErrNotHeld     released    Done closed (if still open); unregistered
//	releasing   release failed: a store error                  held, lost  back where it was (lost if a Lost closed while
//	                                                                       it was released): Unlock may be retried;
//	                                                                       renewal stays stopped, the TTL frees it (expiry
//	                                                                       scheduled, Lost watched if Done was asked for);
//	                                                                       a grant the store keeps alive, which no TTL
//	                                                                       frees, is released again in the background
//	                                                                       (releaseAgain); after Close, lost
//
// Every other pair is ignored: a loss or a refresh's result once a release
// has begun, a second release, a commit of a rolled-back grant. So a grant
// is lost at most once, released at most once, Done closes exactly once,
// and every handler whose Acquire returned nil sees exactly one Release
// (again only when the caller retries a failed Unlock).
type grant struct {
	lease  backend.Lease // the store's view: key, value, TTL, kind, token, handle
	d      *DistributeLock
	first  Lock                        // the first handle, allocated with the grant
	extras atomic.Pointer[grantExtras] // what few grants need; set once, under mu

	mu    sync.Mutex
	state grantState
	flags grantFlags
	slack uint8 // the scheduler's (under its mutex): due may be taken this much early (slackBits)
	refs  int32 // live handles
	pos   int32 // the scheduler's (under its mutex): its place in the scheduler (registered); -1 when not

	// Times on the facade's monotonic clock (see mono).
	expiry  int64 // when the validity ends; never: the store keeps it alive
	renewAt int64 // the next renewal; never: none planned (or one in flight)
	due     int64 // the scheduler's (under its mutex): the next timed event; never: none
}

// grantFlags are a grant's yes/no state, guarded by its mutex.
type grantFlags uint8

const (
	announced    grantFlags = 1 << iota // Done is closed (or will be closed as it is made)
	doneAsked                           // Done was asked for: the expiry is scheduled
	refreshing                          // a refresh (renewal or Extend) is in flight
	keptAlive                           // the store keeps it alive itself (backend.Lease.KeptAlive): no renewal, no expiry
	finished                            // released or lost: the cause is recorded (extras.cause; none: released)
	lostSignal                          // a lease has Lost: the store may report the loss
	watchRunning                        // a goroutine watches Lost (observers, or Done was asked for)
	givenUp                             // the last handle's Unlock (or Close) began: never reentered again
)

// grantExtras is what only some grants need, made on first use: the keys
// of a lock of several keys, Done, a loss's cause, the channels of the
// goroutines that wait on the grant; and, for a grant of a DistributeLock
// with handlers, its Request (see grantRequest).
type grantExtras struct {
	// req is the Request the handler chain saw acquire the grant, which
	// it passes again on release and loss (the handlers may keep it until
	// then); set at the grant's making, only when d has handlers. Without
	// handlers the Request lives in the acquisition, and no later step
	// needs it.
	req        *Request
	subs       []*backend.Lease // a lock of several keys: a lease per key, subs[0] == &g.lease; set before the commit
	done       chan struct{}    // made on the first Done call; closed by announce
	cause      error            // why a lost grant was lost
	announcing chan struct{}    // made by a release waiting for a loss to be announced; closed by announce
	stopLost   chan struct{}    // closed when the grant finishes, while watchRunning
	settled    chan struct{}    // made by a waiter, closed when the release in flight ends
	refreshed  chan struct{}    // made by an Extend or relabel waiting, closed when the refresh in flight ends (or g stops being held)
	// unknownTTL is the shortest TTL carried by a refresh whose outcome
	// is unknown (the store failed or did not answer: it may apply the
	// request later); 0: none. Until a refresh with a TTL no longer than
	// it succeeds, the validity counts with it.
	unknownTTL time.Duration
	// extendedTTL is the TTL of an Extend that succeeded while the grant
	// was released, applied to its leases if the release fails; 0: none.
	extendedTTL time.Duration
	// label is the label of a relabel that succeeded while the grant was
	// released (relabelled), applied to its lease if the release fails.
	label      string
	relabelled bool
}

// extrasLocked returns g's grantExtras, making it.
func (g *grant) extrasLocked() *grantExtras {
	m := g.extras.Load()
	if m == nil {
		m = new(grantExtras)
		g.extras.Store(m)
	}
	return m
}

// request returns the Request of a grant of a DistributeLock with
// handlers (grantExtras.req); nil without handlers.
func (g *grant) request() *Request {
	if m := g.extras.Load(); m != nil {
		return m.req
	}
	return nil
}

// never is the monotonic time of an event that is not planned.
const never = math.MaxInt64

// clockBase is the origin of the facade's monotonic clock: grants keep
// their times as nanoseconds since it, 8 bytes instead of a time.Time's 24.
var clockBase = time.Now()

// mono returns t on the facade's monotonic clock.
func mono(t time.Time) int64 { return int64(t.Sub(clockBase)) }

// monoNow returns the time now on the facade's monotonic clock.
func monoNow() int64 { return int64(time.Since(clockBase)) }

// grantState is where a grant is in its life; see [grant].
type grantState uint8

const (
	acquiring grantState = iota
	held
	releasing
	lost
	released
)

func (s grantState) String() string {
	return [...]string{"acquiring", "held", "releasing", "lost", "released"}[s]
}

type eventKind uint8

const (
	evCommit eventKind = iota
	evRollback
	evReenter
	evDue
	evLose
	evPoll
	evAskDone
	evRefresh
	evRefreshed
	evRelease
	evReleased
	evReleaseFailed
)

// event is what happens to a grant: its kind and what that kind carries.
type event struct {
	kind    eventKind
	at      int64         // (monotonic) commit: the granted attempt's start; due: now; refreshed: the request's send time
	cause   error         // lose, rollback
	max     int           // reenter: the reentrancy limit (0: none)
	err     error         // refreshed: the store's answer
	ttl     time.Duration // refresh, refreshed: the TTL the request carries
	extend  bool          // refreshed: the request was Lock.Extend's
	relabel bool          // refresh, refreshed: the request is a relabel (Election.Proclaim), to label
	label   string        // refresh, refreshed: a relabel's label
	renewAt int64         // refreshed, a relabel: the renewal planned when it was sent
	handle  bool          // release: a handle's Unlock (not Close)
	partial bool          // release failed: some keys of a lock of several are gone
	watcher bool          // lose: from the goroutine watching Lost, which has ended
}

// outcome is what step asks its caller to do outside the grant's lock, and
// how the event went.
type outcome struct {
	ok     bool            // the event applied (commit, reenter, release, refresh, due: a renewal to send)
	err    error           // why it did not (commit, reenter, refresh, release), or the refresh's error
	lostBy error           // the grant was just lost: tell the observers, then close Done
	watch  <-chan struct{} // start watching Lost, until this closes
	wait   <-chan struct{} // wait for this to close, then step again (release, refresh)
	again  bool            // release: step again at once (a loss was just taken in); failed: release again in the background
	done   <-chan struct{} // ask done: the Done channel
	rf     *refresh        // due, refresh: the request to send
}

// step applies ev to g. It is the only function that writes the fields
// that decide g's fate.
func (g *grant) step(ev event) (out outcome) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch ev.kind {
	case evCommit:
		if g.state != acquiring {
			return
		}
		validity := g.validityLocked()
		g.expiry = ev.at + int64(validity)
		if monoNow() >= g.expiry {
			out.err = fmt.Errorf("%w: %s: its validity (%v) ended before the handler chain returned", ErrNotHeld, quote(g.lease.Key), validity)
			return
		}
		signal, kept := false, g.d.cfg.autoRenew
		for _, l := range g.subLeases() {
			lost := l.Lost()
			if lost != nil && lost.Closed() {
				out.err = fmt.Errorf("%w: %s: the backend reported the lock lost before the handler chain returned", ErrNotHeld, quote(g.lease.Key))
				return
			}
			signal = signal || lost != nil
			kept = kept && l.KeptAlive
		}
		g.state, g.refs, out.ok = held, 1, true
		g.renewAt = never
		if kept { // the store keeps it alive and reports its loss
			g.flags |= keptAlive
			g.expiry = never
		} else if g.d.cfg.autoRenew {
			g.renewAt = ev.at + int64(renewInterval(validity))
		}
		if signal {
			// Watched at once when observers must hear of a loss;
			// otherwise from the first Done call, and taken in by
			// whatever asks the grant's state before (poll).
			g.flags |= lostSignal
			if len(g.d.observers) > 0 {
				out.watch = g.watchLocked()
			}
		}
		g.scheduleLocked() // registers it: Close sees it from now on
	case evRollback:
		if g.state == acquiring {
			g.finishLocked(released, ev.cause)
			out.ok = true
		}
	case evReenter:
		if out.lostBy = g.pollLocked(); out.lostBy != nil {
			out.err = fmt.Errorf("%w: reentering %s, which was lost", ErrNotHeld, quote(g.lease.Key))
			return
		}
		switch {
		case g.flags&givenUp != 0:
			// Its last Unlock began (and may have failed: it is
			// released again, by a retry or in the background): the
			// caller acquires anew.
		case g.state == held && g.d.isClosed():
			out.err = fmt.Errorf("%w: reentering %s during Close", ErrClosed, quote(g.lease.Key))
		case g.state == held && monoNow() >= g.expiry:
			out.lostBy = g.loseLocked(fmt.Errorf("%w: %s: its validity ended", ErrNotHeld, quote(g.lease.Key)))
			out.err = fmt.Errorf("%w: reentering %s, whose validity ended", ErrNotHeld, quote(g.lease.Key))
		case g.state == held && (ev.max > 0 && int(g.refs) >= ev.max || g.refs == math.MaxInt32):
			out.err = fmt.Errorf("%w: %s is held %d times", ErrReentrancy, quote(g.lease.Key), g.refs)
		case g.state == held:
			g.refs++
			out.ok = true
		case g.state == lost:
			out.err = fmt.Errorf("%w: reentering %s, which was lost", ErrNotHeld, quote(g.lease.Key))
		}
		// releasing, released: not ok and no error; the caller acquires anew.
	case evDue:
		if g.state != held {
			return
		}
		if ev.at >= g.expiry {
			out.lostBy = g.loseLocked(fmt.Errorf("%w: %s: its validity (TTL %v) ran out", ErrNotHeld, quote(g.lease.Key), g.lease.TTL))
			return
		}
		if g.flags&refreshing == 0 && g.renewAt != never && ev.at+g.renewSlackLocked() >= g.renewAt {
			out.rf, out.ok = g.startRefreshLocked(g.lease.TTL, false), true
		}
		g.scheduleLocked()
	case evLose:
		if ev.watcher {
			g.flags &^= watchRunning
		}
		if g.state == held {
			out.lostBy = g.loseLocked(ev.cause)
		}
		// releasing: a release that fails finds the Lost closed.
	case evPoll:
		out.lostBy = g.pollLocked()
	case evAskDone:
		out.lostBy = g.pollLocked()
		m := g.extrasLocked()
		if m.done == nil {
			m.done = make(chan struct{})
			switch {
			case g.flags&announced != 0:
				close(m.done)
			case g.state == held:
				g.flags |= doneAsked
				g.scheduleLocked()
				out.watch = g.watchLocked()
			case g.state == releasing:
				g.flags |= doneAsked // scheduled and watched if the release fails
			} // else lost, not yet announced: announce closes it
		}
		out.done = m.done
	case evRefresh:
		if out.lostBy = g.pollLocked(); out.lostBy != nil || g.state != held {
			out.err = fmt.Errorf("%w: %s is %v", ErrNotHeld, quote(g.lease.Key), g.state)
			return
		}
		// A relabel also lets a renewal that is due go first, which the
		// scheduler is about to send: relabels one after another must
		// not starve renewals.
		if g.flags&refreshing != 0 || ev.relabel && g.renewAt != never && monoNow() >= g.renewAt {
			m := g.extrasLocked()
			if m.refreshed == nil {
				m.refreshed = make(chan struct{})
			}
			out.wait = m.refreshed
			return
		}
		if ev.relabel {
			out.rf, out.ok = g.startRelabelLocked(ev.label), true
		} else {
			out.rf, out.ok = g.startRefreshLocked(ev.ttl, true), true
		}
		g.scheduleLocked()
	case evRefreshed:
		out = g.refreshedLocked(ev)
	case evRelease:
		if out.lostBy = g.pollLocked(); out.lostBy != nil {
			out.again = true // announce it first, then release the lost grant
			return
		}
		switch {
		case g.state == released:
			out.err = fmt.Errorf("%w: %s already released", ErrNotHeld, quote(g.lease.Key))
			return
		case g.state == releasing:
			m := g.extrasLocked()
			if m.settled == nil {
				m.settled = make(chan struct{})
			}
			out.wait = m.settled
			return
		case g.state == lost && g.flags&announced == 0:
			// Lost a moment ago: the observers are being told. A
			// release waits for them, so that none hears of the
			// loss once a release has begun.
			m := g.extrasLocked()
			if m.announcing == nil {
				m.announcing = make(chan struct{})
			}
			out.wait = m.announcing
			return
		case ev.handle && g.refs > 1: // not the last handle: no I/O
			g.refs--
			if g.state == lost {
				out.err = fmt.Errorf("%w: %s was lost", ErrNotHeld, quote(g.lease.Key))
			}
			return
		}
		g.state, out.ok = releasing, true
		g.flags |= givenUp
		g.renewAt = never
		g.d.sched.unschedule(g)
		g.wakeRefreshWaitersLocked()
	case evReleased:
		if g.state == releasing {
			g.refs = 0
			g.finishLocked(released, nil)
			g.settleLocked()
			g.d.sched.remove(g)
		}
	case evReleaseFailed:
		if g.state != releasing {
			return
		}
		g.state = held // where it was: a lost grant has finished
		if g.flags&finished != 0 {
			g.state = lost
		}
		g.settleLocked()
		if m := g.extras.Load(); m != nil && m.extendedTTL != 0 {
			g.setTTLLocked(m.extendedTTL) // extended while it was released
			m.extendedTTL = 0
		}
		if m := g.extras.Load(); m != nil && m.relabelled {
			g.lease.Label = m.label // relabelled while it was released
			m.relabelled, m.label = false, ""
		}
		if g.state != held {
			return
		}
		switch {
		case g.lostSignalledLocked():
			// Lost while it was released: the watch, if any, saw it
			// and ended.
			out.lostBy = g.loseLocked(g.lostCause())
		case ev.partial:
			// A lock of several keys with some keys gone is not held;
			// what is left is released by a retry, or frees with the
			// TTL.
			out.lostBy = g.loseLocked(fmt.Errorf("%w: %s: some keys were released, the release of others failed", ErrNotHeld, quote(g.lease.Key)))
			out.again = g.flags&keptAlive != 0 // no TTL frees the others
		case g.d.closeOver():
			// Nothing of a closed DistributeLock keeps the lock alive
			// or watches it: it is lost, and the store frees it with
			// its TTL (Unlock may still delete it). During Close, its
			// release pass retries and decides.
			out.lostBy = g.loseLocked(fmt.Errorf("%w: %s: its release failed after Close", ErrNotHeld, quote(g.lease.Key)))
		case g.flags&keptAlive != 0:
			// The store keeps it alive: no TTL would ever free it.
			out.again = true
		default:
			g.scheduleLocked() // expiry only: renewal stays stopped
			if g.flags&doneAsked != 0 {
				out.watch = g.watchLocked()
			}
		}
	}
	return out
}

// refresh is one renewal, extension or relabel request of a grant: its
// leases, copied with the TTL (and label) the request carries.
type refresh struct {
	g       *grant
	expiry  int64 // the validity's end when it was made: a renewal answered later is worthless
	ttl     time.Duration
	extend  bool
	relabel bool  // a relabel: leases[0] carries the new label
	renewAt int64 // a relabel: the renewal planned when it was made
	leases  []backend.Lease
}

// startRefreshLocked marks a refresh in flight and returns it. No renewal
// is planned until it ends; the expiry stays scheduled. A refresh to a
// shorter TTL than the lock's may be applied any time from now: the expiry
// moves to its validity from now at once.
func (g *grant) startRefreshLocked(ttl time.Duration, extend bool) *refresh {
	g.flags |= refreshing
	g.renewAt = never
	if g.flags&keptAlive == 0 && ttl < g.lease.TTL {
		g.expiry = min(g.expiry, monoNow()+int64(safeValidity(backend.Lease{TTL: ttl})))
	}
	subs := g.subLeases()
	rf := &refresh{g: g, expiry: g.expiry, ttl: ttl, extend: extend, leases: make([]backend.Lease, len(subs))}
	for i, l := range subs {
		rf.leases[i] = *l
		rf.leases[i].TTL = ttl
	}
	return rf
}

// startRelabelLocked marks a relabel in flight and returns it: a request
// that changes the label of the grant's one lease, and no TTL. The renewal
// planned waits until it ends.
func (g *grant) startRelabelLocked(label string) *refresh {
	renewAt := g.renewAt
	rf := g.startRefreshLocked(g.lease.TTL, false)
	rf.relabel, rf.renewAt = true, renewAt
	rf.leases[0].Label = label
	return rf
}

// errNotSent is the result of a renewal that waited for a free slot until
// the validity ended: it never reached the store.
var errNotSent = errors.New("distlock: the renewal found no free slot before the lock's validity ended")

// refreshedLocked applies a refresh's result (step's evRefreshed).
func (g *grant) refreshedLocked(ev event) (out outcome) {
	g.flags &^= refreshing
	if m := g.extras.Load(); m != nil && m.refreshed != nil {
		close(m.refreshed)
		m.refreshed = nil
	}
	what := "renewing"
	switch {
	case ev.extend:
		what = "extending"
	case ev.relabel:
		what = "relabelling"
	}
	if g.state != held && g.state != releasing {
		out.err = fmt.Errorf("%w: %s was released or lost while %s", ErrNotHeld, quote(g.lease.Key), what)
		return
	}
	// While it is released, what the store did still counts: the release
	// may fail, and the grant be held again with the expiry the store
	// has. Renewal stays stopped then.
	renew := g.d.cfg.autoRenew && g.state == held
	if out.lostBy = g.pollLocked(); out.lostBy != nil {
		out.err = out.lostBy
		return
	}
	if ev.relabel {
		return g.relabelledLocked(ev, what)
	}
	now := monoNow()
	kept := g.flags&keptAlive != 0
	refusal, refused := g.refusedLocked(ev, what)
	switch {
	case refused:
		out = refusal
	case ev.err == nil:
		m := g.extras.Load()
		if ev.extend && g.state == releasing {
			// The store reads the leases while it releases them: the
			// new TTL applies if the release fails.
			g.extrasLocked().extendedTTL = ev.ttl
		} else if ev.extend {
			g.setTTLLocked(ev.ttl)
		}
		if m != nil && m.unknownTTL != 0 && ev.ttl <= m.unknownTTL {
			// A request still to land carries as long a TTL or
			// longer: it can only move the store's expiry later.
			m.unknownTTL = 0
		}
		out.ok = true
		if !kept {
			validity := g.validityLocked()
			if ev.extend && g.state == releasing { // the leases keep the old TTL meanwhile
				validity = safeValidity(backend.Lease{TTL: ev.ttl})
				if m := g.extras.Load(); m.unknownTTL != 0 {
					validity = min(validity, safeValidity(backend.Lease{TTL: m.unknownTTL}))
				}
			}
			g.expiry = ev.at + int64(validity)
			if renew {
				g.renewAt = ev.at + int64(renewInterval(validity))
			}
		}
	default:
		out.err = ev.err
		if !errors.Is(ev.err, errNotSent) {
			// The store may apply the request yet, and set the TTL it
			// carries from then: never count past it.
			if m := g.extrasLocked(); m.unknownTTL == 0 || ev.ttl < m.unknownTTL {
				m.unknownTTL = ev.ttl
			}
			if !kept {
				g.expiry = min(g.expiry, ev.at+int64(safeValidity(backend.Lease{TTL: ev.ttl})))
			}
		}
		if kept {
			break
		}
		if now >= g.expiry && g.state == held {
			out.lostBy = g.loseLocked(fmt.Errorf("%w: %s %s failed until its validity ended: %w", ErrNotHeld, what, quote(g.lease.Key), ev.err))
			return
		}
		if renew { // retry sooner, within the validity left
			g.renewAt = now + min(int64(renewInterval(g.validityLocked()))/4, g.expiry-now)
		}
	}
	if g.state == held {
		g.scheduleLocked()
	}
	return out
}

// setTTLLocked makes ttl the TTL of every lease of g, extended to it: the
// validity is the new TTL's, from the extension's send time (a store's
// own, such as Redlock's, was the acquisition's).
func (g *grant) setTTLLocked(ttl time.Duration) {
	for _, l := range g.subLeases() {
		l.TTL, l.Validity = ttl, 0
	}
}

// relabelledLocked applies a relabel's result (refreshedLocked): the
// label on success, the loss on ErrNotHeld; the renewal planned before
// it goes on, and the validity is untouched either way.
func (g *grant) relabelledLocked(ev event, what string) (out outcome) {
	refusal, refused := g.refusedLocked(ev, what)
	switch {
	case refused:
		out = refusal
	case ev.err == nil && g.state == releasing:
		// The store reads the lease while it releases it: the new
		// label applies if the release fails.
		m := g.extrasLocked()
		m.relabelled, m.label = true, ev.label
		out.ok = true
	case ev.err == nil:
		g.lease.Label = ev.label
		out.ok = true
	default:
		out.err = ev.err
	}
	if g.state == held { // a release stopped renewal
		g.renewAt = ev.renewAt // the renewal planned before it, due at once if past
		g.scheduleLocked()
	}
	return out
}

// refusedLocked applies what a refresh's or relabel's error says of the
// lock itself, the same for both: ErrNotHeld (the store no longer has
// it: a held grant is lost) and ErrUnsupported (refused before any I/O).
// refused is false for any other result, which the caller applies.
func (g *grant) refusedLocked(ev event, what string) (out outcome, refused bool) {
	switch {
	case errors.Is(ev.err, ErrNotHeld):
		out.err = fmt.Errorf("%s %s: %w", what, quote(g.lease.Key), ev.err)
		if g.state == held {
			out.lostBy = g.loseLocked(out.err)
		}
	case errors.Is(ev.err, errors.ErrUnsupported):
		out.err = fmt.Errorf("%w: %w", ErrUnsupported, ev.err)
	default:
		return out, false
	}
	return out, true
}

// pollLocked takes in a loss the backend reported (a lease's Lost
// closed) while g is held, and returns its cause; nil when none.
func (g *grant) pollLocked() error {
	if g.state != held || !g.lostSignalledLocked() {
		return nil
	}
	return g.loseLocked(g.lostCause())
}

// lostSignalledLocked reports whether a lease's Lost is closed.
func (g *grant) lostSignalledLocked() bool {
	if g.flags&lostSignal == 0 {
		return false
	}
	for _, l := range g.subLeases() {
		if lost := l.Lost(); lost != nil && lost.Closed() {
			return true
		}
	}
	return false
}

// settleLocked wakes whoever waits for the release in flight to end.
func (g *grant) settleLocked() {
	if m := g.extras.Load(); m != nil && m.settled != nil {
		close(m.settled)
		m.settled = nil
	}
}

// loseLocked moves a held grant to lost and returns the cause.
func (g *grant) loseLocked(cause error) error {
	g.finishLocked(lost, cause)
	return cause
}

// announce closes Done once the loss observers were told.
func (g *grant) announce() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.announceLocked()
}

// announceLocked closes Done, once.
func (g *grant) announceLocked() {
	if g.flags&announced != 0 {
		return
	}
	g.flags |= announced
	if m := g.extras.Load(); m != nil {
		if m.done != nil {
			close(m.done)
		}
		if m.announcing != nil {
			close(m.announcing)
		}
	}
}

// finishLocked moves g to lost or released. The first time, it records
// the cause (none for a release) and stops timers and watches; a lost
// grant's release only changes its state. A released grant's Done closes
// here, with the state, so that an Unlock that finds the grant released
// finds Done closed; a lost grant's closes in apply, once the loss
// observers were told (whoever wakes on Done finds them told).
func (g *grant) finishLocked(to grantState, cause error) {
	g.state = to
	if g.flags&finished != 0 {
		return
	}
	g.flags |= finished
	if cause != nil {
		g.extrasLocked().cause = cause
	}
	if m := g.extras.Load(); m != nil && m.stopLost != nil {
		close(m.stopLost)
		m.stopLost = nil
	}
	g.renewAt = never
	g.d.sched.unschedule(g) // a lost grant stays registered until released
	g.wakeRefreshWaitersLocked()
	if to == released {
		g.announceLocked() // nobody to tell first
	}
}

// wakeRefreshWaitersLocked wakes the callers waiting for a refresh to end
// (refreshed) when none is in flight: relabels waiting for a renewal that
// is due to go first, once g stops being held and no renewal will go.
// They step again and find g not held.
func (g *grant) wakeRefreshWaitersLocked() {
	if m := g.extras.Load(); m != nil && m.refreshed != nil && g.flags&refreshing == 0 {
		close(m.refreshed)
		m.refreshed = nil
	}
}

// errReleased is the cause of a grant that ended by its release.
var errReleased = errors.New("distlock: released")

// validityLocked is how long one grant or refresh is known valid: the
// shortest safe validity of the grant's leases (safeValidity), and of a
// refresh whose outcome is unknown.
func (g *grant) validityLocked() time.Duration {
	v := validityAll(g.subLeases())
	if m := g.extras.Load(); m != nil && m.unknownTTL != 0 {
		v = min(v, safeValidity(backend.Lease{TTL: m.unknownTTL}))
	}
	return v
}

// apply does what an outcome asks outside the grant's lock.
func (g *grant) apply(out outcome) {
	if out.watch != nil {
		go g.watchLost(out.watch)
	}
	if out.lostBy != nil {
		g.d.lockLost(g.request(), out.lostBy)
		g.announce()
	}
}

// watchLocked starts the watch of the leases' Lost channels, once, while
// g is held: it returns the channel that stops it, for apply to start
// the goroutine; nil when there is nothing to start.
func (g *grant) watchLocked() <-chan struct{} {
	if g.flags&(lostSignal|watchRunning) != lostSignal || g.state != held {
		return nil
	}
	g.flags |= watchRunning
	m := g.extrasLocked()
	m.stopLost = make(chan struct{})
	return m.stopLost
}

// watchLost reports the backend's loss signal to step.
func (g *grant) watchLost(stop <-chan struct{}) {
	if subs := g.subLeases(); len(subs) > 1 {
		g.watchLostAll(subs, stop)
		return
	}
	select {
	case <-g.lease.Lost().Done():
		g.apply(g.step(event{kind: evLose, watcher: true, cause: g.lostCause()}))
	case <-stop:
	}
}

// lostCause is the cause of a loss the backend reported.
func (g *grant) lostCause() error {
	return fmt.Errorf("%w: %s: the backend reported the lock lost", ErrNotHeld, quote(g.lease.Key))
}

// poll takes in a loss the backend reported while nobody watched for it:
// every call that asks a grant's state polls first, so that a lock
// nobody waits on costs no goroutine.
func (g *grant) poll() {
	g.apply(g.step(event{kind: evPoll}))
}

// doneChan returns the Done channel, making it (and scheduling the
// expiry, and watching Lost) on the first call.
func (g *grant) doneChan() <-chan struct{} {
	out := g.step(event{kind: evAskDone})
	g.apply(out)
	return out.done
}

// deadline returns when the validity ends by the facade's clock; zero
// once the grant is lost or released, or when the store keeps it alive.
func (g *grant) deadline() time.Time {
	g.poll()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != held || g.flags&keptAlive != 0 {
		return time.Time{}
	}
	return wallTime(g.expiry)
}

// ttl returns the lease time of the lock (Extend changes it).
func (g *grant) ttl() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lease.TTL
}

// live reports whether the grant is held or lost but not yet released.
func (g *grant) live() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state == held || g.state == lost || g.state == releasing
}

// err returns why Done closed, or nil while the grant is held.
func (g *grant) err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.flags&finished == 0 {
		return nil
	}
	if m := g.extras.Load(); m != nil && m.cause != nil {
		return m.cause
	}
	return errReleased
}

// release runs the final release through the chain: the last handle's
// Unlock (handle) or Close. A release already in flight (Close's) is
// waited for, bounded by ctx. On a store error the grant goes back to
// held or lost, and a handle's Unlock may be retried.
func (g *grant) release(ctx context.Context, handle bool) error {
	for {
		out := g.step(event{kind: evRelease, handle: handle})
		g.apply(out)
		switch {
		case out.again:
			continue
		case out.wait != nil:
			select {
			case <-out.wait:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		case !out.ok: // not the last handle, or released already
			return out.err
		}
		var err error
		if g.d.noHandlers {
			err = g.d.releaseGrant(ctx, g) // no chain: the store step alone
		} else {
			err = g.d.chain.release(ctx, g.request())
		}
		if err != nil && !errors.Is(err, ErrNotHeld) {
			var pr *partialRelease
			out := g.step(event{kind: evReleaseFailed, partial: errors.As(err, &pr)})
			g.apply(out)
			if out.again && handle {
				g.d.releaseAgain(g)
			}
			return err
		}
		g.apply(g.step(event{kind: evReleased}))
		return err
	}
}

// isFinal reports whether a release's error leaves nothing to retry.
func isFinal(err error) bool { return errors.Is(err, ErrNotHeld) }

// extend extends the lock to ttl from now (Lock.Extend). It waits for a
// renewal in flight to end first: one refresh of a grant at a time, so
// that the reply processed last is of the request the store applied last.
// The request is bounded by the lock's validity: an answer after it is
// worthless.
func (g *grant) extend(ctx context.Context, ttl time.Duration) error {
	if g.d.refresher == nil {
		return fmt.Errorf("%w: %T cannot extend locks", ErrUnsupported, g.d.res)
	}
	rf, ctx, cancel, err := g.beginRefresh(ctx, event{kind: evRefresh, ttl: ttl})
	if err != nil {
		return err
	}
	defer cancel()
	at := monoNow()
	err = refreshAll(ctx, g.d.refresher, rf.leases)
	out := g.step(event{kind: evRefreshed, at: at, ttl: ttl, extend: true, err: err})
	g.apply(out)
	return out.err
}

// beginRefresh takes g's one refresh slot with ev (an Extend's or a
// relabel's evRefresh), waiting while another refresh is in flight, and
// returns the refresh with ctx bounded by the lock's validity (an answer
// after it is worthless); cancel releases that bound.
func (g *grant) beginRefresh(ctx context.Context, ev event) (*refresh, context.Context, context.CancelFunc, error) {
	for {
		out := g.step(ev)
		g.apply(out)
		if out.wait != nil {
			select {
			case <-out.wait:
				continue
			case <-ctx.Done():
				return nil, ctx, nil, ctx.Err()
			}
		}
		if !out.ok {
			return nil, ctx, nil, out.err
		}
		if out.rf == nil {
			continue
		}
		if out.rf.expiry == never {
			return out.rf, ctx, func() {}, nil
		}
		ctx, cancel := context.WithDeadline(ctx, wallTime(out.rf.expiry))
		return out.rf, ctx, cancel, nil
	}
}

// relabel sets the label the store keeps with g's one lease
// (Election.Proclaim): as a refresh, one at a time with renewals and
// extensions (a renewal that carried the old label could land after it),
// bounded by the lock's validity as well as ctx.
func (g *grant) relabel(ctx context.Context, rl backend.Relabeler, label string) error {
	rf, ctx, cancel, err := g.beginRefresh(ctx, event{kind: evRefresh, relabel: true, label: label})
	if err != nil {
		return err
	}
	defer cancel()
	err = rl.Relabel(ctx, &rf.leases[0])
	out := g.step(event{kind: evRefreshed, relabel: true, label: label, renewAt: rf.renewAt, err: err})
	g.apply(out)
	return out.err
}

// safeValidity is how long after the start of its successful attempt a
// lock is known held: the backend's validity (or the TTL), less an allowance
// for timer lateness and clock drift between this process and the store
// (1% + 2ms, as Redlock's drift, and at most half), so that Done closes
// before the store can hand the key to someone else.
func safeValidity(l backend.Lease) time.Duration {
	v := l.Validity
	if v <= 0 {
		v = l.TTL
	}
	return v - min(v/100+2*time.Millisecond, v/2)
}

// releaseAgain releases g in the background after its release failed:
// the store keeps g alive (backend.Lease.KeptAlive), so no TTL would free
// it while this process lives. It retries with backoff, each attempt
// bounded by the lease's TTL (at least a second), until the store answers
// (ErrNotHeld too: a lock its store lost is gone) or Close's bound. An
// Unlock called meanwhile waits for the attempt in flight.
func (d *DistributeLock) releaseAgain(g *grant) {
	d.bg.goRun("releasing "+quote(g.lease.Key)+" again", func(ctx context.Context) error {
		return retry(ctx, func(ctx context.Context) error {
			if !g.keptUnreleased() {
				return nil // released
			}
			ctx, cancel := context.WithTimeout(ctx, max(g.ttl(), time.Second))
			defer cancel()
			return g.release(ctx, false)
		})
	})
}

// keptUnreleased reports whether g is kept alive by the store and not
// released: held, or lost (by its store, which then answers ErrNotHeld; or
// by the facade, when some keys of a lock of several were released).
func (g *grant) keptUnreleased() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state != released && g.flags&keptAlive != 0
}
