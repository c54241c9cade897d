package safety

import (
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/distlock/distlock/etcd"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/safety/harness"
)

// etcdTTL is etcd's shortest lease: whole seconds, and at least 1.5
// election timeouts (2s with the default 1s).
const etcdTTL = 2 * time.Second

func etcdTarget(t testing.TB, endpoints []string) target {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	res := etcd.New(c)
	t.Cleanup(func() { _ = res.Close(); _ = c.Close() })
	return target{
		name:    "etcd",
		backend: harness.Backend{Kind: "etcd", Addrs: endpoints, Timeout: 5 * time.Second},
		ttl:     etcdTTL,
		expiry:  etcdTTL,
		hold:    100 * time.Millisecond,
		server:  strings.TrimPrefix(endpoints[0], "http://"),
		via: func(hp string) harness.Backend {
			return harness.Backend{Kind: "etcd", Addrs: []string{"http://" + hp}, Timeout: 5 * time.Second}
		},
		leftovers: res.Leftovers,
	}
}

func TestEtcd(t *testing.T) {
	srv := testserver.Etcd(t)
	tg := etcdTarget(t, srv.Endpoints)
	t.Run("NoFault", func(t *testing.T) { testNoFault(t, tg) })
	t.Run("HolderPause", func(t *testing.T) { testHolderPause(t, tg) })
	t.Run("WaiterExpiredWhileQueued", func(t *testing.T) { testWaiterExpiredWhileQueued(t, tg) })
	t.Run("Partition", func(t *testing.T) { testPartition(t, tg) })
	t.Run("CancelStorm", func(t *testing.T) { testCancelStorm(t, tg) })
}

func TestEtcdCluster(t *testing.T) {
	cl := testserver.EtcdCluster(t, 3)
	tg := etcdTarget(t, cl.Endpoints())
	testLeaderKill(t, tg, cluster{
		leader: cl.Leader,
		kill:   func(i int) { cl.Members[i].Kill() },
		start:  func(i int) { cl.Members[i].Start() },
	})
}
