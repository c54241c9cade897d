package testserver

import (
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
