package zookeeper

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/testsuite"
)

// TestNoGoroutineLeak checks that no goroutine outlives Close and the
// connections' Close: the session poller, background deletions, waiters'
// watches, renewers and TTL timers all end. Nothing is ignored but what
// ran before the connections were made (the server's watcher).
func TestNoGoroutineLeak(t *testing.T) {
	addrs := []string{testserver.ZooKeeper(t).Addr}
	before := goleak.IgnoreCurrent()
	c1, c2 := connect(t, addrs), connect(t, addrs)
	testsuite.Exercise(t, mustNew(t, c1), mustNew(t, c2), 300*time.Millisecond)
	c1.Close()
	c2.Close()
	verifyNoLeak(t, before)
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
