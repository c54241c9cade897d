package redis_test

import (
	"context"
	"errors"
	"sync"
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
	t.Run("standalone", func(t *testing.T) {
		srv := testserver.Redis(t)
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = c.Close() })
		testsuite.Run(t, harness(c, srv))
	})
	t.Run("cluster", func(t *testing.T) {
		srv := testserver.RedisCluster(t)
		c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: srv.Addrs})
		t.Cleanup(func() { _ = c.Close() })
		testsuite.Run(t, harness(c, srv.Nodes...))
	})
}

// TestStalledServerContextTimeout runs the stalled-store cases with
// go-redis's ContextTimeoutEnabled: the client honours the context's
// deadline, never a cancellation without one. TestConformance runs them
// with the client's defaults (the context ignored, ReadTimeout 5s).
func TestStalledServerContextTimeout(t *testing.T) {
	srv := testserver.Redis(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	testsuite.RunStalled(t, harness(c, srv))
}

// harness adapts the Resource over c to the suite; servers are the ones c
// reaches, which Stall freezes (SIGSTOP) all at once.
func harness(c goredis.UniversalClient, servers ...*testserver.RedisServer) testsuite.Harness {
	return testsuite.Harness{
		// A client as the package doc advises (DialerRetries: 1): it
		// reports a refused dial at once, not after go-redis's ~1.7s of
		// retries, past the bound of one attempt.
		NewRefusedResource: func(t *testing.T) backend.RemoteResource {
			rc := goredis.NewClient(&goredis.Options{Addr: testsuite.RefusingAddr(t), DialerRetries: 1})
			t.Cleanup(func() { _ = rc.Close() })
			return newResource(t, rc)
		},
		RefusedCause: "connection refused",
		NewResource: func(t *testing.T) backend.RemoteResource {
			return newResource(t, c)
		},
		// Every key of every kind of lock on key: the mutex and its label,
		// the semaphore's and the read/write lock's sets and hashes. The
		// fences outlive their lock by redisscript.FenceGrace on purpose
		// (they keep tokens increasing), a release's trace lives out the
		// lock's TTL, and a failed attempt's tombstone lives one TTL.
		Leftovers: func(ctx context.Context, key string) ([]string, error) {
			var left []string
			for _, k := range redisscript.StateKeys(redis.DefaultPrefix, key) {
				n, err := c.Exists(ctx, k).Result()
				if err != nil {
					return nil, err
				}
				if n > 0 {
					left = append(left, k)
				}
			}
			return left, nil
		},
		// A mutex's holder is its key (unless kept for the head of its
		// line: a value starting with a NUL byte); a semaphore's holders
		// are in its set; the waiters, in the line.
		Requests: func(ctx context.Context, key string, kind backend.Kind) (int, error) {
			lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
			holders := int64(0)
			switch kind {
			case backend.KindMutex:
				v, err := c.Get(ctx, lock).Result()
				if err != nil && !errors.Is(err, goredis.Nil) {
					return 0, err
				}
				if v != "" && v[0] != 0 {
					holders = 1
				}
			case backend.KindSemaphore:
				n, err := c.ZCard(ctx, lock+redisscript.SemSuffix).Result()
				if err != nil {
					return 0, err
				}
				holders = n
				lock += redisscript.SemSuffix
			default:
				return 0, errors.ErrUnsupported
			}
			n, err := c.ZCard(ctx, lock+redisscript.QueueSuffix).Result()
			return int(holders + n), err
		},
		Evict: func(ctx context.Context, key string) error {
			for _, k := range redisscript.StateKeys(redis.DefaultPrefix, key) {
				if err := c.Del(ctx, k).Err(); err != nil {
					return err
				}
			}
			return nil
		},
		MaxKeyLen: redis.MaxKeyLen,
		NewClosedResource: func(t *testing.T) backend.RemoteResource {
			return closedResource(t, c)
		},
		Stall: func(t *testing.T) func() {
			return stall(t, servers...)
		},
	}
}

// stall freezes servers (SIGSTOP) and returns what resumes them
// (SIGCONT), once, also registered with t.Cleanup.
func stall(t *testing.T, servers ...*testserver.RedisServer) func() {
	t.Helper()
	if len(servers) == 0 {
		t.Fatal("stall: no server to freeze")
	}
	for _, s := range servers {
		s.Pause()
	}
	var once sync.Once
	resume := func() {
		once.Do(func() {
			for _, s := range servers {
				s.Resume()
			}
		})
	}
	t.Cleanup(resume)
	return resume
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
	r := mustNew(t, closed)
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
	if ch, cancel := mustNew(t, ring).Subscribe("k"); ch != nil {
		t.Errorf("Subscribe over a Ring: non-nil channel; want nil (no wake-up)")
	} else {
		cancel()
	}
	testsuite.Run(t, harness(ring, nodes...))
}
