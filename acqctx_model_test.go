package distlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock/backend/memory"
)

// boundSlack is how late past its bound an acquisition's Done may close
// (the registry's timer, a loaded machine, the race detector).
const boundSlack = 250 * time.Millisecond

// TestAcqCtxRandomized drives acquisition contexts of one facade with
// random bounds (waits, and single attempts), callers' contexts of three
// kinds (one that cannot end, a cancel context with a cause, one that
// registers callbacks only through its AfterFunc method, counted), Done
// asked at random moments or never, callers' cancels, stops (the
// acquisition returning), stalled stores (which return only once Done
// closes) and Close at a random moment, and after every step checks: an
// acquisition's Done closes no earlier than its first end (caller, Close
// for one that may wait, bound, stop) and no later than it (Close and
// stop at once, the caller's cancel within a poll, the bound within
// boundSlack); Err and Cause of the acquisition's context and of a
// context derived from it (a values wrapper, as gRPC's) match one of the
// ends that happened; the registry holds only acquisitions whose Done was
// made and that did not stop, in heap order, and the caller's context
// only their registrations. At the end of a round nothing stays
// registered and no goroutine is left. DISTLOCK_ACQCTX_SEED replays a
// seed; DISTLOCK_ACQCTX_ROUNDS sets the number of rounds.
func TestAcqCtxRandomized(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("DISTLOCK_ACQCTX_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	rounds := 8
	if s := os.Getenv("DISTLOCK_ACQCTX_ROUNDS"); s != "" {
		rounds, _ = strconv.Atoi(s)
	}
	t.Logf("seed %d (DISTLOCK_ACQCTX_SEED=%d replays it)", seed, seed)
	for round := range rounds {
		acqRound(t, rand.New(rand.NewPCG(seed, uint64(round))))
		if t.Failed() {
			t.Logf("failed in round %d", round)
			return
		}
	}
}

// countingParent is a caller's context that hides its cancel context from
// the context package, so that what registers with it goes through its
// AfterFunc method, which counts the registrations still in place.
type countingParent struct {
	context.Context
	n atomic.Int64
}

func (p *countingParent) Value(key any) any {
	if isCancelCtxKey(key) {
		return nil
	}
	return p.Context.Value(key)
}

func (p *countingParent) AfterFunc(f func()) func() bool {
	p.n.Add(1)
	var once sync.Once
	drop := func() { once.Do(func() { p.n.Add(-1) }) }
	stop := context.AfterFunc(p.Context, func() { drop(); f() })
	return func() bool {
		// Once stop returns, the registration is no longer in place:
		// removed, or its callback started (whose drop may not have run
		// yet on its goroutine).
		ok := stop()
		drop()
		return ok
	}
}

type modelKey struct{}

var errCallerCause = errors.New("the caller's cause")

// modelAcq is one acquisition of the model. The flags are set before the
// event they record happens, so that a check that sees an effect sees its
// cause.
type modelAcq struct {
	c        *acqCtx
	parent   context.Context
	cancel   context.CancelCauseFunc // nil: the caller's context cannot end
	counting *countingParent
	bound    time.Time // zero until Done or Err asked, for a single attempt
	stalls   bool      // a store that returns only once Done closes

	made      bool // Done asked
	derived   context.Context
	endDerive context.CancelFunc
	cancelled atomic.Bool
	stopped   atomic.Bool
	stalled   chan struct{} // closed when a stalled store returned
}

func acqRound(t *testing.T, rnd *rand.Rand) {
	t.Helper()
	before := runtime.NumGoroutine()
	d, err := New(memory.New())
	if err != nil {
		t.Fatal(err)
	}
	var closed atomic.Bool
	n := 6 + rnd.IntN(14)
	acqs := make([]*modelAcq, n)
	for i := range acqs {
		a := &modelAcq{c: new(acqCtx)}
		var ctx context.Context
		switch rnd.IntN(3) {
		case 0:
			ctx = context.WithValue(context.Background(), modelKey{}, i)
		case 1:
			ctx, a.cancel = context.WithCancelCause(context.WithValue(context.Background(), modelKey{}, i))
		case 2:
			var inner context.Context
			inner, a.cancel = context.WithCancelCause(context.WithValue(context.Background(), modelKey{}, i))
			a.counting = &countingParent{Context: inner}
			ctx = a.counting
		}
		a.parent = ctx
		r := &Request{Key: "k"}
		if rnd.IntN(4) != 0 {
			r.Wait = time.Duration(5+rnd.IntN(400)) * time.Millisecond
			r.Deadline = time.Now().Add(r.Wait)
		}
		a.c.init(ctx, d, r)
		a.stalls = rnd.IntN(3) == 0
		acqs[i] = a
	}
	askDone := func(a *modelAcq) {
		if a.made {
			return
		}
		a.made = true
		done := a.c.Done()
		a.bound = a.c.bound // set by Done, read by this goroutine only after
		// A client that derives its requests' contexts: gRPC's metadata
		// wraps the context with a value, then a cancel context.
		a.derived, a.endDerive = context.WithCancel(context.WithValue(a.c, modelKey{}, "derived"))
		if a.derived.Value(modelKey{}) != "derived" || a.c.Value(modelKey{}) == nil {
			t.Errorf("the derived context lost a value")
		}
		if a.stalls {
			a.stalled = make(chan struct{})
			go func() {
				defer close(a.stalled)
				<-done
				a.stopped.Store(true)
				a.c.stop()
			}()
		}
	}
	stop := func(a *modelAcq) {
		if a.stopped.Load() || (a.stalls && a.made) {
			return
		}
		a.stopped.Store(true)
		a.c.stop()
	}

	check := func(step string) {
		t.Helper()
		for i, a := range acqs {
			if err := checkAcq(a, closed.Load()); err != nil {
				t.Errorf("after %s: acquisition %d: %v", step, i, err)
			}
		}
		if err := checkRegistry(&d.acqs, acqs); err != nil {
			t.Errorf("after %s: %v", step, err)
		}
	}

	for step := 0; ; step++ {
		pending := 0
		for _, a := range acqs {
			if !a.stopped.Load() {
				pending++
			}
		}
		if pending == 0 {
			break
		}
		if step > 400 {
			// Let the stalled stores end at their bounds; stop the rest.
			for _, a := range acqs {
				stop(a)
			}
			check("stopping the rest")
			<-time.After(time.Millisecond)
			continue
		}
		a := acqs[rnd.IntN(n)]
		var what string
		switch k := rnd.IntN(20); {
		case k < 6:
			wait := time.Duration(rnd.IntN(15)) * time.Millisecond
			what = fmt.Sprintf("letting the clock advance %v", wait)
			<-time.After(wait)
		case k < 11:
			what = "asking Done"
			askDone(a)
		case k < 14:
			what = "the caller's cancel"
			if a.cancel != nil {
				a.cancelled.Store(true)
				a.cancel(errCallerCause)
			}
		case k < 15:
			what = "Close"
			if !closed.Load() && rnd.IntN(3) == 0 {
				closed.Store(true)
				if err := d.Close(); err != nil {
					t.Errorf("Close = %v", err)
				}
			}
		case k < 17:
			what = "asking Err"
			_ = a.c.Err()
		default:
			what = "stopping"
			stop(a)
		}
		check(what)
		if t.Failed() {
			return
		}
	}
	for _, a := range acqs {
		if a.stalled != nil {
			<-a.stalled
		}
	}
	check("the end")
	if n := d.acqs.len(); n != 0 {
		t.Errorf("%d acquisitions stay registered after they stopped", n)
	}
	for i, a := range acqs {
		if a.counting != nil {
			if n := a.counting.n.Load(); n != 0 {
				t.Errorf("acquisition %d left %d registrations on the caller's context", i, n)
			}
		}
		if a.cancel != nil {
			a.cancel(nil)
		}
		if a.endDerive != nil {
			a.endDerive()
		}
	}
	if !closed.Load() {
		if err := d.Close(); err != nil {
			t.Errorf("Close = %v", err)
		}
	}
	// Nothing left running: the registry's timer and the callbacks on the
	// callers' contexts have returned.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		<-time.After(5 * time.Millisecond)
	}
	if got := runtime.NumGoroutine(); got > before {
		t.Errorf("%d goroutines after the round; want at most %d", got, before)
	}
}

// ends returns the (Err, Cause) pairs the acquisition's context may have,
// given what happened so far, and whether one of them has happened.
func (a *modelAcq) ends(closed bool, now time.Time) (errs, causes []error) {
	if a.cancelled.Load() {
		errs, causes = append(errs, context.Canceled), append(causes, context.Cause(a.parent))
	}
	if closed && a.c.closable {
		errs, causes = append(errs, context.Canceled), append(causes, context.Canceled)
	}
	if !a.bound.IsZero() && !now.Before(a.bound) {
		errs, causes = append(errs, context.DeadlineExceeded), append(causes, context.DeadlineExceeded)
	}
	return errs, causes
}

// checkAcq checks one acquisition against what happened to it.
func checkAcq(a *modelAcq, closed bool) error {
	if !a.made {
		// No Done: Err tells the ends that happened (it reads the
		// clock, and starts a single attempt's bound).
		err := a.c.Err()
		a.c.mu.Lock()
		bound := a.c.bound
		a.c.mu.Unlock()
		errs, _ := a.ends(closed, time.Now())
		if !time.Now().Before(bound) {
			errs = append(errs, context.DeadlineExceeded)
		}
		if stoppedDone(a) {
			errs = append(errs, context.Canceled)
		}
		if err == nil && (a.cancelled.Load() || closed && a.c.closable || stoppedDone(a)) {
			return errors.New("Err = nil after the caller's cancel, Close or the stop")
		}
		if err != nil && !oneOf(err, errs) {
			return fmt.Errorf("Err = %v; want one of %v", err, errs)
		}
		return nil
	}
	stopped := a.stopped.Load()
	immediate := stopped || (closed && a.c.closable)
	// Done closes at once for Close and stop; within a poll for the
	// caller's cancel (a callback on its context) and the bound.
	var limit time.Time
	switch {
	case immediate:
		limit = time.Now()
	case a.cancelled.Load():
		limit = time.Now().Add(2 * time.Second)
	case !time.Now().Before(a.bound):
		limit = a.bound.Add(boundSlack)
	}
	isClosed := func() bool {
		select {
		case <-a.c.Done():
			return true
		default:
			return false
		}
	}
	if !limit.IsZero() {
		for !isClosed() {
			if time.Now().After(limit) {
				return fmt.Errorf("Done still open %v after its end (stopped %v, closed %v, cancelled %v, bound %v)",
					time.Since(limit), stopped, closed && a.c.closable, a.cancelled.Load(), time.Until(a.bound))
			}
			<-time.After(time.Millisecond)
		}
	}
	if !isClosed() {
		if err := a.c.Err(); err != nil {
			return fmt.Errorf("Err = %v with Done open", err)
		}
		if err := a.derived.Err(); err != nil {
			return fmt.Errorf("the derived context's Err = %v with Done open", err)
		}
		return nil
	}
	// Closed: for a reason that happened.
	now := time.Now()
	errs, causes := a.ends(closed, now)
	if stopped {
		errs, causes = append(errs, context.Canceled), append(causes, errAcquisitionOver)
	}
	if len(causes) == 0 {
		return fmt.Errorf("Done closed before any end (bound in %v)", a.bound.Sub(now))
	}
	// The derived context ends with inner's error and cause: just after
	// inner's Done closes (the context package closes a parent's Done,
	// then cancels its children).
	select {
	case <-a.derived.Done():
	case <-time.After(time.Second):
		return errors.New("the derived context's Done still open a second after Done closed")
	}
	derr, dcause := a.derived.Err(), context.Cause(a.derived)
	if derr == nil {
		return errors.New("the derived context's Err = nil with its Done closed")
	}
	if i := index(causes, dcause); i < 0 || errs[i] != derr {
		return fmt.Errorf("the derived context's Err, Cause = %v, %v; want one of %v, %v", derr, dcause, errs, causes)
	}
	// The acquisition's own Err and Cause.
	if err := a.c.Err(); err == nil {
		return errors.New("Err = nil with Done closed")
	} else if !oneOf(err, errs) {
		return fmt.Errorf("Err = %v; want one of %v", err, errs)
	} else if cause := context.Cause(a.c); !oneOf(cause, causes) {
		return fmt.Errorf("Cause = %v; want one of %v", cause, causes)
	}
	return nil
}

func oneOf(err error, errs []error) bool { return index(errs, err) >= 0 }

func index(errs []error, err error) int {
	for i, e := range errs {
		if e == err {
			return i
		}
	}
	return -1
}

// checkRegistry checks that the registry is a heap by bound holding only
// acquisitions of the model whose Done was made and that did not stop,
// each knowing its place, and that callers' contexts hold at most one
// registration per such acquisition.
func checkRegistry(r *acqRegistry, acqs []*modelAcq) error {
	byCtx := map[*acqCtx]*modelAcq{}
	for _, a := range acqs {
		byCtx[a.c] = a
	}
	r.mu.Lock()
	heap := append([]*acqCtx(nil), r.q...)
	for i, c := range r.q {
		a := byCtx[c]
		var err error
		switch {
		case a == nil:
			err = fmt.Errorf("registry[%d] is no acquisition of the model", i)
		case !a.made:
			err = fmt.Errorf("registry[%d]: Done was never asked", i)
		case c.idx != i:
			err = fmt.Errorf("registry[%d] thinks it is at %d", i, c.idx)
		case i > 0 && c.bound.Before(r.q[(i-1)/2].bound):
			err = fmt.Errorf("registry[%d]'s bound is before its parent's: not a heap", i)
		case r.armed.IsZero():
			err = fmt.Errorf("%d acquisitions registered and the timer not armed", len(r.q))
		case r.q[0].bound.Before(r.armed):
			err = fmt.Errorf("the timer is armed %v after the earliest bound", r.armed.Sub(r.q[0].bound))
		}
		if err != nil {
			r.mu.Unlock()
			return err
		}
	}
	r.mu.Unlock()
	// A stopped acquisition is out of the registry (stop removes it
	// under the acquisition's mu, which comes before the registry's).
	for i, c := range heap {
		c.mu.Lock()
		if c.stopped {
			r.mu.Lock()
			idx := c.idx
			r.mu.Unlock()
			if idx >= 0 {
				c.mu.Unlock()
				return fmt.Errorf("registry[%d] stopped but stays registered", i)
			}
		}
		c.mu.Unlock()
	}
	for i, a := range acqs {
		if a.counting == nil {
			continue
		}
		// stopped first: a stop that runs between the two reads would
		// otherwise pair a registration counted before it with its end.
		stopped := stoppedDone(a)
		n := a.counting.n.Load()
		if n < 0 || n > 1 || (n == 1 && (!a.made || stopped)) {
			return fmt.Errorf("acquisition %d has %d registrations on its caller's context (made %v, stopped %v)", i, n, a.made, a.stopped.Load())
		}
	}
	return nil
}

// stoppedDone reports whether a's stop has run.
func stoppedDone(a *modelAcq) bool {
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	return a.c.stopped
}
