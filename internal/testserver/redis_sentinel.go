package testserver

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// RedisSentinelServer is a Redis Sentinel watching one master for a test.
type RedisSentinelServer struct {
	// Addr is the sentinel's address, "127.0.0.1:port".
	Addr string
	// MasterName is the name the master is monitored under.
	MasterName string

	node
}

// RedisSentinel starts a Redis Sentinel monitoring master as "mymaster"
// (quorum 1, master down after 1s, failover timeout 5s), waits until it
// knows the master, and stops it when t ends. Start replicas with
// [RedisReplica] first: the sentinel finds them through the master and
// promotes one when the master dies. DISTLOCK_TEST_REDIS_SENTINEL=host:port
// makes it use a running sentinel (monitoring "mymaster") instead.
func RedisSentinel(t testing.TB, master *RedisServer) *RedisSentinelServer {
	t.Helper()
	const name = "mymaster"
	if master == nil {
		t.Fatal("testserver: RedisSentinel: nil master")
	}
	k := redisKind
	k.envVar = "DISTLOCK_TEST_REDIS_SENTINEL"
	k.image = ""
	bin, err := exec.LookPath("redis-server")
	src, env := k.choose(t, err == nil)
	if src == sourceEnv {
		return &RedisSentinelServer{Addr: env, MasterName: name, node: node{t: t, envVar: k.envVar}}
	}
	host, port, err := net.SplitHostPort(master.Addr)
	if err != nil {
		t.Fatalf("testserver: RedisSentinel: master address %q: %v", master.Addr, err)
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "sentinel.conf")
	build := func(p int) *process {
		// Sentinel rewrites its config file as it learns: write it anew
		// for every port tried.
		cfg := strings.Join([]string{
			"bind 127.0.0.1",
			"port " + strconv.Itoa(p),
			"protected-mode no",
			"dir " + dir,
			fmt.Sprintf("sentinel monitor %s %s %s 1", name, host, port),
			"sentinel down-after-milliseconds " + name + " 1000",
			"sentinel failover-timeout " + name + " 5000",
			"sentinel parallel-syncs " + name + " 1",
		}, "\n") + "\n"
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			t.Fatalf("testserver: %v", err)
		}
		pr := newProcess(t, "redis-sentinel "+hostPort(p), filepath.Join(dir, "sentinel.log"), bin, cfgPath, "--sentinel")
		pr.dir = dir
		return pr
	}
	ready := func(addr string) error {
		got, err := redisDo(addr, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
		if err != nil {
			return err
		}
		if got != host+"\n"+port {
			return fmt.Errorf("sentinel %s: master %q; want %s", addr, got, master.Addr)
		}
		return nil
	}
	p, sport := startOnFreePort(t, build, func(_ *process, p int) error { return ready(hostPort(p)) })
	addr := hostPort(sport)
	return &RedisSentinelServer{Addr: addr, MasterName: name,
		node: node{t: t, proc: p, ready: func() error { _, err := redisDo(addr, "PING"); return err }}}
}

// MasterAddr asks the sentinel for the current master's address.
func (s *RedisSentinelServer) MasterAddr() (string, error) {
	got, err := redisDo(s.Addr, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.MasterName)
	if err != nil {
		return "", err
	}
	host, port, ok := strings.Cut(got, "\n")
	if !ok {
		return "", fmt.Errorf("sentinel %s: no master %q", s.Addr, s.MasterName)
	}
	return net.JoinHostPort(host, port), nil
}
