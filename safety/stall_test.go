package safety

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/safety/harness"
)

// stallSlack is how far past its bound a call may return while the store
// is stalled before the run counts it as a bound missed (the promise is a
// few milliseconds; the slack is for a loaded 2-core machine under -race).
const stallSlack = time.Second

// stalledCall is one call made while the store was stalled.
type stalledCall struct {
	what    string
	elapsed time.Duration
	bound   time.Duration
	err     error
	granted bool // a TryLock that returned a lock
}

// testStalledStore stalls the store (stall, until resume) in rounds whose
// lengths are given: during each stall a TryLock
// with a 300ms context and a 5s wait, a TryLock with a 500ms wait, an
// Unlock with a 300ms context, a queued waiter whose context is cancelled
// 100ms in, and a Close bounded to 500ms, each on a key of its own. Every
// call must return within its bound (plus stallSlack). Once the store
// answers, the run closes the DistributeLocks that made the abandoned
// attempts (Close waits for their clean-ups), then takes every key with a
// fresh owner and counts what the store still holds (orphans).
//
// A late grant is a TryLock that returned a lock past its bound, or an
// abandoned attempt found holding a key (head returns the value of the
// key's holder in the store) once its DistributeLock has closed. head is
// also sampled from the resume until then: the notes say how often, and
// for how long at most, an abandoned attempt's request landed and held a
// key before its clean-up removed it.
func testStalledStore(t *testing.T, tg target, b harness.Backend, lengths []time.Duration,
	stall func() (resume func()), head func(ctx context.Context, key string) (string, error)) {
	ctx := t.Context()
	prefix := uniqueKey(t)
	var seq atomic.Int64
	// Each DistributeLock's owner values carry its name, to tell in the
	// store whose attempt holds a key.
	open := func(name string, closeTimeout time.Duration) *distlock.DistributeLock {
		valueOf := func() string { return fmt.Sprintf("%s-%s-v%d", prefix, name, seq.Add(1)) }
		res, closeRes, err := b.Open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(closeRes)
		d, err := distlock.New(res, distlock.WithDefaultTTL(30*time.Second), distlock.WithValueFunc(valueOf),
			distlock.WithSpin(5*time.Millisecond, 5*time.Millisecond), distlock.WithCloseTimeout(closeTimeout))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d
	}

	var (
		calls        []stalledCall
		acquisitions int
		lateGrants   int
		orphaned     int
		seenAtHead   int           // abandoned attempts seen holding a key after the resume
		longestHead  time.Duration // the longest such sighting
	)
	for round, length := range lengths {
		kCtx, kWait, kHeld, kQueue, kClose := fmt.Sprintf("%s-%d-ctx", prefix, round), fmt.Sprintf("%s-%d-wait", prefix, round),
			fmt.Sprintf("%s-%d-held", prefix, round), fmt.Sprintf("%s-%d-queue", prefix, round), fmt.Sprintf("%s-%d-close", prefix, round)
		keys := []string{kCtx, kWait, kHeld, kQueue, kClose}
		a, holder, waiter := open("a", 10*time.Second), open("holder", 10*time.Second), open("waiter", 10*time.Second)
		closer, fresh := open("closer", 500*time.Millisecond), open("fresh", 10*time.Second)

		// The keys of the TryLocks were used before: their creates, sent
		// during the stall, land once the store answers.
		for _, k := range []string{kCtx, kWait} {
			lk, err := fresh.TryLock(ctx, k, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := lk.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		held, err := a.TryLock(ctx, kHeld, 0)
		if err != nil {
			t.Fatal(err)
		}
		queued, err := holder.TryLock(ctx, kQueue, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := closer.TryLock(ctx, kClose, 0); err != nil {
			t.Fatal(err)
		}
		acquisitions += 3
		// The waiter queues behind the holder before the stall.
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		waiterDone := make(chan stalledCall, 1)
		go func() {
			lk, err := waiter.TryLock(wctx, kQueue, time.Minute)
			waiterDone <- stalledCall{what: "queued TryLock cancelled 100ms into the stall", err: err, granted: lk != nil}
		}()
		waitUntil(t, 30*time.Second, "the waiter to queue", func() bool {
			c, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			left, err := tg.leftovers(c, kQueue)
			return err == nil && len(left) == 2
		})

		resume := stall()
		stalledAt := time.Now()
		// The stall lasts length whatever the calls do.
		resumed := make(chan time.Time, 1)
		time.AfterFunc(length, func() { resume(); resumed <- time.Now() })
		var mu sync.Mutex
		var wg sync.WaitGroup
		timed := func(what string, bound time.Duration, fn func() (bool, error)) {
			wg.Go(func() {
				start := time.Now()
				granted, err := fn()
				c := stalledCall{what: what, elapsed: time.Since(start), bound: bound, err: err, granted: granted}
				mu.Lock()
				calls = append(calls, c)
				mu.Unlock()
			})
		}
		timed("TryLock, 300ms context, 5s wait", 300*time.Millisecond, func() (bool, error) {
			c, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			lk, err := a.TryLock(c, kCtx, 5*time.Second)
			return lk != nil, err
		})
		timed("TryLock, 500ms wait", 500*time.Millisecond, func() (bool, error) {
			lk, err := a.TryLock(ctx, kWait, 500*time.Millisecond)
			return lk != nil, err
		})
		timed("Unlock, 300ms context", 300*time.Millisecond, func() (bool, error) {
			c, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			return false, held.Unlock(c)
		})
		timed("Close, 500ms bound", 500*time.Millisecond, func() (bool, error) { return false, closer.Close() })
		time.AfterFunc(100*time.Millisecond, wcancel)
		wg.Go(func() {
			select {
			case c := <-waiterDone:
				c.elapsed, c.bound = time.Since(stalledAt.Add(100*time.Millisecond)), 0
				mu.Lock()
				calls = append(calls, c)
				mu.Unlock()
			case <-time.After(length + 30*time.Second):
				t.Errorf("the queued TryLock did not return")
			}
		})
		wg.Wait()
		resumedAt := <-resumed

		// Sample the holders until the DistributeLocks that abandoned
		// attempts have closed (their Close waits for the clean-ups).
		sampling := make(chan struct{})
		sampled := make(chan struct{})
		firstSeen := map[string]time.Time{}
		lastSeen := map[string]time.Time{}
		go func() {
			defer close(sampled)
			for {
				for _, k := range []string{kCtx, kWait, kQueue} {
					c, cancel := context.WithTimeout(ctx, 5*time.Second)
					v, err := head(c, k)
					cancel()
					if err != nil || v == "" {
						continue
					}
					now := time.Now()
					if _, ok := firstSeen[v]; !ok {
						firstSeen[v] = now
					}
					lastSeen[v] = now
				}
				select {
				case <-sampling:
					return
				case <-time.After(2 * time.Millisecond): // sampling
				}
			}
		}()
		if err := held.Unlock(ctx); err != nil && !errors.Is(err, distlock.ErrNotHeld) {
			t.Errorf("Unlock once the store answers = %v; want nil or ErrNotHeld", err)
		}
		if err := queued.Unlock(ctx); err != nil && !errors.Is(err, distlock.ErrNotHeld) {
			t.Errorf("the holder's Unlock once the store answers = %v; want nil or ErrNotHeld", err)
		}
		for _, d := range []*distlock.DistributeLock{a, waiter, holder} {
			if err := d.Close(); err != nil {
				t.Errorf("Close once the store answers = %v", err)
			}
		}
		close(sampling)
		<-sampled
		// The sampled keys were granted to the holder only (kQueue): any
		// other value holding one is an abandoned attempt's.
		abandonedSeen := 0
		for v, first := range firstSeen {
			if strings.HasPrefix(v, prefix+"-holder-") {
				continue
			}
			abandonedSeen++
			seenAtHead++
			if d := lastSeen[v].Sub(first); d > longestHead {
				longestHead = d
			}
			t.Logf("round %d: an abandoned attempt (%s) held a key from %v to %v after SIGCONT", round, v,
				first.Sub(resumedAt).Round(time.Millisecond), lastSeen[v].Sub(resumedAt).Round(time.Millisecond))
		}
		for _, k := range []string{kCtx, kWait, kQueue} {
			c, cancel := context.WithTimeout(ctx, 5*time.Second)
			v, err := head(c, k)
			cancel()
			if err == nil && v != "" && !strings.HasPrefix(v, prefix+"-holder-") {
				lateGrants++
				t.Errorf("round %d: %s held by %s once every DistributeLock closed", round, k, v)
			}
		}
		// A fresh owner takes every key; then nothing may be left.
		for _, k := range keys {
			lk, err := fresh.TryLock(ctx, k, 30*time.Second)
			if err != nil {
				t.Errorf("round %d: a fresh owner's TryLock of %s = %v", round, k, err)
				continue
			}
			acquisitions++
			if err := lk.Unlock(ctx); err != nil {
				t.Errorf("round %d: Unlock of %s: %v", round, k, err)
			}
		}
		for _, k := range keys {
			if left := leftAfter(tg, k, 10*time.Second); len(left) > 0 {
				orphaned += len(left)
				t.Errorf("round %d: orphan for %s: %v", round, k, left)
			}
		}
		t.Logf("round %d: stall of %v; %d abandoned attempts seen holding a key", round, length, abandonedSeen)
	}

	var missed, overshootMax time.Duration
	var missedN int
	for _, c := range calls {
		if c.granted {
			lateGrants++
			t.Errorf("%s returned a lock on a stalled store after %v", c.what, c.elapsed)
		}
		if c.err == nil {
			t.Errorf("%s on a stalled store returned nil after %v", c.what, c.elapsed)
		}
		over := c.elapsed - c.bound
		overshootMax = max(overshootMax, over)
		if over > stallSlack {
			missedN++
			missed = max(missed, over)
			t.Errorf("%s returned after %v; its bound was %v: %v", c.what, c.elapsed, c.bound, c.err)
		}
	}
	perWhat := map[string]time.Duration{}
	for _, c := range calls {
		perWhat[c.what] = max(perWhat[c.what], c.elapsed-c.bound)
	}
	t.Logf("largest overshoot per call: %v", perWhat)
	res := &harness.Result{Backend: tg.name, Fault: fmt.Sprintf("store stalled (server SIGSTOP) %v, calls bounded by 300ms/500ms contexts and waits", lengths),
		Acquisitions: acquisitions, Orphans: orphaned, LossLatency: -1, Recovery: -1,
		Notes: fmt.Sprintf("%d calls, %d past their bound (+%v slack), largest overshoot %v; %d late grants; abandoned requests that landed after SIGCONT held a key %d times, at most %v, before their clean-up",
			len(calls), missedN, stallSlack, overshootMax.Round(100*time.Microsecond), lateGrants, seenAtHead, longestHead.Round(100*time.Microsecond))}
	res.Log(t)
	if missedN != 0 || lateGrants != 0 || orphaned != 0 {
		t.Errorf("%d bounds missed, %d late grants, %d orphans; want 0, 0, 0", missedN, lateGrants, orphaned)
	}
}
