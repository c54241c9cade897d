package redis_test

import (
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/testsuite"
)

// TestNoGoroutineLeak checks that no goroutine outlives Close and the
// clients' Close, on a standalone server and on a Cluster: the
// subscription hub, its forwarders, renewers and waiters all end. Nothing
// is ignored but what ran before the clients were made (the servers'
// watchers).
func TestNoGoroutineLeak(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		srv := testserver.Redis(t)
		before := goleak.IgnoreCurrent()
		c1 := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
		c2 := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
		testsuite.Exercise(t, mustNew(t, c1), mustNew(t, c2), 300*time.Millisecond)
		closeAll(t, c1, c2)
		verifyNoLeak(t, before)
	})
	t.Run("cluster", func(t *testing.T) {
		srv := testserver.RedisCluster(t)
		before := goleak.IgnoreCurrent()
		c1 := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: srv.Addrs})
		c2 := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: srv.Addrs})
		testsuite.Exercise(t, mustNew(t, c1), mustNew(t, c2), 300*time.Millisecond)
		closeAll(t, c1, c2)
		verifyNoLeak(t, before)
	})
}

func closeAll(t *testing.T, cs ...goredis.UniversalClient) {
	t.Helper()
	for _, c := range cs {
		if err := c.Close(); err != nil {
			t.Errorf("client Close: %v", err)
		}
	}
}

// verifyNoLeak fails t if goroutines other than those opts ignore are
// still running after a few seconds' grace for the ones already ending.
func verifyNoLeak(t *testing.T, opts ...goleak.Option) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); goleak.Find(opts...) != nil && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	goleak.VerifyNone(t, opts...)
}
