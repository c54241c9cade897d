package testserver

import (
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// RedisClusterServer is a Redis Cluster of three masters (no replicas) for
// one test, its 16384 slots split evenly.
type RedisClusterServer struct {
	// Addrs are the masters' addresses, "127.0.0.1:port".
	Addrs []string
	// Nodes are the masters, in the order of Addrs (empty for an external
	// cluster).
	Nodes []*RedisServer
}

// RedisCluster starts a Redis Cluster of three masters for t, waits until
// every node reports cluster_state:ok and stops it when t ends.
// DISTLOCK_TEST_REDIS_CLUSTER=addr1,addr2,... makes it use a running
// cluster instead.
func RedisCluster(t testing.TB) *RedisClusterServer {
	t.Helper()
	k := redisKind
	k.envVar = "DISTLOCK_TEST_REDIS_CLUSTER"
	k.image = "" // a cluster of containers needs announced addresses: not worth it
	bin, err := exec.LookPath("redis-server")
	src, env := k.choose(t, err == nil)
	if src == sourceEnv {
		return &RedisClusterServer{Addrs: splitList(env)}
	}
	const n = 3
	c := &RedisClusterServer{}
	busPorts := make([]int, n)
	for i := range n {
		s := startRedisWith(t, bin, fmt.Sprintf("redis-cluster%d", i), func(port int) ([]string, error) {
			// The cluster bus needs a second port; Redis 7 takes it as
			// cluster-port.
			bus, err := freePort()
			if err != nil {
				return nil, err
			}
			busPorts[i] = bus
			return []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", "2000",
				"--cluster-port", strconv.Itoa(bus),
			}, nil
		})
		c.Nodes = append(c.Nodes, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	// What redis-cli --cluster create does, without needing redis-cli:
	// distinct config epochs, slots split in ranges, every node met.
	for i, s := range c.Nodes {
		if _, err := redisDo(s.Addr, "CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i+1)); err != nil {
			t.Fatalf("testserver: redis cluster: %v", err)
		}
		lo, hi := i*16384/n, (i+1)*16384/n-1
		if _, err := redisDo(s.Addr, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi)); err != nil {
			t.Fatalf("testserver: redis cluster: %v", err)
		}
	}
	// Every node meets every other: no waiting for gossip to spread.
	for i, a := range c.Nodes {
		for j, b := range c.Nodes[i+1:] {
			host, port, _ := net.SplitHostPort(b.Addr)
			bus := strconv.Itoa(busPorts[i+1+j])
			if _, err := redisDo(a.Addr, "CLUSTER", "MEET", host, port, bus); err != nil {
				t.Fatalf("testserver: redis cluster: %v", err)
			}
		}
	}
	for _, s := range c.Nodes {
		s.ready = func() error { return redisPing(s.Addr) }
	}
	if err := pollReady(c.ok); err != nil {
		t.Fatalf("testserver: redis cluster: %v", err)
	}
	return c
}

// ok checks that every node sees the cluster whole.
func (c *RedisClusterServer) ok() error {
	for _, a := range c.Addrs {
		info, err := redisDo(a, "CLUSTER", "INFO")
		if err != nil {
			return err
		}
		f := infoFields(info)
		if f["cluster_state"] != "ok" || f["cluster_known_nodes"] != strconv.Itoa(len(c.Addrs)) || f["cluster_slots_ok"] != "16384" {
			return fmt.Errorf("%s: cluster_state=%s known_nodes=%s slots_ok=%s", a,
				f["cluster_state"], f["cluster_known_nodes"], f["cluster_slots_ok"])
		}
	}
	return nil
}

// infoFields parses the key:value lines of INFO and CLUSTER INFO.
func infoFields(info string) map[string]string {
	f := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			f[k] = v
		}
	}
	return f
}

// RedisReplica starts a Redis server replicating master for t, waits until
// the replication link is up and the initial sync is done, and stops it
// when t ends. Promote it with [RedisServer.Promote] to test failover.
// It needs a local redis-server even when master is external.
func RedisReplica(t testing.TB, master *RedisServer) *RedisServer {
	t.Helper()
	if master == nil {
		t.Fatal("testserver: RedisReplica: nil master")
	}
	k := redisKind
	k.envVar = "DISTLOCK_TEST_REDIS_REPLICA"
	k.image = ""
	bin, err := exec.LookPath("redis-server")
	src, env := k.choose(t, err == nil)
	if src == sourceEnv {
		return &RedisServer{Addr: env, node: node{t: t, envVar: k.envVar}}
	}
	host, port, err := net.SplitHostPort(master.Addr)
	if err != nil {
		t.Fatalf("testserver: RedisReplica: master address %q: %v", master.Addr, err)
	}
	s := startRedisWith(t, bin, "redis-replica", func(int) ([]string, error) {
		return []string{"--replicaof", host, port}, nil
	})
	if err := pollReady(s.replicaSynced); err != nil {
		t.Fatalf("testserver: redis replica of %s: %v", master.Addr, err)
	}
	return s
}

func (s *RedisServer) replicaSynced() error {
	info, err := redisDo(s.Addr, "INFO", "replication")
	if err != nil {
		return err
	}
	f := infoFields(info)
	if f["role"] != "slave" || f["master_link_status"] != "up" || f["master_sync_in_progress"] != "0" {
		return fmt.Errorf("%s: role=%s master_link_status=%s master_sync_in_progress=%s", s.Addr,
			f["role"], f["master_link_status"], f["master_sync_in_progress"])
	}
	return nil
}

// Promote makes a replica a master (REPLICAOF NO ONE), as a failover does.
func (s *RedisServer) Promote() {
	s.t.Helper()
	if _, err := redisDo(s.Addr, "REPLICAOF", "NO", "ONE"); err != nil {
		s.t.Fatalf("testserver: promote %s: %v", s.Addr, err)
	}
}
