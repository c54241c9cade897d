package testserver

import (
	"net"
	"strings"
	"testing"
	"time"
)

func TestRedisPing(t *testing.T) {
	s := Redis(t)
	if got, err := redisDo(s.Addr, "PING"); err != nil || got != "PONG" {
		t.Fatalf("PING = %q, %v; want PONG", got, err)
	}
}

func TestRedisControl(t *testing.T) {
	s := Redis(t)
	if _, err := redisDo(s.Addr, "SET", "k", "v"); err != nil {
		t.Fatal(err)
	}

	s.Pause()
	if _, err := redisDoTimeout(s.Addr, 300*time.Millisecond, "PING"); err == nil {
		t.Fatal("PING answered while the server was paused")
	}
	s.Resume()
	if err := redisPing(s.Addr); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}

	pid := s.PID()
	s.Kill()
	if err := redisPing(s.Addr); err == nil {
		t.Fatal("PING answered after Kill")
	}
	if s.PID() != 0 {
		t.Fatalf("PID after Kill = %d; want 0", s.PID())
	}
	s.Restart()
	if s.PID() == 0 || s.PID() == pid {
		t.Fatalf("PID after Restart = %d; want a new process (old %d)", s.PID(), pid)
	}
	if got, err := redisDo(s.Addr, "GET", "k"); err != nil || got != "" {
		t.Fatalf("GET k after restart = %q, %v; want empty (no persistence)", got, err)
	}

	s.Stop()
	if err := redisPing(s.Addr); err == nil {
		t.Fatal("PING answered after Stop")
	}
	s.Restart()
	if err := redisPing(s.Addr); err != nil {
		t.Fatalf("PING after second Restart: %v", err)
	}
	// Stopping a paused server must not hang.
	s.Pause()
}

func TestRedisNodes(t *testing.T) {
	nodes := RedisNodes(t, 3)
	seen := map[string]bool{}
	for _, n := range nodes {
		if seen[n.Addr] {
			t.Fatalf("address %s used twice", n.Addr)
		}
		seen[n.Addr] = true
		if _, err := redisDo(n.Addr, "SET", "k", n.Addr); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		if got, err := redisDo(n.Addr, "GET", "k"); err != nil || got != n.Addr {
			t.Fatalf("GET k on %s = %q, %v; want its own value", n.Addr, got, err)
		}
	}
}

func TestRedisClusterInfo(t *testing.T) {
	c := RedisCluster(t)
	if len(c.Addrs) != 3 {
		t.Fatalf("len(Addrs) = %d; want 3", len(c.Addrs))
	}
	for _, a := range c.Addrs {
		info, err := redisDo(a, "CLUSTER", "INFO")
		if err != nil {
			t.Fatal(err)
		}
		if f := infoFields(info); f["cluster_state"] != "ok" || f["cluster_size"] != "3" {
			t.Fatalf("CLUSTER INFO on %s: cluster_state=%s cluster_size=%s; want ok, 3", a, f["cluster_state"], f["cluster_size"])
		}
	}
	// A key lands on the node owning its slot; the others redirect.
	moved := 0
	for _, a := range c.Addrs {
		if _, err := redisDo(a, "SET", "{smoke}", "v"); err != nil {
			if !strings.HasPrefix(err.Error(), "MOVED ") {
				t.Fatalf("SET on %s: %v; want OK or MOVED", a, err)
			}
			moved++
		}
	}
	if moved != 2 {
		t.Fatalf("%d nodes answered MOVED; want 2", moved)
	}
}

func TestRedisReplicaFailover(t *testing.T) {
	master := Redis(t)
	if _, err := redisDo(master.Addr, "SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	replica := RedisReplica(t, master)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := redisDo(replica.Addr, "GET", "k")
		if err == nil && got == "v" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET k on the replica = %q, %v; want v", got, err)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
	if _, err := redisDo(replica.Addr, "SET", "k", "w"); err == nil || !strings.HasPrefix(err.Error(), "READONLY") {
		t.Fatalf("SET on the replica: %v; want READONLY", err)
	}
	master.Kill()
	replica.Promote()
	if _, err := redisDo(replica.Addr, "SET", "k", "w"); err != nil {
		t.Fatalf("SET on the promoted replica: %v", err)
	}
}

func TestRedisSentinelFailover(t *testing.T) {
	master := Redis(t)
	replica := RedisReplica(t, master)
	sentinel := RedisSentinel(t, master)
	if got, err := sentinel.MasterAddr(); err != nil || got != master.Addr {
		t.Fatalf("MasterAddr() = %q, %v; want %s", got, err, master.Addr)
	}
	// The sentinel learns about the replica from the master's INFO.
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := redisDo(sentinel.Addr, "SENTINEL", "REPLICAS", sentinel.MasterName)
		_, port, _ := net.SplitHostPort(replica.Addr)
		if err == nil && strings.Contains(got, "\nport\n"+port+"\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sentinel does not know the replica %s: %q, %v", replica.Addr, got, err)
		}
		time.Sleep(50 * time.Millisecond) // polling with a deadline
	}

	master.Kill()
	deadline = time.Now().Add(60 * time.Second)
	for {
		got, err := sentinel.MasterAddr()
		if err == nil && got == replica.Addr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("MasterAddr() after the master died = %q, %v; want the replica %s", got, err, replica.Addr)
		}
		time.Sleep(50 * time.Millisecond) // polling with a deadline
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		_, err := redisDo(replica.Addr, "SET", "k", "v")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("SET on the promoted replica: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // polling with a deadline
	}
}
