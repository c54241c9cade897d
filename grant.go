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
// [grant.step], the one function that moves between them. Nothing else
// writes a grant's state.
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
//	held        reenter: validity left, under the limit        held        one more handle (no I/O)
//	held        expire: reenter or the timer finds the         lost        as lose
//	            validity ended by the facade's clock
//	held        lose: a renewal found the lock gone, or        lost        Done closed with the cause; loss observers told
//	            failed until the validity ended; the                       once; renewal stopped
//	            backend's Lost closed (seen by the watch)
//	held        poll: a lease's Lost closed while nobody       lost        as lose
//	            watched it, seen by a call that asks the
//	            state (Done, Deadline, reenter, Unlock,
//	            Extend)
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
//	                                                                       (expiry scheduled, Lost watched if Done was
//	                                                                       asked for meanwhile); a grant the store keeps
//	                                                                       alive, which no TTL frees, is released again in
//	                                                                       the background (releaseAgain) until the store
//	                                                                       answers, it is lost, or Close's bound
//
// Every other pair is ignored: a loss or a renewal's result once a release
// has begun, a second release, a commit of a rolled-back grant. So a grant
// is lost at most once, released at most once, Done closes exactly once,
// and every handler whose Acquire returned nil sees exactly one Release
// (again only when the caller retries a failed Unlock).
type grant struct {
	lease backend.Lease // the store's view: key, value, TTL, kind, token, handle
	d     *DistributeLock
	// req is the Request the chain passes: while acquiring, and after
	// the commit only when d has handlers (they may keep it until its
	// Release). Without handlers it lives in the acquisition and is
	// dropped at the commit.
	req   *Request
	first Lock                      // the first handle, allocated with the grant
	more  atomic.Pointer[grantMore] // what few grants need; set once, under mu

	mu    sync.Mutex
	state grantState
	flags grantFlags
	slack uint8  // the scheduler's: due may be taken this much early (slackBits)
	refs  int32  // live handles
	epoch uint32 // bumped when a release begins: older renewal results are stale
	index int32  // the scheduler's: in its heap (registered); -1 when not

	// Times on the facade's monotonic clock (see mono).
	expiry  int64 // when the validity ends; never: the store keeps it alive
	renewAt int64 // the next renewal; never: none planned
	due     int64 // the scheduler's: the next timed event; never: none
}

// grantFlags are a grant's yes/no state, guarded by its mutex.
type grantFlags uint8

const (
	announced  grantFlags = 1 << iota // Done is closed (or will be closed as it is made)
	watched                           // Done was asked for: the expiry is scheduled
	renewing                          // a renewal is in flight
	kept                              // the store keeps it alive itself (backend.Lease.KeptAlive): no renewal, no expiry
	finished                          // released or lost: the cause is recorded (more.cause; none: released)
	lostSignal                        // a lease has Lost: the store may report the loss
	watching                          // a goroutine watches Lost (observers, or Done was asked for)
)

// grantMore is what only some grants need, made on first use: the keys
// of a lock of several keys, Done, a loss's cause, the channels of the
// goroutines that wait on the grant.
type grantMore struct {
	subs       []*backend.Lease // a lock of several keys: a lease per key, subs[0] == &g.lease; set before the commit
	done       chan struct{}    // made on the first Done call; closed by announce
	cause      error            // why a lost grant was lost
	announcing chan struct{}    // made by a release waiting for a loss to be announced; closed by announce
	stopLost   chan struct{}    // closed when the grant leaves held, while watching
	settled    chan struct{}    // made by a waiter, closed when the release in flight ends
}

// moreLocked returns g's grantMore, making it.
func (g *grant) moreLocked() *grantMore {
	m := g.more.Load()
	if m == nil {
		m = new(grantMore)
		g.more.Store(m)
	}
	return m
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
	evExpire
	evLose
	evPoll
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
	at    int64         // (monotonic) commit: the granted attempt's start; renewed, extended: the start; expire: now
	cause error         // lose, rollback
	epoch uint32        // renewed, renew failed, extended: the epoch the call started in
	max   int           // reenter: the reentrancy limit (0: none)
	err   error         // renew failed: the store's error
	ttl   time.Duration // extended: the new TTL
}

// outcome is what step asks its caller to do outside the grant's lock, and
// how the event went.
type outcome struct {
	ok     bool            // the event applied (commit, reenter, release, renew start)
	err    error           // why it did not (commit, reenter)
	lostBy error           // the grant was just lost: tell the observers, then close Done
	watch  <-chan struct{} // start watching Lost, until this closes
	again  bool            // a failed release of a kept grant: release it again in the background
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
		validity := g.validityLocked()
		g.expiry = ev.at + int64(validity)
		if monoNow() >= g.expiry {
			out.err = fmt.Errorf("%w: %s: its validity (%v) ended before the handler chain returned", ErrNotHeld, quote(g.lease.Key), validity)
			return
		}
		signal := false
		for _, l := range g.subLeases() {
			if isClosed(l.Lost) {
				out.err = fmt.Errorf("%w: %s: the backend reported the lock lost before the handler chain returned", ErrNotHeld, quote(g.lease.Key))
				return
			}
			signal = signal || l.Lost != nil
		}
		g.state, g.refs, out.ok = held, 1, true
		keptAlive := g.d.cfg.autoRenew
		for _, l := range g.subLeases() {
			keptAlive = keptAlive && l.KeptAlive
		}
		g.renewAt = never
		if keptAlive { // the store keeps it alive and reports its loss
			g.flags |= kept
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
		if g.d.bare {
			g.req = nil // the acquisition's: nobody else keeps it
		}
		g.scheduleLocked() // registers it: Close sees it from now on
	case evRollback:
		if g.state == acquiring {
			g.finishLocked(released, ev.cause)
			out.ok = true
		}
	case evReenter:
		switch {
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
	case evExpire:
		if g.state != held {
			return
		}
		if ev.at < g.expiry { // renewed meanwhile
			g.scheduleLocked()
			return
		}
		out.lostBy = g.loseLocked(fmt.Errorf("%w: %s: TTL %v ran out", ErrNotHeld, quote(g.lease.Key), g.lease.TTL))
	case evLose:
		if g.state == held {
			out.lostBy = g.loseLocked(ev.cause)
		}
	case evPoll:
		if g.state == held && g.lostUnseenLocked() {
			out.lostBy = g.loseLocked(g.lostCause())
		}
	case evRenewStart:
		if g.state == held && g.flags&renewing == 0 {
			g.flags |= renewing
			g.renewAt, out.ok = never, true
		}
	case evExtended:
		if ev.epoch != g.epoch || g.state != held {
			out.err = fmt.Errorf("%w: %s was released or lost while it was extended", ErrNotHeld, quote(g.lease.Key))
			return
		}
		for _, l := range g.subLeases() {
			// The validity is the new TTL's, from the extension's
			// start (a store's own, such as Redlock's, was the
			// acquisition's).
			l.TTL, l.Validity = ev.ttl, 0
		}
		if g.flags&kept == 0 { // a kept lock stays the store's to keep
			validity := g.validityLocked()
			g.expiry = ev.at + int64(validity)
			if g.d.cfg.autoRenew {
				g.renewAt = ev.at + int64(renewInterval(validity))
			}
			g.scheduleLocked()
		}
		out.ok = true
	case evRenewed, evRenewFailed:
		g.flags &^= renewing
		if ev.epoch != g.epoch || g.state != held {
			return
		}
		now := monoNow()
		validity := g.validityLocked()
		interval := int64(renewInterval(validity))
		switch {
		case ev.kind == evRenewed:
			g.expiry = max(g.expiry, ev.at+int64(validity))
			g.renewAt = ev.at + interval
		case errors.Is(ev.err, ErrNotHeld):
			out.lostBy = g.loseLocked(fmt.Errorf("renewing %s: %w", quote(g.lease.Key), ev.err))
			return
		case now >= g.expiry:
			out.lostBy = g.loseLocked(fmt.Errorf("%w: renewing %s failed until its validity ended: %w", ErrNotHeld, quote(g.lease.Key), ev.err))
			return
		default: // retry sooner, within the validity left
			g.renewAt = now + min(interval/4, g.expiry-now)
		}
		g.scheduleLocked()
	case evRelease:
		if g.state != held && g.state != lost {
			return
		}
		g.state, out.ok = releasing, true
		g.epoch++
		g.renewAt = never
		g.d.sched.unschedule(g)
	case evReleased:
		if g.state == releasing {
			g.finishLocked(released, nil)
			g.settleLocked()
			g.d.sched.remove(g)
		}
	case evReleaseFailed:
		if g.state == releasing {
			g.state = held // where it was: a lost grant has finished
			if g.flags&finished != 0 {
				g.state = lost
			}
			g.settleLocked()
			if g.state == held && g.d.isClosed() {
				// Nothing of a closed DistributeLock keeps the lock
				// alive or watches it: it is lost, and the store frees
				// it with its TTL (Unlock may still delete it).
				out.lostBy = g.loseLocked(fmt.Errorf("%w: %s: its release failed after Close", ErrNotHeld, quote(g.lease.Key)))
			} else if g.state == held && g.flags&kept != 0 {
				// The store keeps it alive: no TTL would ever free it.
				out.again = true
			} else if g.state == held {
				g.scheduleLocked() // expiry only: renewal stays stopped
				if g.flags&watched != 0 {
					out.watch = g.watchLocked()
				}
			}
		}
	}
	return out
}

// settleLocked wakes whoever waits for the release in flight to end.
func (g *grant) settleLocked() {
	if m := g.more.Load(); m != nil && m.settled != nil {
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
	if m := g.more.Load(); m != nil {
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
		g.moreLocked().cause = cause
	}
	if m := g.more.Load(); m != nil && m.stopLost != nil {
		close(m.stopLost)
	}
	g.renewAt = never
	g.d.sched.unschedule(g) // a lost grant stays registered until released
	if to == released {
		g.announceLocked() // nobody to tell first
	}
}

// errReleased is the cause of a grant that ended by its release.
var errReleased = errors.New("distlock: released")

// renewInterval is the time between renewals of a lock valid for
// validity: a third of it, so that two may fail before it ends.
func renewInterval(validity time.Duration) time.Duration {
	return max(validity/3, time.Millisecond)
}

// validityLocked is how long one grant or renewal is known valid: the
// shortest safe validity of the grant's leases (safeValidity).
func (g *grant) validityLocked() time.Duration {
	return validityAll(g.subLeases())
}

// scheduleLocked tells the scheduler the grant's next event: the renewal,
// or the expiry when someone watches Done or renewal is on. A renewal may
// run up to half an interval early, so that the renewals due about the same
// time go to the store together.
func (g *grant) scheduleLocked() {
	at, slack := int64(never), int64(0)
	if g.renewAt != never {
		at, slack = g.renewAt, int64(renewInterval(g.validityLocked())/2)
	}
	if (g.flags&watched != 0 || g.d.cfg.autoRenew) && g.expiry < at {
		at, slack = g.expiry, 0
	}
	g.d.sched.schedule(g, at, slack)
}

// takeDue tells what the scheduler found due for g at now: a renewal (within
// its slack), or else its expiry (applied here).
func (g *grant) takeDue(now int64) (renew bool) {
	g.mu.Lock()
	renew = g.state == held && g.flags&renewing == 0 && g.renewAt != never &&
		now+int64(renewInterval(g.validityLocked())/2) >= g.renewAt
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
	epoch  uint32
	expiry int64
	leases []backend.Lease
}

// renewed reports a renewal's result to step.
func (rn renewal) renewed(start int64, err error) {
	if err == nil {
		rn.g.apply(rn.g.step(event{kind: evRenewed, at: start, epoch: rn.epoch}))
		return
	}
	rn.g.apply(rn.g.step(event{kind: evRenewFailed, epoch: rn.epoch, err: err}))
}

// wallTime returns the time.Time of t on the facade's monotonic clock.
func wallTime(t int64) time.Time {
	now := time.Now()
	return now.Add(time.Duration(t - mono(now)))
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
		d.inWorkers(len(rns), func(i int) {
			rn := rns[i]
			start := monoNow()
			// A renewal that answers after the validity ended is worthless.
			ctx, cancel := context.WithDeadline(context.Background(), wallTime(rn.expiry))
			err := refreshAll(ctx, d.refresher, rn.leases)
			cancel()
			rn.renewed(start, err)
		})
		return
	}
	// Batches of at most MaxRefreshBatch leases; a lock's leases stay in
	// one batch.
	var parts [][]renewal
	var part []renewal
	n := 0
	for _, rn := range rns {
		if n > 0 && n+len(rn.leases) > backend.MaxRefreshBatch {
			parts = append(parts, part)
			part, n = nil, 0
		}
		part = append(part, rn)
		n += len(rn.leases)
	}
	parts = append(parts, part)
	d.inWorkers(len(parts), func(i int) { refreshBatch(br, parts[i]) })
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

// inWorkers runs do(0) .. do(n-1) in the background, each holding one of
// d's renewal slots while it runs, and returns at once.
func (d *DistributeLock) inWorkers(n int, do func(i int)) {
	var next atomic.Int64
	for range min(n, cap(d.renewSlots)) {
		go func() {
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				d.renewSlots <- struct{}{}
				do(int(i))
				<-d.renewSlots
			}
		}()
	}
}

// refreshBatch renews rns in one request and reports each result.
func refreshBatch(br backend.BatchRefresher, rns []renewal) {
	var ls []*backend.Lease
	deadline := rns[0].expiry
	for _, rn := range rns {
		for i := range rn.leases {
			ls = append(ls, &rn.leases[i])
		}
		deadline = min(deadline, rn.expiry)
	}
	start := monoNow()
	ctx, cancel := context.WithDeadline(context.Background(), wallTime(deadline))
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
	if out.watch != nil {
		go g.watchLost(out.watch)
	}
	if out.lostBy != nil {
		g.d.lockLost(g.req, out.lostBy)
	}
	if out.lostBy != nil {
		g.announce()
	}
}

// watchLocked starts the watch of the leases' Lost channels, once, while
// g is held: it returns the channel that stops it, for apply to start
// the goroutine; nil when there is nothing to start.
func (g *grant) watchLocked() <-chan struct{} {
	if g.flags&(lostSignal|watching) != lostSignal || g.state != held {
		return nil
	}
	g.flags |= watching
	m := g.moreLocked()
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
	case <-g.lease.Lost:
		g.apply(g.step(event{kind: evLose, cause: g.lostCause()}))
	case <-stop:
	}
}

// lostUnseenLocked reports whether a lease's Lost closed while nobody
// watches for it.
func (g *grant) lostUnseenLocked() bool {
	if g.flags&(lostSignal|watching) != lostSignal {
		return false
	}
	for _, l := range g.subLeases() {
		if isClosed(l.Lost) {
			return true
		}
	}
	return false
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
	g.poll()
	g.mu.Lock()
	var watch <-chan struct{}
	m := g.moreLocked()
	if m.done == nil {
		m.done = make(chan struct{})
		switch {
		case g.state == held:
			g.flags |= watched
			g.scheduleLocked()
			watch = g.watchLocked()
		case g.state == releasing && g.flags&finished == 0:
			g.flags |= watched // scheduled and watched if the release fails
		case g.flags&announced != 0:
			close(m.done)
		} // else finished, not yet announced: announce closes it
	}
	done := m.done
	g.mu.Unlock()
	g.apply(outcome{watch: watch})
	return done
}

// deadline returns when the validity ends by the facade's clock; zero
// once the grant is lost or released, or when the store keeps it alive.
func (g *grant) deadline() time.Time {
	g.poll()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != held || g.flags&kept != 0 {
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
	if m := g.more.Load(); m != nil && m.cause != nil {
		return m.cause
	}
	return errReleased
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
			return fmt.Errorf("%w: %s already released", ErrNotHeld, quote(g.lease.Key))
		case held:
			if g.lostUnseenLocked() {
				g.mu.Unlock()
				g.poll()
				continue
			}
		case releasing:
			m := g.moreLocked()
			if m.settled == nil {
				m.settled = make(chan struct{})
			}
			settled := m.settled
			g.mu.Unlock()
			select {
			case <-settled:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		case lost:
			if g.flags&announced == 0 {
				// Lost a moment ago: the observers are being told. A
				// release waits for them, so that none hears of the
				// loss once a release has begun.
				m := g.moreLocked()
				if m.announcing == nil {
					m.announcing = make(chan struct{})
				}
				announcing := m.announcing
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
				return fmt.Errorf("%w: %s was lost", ErrNotHeld, quote(g.lease.Key))
			}
			return nil
		}
		g.mu.Unlock()
		if !g.step(event{kind: evRelease}).ok {
			continue // moved meanwhile: look again
		}
		var err error
		if g.d.bare {
			err = g.d.releaseGrant(ctx, g) // no chain: the store step alone
		} else {
			err = g.d.chain.release(ctx, g.req)
		}
		if err != nil && !errors.Is(err, ErrNotHeld) {
			out := g.step(event{kind: evReleaseFailed})
			g.apply(out)
			if out.again && h != nil {
				g.d.releaseAgain(g)
			}
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
	g.poll()
	g.mu.Lock()
	if g.state != held {
		g.mu.Unlock()
		return fmt.Errorf("%w: %s is %v", ErrNotHeld, quote(g.lease.Key), g.state)
	}
	epoch := g.epoch
	leases := g.leaseCopiesLocked()
	g.mu.Unlock()
	for i := range leases {
		leases[i].TTL = ttl
	}
	start := monoNow()
	err := refreshAll(ctx, g.d.refresher, leases)
	switch {
	case err == nil:
		out := g.step(event{kind: evExtended, at: start, epoch: epoch, ttl: ttl})
		return out.err
	case errors.Is(err, ErrNotHeld):
		g.apply(g.step(event{kind: evLose, cause: fmt.Errorf("extending %s: %w", quote(g.lease.Key), err)}))
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

// releaseAgain releases g in the background after its release failed:
// the store keeps g alive (backend.Lease.KeptAlive), so no TTL would free
// it while this process lives. It retries with backoff, each attempt
// bounded by the lease's TTL (at least a second), until the store answers,
// the lock is lost (the store frees it then), or Close's bound. An Unlock
// called meanwhile waits for the attempt in flight.
func (d *DistributeLock) releaseAgain(g *grant) {
	d.bg.goRun("releasing "+quote(g.lease.Key)+" again", func(ctx context.Context) error {
		return retry(ctx, func(ctx context.Context) error {
			if !g.keptHeld() {
				return nil // released, or lost: the store frees it
			}
			ctx, cancel := context.WithTimeout(ctx, max(g.ttl(), time.Second))
			defer cancel()
			return g.release(ctx, nil)
		})
	})
}

// keptHeld reports whether g is held, kept alive by the store.
func (g *grant) keptHeld() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state == held && g.flags&kept != 0
}
