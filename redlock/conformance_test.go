package redlock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/redlock"
	"github.com/distlock/distlock/testsuite"
)

// TestConformance runs the conformance suite through distlock.New on five
// independent nodes. Redlock makes no fencing tokens: NoToken.
func TestConformance(t *testing.T) {
	c := startNodes(t, 5, nil)
	testsuite.Run(t, testsuite.Harness{
		NoInspect: testsuite.NotYetInspect, // issue 25: inspection is being built for this store
		NoStall:   testsuite.NotYetStall,   // issue 26: Redlock calls bounded by their context are being built for this store
		Unsupported: map[backend.Kind]string{
			backend.KindSemaphore: "majorities cannot bound a semaphore",
			backend.KindRead:      "majorities cannot order readers and writers",
			backend.KindWrite:     "majorities cannot order readers and writers",
		},
		NewResource: func(t *testing.T) backend.RemoteResource {
			return c.newResource(t)
		},
		// Every node is checked: a failed or cancelled acquire must not
		// leave our key on any of them.
		Leftovers: func(ctx context.Context, key string) ([]string, error) {
			var left []string
			for i, cl := range c.inspect {
				n, err := cl.Exists(ctx, lockKey(key)).Result()
				if err != nil {
					return nil, fmt.Errorf("node %d: %w", i, err)
				}
				if n > 0 {
					left = append(left, fmt.Sprintf("node %d: %s", i, lockKey(key)))
				}
			}
			return left, nil
		},
		Evict: func(ctx context.Context, key string) error {
			for i, cl := range c.inspect {
				if err := cl.Del(ctx, lockKey(key)).Err(); err != nil {
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
	})
}
