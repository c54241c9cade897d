package testsuite

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/distlock/distlock"
)

// attemptBound is the bound of one attempt (TryLock with no wait), as
// distlock's TryLock documents it.
const attemptBound = time.Second

// RefusingAddr returns a "127.0.0.1:port" address at which nothing
// listens: a dial to it is refused. The port was free a moment ago, so
// another process taking it meanwhile is possible, if unlikely.
func RefusingAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("RefusingAddr: %v", err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatalf("RefusingAddr: %v", err)
	}
	return addr
}

// testOneAttemptStalled: TryLock with no wait on a store that stopped
// answering returns within the bound of one attempt, not the TTL's, with
// a store error that names the key and wraps context.DeadlineExceeded;
// once the store answers again, the attempt left nothing.
func testOneAttemptStalled(t *testing.T, h *Harness) {
	needStall(t, h)
	ctx := context.Background()
	d := newManual(t, h.NewResource(t), distlock.WithCloseTimeout(500*time.Millisecond))
	t.Cleanup(func() { d.Close() })
	key := Key(t)
	// Connections made, scripts loaded, parents created: the attempt
	// below is the store's usual one.
	mustUnlock(t, mustLock(t, d, ctx, key+"-warm", 0))

	resume := h.Stall(t)
	resumed := false
	defer func() {
		if !resumed {
			resume()
		}
	}()
	// A TTL far longer than the bound: the attempt must not wait for it.
	start := time.Now()
	lk, err := d.TryLock(distlock.ContextWithTTL(ctx, time.Minute), key, 0)
	el := time.Since(start)
	if lk != nil {
		t.Errorf("TryLock on a stalled store returned a lock")
	}
	if el > attemptBound+StallSlack {
		t.Errorf("TryLock(wait 0) on a stalled store returned after %v; the bound of one attempt is %v", el, attemptBound)
	}
	if err == nil || errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) ||
		!strings.Contains(err.Error(), key) {
		t.Errorf("TryLock(wait 0) on a stalled store = %v; want a store error naming %q and wrapping context.DeadlineExceeded", err, key)
	}
	resume()
	resumed = true
	noLeftovers(t, h, key)
	if err := d.Close(); err != nil {
		t.Errorf("Close once the store answers = %v", err)
	}
}

// testRefusedConnection: on a store that refuses connections, TryLock
// returns within its wait (or the bound of one attempt) with a store
// error that names the key and keeps the cause; nothing was sent, so
// nothing is cleaned up: Close returns at once, with no error.
func testRefusedConnection(t *testing.T, h *Harness) {
	if h.NewRefusedResource == nil {
		if h.NoRefuse != "" {
			t.Skip(h.NoRefuse)
		}
		t.Fatal("the harness sets neither NewRefusedResource nor NoRefuse")
	}
	const closeTimeout = 5 * time.Second
	d := newManual(t, h.NewRefusedResource(t), distlock.WithCloseTimeout(closeTimeout))
	t.Cleanup(func() { d.Close() })
	ctx := distlock.ContextWithTTL(context.Background(), time.Minute)
	for _, wait := range []time.Duration{0, 300 * time.Millisecond} {
		key := Key(t)
		bound := wait
		if wait == 0 {
			bound = attemptBound
		}
		start := time.Now()
		lk, err := d.TryLock(ctx, key, wait)
		el := time.Since(start)
		if lk != nil {
			t.Errorf("TryLock(wait %v) on a refusing store returned a lock", wait)
		}
		if el > bound+StallSlack {
			t.Errorf("TryLock(wait %v) on a refusing store returned after %v; its bound was %v", wait, el, bound)
		}
		switch {
		case err == nil, errors.Is(err, distlock.ErrNotAcquired), errors.Is(err, distlock.ErrInvalid):
			t.Errorf("TryLock(wait %v) on a refusing store = %v; want a store error", wait, err)
		case !strings.Contains(err.Error(), key):
			t.Errorf("TryLock(wait %v) on a refusing store = %v; want the key %q named", wait, err, key)
		case !strings.Contains(err.Error(), h.RefusedCause):
			t.Errorf("TryLock(wait %v) on a refusing store = %v; want the cause (%q) kept", wait, err, h.RefusedCause)
		case strings.Contains(err.Error(), "\n"), strings.Count(err.Error(), "distlock:") > 1:
			t.Errorf("TryLock(wait %v) on a refusing store = %q; want one line, one prefix", wait, err)
		}
	}
	start := time.Now()
	err := d.Close()
	// Nothing to clean up: Close waits for nothing. A clean-up it waited
	// for would take it to its bound and report itself.
	if el := time.Since(start); el > closeTimeout/5 {
		t.Errorf("Close after refused attempts took %v (bound %v); want it at once", el, closeTimeout)
	}
	if err != nil {
		t.Errorf("Close after refused attempts = %v; want nil: nothing was sent", err)
	}
}
