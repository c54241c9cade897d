package sqldb

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/distlock/distlock/testsuite"
)

// testNoGoroutineLeak checks that no goroutine outlives Close and the
// pools' Close: the LISTEN connection's goroutine, renewers and waiters all
// end. The workload runs in a subtest, whose cleanup closes the pools it
// made; nothing is ignored but what ran before (the admin pool, the
// server's watcher).
func testNoGoroutineLeak(t *testing.T, f fixture) {
	before := goleak.IgnoreCurrent()
	t.Run("Workload", func(t *testing.T) {
		testsuite.Exercise(t, f.newResource(t), f.newResource(t), 600*time.Millisecond)
	})
	for end := time.Now().Add(5 * time.Second); goleak.Find(before) != nil && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	goleak.VerifyNone(t, before)
}
