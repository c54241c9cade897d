package redis_test

import (
	"context"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/testsuite"
)

// TestConformance runs the conformance suite through distlock.New on a
// standalone server and on a three-master Cluster.
func TestConformance(t *testing.T) {
	deployments(t, func(t *testing.T, c goredis.UniversalClient) {
		testsuite.Run(t, harness(c))
	})
}

func harness(c goredis.UniversalClient) testsuite.Harness {
	return testsuite.Harness{
		NoInspect:   testsuite.NotYetInspect, // issue 25: inspection is being built for this store
		Unsupported: testsuite.NotYet,        // issue 24: semaphores and read/write locks are being built for this store
		NoStall:     testsuite.NotYetStall,   // issue 26: Redis calls bounded by their context are being built for this store
		NewResource: func(t *testing.T) backend.RemoteResource {
			return newResource(t, c)
		},
		// The fence counter stays on purpose (it keeps tokens increasing);
		// the lock key must not.
		Leftovers: func(ctx context.Context, key string) ([]string, error) {
			lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
			n, err := c.Exists(ctx, lock).Result()
			if err != nil || n == 0 {
				return nil, err
			}
			return []string{lock}, nil
		},
		Evict: func(ctx context.Context, key string) error {
			lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
			return c.Del(ctx, lock).Err()
		},
		MaxKeyLen: redis.MaxKeyLen,
		NewClosedResource: func(t *testing.T) backend.RemoteResource {
			return closedResource(t, c)
		},
	}
}

// closedResource returns a Resource over a client like c that was closed
// after the Resource was made.
func closedResource(t *testing.T, c goredis.UniversalClient) backend.RemoteResource {
	var closed goredis.UniversalClient
	switch c := c.(type) {
	case *goredis.Client:
		closed = goredis.NewClient(c.Options())
	case *goredis.ClusterClient:
		closed = goredis.NewClusterClient(c.Options())
	case *goredis.Ring:
		closed = goredis.NewRing(c.Options())
	default:
		t.Fatalf("closedResource: unexpected client %T", c)
	}
	r := redis.New(closed)
	t.Cleanup(func() { _ = r.Close() })
	if err := closed.Close(); err != nil {
		t.Fatalf("closing the client: %v", err)
	}
	return r
}

// TestConformanceRing runs the suite over a two-shard *goredis.Ring: locks
// work (shards follow the hash tag), wake-up is off.
func TestConformanceRing(t *testing.T) {
	nodes := testserver.RedisNodes(t, 2)
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{
		"a": nodes[0].Addr, "b": nodes[1].Addr,
	}})
	t.Cleanup(func() { _ = ring.Close() })
	if ch, cancel := redis.New(ring).Subscribe("k"); ch != nil {
		t.Errorf("Subscribe over a Ring: non-nil channel; want nil (no wake-up)")
	} else {
		cancel()
	}
	testsuite.Run(t, harness(ring))
}
