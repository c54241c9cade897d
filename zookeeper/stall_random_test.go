//go:build !race

// TestRandomizedStalls runs without the race detector: it makes
// go-zookeeper reconnect with watches set many times, and go-zookeeper
// v1.0.4 (the latest) races with itself on every such reconnect
// (Conn.lastZxid, written by recvLoop while sendSetWatches reads it:
// go-zookeeper/zk pull request #35, open since 2020). make test runs it in
// a pass of its own without -race; every other test of the module runs
// with it.

package zookeeper

import (
	"fmt"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/testsuite"
)

// TestRandomizedStalls runs testsuite.RunRandomStalls with the server's
// longest stalls past go-zookeeper's receive timeout (two thirds of the
// session): requests are abandoned in flight at every step, the create,
// the listing, the watch, the stat, the delete. Once the server answers,
// every client is back in session before the clean-ups run, and at the
// end no znode and no watch is left. DISTLOCK_SEED reruns a seed.
func TestRandomizedStalls(t *testing.T) {
	zs := testserver.ZooKeeper(t)
	addrs := []string{zs.Addr}
	const session = 3 * time.Second // receive timeout 2s
	var (
		clients []testsuite.StallingWaiter
		conns   []*zk.Conn
	)
	for i := range 3 {
		conn := connectWith(t, addrs, connOpts{timeout: session})
		var opts []Option
		if i > 0 {
			opts = append(opts, WithSessionTimeout(negotiated(t, conn)))
		}
		r := mustNew(t, conn, opts...)
		t.Cleanup(func() { _ = r.Close() })
		clients = append(clients, r)
		conns = append(conns, conn)
	}
	admin := connectWith(t, addrs, connOpts{timeout: session})
	probe := mustNew(t, admin) // for parentPath only
	testsuite.RunRandomStalls(t, testsuite.RandomStalls{
		Clients:             clients,
		Goroutines:          3,
		Run:                 15 * time.Second,
		Seed:                randomSeed(t),
		Pause:               zs.Pause,
		Resume:              zs.Resume,
		Name:                pathOf,
		ReleaseInBackground: true, // a release cut short deletes in the background
		Settle: func(t *testing.T) {
			for i, c := range conns {
				waitFor(t, 30*time.Second, fmt.Sprintf("client %d back in session", i), func() bool { return c.State() == zk.StateHasSession })
			}
		},
		Empty: func(t *testing.T, key string) {
			waitFor(t, 20*time.Second, "no znode left for "+key, func() bool {
				cs, err := children(admin, probe, key)
				return err == nil && len(cs) == 0
			})
			for i, c := range conns {
				waitFor(t, 10*time.Second, fmt.Sprintf("client %d's watches to fire", i), func() bool { return clientWatchers(t, c) == 0 })
			}
		},
	})
}
