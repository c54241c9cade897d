package distlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/distlock/distlock/backend"
)

// A grant is one acquisition through a [DistributeLock], shared by all the
// handles ([Lock]) of it. Every kind of lock the facade hands out is a grant
// to this state machine, and its whole life is here: the states, and
// [grant.step], the one function that moves between them. Nothing else
// writes a grant's state.
//
//	from        event                                          to          effect
//	----------  ---------------------------------------------  ----------  -------------------------------------------------
//	acquiring   commit: the whole chain returned nil, the      held        registered with the DistributeLock (Close sees
//	            store granted, d is open, validity is left,                it); renewal and expiry scheduled (none when the
//	            no Lost closed                                             store keeps it alive: KeptAlive); Lost watched
//	acquiring   rollback: a handler failed after the store     released    Done closed; the handlers that acquired, and only
//	            granted, Close ran, or the validity ended                  they, see Release (the store too, if it granted)
//	held        reenter: validity left, under the limit        held        one more handle (no I/O)
//	held        expire: reenter or the timer finds the         lost        as lose
//	            validity ended by the facade's clock
//	held        lose: a renewal found the lock gone, or        lost        Done closed with the cause; loss observers told
//	            failed until the validity ended; the                       once; renewal stopped
//	            backend's Lost closed
//	held        renew start: the scheduler finds it due        held        one renewal in flight (never two)
//	held        renewed (started after the last release        held        validity extended; next renewal scheduled
//	            began: same epoch)
//	held        renew failed (same epoch): a store error       held        retried sooner, within the validity left
//	            with validity left
//	held        renew failed: ErrNotHeld, or validity ended    lost        as lose
//	held        extended (Lock.Extend, same epoch)             held        the new TTL's validity from the extension's
//	                                                                       start; renewal keeps the new TTL
//	held, lost  release: the last handle's Unlock, or Close    releasing   renewal stopped; the release chain runs (a
//	            (a lost grant's once its loss was announced)                   release of a lost grant waits until the
//	                                                                            observers were told and Done closed)
//	releasing   released: the store said nil or ErrNotHeld     released    Done closed (if still open); unregistered
//	releasing   release failed: a store error                  held, lost  back where it was: Unlock may be retried;
//	                                                                       renewal stays stopped, the TTL frees it
//
// Every other pair is ignored: a loss or a renewal's result once a release
// has begun, a second release, a commit of a rolled-back grant. So a grant
// is lost at most once, released at most once, Done closes exactly once,
// and every handler whose Acquire returned nil sees exactly one Release
// (again only when the caller retries a failed Unlock).
type grant struct {
	d     *DistributeLock
	req   Request
	lease backend.Lease
	subs  []*backend.Lease // a lock of several keys: a lease per key, subs[0] == &lease; nil otherwise
	actx  acqCtx           // the acquisition's context, while acquiring

	mu         sync.Mutex
	state      grantState
	prev       grantState    // while releasing: where a failed release returns
	refs       int           // live handles
	epoch      uint64        // bumped when a release begins: older renewal results are stale
	validity   time.Duration // how long one grant or renewal is known valid (safeValidity)
	expiry     time.Time     // when the validity ends, by the facade's clock
	cause      error         // why Done closed: nil while held
	done       chan struct{} // made on the first Done call; closed by announce
	announced  bool          // Done is closed (or will be closed as it is made)
	announcing chan struct{} // made by a release waiting for a loss to be announced; closed by announce
	watched    bool          // Done was asked for: the expiry is scheduled
	renewAt    time.Time     // the next renewal; zero: none planned
	renewing   bool          // a renewal is in flight
	kept       bool          // the store keeps it alive itself (backend.Lease.KeptAlive): no renewal, no expiry
	stopLost   chan struct{} // closed when the grant leaves held; nil unless lease.Lost is set
	settled    chan struct{} // made by a waiter, closed when the release in flight ends

	// The scheduler's, guarded by its mutex.
	due   time.Time
	slack time.Duration // due may be taken this much early
	index int           // in the scheduler's heap; -1 when not in it
}

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
	evExpire
	evLose
	evRenewStart
	evRenewed
	evRenewFailed
	evRelease
	evReleased
	evReleaseFailed
	evExtended
)

// event is what happens to a grant: its kind and what that kind carries.
type event struct {
	kind  eventKind
	at    time.Time     // commit: the granted attempt's start; renewed: the renewal's start; expire, renew failed: now
	cause error         // lose, rollback
	epoch uint64        // renewed, renew failed: the epoch the renewal started in
	max   int           // reenter: the reentrancy limit (0: none)
	err   error         // renew failed: the store's error
	ttl   time.Duration // extended: the new TTL
}

// outcome is what step asks its caller to do outside the grant's lock, and
// how the event went.
type outcome struct {
	ok       bool  // the event applied (commit, reenter, release, renew start)
	err      error // why it did not (commit, reenter)
	lostBy   error // the grant was just lost: tell the observers
	register bool  // commit: register with d and watch Lost
	forget   bool  // released: unregister from d
	finished bool  // released or lost just now: apply closes Done
}

// step applies ev to g. It is the only function that writes g.state.
func (g *grant) step(ev event) (out outcome) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch ev.kind {
	case evCommit:
		if g.state != acquiring {
			return
		}
		g.expiry = ev.at.Add(g.validity)
		if !time.Now().Before(g.expiry) {
			out.err = fmt.Errorf("%w: %s: its validity (%v) ended before the handler chain returned", ErrNotHeld, quote(g.req.Key), g.validity)
			return
		}
		watch := false
		for _, l := range g.subLeases() {
			if isClosed(l.Lost) {
				out.err = fmt.Errorf("%w: %s: the backend reported the lock lost before the handler chain returned", ErrNotHeld, quote(g.req.Key))
				return
			}
			watch = watch || l.Lost != nil
		}
		g.state, g.refs, out.ok, out.register = held, 1, true, true
		g.kept = g.d.cfg.autoRenew
		for _, l := range g.subLeases() {
			g.kept = g.kept && l.KeptAlive
		}
		if g.kept { // the store keeps it alive and reports its loss
			g.expiry = neverExpires
		} else if g.d.cfg.autoRenew {
			g.renewAt = ev.at.Add(g.renewInterval())
		}
		if watch {
			g.stopLost = make(chan struct{})
		}
		g.scheduleLocked()
	case evRollback:
		if g.state == acquiring {
			out.finished = g.finishLocked(released, ev.cause)
			out.ok = true
		}
	case evReenter:
		switch {
		case g.state == held && !time.Now().Before(g.expiry):
			out.lostBy = g.loseLocked(fmt.Errorf("%w: %s: its validity ended", ErrNotHeld, quote(g.req.Key)))
			out.err = fmt.Errorf("%w: reentering %s, whose validity ended", ErrNotHeld, quote(g.req.Key))
		case g.state == held && ev.max > 0 && g.refs >= ev.max:
			out.err = fmt.Errorf("%w: %s is held %d times", ErrReentrancy, quote(g.req.Key), g.refs)
		case g.state == held:
			g.refs++
			out.ok = true
		case g.state == lost:
			out.err = fmt.Errorf("%w: reentering %s, which was lost", ErrNotHeld, quote(g.req.Key))
		}
		// releasing, released: not ok and no error; the caller acquires anew.
	case evExpire:
		if g.state != held {
			return
		}
		if ev.at.Before(g.expiry) { // renewed meanwhile
			g.scheduleLocked()
			return
		}
		out.lostBy = g.loseLocked(fmt.Errorf("%w: %s: TTL %v ran out", ErrNotHeld, quote(g.req.Key), g.lease.TTL))
	case evLose:
		if g.state == held {
			out.lostBy = g.loseLocked(ev.cause)
		}
	case evRenewStart:
		if g.state == held && !g.renewing {
			g.renewing, g.renewAt, out.ok = true, time.Time{}, true
		}
	case evExtended:
		if ev.epoch != g.epoch || g.state != held {
			out.err = fmt.Errorf("%w: %s was released or lost while it was extended", ErrNotHeld, quote(g.req.Key))
			return
		}
		for _, l := range g.subLeases() {
			// The validity is the new TTL's, from the extension's
			// start (a store's own, such as Redlock's, was the
			// acquisition's).
			l.TTL, l.Validity = ev.ttl, 0
		}
		g.validity = validityAll(g.subLeases())
		g.expiry = ev.at.Add(g.validity)
		if g.d.cfg.autoRenew {
			g.renewAt = ev.at.Add(g.renewInterval())
		}
		g.scheduleLocked()
		out.ok = true
	case evRenewed, evRenewFailed:
		if ev.epoch != g.epoch || g.state != held {
			g.renewing = false
			return
		}
		g.renewing = false
		now := time.Now()
		switch {
		case ev.kind == evRenewed:
			if e := ev.at.Add(g.validity); e.After(g.expiry) {
				g.expiry = e
			}
			g.renewAt = ev.at.Add(g.renewInterval())
		case errors.Is(ev.err, ErrNotHeld):
			out.lostBy = g.loseLocked(fmt.Errorf("renewing %s: %w", quote(g.req.Key), ev.err))
			return
		case !now.Before(g.expiry):
			out.lostBy = g.loseLocked(fmt.Errorf("%w: renewing %s failed until its validity ended: %w", ErrNotHeld, quote(g.req.Key), ev.err))
			return
		default: // retry sooner, within the validity left
			g.renewAt = now.Add(min(g.renewInterval()/4, g.expiry.Sub(now)))
		}
		g.scheduleLocked()
	case evRelease:
		if g.state != held && g.state != lost {
			return
		}
		g.prev, g.state, out.ok = g.state, releasing, true
		g.epoch++
		g.renewAt = time.Time{}
		g.d.sched.remove(g)
	case evReleased:
		if g.state == releasing {
			out.finished = g.finishLocked(released, nil)
			g.settleLocked()
			out.forget = true
		}
	case evReleaseFailed:
		if g.state == releasing {
			g.state = g.prev
			g.settleLocked()
			if g.state == held {
				g.scheduleLocked() // expiry only: renewal stays stopped
			}
		}
	}
	return out
}

// settleLocked wakes whoever waits for the release in flight to end.
func (g *grant) settleLocked() {
	if g.settled != nil {
		close(g.settled)
		g.settled = nil
	}
}

// loseLocked moves a held grant to lost and returns the cause.
func (g *grant) loseLocked(cause error) error {
	g.finishLocked(lost, cause)
	return cause
}

// announce closes Done once the grant has finished.
func (g *grant) announce() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.announced {
		return
	}
	g.announced = true
	if g.done != nil {
		close(g.done)
	}
	if g.announcing != nil {
		close(g.announcing)
	}
}

// finishLocked moves g to lost or released. The first time, it records
// the cause and stops timers and watches, and asks apply to close Done
// (after telling the loss observers, so that whoever wakes on Done finds
// them told); a lost grant's release only changes its state.
func (g *grant) finishLocked(to grantState, cause error) bool {
	g.state = to
	if g.cause != nil {
		return false
	}
	if cause == nil {
		cause = errReleased
	}
	g.cause = cause
	if g.stopLost != nil {
		close(g.stopLost)
	}
	g.renewAt = time.Time{}
	g.d.sched.remove(g)
	return true
}

// errReleased is the cause of a grant that ended by its release.
var errReleased = errors.New("distlock: released")

// renewInterval is the time between renewals: a third of the validity, so
// that two may fail before it ends.
func (g *grant) renewInterval() time.Duration {
	return max(g.validity/3, time.Millisecond)
}

// neverExpires is the expiry of a lock the store keeps alive itself.
var neverExpires = time.Unix(1<<62, 0)

// scheduleLocked tells the scheduler the grant's next event: the renewal,
// or the expiry when someone watches Done or renewal is on. A renewal may
// run up to half an interval early, so that the renewals due about the same
// time go to the store together.
func (g *grant) scheduleLocked() {
	if g.kept {
		g.d.sched.remove(g)
		return
	}
	var at time.Time
	var slack time.Duration
	if !g.renewAt.IsZero() {
		at, slack = g.renewAt, g.renewInterval()/2
	}
	if (g.watched || g.d.cfg.autoRenew) && (at.IsZero() || g.expiry.Before(at)) {
		at, slack = g.expiry, 0
	}
	if at.IsZero() {
		g.d.sched.remove(g)
		return
	}
	g.d.sched.schedule(g, at, slack)
}

// takeDue tells what the scheduler found due for g at now: a renewal (within
// its slack), or else its expiry (applied here).
func (g *grant) takeDue(now time.Time) (renew bool) {
	g.mu.Lock()
	renew = g.state == held && !g.renewing && !g.renewAt.IsZero() &&
		!now.Add(g.renewInterval()/2).Before(g.renewAt)
	g.mu.Unlock()
	if renew {
		return g.step(event{kind: evRenewStart}).ok
	}
	g.apply(g.step(event{kind: evExpire, at: now}))
	return false
}

// leaseCopies returns copies of the grant's leases, for a renewal or an
// extension that runs while Extend may change the TTL.
func (g *grant) leaseCopiesLocked() []backend.Lease {
	subs := g.subLeases()
	out := make([]backend.Lease, len(subs))
	for i, l := range subs {
		out[i] = *l
	}
	return out
}

// renewal is one grant's part of a renewal: its leases, copied.
type renewal struct {
	g      *grant
	epoch  uint64
	expiry time.Time
	leases []backend.Lease
}

// renewed reports a renewal's result to step.
func (rn renewal) renewed(start time.Time, err error) {
	if err == nil {
		rn.g.apply(rn.g.step(event{kind: evRenewed, at: start, epoch: rn.epoch}))
		return
	}
	rn.g.apply(rn.g.step(event{kind: evRenewFailed, epoch: rn.epoch, err: err}))
}

// renewGrants renews grants due together: in batches where the store
// takes them (backend.BatchRefresher), otherwise one by one, a few
// goroutines at a time.
func (d *DistributeLock) renewGrants(gs []*grant) {
	rns := make([]renewal, len(gs))
	for i, g := range gs {
		g.mu.Lock()
		rns[i] = renewal{g: g, epoch: g.epoch, expiry: g.expiry, leases: g.leaseCopiesLocked()}
		g.mu.Unlock()
	}
	br, batch := d.res.(backend.BatchRefresher)
	if !batch || len(rns) == 1 {
		for chunk := range slices.Chunk(rns, 32) {
			go func() {
				for _, rn := range chunk {
					start := time.Now()
					// A renewal that answers after the validity ended is worthless.
					ctx, cancel := context.WithDeadline(context.Background(), rn.expiry)
					err := refreshAll(ctx, d.refresher, rn.leases)
					cancel()
					rn.renewed(start, err)
				}
			}()
		}
		return
	}
	// Batches of at most MaxRefreshBatch leases; a lock's leases stay in
	// one batch.
	var part []renewal
	n := 0
	for _, rn := range rns {
		if n > 0 && n+len(rn.leases) > backend.MaxRefreshBatch {
			go refreshBatch(br, part)
			part, n = nil, 0
		}
		part = append(part, rn)
		n += len(rn.leases)
	}
	go refreshBatch(br, part)
}

// refreshBatch renews rns in one request and reports each result.
func refreshBatch(br backend.BatchRefresher, rns []renewal) {
	var ls []*backend.Lease
	deadline := rns[0].expiry
	for _, rn := range rns {
		for i := range rn.leases {
			ls = append(ls, &rn.leases[i])
		}
		if rn.expiry.Before(deadline) {
			deadline = rn.expiry
		}
	}
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	errs := br.RefreshAll(ctx, ls)
	cancel()
	for _, rn := range rns {
		var gerrs []error
		for range rn.leases {
			err := errors.New("distlock: the store answered a batch renewal short")
			if len(errs) > 0 {
				err, errs = errs[0], errs[1:]
			}
			gerrs = append(gerrs, err)
		}
		rn.renewed(start, errors.Join(gerrs...))
	}
}

// apply does what an outcome asks outside the grant's lock.
func (g *grant) apply(out outcome) {
	if out.register {
		g.d.register(g)
		if g.stopLost != nil {
			if subs := g.subLeases(); len(subs) > 1 {
				go g.watchLostAll(subs, g.stopLost)
			} else {
				go g.watchLost(g.lease.Lost, g.stopLost)
			}
		}
	}
	if out.forget {
		g.d.forget(g)
	}
	if out.lostBy != nil {
		g.d.lockLost(&g.req, out.lostBy)
	}
	if out.finished || out.lostBy != nil {
		g.announce()
	}
}

// watchLost reports the backend's loss signal to step.
func (g *grant) watchLost(lost, stop <-chan struct{}) {
	select {
	case <-lost:
		g.apply(g.step(event{kind: evLose, cause: fmt.Errorf("%w: %s: the backend reported the lock lost", ErrNotHeld, quote(g.req.Key))}))
	case <-stop:
	}
}

// doneChan returns the Done channel, making it (and scheduling the
// expiry) on the first call.
func (g *grant) doneChan() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done == nil {
		g.done = make(chan struct{})
		switch {
		case g.state == held:
			g.watched = true
			g.scheduleLocked()
		case g.state == releasing && g.cause == nil:
			g.watched = true // scheduled if the release fails
		case g.announced:
			close(g.done)
		} // else finished, not yet announced: announce closes it
	}
	return g.done
}

// deadline returns when the validity ends by the facade's clock; zero
// once the grant is lost or released, or when the store keeps it alive.
func (g *grant) deadline() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != held || g.kept {
		return time.Time{}
	}
	return g.expiry
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
	return g.cause
}

// release runs the final release through the chain: the last handle's
// Unlock (h set) or Close (h nil). A release already in flight (Close's)
// is waited for, bounded by ctx. On a store error the grant goes back to
// held or lost, and a handle's Unlock may be retried.
func (g *grant) release(ctx context.Context, h *Lock) error {
	for {
		g.mu.Lock()
		switch g.state {
		case released:
			g.mu.Unlock()
			return fmt.Errorf("%w: %s already released", ErrNotHeld, quote(g.req.Key))
		case releasing:
			if g.settled == nil {
				g.settled = make(chan struct{})
			}
			settled := g.settled
			g.mu.Unlock()
			select {
			case <-settled:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		case lost:
			if !g.announced {
				// Lost a moment ago: the observers are being told. A
				// release waits for them, so that none hears of the
				// loss once a release has begun.
				if g.announcing == nil {
					g.announcing = make(chan struct{})
				}
				announcing := g.announcing
				g.mu.Unlock()
				select {
				case <-announcing:
					continue
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		if h != nil && g.refs > 1 { // not the last handle: no I/O
			g.refs--
			wasLost := g.state == lost
			g.mu.Unlock()
			if wasLost {
				return fmt.Errorf("%w: %s was lost", ErrNotHeld, quote(g.req.Key))
			}
			return nil
		}
		g.mu.Unlock()
		if !g.step(event{kind: evRelease}).ok {
			continue // moved meanwhile: look again
		}
		err := g.d.chain.release(ctx, &g.req)
		if err != nil && !errors.Is(err, ErrNotHeld) {
			g.step(event{kind: evReleaseFailed})
			return err
		}
		g.apply(g.step(event{kind: evReleased}))
		if h != nil {
			g.mu.Lock()
			g.refs = 0
			g.mu.Unlock()
		}
		return err
	}
}

// isClosed reports whether ch is closed; false for nil.
func isClosed(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// isFinal reports whether a release's error leaves nothing to retry.
func isFinal(err error) bool { return errors.Is(err, ErrNotHeld) }

// extend extends the lock to ttl from now (Lock.Extend).
func (g *grant) extend(ctx context.Context, ttl time.Duration) error {
	if g.d.refresher == nil {
		return fmt.Errorf("%w: %T cannot extend locks", ErrUnsupported, g.d.res)
	}
	g.mu.Lock()
	if g.state != held {
		g.mu.Unlock()
		return fmt.Errorf("%w: %s is %v", ErrNotHeld, quote(g.req.Key), g.state)
	}
	epoch := g.epoch
	leases := g.leaseCopiesLocked()
	g.mu.Unlock()
	for i := range leases {
		leases[i].TTL = ttl
	}
	start := time.Now()
	err := refreshAll(ctx, g.d.refresher, leases)
	switch {
	case err == nil:
		out := g.step(event{kind: evExtended, at: start, epoch: epoch, ttl: ttl})
		return out.err
	case errors.Is(err, ErrNotHeld):
		g.apply(g.step(event{kind: evLose, cause: fmt.Errorf("extending %s: %w", quote(g.req.Key), err)}))
	case errors.Is(err, errors.ErrUnsupported):
		return fmt.Errorf("%w: %w", ErrUnsupported, err)
	}
	return err
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
