package safety

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/safety/harness"
	"github.com/distlock/distlock/zookeeper"
)

const (
	zkTTL     = 500 * time.Millisecond
	zkSession = time.Second
)

// zkTarget is ZooKeeper at addrs. A ZooKeeper lock's TTL is enforced by
// its holder's process; a frozen holder's lock is freed by the server
// when the session times out.
func zkTarget(t testing.TB, addrs []string) target {
	conn, events, err := zk.Connect(addrs, 10*time.Second, zk.WithLogger(quietZK{}))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range events {
		}
	}()
	t.Cleanup(conn.Close)
	return target{
		name:    "zookeeper",
		backend: harness.Backend{Kind: "zookeeper", Addrs: addrs, SessionTimeout: zkSession},
		ttl:     zkTTL,
		expiry:  zkSession,
		hold:    100 * time.Millisecond,
		server:  addrs[0],
		via: func(hp string) harness.Backend {
			return harness.Backend{Kind: "zookeeper", Addrs: []string{hp}, SessionTimeout: zkSession}
		},
		leftovers: func(ctx context.Context, key string) ([]string, error) {
			// Our keys are letters, digits and '-': they stand for
			// themselves in the znode name.
			children, _, err := conn.Children(zookeeper.DefaultRoot + "/" + key)
			if errors.Is(err, zk.ErrNoNode) {
				return nil, nil
			}
			return children, err
		},
	}
}

type quietZK struct{}

func (quietZK) Printf(string, ...any) {}

func TestZooKeeper(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	tg := zkTarget(t, []string{srv.Addr})
	t.Run("NoFault", func(t *testing.T) { testNoFault(t, tg) })
	t.Run("HolderPause", func(t *testing.T) { testHolderPause(t, tg) })
	t.Run("WaiterExpiredWhileQueued", func(t *testing.T) { testWaiterExpiredWhileQueued(t, tg) })
	t.Run("Partition", func(t *testing.T) { testPartition(t, tg) })
	t.Run("CancelStorm", func(t *testing.T) { testCancelStorm(t, tg) })
	t.Run("ServerPause", func(t *testing.T) { testServerPause(t, tg, srv) })
}

func TestZooKeeperEnsemble(t *testing.T) {
	ens := testserver.ZooKeeperEnsemble(t, 3)
	tg := zkTarget(t, ens.Addrs)
	testLeaderKill(t, tg, cluster{
		leader: ens.Leader,
		kill:   func(i int) { ens.Members[i].Kill() },
		start:  func(i int) { ens.Members[i].Start() },
	})
}
