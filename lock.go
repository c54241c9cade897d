package distlock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/owner"
	"github.com/distlock/distlock/internal/spin"
)

// DistributeLock is the facade over one backend. Build it with [New] once
// and share it: it is safe for concurrent use.
type DistributeLock struct {
	res        backend.RemoteResource
	spinner    backend.Spinner
	waiter     backend.Waiter
	notifier   backend.Notifier // shared per key: one waiter woken per notice
	notifyEach backend.Notifier // unshared: every waiter woken
	refresher  backend.Refresher
	validator  backend.KeyValidator
	kinds      backend.KindChecker
	withdraw   backend.Withdrawer
	queuer     backend.Queuer         // nil: the store queues no mutex or semaphore waiter
	heads      backend.HeadNotifier   // notices addressed to a queued waiter
	minQueue   backend.MinQueueWaiter // nil: every wait queues
	cfg        config
	policy     spin.Policy
	chain      *chain
	noHandlers bool // no handlers: a grant drops its Request at the commit
	observers  []LossObserver

	// flights counts the acquisitions in flight; closedBit is set by Close,
	// which then waits for drained: closed when the count reaches 0.
	flights   atomic.Int64
	drained   chan struct{}
	drainOnce sync.Once
	closing   context.Context // ended by Close: ends the waits in flight
	closeAll  context.CancelFunc
	acqs      acqRegistry // the acquisitions whose Done was made: their bounds, and Close
	sched     scheduler   // the committed grants, with their renewals and expiries
	// closeEnd is when Close's release pass is over, on the facade's
	// clock: its bound, or earlier once every grant was released or
	// lost; 0 before Close.
	closeEnd atomic.Int64
	// renewSlots bounds the renewal requests in flight (see inWorkers).
	renewSlots chan struct{}
	bg         *background // rollbacks and clean-ups nobody waits for
}

const closedBit = 1 << 62

// attemptGrace is how long past the wait's end the last attempt may take
// to answer: the spin loop makes its last attempt at the deadline, and the
// store needs a round trip to answer it.
const attemptGrace = 10 * time.Millisecond

// withdrawBound is how long a request refused at the end of its wait
// waits for the store to withdraw its intent before it returns.
const withdrawBound = 50 * time.Millisecond

// New returns a DistributeLock over r, configured by opts. r must implement
// [backend.Spinner] (a pull store) or [backend.Waiter] (a push store).
//
// New returns an error wrapping [ErrInvalid] when r is nil, implements
// neither, or an option has a bad value, and when [WithAutoRenew] is given
// for a backend that cannot extend locks.
func New(r backend.RemoteResource, opts ...Option) (*DistributeLock, error) {
	if r == nil {
		return nil, fmt.Errorf("%w: nil resource", ErrInvalid)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", ErrInvalid)
		}
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d := &DistributeLock{
		res:     r,
		cfg:     cfg,
		policy:  spin.Policy{Min: cfg.spinMin, Random: cfg.spinRandom},
		drained: make(chan struct{}),
		bg:      newBackground(),
	}
	d.closing, d.closeAll = context.WithCancel(context.Background())
	if w, ok := r.(backend.Waiter); ok {
		d.waiter = w
	} else if s, ok := r.(backend.Spinner); ok {
		d.spinner = s
		if n, ok := r.(backend.Notifier); ok {
			// Waiters of one key share one subscription: a release
			// wakes one of them, not all (see spin.Share). Readers
			// subscribe each on their own: a writer's release lets
			// every reader behind it in. (A semaphore's release frees
			// one permit: its waiters share, as a mutex's do.)
			d.notifier, d.notifyEach = spin.Share(n), n
		}
	} else {
		return nil, fmt.Errorf("%w: %T implements neither backend.Spinner nor backend.Waiter", ErrInvalid, r)
	}
	d.refresher, _ = r.(backend.Refresher)
	if _, batch := r.(backend.BatchRefresher); batch {
		d.renewSlots = make(chan struct{}, maxBatchesInFlight)
	} else {
		d.renewSlots = make(chan struct{}, maxRenewalsInFlight)
	}
	d.validator, _ = r.(backend.KeyValidator)
	d.kinds, _ = r.(backend.KindChecker)
	d.withdraw, _ = r.(backend.Withdrawer)
	if q, ok := r.(backend.Queuer); ok && d.spinner != nil && d.withdraw != nil {
		d.queuer = q
		d.heads, _ = r.(backend.HeadNotifier)
		d.minQueue, _ = r.(backend.MinQueueWaiter)
	}
	if cfg.autoRenew && d.refresher == nil {
		return nil, fmt.Errorf("%w: WithAutoRenew: %T cannot extend locks", ErrInvalid, r)
	}
	for _, h := range cfg.handlers {
		if o, ok := h.(LossObserver); ok {
			d.observers = append(d.observers, o)
		}
	}
	d.chain = newChain(cfg.handlers, d.remoteAcquire, d.remoteRelease)
	d.noHandlers = len(cfg.handlers) == 0
	return d, nil
}

// WaitForever is a wait that ends only with the context: pass it to
// TryLock (or any acquire) to block until the lock is had or ctx ends.
const WaitForever time.Duration = math.MaxInt64

// TryLock acquires key, waiting at most wait for another owner to let go:
// wait == 0 makes exactly one attempt, [WaitForever] waits until ctx ends. The lease time is the context's
// ([ContextWithTTL]) or the default ([WithDefaultTTL]).
//
// TryLock returns within a few milliseconds of the earlier of ctx's end and
// the wait's end, even when the store stops answering. A single attempt
// (wait == 0, what flock -n does) is bounded by ctx and by one second from
// when it reaches the store: one attempt is one or two round trips, so a
// store that has not answered in a second is down, frozen or cut off, and
// a caller who asked for one attempt wants to know at once; the bound is
// fixed, not the TTL, so that a long lease does not make a dead store's
// answer slow. A caller who wants longer passes a wait. What an attempt
// cut short may have done in the store is undone in the background (Close
// waits for it); an attempt the store could not send (a refused
// connection) leaves nothing to undo. A read or write request refused at
// the end of its wait first withdraws the intent it left in the store, so
// that nothing of it keeps the next request out: it waits at most 50ms for
// that.
//
// When ctx carries a live lock of key on d ([ContextWithLock], [Do]), TryLock
// reenters it at once, with no I/O: the new handle shares the token, Done
// channel and deadline, and the store is released when the last handle is
// unlocked. The nested call's wait and TTL do not apply: the lock is the
// outer one. A key of a lock of several keys ([DistributeLock.TryLockAll])
// the context carries reenters that lock. A lock whose last handle's
// Unlock began (even one that failed: the lock is released again) is not
// reentered: TryLock acquires anew.
//
// Errors: [ErrNotAcquired] when another owner held key for the whole wait;
// errors.Join(ErrNotAcquired, ctx.Err()) when ctx ended first; an
// [ErrInvalid] error for bad input (empty key, a key the backend rejects,
// a key starting with backend.ElectionPrefix, which names an [Election]'s
// mutex, negative wait, TTL <= 0, nil ctx), with no I/O; [ErrClosed] after
// or during Close (a nested attempt too); [ErrReentrancy] for a nested
// attempt over the limit, and
// [ErrNotHeld] for a nested attempt of a lock that was lost or whose
// validity ended, with no I/O; otherwise the store's error, wrapped with
// the operation and key, and its cause (a refused connection, a timeout)
// kept; when the store did not answer within the wait (or the bound of
// one attempt), the error says so and wraps [context.DeadlineExceeded].
func (d *DistributeLock) TryLock(ctx context.Context, key string, wait time.Duration) (*Lock, error) {
	return d.tryLock(ctx, key, wait, KindMutex, 0)
}

// tryLock is TryLock for every kind of lock.
func (d *DistributeLock) tryLock(ctx context.Context, key string, wait time.Duration, kind Kind, limit int) (*Lock, error) {
	ttl, err := d.checkCall(ctx, key, wait)
	if err != nil {
		return nil, err
	}
	if err := d.checkKind(key, kind, limit); err != nil {
		return nil, err
	}
	if err := d.checkKey(key); err != nil {
		return nil, err
	}
	if kind == KindMutex {
		if err := checkNotElection(key); err != nil {
			return nil, err
		}
	}
	if g := otherSide(ctx, d, key, kind); g != nil {
		return nil, fmt.Errorf("%w: the context holds the %v side of %s: no upgrade or downgrade", ErrReentrancy, g.lease.Kind, quote(key))
	}
	if g := heldIn(ctx, d, key, kind, limit); g != nil {
		if lk, err := d.reenter(g); lk != nil || err != nil {
			return lk, err
		}
	}
	return d.acquireNew(ctx, key, nil, wait, ttl, kind, limit, d.cfg.label)
}

// reenter makes a new handle of g, held in the caller's context. It
// returns neither a handle nor an error when g is being released or was
// released: the caller then acquires anew.
func (d *DistributeLock) reenter(g *grant) (*Lock, error) {
	out := g.step(event{kind: evReenter, max: d.cfg.maxReentrancy})
	g.apply(out)
	if out.ok {
		return &Lock{g: g}, nil
	}
	return nil, out.err
}

// checkCall validates what every acquisition takes, ctx, key and wait, and
// returns the call's TTL.
func (d *DistributeLock) checkCall(ctx context.Context, key string, wait time.Duration) (time.Duration, error) {
	if ctx == nil {
		return 0, fmt.Errorf("%w: nil context", ErrInvalid)
	}
	ttl, ok := TTLFromContext(ctx)
	if !ok {
		ttl = d.cfg.ttl
	}
	switch {
	case key == "":
		return 0, fmt.Errorf("%w: empty key", ErrInvalid)
	case wait < 0:
		return 0, fmt.Errorf("%w: negative wait %v for %s", ErrInvalid, wait, quote(key))
	case ttl <= 0:
		return 0, fmt.Errorf("%w: TTL %v for %s must be > 0", ErrInvalid, ttl, quote(key))
	}
	return ttl, nil
}

// checkKey refuses a key the store cannot hold.
func (d *DistributeLock) checkKey(key string) error {
	if d.validator != nil {
		if err := d.validator.ValidateKey(key); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	return nil
}

// checkNotElection refuses a mutex key that names an election's mutex
// (backend.ElectionPrefix): an election and a mutex are distinct locks.
func checkNotElection(key string) error {
	if strings.HasPrefix(key, backend.ElectionPrefix) {
		return fmt.Errorf("%w: key %s: keys starting with %q are elections' (DistributeLock.Election)", ErrInvalid, quote(key), backend.ElectionPrefix)
	}
	return nil
}

// acquireNew makes a grant for a fresh acquisition of key (or of keys, a
// lock of several) with label, and acquires it. The input is valid.
func (d *DistributeLock) acquireNew(ctx context.Context, key string, keys []string, wait, ttl time.Duration, kind Kind, limit int, label string) (*Lock, error) {
	value := owner.New()
	if d.cfg.valueFunc != nil {
		if value = d.cfg.valueFunc(); value == "" {
			return nil, fmt.Errorf("%w: value func returned an empty owner value", ErrInvalid)
		}
	}
	if !d.enter() {
		return nil, ErrClosed
	}
	defer d.leave()
	// Three allocations: the owner value, the grant (with its first
	// handle) and what the acquisition needs only until it returns (its
	// context; and the Request, unless handlers may keep it: then it is
	// allocated with the grant).
	var (
		g    *grant
		r    *Request
		actx *acqCtx
	)
	if d.noHandlers {
		a := new(acquisition)
		g, r, actx = new(grant), &a.req, &a.ctx
	} else {
		gr := new(grantRequest)
		g, r, actx = &gr.grant, &gr.req, new(acqCtx)
		gr.extras.req = r
		g.extras.Store(&gr.extras)
	}
	g.d, g.pos, g.first.g = d, -1, g
	*r = Request{Key: key, Keys: keys, Kind: kind, Limit: limit, Value: value, TTL: ttl, Wait: wait, g: g, label: label}
	if wait > 0 {
		r.Deadline = time.Now().Add(wait)
	}
	return d.acquire(ctx, g, r, actx)
}

// acquisition is what an acquisition of a DistributeLock without handlers
// needs only while it runs: its context and the Request the store step is
// given. It is garbage once TryLock returns.
type acquisition struct {
	ctx acqCtx
	req Request
}

// grantRequest is a grant, its Request and its grantExtras (which point
// to the Request) in one allocation, for a DistributeLock with handlers:
// they see the same Request on acquire and release, so it lives as long
// as the grant. A grant without handlers keeps no pointer to a Request,
// so that it is 8 bytes smaller.
type grantRequest struct {
	grant
	req    Request
	extras grantExtras
}

// acquire runs g's acquisition, of the Request r, through the chain and
// commits it, or rolls back what it acquired.
func (d *DistributeLock) acquire(ctx context.Context, g *grant, r *Request, actx *acqCtx) (*Lock, error) {
	actx.init(ctx, d, r)
	defer actx.stop()
	err := d.chain.acquire(actx, r)
	if err == nil && !d.chain.storeAcquired(r) {
		err = fmt.Errorf("distlock: a handler returned nil without acquiring %s", quote(r.Key))
	}
	if err == nil {
		if d.isClosed() {
			err = fmt.Errorf("%w: Close ran while %s was acquired", ErrClosed, quote(r.Key))
		} else if out := g.step(event{kind: evCommit, at: mono(r.Acquired)}); out.ok {
			g.apply(out)
			return &g.first, nil
		} else {
			err = out.err
		}
	}
	if r.acquired != 0 {
		d.rollback(actx, g, r, err)
	}
	return nil, d.acquireError(ctx, actx, r, err)
}

// rollback gives back what an acquisition that will not be returned
// acquired, through exactly the handlers whose Acquire returned nil (and
// the store, if it granted), in the background. The caller waits for it
// while its acquisition context lives, so that on a healthy store the
// rollback is over when TryLock returns.
func (d *DistributeLock) rollback(actx *acqCtx, g *grant, r *Request, cause error) {
	out := g.step(event{kind: evRollback, cause: cause})
	g.apply(out)
	if !out.ok {
		return
	}
	r.RolledBack = true
	done := d.bg.goRun("rolling back "+quote(r.Key), func(ctx context.Context) error {
		err := d.chain.release(ctx, r)
		if errors.Is(err, ErrNotHeld) {
			return nil
		}
		return err
	})
	select {
	case <-done:
	case <-actx.Done():
	}
}

// acquireError turns an acquisition's error into TryLock's, and hands what
// an abandoned attempt may have left to the background.
func (d *DistributeLock) acquireError(ctx context.Context, actx *acqCtx, r *Request, err error) error {
	for _, clean := range cleanups(err, nil) {
		d.bg.goRun("cleaning up after an abandoned attempt on "+quote(r.Key), func(ctx context.Context) error {
			return retry(ctx, clean)
		})
	}
	ended := callerEnded(ctx)
	switch {
	case errors.Is(err, ErrInvalid):
		return err
	case d.isClosed():
		if errors.Is(err, ErrClosed) {
			return err
		}
		return fmt.Errorf("%w: TryLock of %s ended by Close", ErrClosed, quote(r.Key))
	case ended != nil:
		return errors.Join(ErrNotAcquired, ended)
	case errors.Is(err, ErrNotAcquired):
		return err
	case actx.pastBound() && r.answered > 0:
		return fmt.Errorf("%w: %s was held for the whole wait (the last attempt was cut at its end: %v)", ErrNotAcquired, quote(r.Key), err)
	case actx.pastBound():
		return unansweredError(r, err)
	}
	return err
}

// callerEnded returns the caller's context's error, or
// context.DeadlineExceeded once its deadline has passed on the clock: a
// store whose I/O deadline is the context's (go-redis, gRPC) fails at that
// instant with its own timeout, and the context's timer may not have
// fired yet.
func callerEnded(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// cleanups appends to fns the Cleanup of every [backend.AbandonedError]
// in err's tree: an attempt on several keys may have abandoned several
// requests, and each must be undone.
func cleanups(err error, fns []func(context.Context) error) []func(context.Context) error {
	switch e := err.(type) {
	case nil:
		return fns
	case *backend.AbandonedError:
		if e.Cleanup != nil {
			fns = append(fns, e.Cleanup)
		}
		return cleanups(e.Err, fns)
	case interface{ Unwrap() []error }:
		for _, err := range e.Unwrap() {
			fns = cleanups(err, fns)
		}
		return fns
	case interface{ Unwrap() error }:
		return cleanups(e.Unwrap(), fns)
	}
	return fns
}

// unansweredError is the error of an acquisition that the bound ended
// before the store answered: err, the store's (which names the operation
// and key), and how long the store had. A bare context error from the
// store gets the operation and key. It wraps context.DeadlineExceeded.
func unansweredError(r *Request, err error) error {
	within := fmt.Sprintf("the wait, %v", r.Wait)
	if r.Wait == 0 {
		within = fmt.Sprintf("%v, the bound of one attempt", attemptBound)
	}
	bare := err
	if ab, ok := err.(*backend.AbandonedError); ok {
		bare = ab.Err
	}
	switch {
	case bare == context.DeadlineExceeded:
		return fmt.Errorf("distlock: acquire %s: no answer within %s: %w", quote(r.Key), within, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w (no answer within %s)", err, within)
	}
	return fmt.Errorf("%w (no answer within %s: %w)", err, within, context.DeadlineExceeded)
}

// enter counts an acquisition in, unless d is closed.
func (d *DistributeLock) enter() bool {
	if d.flights.Add(1)&closedBit != 0 {
		d.leave()
		return false
	}
	return true
}

// leave counts an acquisition out; the last one out after Close tells it.
func (d *DistributeLock) leave() {
	if d.flights.Add(-1) == closedBit {
		d.drainOnce.Do(func() { close(d.drained) })
	}
}

func (d *DistributeLock) isClosed() bool { return d.flights.Load()&closedBit != 0 }

// closeOver reports whether Close's release pass is over: nothing of d
// retries a failed release any longer.
func (d *DistributeLock) closeOver() bool {
	end := d.closeEnd.Load()
	return end != 0 && monoNow() >= end
}

// quote returns key quoted for an error message, cut short when long: a
// key of a megabyte must not make a megabyte error.
func quote(key string) string {
	const max = 64
	if len(key) <= max {
		return strconv.Quote(key)
	}
	return fmt.Sprintf("%q... (%d bytes)", key[:max], len(key))
}

// remoteAcquire is the innermost acquire step: the spin loop or the watch.
func (d *DistributeLock) remoteAcquire(ctx context.Context, r *Request) error {
	if err := ctx.Err(); err != nil { // ended before any I/O
		return err
	}
	g := r.g
	kind := r.Kind
	if kind == KindElection { // a leadership is a mutex to the store
		kind = KindMutex
	}
	g.lease = backend.Lease{Key: r.Key, Kind: kind, Limit: int32(r.Limit), Value: r.Value, TTL: r.TTL,
		AutoRenew: d.cfg.autoRenew, Label: r.label}
	var start time.Time
	var err error
	if len(r.Keys) > 1 {
		start, err = d.acquireAll(ctx, r)
	} else if d.waiter != nil {
		r.RemoteAttempts++
		err = d.waiter.Acquire(ctx, &g.lease, r.Deadline)
		start = time.Now()
	} else {
		start, err = d.spin(ctx, r, g)
	}
	if err != nil {
		return err
	}
	r.Token = g.lease.Token
	r.Acquired = start
	return nil
}

// spin runs the spin loop for g's one lease, and withdraws the intent a
// wait that ended without the lock may have left in the store.
func (d *DistributeLock) spin(ctx context.Context, r *Request, g *grant) (time.Time, error) {
	var st spin.Stats
	n, q := d.notifier, spin.Unqueued
	rw := r.Kind == KindRead || r.Kind == KindWrite
	if rw {
		n = d.notifyEach
	}
	if !rw && d.queuer != nil && d.queuer.Queues(g.lease.Kind) &&
		(d.minQueue == nil || r.Wait >= d.minQueue.MinQueueWait(g.lease.Kind)) {
		q, g.lease.Waits = spin.Queued, !r.Deadline.IsZero()
		if d.heads != nil && g.lease.Waits {
			// Notices come addressed to this waiter: no sharing.
			n, q = d.heads, spin.HeadOnly
		}
	}
	start, err := spin.Acquire(ctx, d.spinner, n, d.policy, &g.lease, r.Deadline, q, &st)
	r.RemoteAttempts += st.Attempts
	r.answered += st.Answered
	if err != nil && st.Answered > 0 && d.withdraw != nil && (rw || g.lease.Waits) {
		// The wait may have recorded an intent: withdraw it before
		// returning, so that nobody, not even the caller's next
		// request, is kept out by a request that left (nor a lock
		// kept for it). A store slower than withdrawBound finishes it
		// in the background.
		l := g.lease
		done := d.bg.goRun("withdrawing the intent on "+quote(r.Key), func(ctx context.Context) error {
			return retry(ctx, func(ctx context.Context) error { return d.withdraw.Withdraw(ctx, &l) })
		})
		t := time.NewTimer(withdrawBound)
		select {
		case <-done:
		case <-t.C:
		}
		t.Stop()
	}
	return start, err
}

// remoteRelease is the innermost release step. A rollback's release
// retries store errors until the store answers or Close's bound: nobody
// else will release that lock.
func (d *DistributeLock) remoteRelease(ctx context.Context, r *Request) error {
	if r.RolledBack {
		return retry(ctx, func(ctx context.Context) error { return d.releaseGrant(ctx, r.g) })
	}
	return d.releaseGrant(ctx, r.g)
}

// releaseGrant releases g's lease, or each of its leases.
func (d *DistributeLock) releaseGrant(ctx context.Context, g *grant) error {
	if subs := g.subLeases(); len(subs) > 1 {
		return d.releaseAll(ctx, subs)
	}
	return d.res.Release(ctx, &g.lease)
}

// Do runs fn while holding key, acquired as by TryLock(ctx, key, wait).
// fn's context carries the lock (nested Do and TryLock calls of key reenter
// it) and is cancelled, with cause [ErrNotHeld], when the lock is known
// lost. The lock is always released when fn returns or panics, with a
// context that outlives ctx's cancellation for at most the lock's TTL.
//
// Do returns TryLock's error without calling fn, or else fn's error joined
// with Unlock's (ErrNotHeld if the lock was lost before the release). When
// the release fails with a store error, Do keeps releasing in the
// background until the store answers (Close waits for it within its bound).
func (d *DistributeLock) Do(ctx context.Context, key string, wait time.Duration,
	fn func(ctx context.Context, lk *Lock) error) error {
	return d.do(ctx, key, wait, KindMutex, 0, fn)
}

// do is Do for every kind of lock.
func (d *DistributeLock) do(ctx context.Context, key string, wait time.Duration, kind Kind, limit int,
	fn func(ctx context.Context, lk *Lock) error) (err error) {
	if fn == nil {
		return fmt.Errorf("%w: nil function for %s", ErrInvalid, quote(key))
	}
	lk, err := d.tryLock(ctx, key, wait, kind, limit)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ContextWithLock(ctx, lk))
	stop := make(chan struct{})
	go func() {
		select {
		case <-lk.Done():
			cancel(lk.g.err())
		case <-stop:
		}
	}()
	defer func() {
		close(stop)
		cancel(nil)
		uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), lk.g.ttl())
		defer ucancel()
		uerr := lk.Unlock(uctx)
		if uerr != nil && !isFinal(uerr) {
			// Nobody else holds a handle: keep releasing in the
			// background until the store answers (or Close's bound).
			d.bg.goRun("releasing "+quote(key)+" after Do", func(ctx context.Context) error {
				return retry(ctx, lk.Unlock)
			})
		}
		err = errors.Join(err, uerr)
	}()
	return fn(fctx, lk)
}

// Close ends d: it ends the acquisitions in flight (their waits, handlers'
// waits included, end at once with [ErrClosed]), releases every lock still
// held through d, lost ones included (their handlers see Release), waits
// for the clean-ups d runs in the background, then closes the backend if
// it implements io.Closer. The backend's client stays open: the caller owns
// it. Close returns within the bound set by [WithCloseTimeout] (plus a few
// milliseconds), whatever the store does. After Close, TryLock returns
// [ErrClosed]; a second Close returns nil.
//
// A lock Close could not release (the store failed until the bound) is
// lost: its Done closes, nothing renews or watches it, and the store frees
// it with its TTL; its Unlock may still be called and deletes it if the
// store still holds it. Close returns the errors of the releases and clean-ups that
// failed or did not finish within the bound, and of the backend's Close,
// joined.
func (d *DistributeLock) Close() error {
	if d.flights.Or(closedBit)&closedBit != 0 {
		return nil
	}
	bound := time.Now().Add(d.cfg.closeTimeout)
	d.closeEnd.Store(mono(bound))
	if d.flights.Load() == closedBit {
		d.drainOnce.Do(func() { close(d.drained) })
	}
	d.closeAll()
	d.acqs.close()
	var errs []error
	t := time.NewTimer(time.Until(bound))
	select {
	case <-d.drained:
	case <-t.C:
		errs = append(errs, errors.New("distlock: close: acquisitions still in flight at the bound"))
	}
	t.Stop()
	errs = append(errs, d.releaseHeld(bound)...)
	d.closeEnd.Store(min(d.closeEnd.Load(), monoNow()))
	errs = append(errs, d.bg.wait(bound))
	if c, ok := d.res.(io.Closer); ok {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// releaseHeld releases every committed grant, a few at a time, retrying a
// release that fails until Close's bound.
func (d *DistributeLock) releaseHeld(bound time.Time) []error {
	gs := d.sched.grants()
	ctx, cancel := context.WithDeadline(context.Background(), bound)
	defer cancel()
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		work = make(chan *grant)
	)
	for range min(len(gs), 16) {
		wg.Go(func() {
			for g := range work {
				err := retry(ctx, func(ctx context.Context) error { return g.release(ctx, false) })
				if err == nil {
					continue
				}
				// Nothing of d runs after Close: the lock is lost (no
				// renewal, no watch) and the store frees it with its TTL.
				g.apply(g.step(event{kind: evLose, cause: fmt.Errorf("%w: %s: Close could not release it: %w", ErrNotHeld, quote(g.lease.Key), err)}))
				mu.Lock()
				errs = append(errs, fmt.Errorf("distlock: close: release %s: %w", quote(g.lease.Key), err))
				mu.Unlock()
			}
		})
	}
	for _, g := range gs {
		work <- g
	}
	close(work)
	wg.Wait()
	return errs
}

// lockLost tells the loss observers.
func (d *DistributeLock) lockLost(r *Request, cause error) {
	for _, o := range d.observers {
		o.LockLost(r, cause)
	}
}
