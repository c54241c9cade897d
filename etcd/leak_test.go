package etcd

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/testsuite"
)

// TestNoGoroutineLeak checks that no goroutine outlives Close and the
// clients' Close, in both lease modes: shared-lease keep-alives, watches
// (the Resource's key watch among them), renewers and waiters all end. The server is a one-member cluster in a
// process of its own, so that the in-process server's goroutines are not
// counted; nothing is ignored but what ran before the clients were made.
func TestNoGoroutineLeak(t *testing.T) {
	endpoints := testserver.EtcdCluster(t, 1).Endpoints()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			before := goleak.IgnoreCurrent()
			var cs []*clientv3.Client
			for range 2 {
				c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
				if err != nil {
					t.Fatalf("clientv3.New: %v", err)
				}
				cs = append(cs, c)
			}
			testsuite.Exercise(t, mustNew(t, cs[0], m.opts...), mustNew(t, cs[1], m.opts...), time.Second)
			// A lock on a lease of its own starts the Resource's key watch,
			// which must end with the client, Close or not.
			own := mustNew(t, cs[0])
			l := lease(testsuite.Key(t), time.Second)
			if err := own.Acquire(t.Context(), l, time.Time{}); err != nil {
				t.Fatal(err)
			}
			if err := own.Release(t.Context(), l); err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				if err := c.Close(); err != nil {
					t.Errorf("client Close: %v", err)
				}
			}
			verifyNoLeak(t, before)
		})
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
