package etcd

import (
	"math"
	"testing"
	"time"

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
