package testserver

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var redisKind = kind{
	name:    "redis",
	envVar:  "DISTLOCK_TEST_REDIS",
	binary:  "redis-server",
	install: "apt-get install redis-server redis-tools",
	image:   "redis:7",
}

// RedisServer is a Redis server for one test.
//
// Stop, Kill, Pause, Resume and Restart control a server the test started;
// on a server given by an environment variable they skip the test (fail it
// when CI is set). Call them from the test's goroutine. The server keeps no
// data on disk: a restarted server is empty, as after a crash without
// persistence.
type RedisServer struct {
	// Addr is the server's "host:port".
	Addr string

	node
}

// Redis starts a Redis server for t and stops it when t ends.
// DISTLOCK_TEST_REDIS=host:port makes it use a running server instead.
func Redis(t testing.TB) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	src, env := redisKind.choose(t, err == nil)
	switch src {
	case sourceEnv:
		return &RedisServer{Addr: env, node: node{t: t, envVar: redisKind.envVar}}
	case sourceDocker:
		return &RedisServer{Addr: dockerRun(t, redisKind, 6379, nil), node: node{t: t, envVar: redisKind.envVar}}
	}
	return startRedisWith(t, bin, "redis", nil)
}

// RedisNodes starts n independent Redis servers (for Redlock).
// DISTLOCK_TEST_REDIS_NODES=addr1,addr2,... (at least n) makes it use
// running servers instead.
func RedisNodes(t testing.TB, n int) []*RedisServer {
	t.Helper()
	if n < 1 {
		t.Fatalf("testserver: RedisNodes(%d): n must be positive", n)
	}
	if env := os.Getenv("DISTLOCK_TEST_REDIS_NODES"); env != "" {
		addrs := splitList(env)
		if len(addrs) < n {
			t.Fatalf("testserver: DISTLOCK_TEST_REDIS_NODES lists %d addresses; the test needs %d", len(addrs), n)
		}
		nodes := make([]*RedisServer, n)
		for i := range nodes {
			nodes[i] = &RedisServer{Addr: addrs[i], node: node{t: t, envVar: "DISTLOCK_TEST_REDIS_NODES"}}
		}
		return nodes
	}
	bin, err := exec.LookPath("redis-server")
	k := redisKind
	k.envVar = "DISTLOCK_TEST_REDIS_NODES"
	src, _ := k.choose(t, err == nil)
	nodes := make([]*RedisServer, n)
	for i := range nodes {
		if src == sourceDocker {
			nodes[i] = &RedisServer{Addr: dockerRun(t, redisKind, 6379, nil), node: node{t: t, envVar: redisKind.envVar}}
			continue
		}
		nodes[i] = startRedisWith(t, bin, fmt.Sprintf("redis-node%d", i), nil)
	}
	return nodes
}

// startRedisWith starts redis-server in a fresh temp dir; extra, if not
// nil, gives more arguments for the port the server is about to use.
func startRedisWith(t testing.TB, bin, name string, extra func(port int) ([]string, error)) *RedisServer {
	t.Helper()
	dir := t.TempDir()
	build := func(port int) *process {
		args := []string{bin,
			"--bind", "127.0.0.1",
			"--port", strconv.Itoa(port),
			"--dir", dir,
			"--save", "",
			"--appendonly", "no",
			"--repl-diskless-sync-delay", "0",
			"--daemonize", "no",
			"--protected-mode", "no",
			"--logfile", "",
			"--loglevel", "notice",
		}
		if extra != nil {
			more, err := extra(port)
			if err != nil {
				t.Fatalf("testserver: %v", err)
			}
			args = append(args, more...)
		}
		p := newProcess(t, name+" "+hostPort(port), filepath.Join(dir, "redis.log"), args...)
		p.dir = dir
		return p
	}
	p, port := startOnFreePort(t, build, func(_ *process, port int) error { return redisPing(hostPort(port)) })
	addr := hostPort(port)
	return &RedisServer{Addr: addr, node: node{t: t, proc: p, ready: func() error { return redisPing(addr) }}}
}

func redisPing(addr string) error {
	r, err := redisDo(addr, "PING")
	if err != nil {
		return err
	}
	if r != "PONG" {
		return fmt.Errorf("PING: got %q", r)
	}
	return nil
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
