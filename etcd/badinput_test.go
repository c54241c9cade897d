package etcd

import (
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
)

// TestHugeTTLSharedLease: with WithSharedLease, a TTL too long for etcd
// must fail with a clear error and leave no shared lease behind renewing
// with a negative period (a KeepAliveOnce loop with no pause, until
// Close), as an overflow of the session's TTL arithmetic does.
func TestHugeTTLSharedLease(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	r := newResource(t, endpoints, WithSharedLease())
	for _, ttl := range []time.Duration{math.MaxInt64, math.MaxInt64 / 4 * 3} {
		l := lease(uniqueKey(t), ttl)
		err := r.Acquire(t.Context(), l, time.Time{})
		if err == nil {
			if l.TTL < ttl {
				t.Errorf("TTL %v: acquired with TTL %v", ttl, l.TTL)
			}
			_ = r.Release(t.Context(), l)
		} else {
			t.Logf("TTL %v: %v", ttl, err)
		}
		r.mu.Lock()
		for secs, s := range r.sessions {
			select {
			case <-s.ready:
				if s.err == nil && (s.ttl <= 0 || s.period <= 0) {
					t.Errorf("TTL %v left a shared lease for %ds with TTL %v, renewed every %v", ttl, secs, s.ttl, s.period)
				}
			default:
			}
		}
		r.mu.Unlock()
	}
}

// TestMaxTTL: in both modes a TTL above MaxTTL is refused with a clear
// error and no request to the server, and MaxTTL itself is granted in
// full (with WithSharedLease, on a lease a third longer: etcd's longest).
func TestMaxTTL(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			var rpcs atomic.Int64
			r := mustNew(t, countingClient(t, endpoints, &rpcs), m.opts...)
			t.Cleanup(func() { _ = r.Close() })
			for _, ttl := range []time.Duration{MaxTTL + time.Nanosecond, MaxTTL + time.Second, math.MaxInt64} {
				rpcs.Store(0)
				err := r.Acquire(t.Context(), lease(uniqueKey(t), ttl), time.Time{})
				if err == nil || errors.Is(err, backend.ErrNotAcquired) || !strings.Contains(err.Error(), "TTL") {
					t.Errorf("Acquire(TTL %v) = %v; want an error about the TTL", ttl, err)
				}
				if n := rpcs.Load(); n != 0 {
					t.Errorf("Acquire(TTL %v) sent %d requests; want 0", ttl, n)
				}
			}
			l := lease(uniqueKey(t), MaxTTL)
			if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
				t.Fatalf("Acquire(MaxTTL): %v", err)
			}
			if l.TTL != MaxTTL || l.Validity <= 0 {
				t.Errorf("Acquire(MaxTTL) gave TTL %v, validity %v; want %v and > 0", l.TTL, l.Validity, MaxTTL)
			}
			if err := r.Release(t.Context(), l); err != nil {
				t.Errorf("Release: %v", err)
			}
		})
	}
}

// TestClosedClientHeldLock closes the client under a held lock: Release,
// Refresh and Acquire fail with an error saying so without sending a
// request (a closed client retries each for seconds), a shared lease
// reports itself lost (a lease of the lock's own is not lost: it lives its
// TTL, which the facade counts), and the key expires with its lease.
func TestClosedClientHeldLock(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	admin := mustNew(t, newClient(t, endpoints))
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			var rpcs atomic.Int64
			c := countingClient(t, endpoints, &rpcs)
			r := mustNew(t, c, m.opts...)
			l := lease(uniqueKey(t), time.Second)
			if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
				t.Fatal(err)
			}
			if err := c.Close(); err != nil {
				t.Fatalf("closing the client: %v", err)
			}
			rpcs.Store(0)
			for what, err := range map[string]error{
				"Release": r.Release(t.Context(), l),
				"Refresh": r.Refresh(t.Context(), l),
				"Acquire": r.Acquire(t.Context(), lease(l.Key, time.Second), time.Now().Add(time.Minute)),
			} {
				if err == nil || errors.Is(err, backend.ErrNotHeld) || errors.Is(err, backend.ErrNotAcquired) ||
					!strings.Contains(err.Error(), "client closed") {
					t.Errorf("%s over a closed client = %v; want an error saying the client is closed", what, err)
				}
			}
			shared := l.Handle.(*handle).sess != nil
			if shared {
				select {
				case <-l.Lost().Done():
				case <-time.After(10 * time.Second):
					t.Errorf("Lost still open 10s after the client was closed")
				}
			}
			err := r.Close()
			if (err != nil) != shared {
				t.Errorf("Close = %v; want an error only when a shared lease is left to expire", err)
			}
			if n := rpcs.Load(); n != 0 {
				t.Errorf("%d requests sent over the closed client; want 0", n)
			}
			waitKeys(t, admin, l.Key, 0) // expired with its lease
		})
	}
}
