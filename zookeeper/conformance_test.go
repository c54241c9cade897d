package zookeeper

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/testsuite"
)

func TestConformance(t *testing.T) {
	testsuite.Run(t, harness(t, testserver.ZooKeeper(t)))
}

// TestStalledServerLongSession runs the stalled-store cases with a 10s
// session: go-zookeeper notices nothing during a stall (its receive
// timeout is 2/3 of it), so what returns at its bound is the resource's
// doing, not the client's.
func TestStalledServerLongSession(t *testing.T) {
	zs := testserver.ZooKeeper(t)
	h := harness(t, zs)
	h.NewResource = func(t *testing.T) backend.RemoteResource {
		conn := connectWith(t, []string{zs.Addr}, connOpts{timeout: 10 * time.Second})
		r := mustNew(t, conn, WithSessionTimeout(negotiated(t, conn)))
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	testsuite.RunStalled(t, h)
}

// harness adapts resources over connections to zs to the suite.
func harness(t *testing.T, zs *testserver.ZooKeeperServer) testsuite.Harness {
	addrs := []string{zs.Addr}
	admin := connect(t, addrs) // the operator's view
	probe := mustNew(t, admin)
	return testsuite.Harness{
		NewResource: func(t *testing.T) backend.RemoteResource {
			r, _ := newResource(t, addrs)
			return r
		},
		// What is left is a child of one of the key's parents (mutex,
		// semaphore, read/write lock); an empty parent is a container the
		// server removes by itself.
		Leftovers: func(ctx context.Context, key string) ([]string, error) {
			return allChildren(admin, probe, key)
		},
		// Holders and waiters alike are children of the kind's parent.
		Requests: func(ctx context.Context, key string, kind backend.Kind) (int, error) {
			cs, _, err := admin.Children(probe.kindParent(key, kind))
			if errors.Is(err, zk.ErrNoNode) {
				return 0, nil
			}
			return len(cs), err
		},
		Evict: func(ctx context.Context, key string) error {
			cs, err := allChildren(admin, probe, key)
			if err != nil {
				return err
			}
			for _, c := range cs {
				if err := admin.Delete(c, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
					return err
				}
			}
			return nil
		},
		MaxKeyLen: MaxKeyLen,
		// The server frozen (SIGSTOP) answers nobody until SIGCONT.
		Stall: func(t *testing.T) func() {
			zs.Pause()
			var once sync.Once
			resume := func() { once.Do(zs.Resume) }
			t.Cleanup(resume)
			return resume
		},
		NewClosedResource: func(t *testing.T) backend.RemoteResource {
			r, conn := newResource(t, addrs)
			conn.Close()
			return r
		},
		// Nothing listens at the address: the client never gets a
		// session. go-zookeeper logs the dial's error but returns only
		// zk.ErrNoServer.
		NewRefusedResource: func(t *testing.T) backend.RemoteResource {
			conn, _, err := zk.Connect([]string{testsuite.RefusingAddr(t)}, sessionTimeout, zk.WithLogger(silentLogger{}))
			if err != nil {
				t.Fatalf("zk.Connect: %v", err)
			}
			t.Cleanup(conn.Close)
			r := mustNew(t, conn)
			t.Cleanup(func() { _ = r.Close() })
			return r
		},
		RefusedCause: "could not connect to a server",
	}
}
