package redlock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/redlock"
	"github.com/distlock/distlock/testsuite"
)

// TestConformance runs the conformance suite through distlock.New on five
// independent nodes. Redlock makes no fencing tokens: NoToken.
func TestConformance(t *testing.T) {
	testsuite.Run(t, harness(startNodes(t, 5, nil)))
}

// TestStalledMajorityClientDefaults runs the stalled-store cases (three
// of five nodes frozen) with go-redis's defaults: ContextTimeoutEnabled
// off, so the client ignores the context, and ReadTimeout 5s.
// TestConformance runs them with ContextTimeoutEnabled.
func TestStalledMajorityClientDefaults(t *testing.T) {
	c := startNodes(t, 5, func(o *goredis.Options) { o.ContextTimeoutEnabled = false })
	testsuite.RunStalled(t, harness(c))
}

// harness adapts Resources over c's five nodes to the suite.
func harness(c *cluster) testsuite.Harness {
	return testsuite.Harness{
		Unsupported: map[backend.Kind]string{
			backend.KindSemaphore: "majorities cannot bound a semaphore",
			backend.KindRead:      "majorities cannot order readers and writers",
			backend.KindWrite:     "majorities cannot order readers and writers",
		},
		NoLine: map[backend.Kind]string{
			backend.KindMutex: "Redlock's independent nodes keep no common line of waiters: after a release, whichever waiter's attempt wins a majority first gets the lock",
		},
		NewResource: func(t *testing.T) backend.RemoteResource {
			return c.newResource(t)
		},
		// Every node is checked: a failed or cancelled acquire must not
		// leave our key, nor a labeled lock its label key, on any of them.
		Leftovers: func(ctx context.Context, key string) ([]string, error) {
			var left []string
			for i, cl := range c.inspect {
				for _, k := range []string{lockKey(key), lockKey(key) + redisscript.LabelSuffix} {
					n, err := cl.Exists(ctx, k).Result()
					if err != nil {
						return nil, fmt.Errorf("node %d: %w", i, err)
					}
					if n > 0 {
						left = append(left, fmt.Sprintf("node %d: %s", i, k))
					}
				}
			}
			return left, nil
		},
		Evict: func(ctx context.Context, key string) error {
			for i, cl := range c.inspect {
				if err := cl.Del(ctx, lockKey(key), lockKey(key)+redisscript.LabelSuffix).Err(); err != nil {
					return fmt.Errorf("node %d: %w", i, err)
				}
			}
			return nil
		},
		// A second, not the suite's 300ms: the default per-node timeout
		// is 5% of the TTL, and two shared cores under the race detector
		// can stall a round trip for more than 15ms.
		TTL:       time.Second,
		NoToken:   true,
		MaxKeyLen: redlock.MaxKeyLen,
		// A majority frozen: no round can be decided.
		Stall: func(t *testing.T) func() { return c.stall(t, 2, 3, 4) },
		// Clients as the package doc advises (DialerRetries: 1): a
		// refused dial is reported at once, within the per-node timeout.
		NewRefusedResource: func(t *testing.T) backend.RemoteResource {
			cs := make([]goredis.UniversalClient, 3)
			for i := range cs {
				cl := goredis.NewClient(&goredis.Options{Addr: testsuite.RefusingAddr(t), DialerRetries: 1})
				t.Cleanup(func() { _ = cl.Close() })
				cs[i] = cl
			}
			r, err := redlock.New(cs)
			if err != nil {
				t.Fatalf("redlock.New: %v", err)
			}
			t.Cleanup(func() { _ = r.Close() })
			return r
		},
		RefusedCause: "connection refused",
	}
}
