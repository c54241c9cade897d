package testserver

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// EtcdMember is one member of an [EtcdClusterServer]. It runs in a process
// of its own, so it can be stopped, killed, paused and restarted like any
// server; it keeps its data across a restart and rejoins the cluster.
type EtcdMember struct {
	// Endpoint is the member's client URL, "http://127.0.0.1:port".
	Endpoint string

	node
}

// EtcdClusterServer is an etcd cluster for one test.
type EtcdClusterServer struct {
	// Members are the members; member i is named "m<i>".
	Members []*EtcdMember
}

// Endpoints returns the members' client URLs.
func (c *EtcdClusterServer) Endpoints() []string {
	eps := make([]string, len(c.Members))
	for i, m := range c.Members {
		eps[i] = m.Endpoint
	}
	return eps
}

// Leader returns the index in Members of the current leader.
func (c *EtcdClusterServer) Leader() (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return etcdLeader(ctx, c.Endpoints())
}

// EtcdCluster starts an etcd cluster of n members (n odd) for t, each in a
// process of its own, waits until it has a leader and every member
// answers, and stops it when t ends. The members run the helper program
// cmd/etcdmember, built once per test binary with the go command (see
// helper.go): the etcd server is the helper's dependency, not the
// dependency of every module whose tests start etcd.
// DISTLOCK_TEST_ETCD_CLUSTER=url1,url2,... makes it use a running cluster
// instead (its members cannot be stopped by the test).
func EtcdCluster(t testing.TB, n int) *EtcdClusterServer {
	t.Helper()
	if n < 1 || n%2 == 0 {
		t.Fatalf("testserver: EtcdCluster(%d): n must be odd", n)
	}
	k := etcdKind
	k.envVar = "DISTLOCK_TEST_ETCD_CLUSTER"
	src, env := k.choose(t, true)
	c := &EtcdClusterServer{}
	if src == sourceEnv {
		for _, ep := range splitList(env) {
			c.Members = append(c.Members, &EtcdMember{Endpoint: ep, node: node{t: t, envVar: k.envVar}})
		}
		return c
	}
	c.Members = startEtcdMembers(t, n)
	return c
}

// startEtcdMembers starts n members of one new cluster and waits until
// each answers with a leader. A member that exits before it answered
// (most likely because another process took its port between the
// reservation and the start) makes it try again with other ports.
func startEtcdMembers(t testing.TB, n int) []*EtcdMember {
	t.Helper()
	exe := helperBinary(t, "etcdmember")
	var lastErr error
	for range 3 {
		ms, err := tryEtcdMembers(t, exe, n)
		if err == nil {
			return ms
		}
		lastErr = err
	}
	t.Fatalf("testserver: etcd: %v", lastErr)
	return nil
}

func tryEtcdMembers(t testing.TB, exe string, n int) ([]*EtcdMember, error) {
	t.Helper()
	ports, release, err := reservePorts(2 * n)
	if err != nil {
		t.Fatalf("testserver: %v", err)
	}
	var peers []string
	for i := range n {
		peers = append(peers, fmt.Sprintf("m%d=http://%s", i, hostPort(ports[2*i+1])))
	}
	release()
	var ms []*EtcdMember
	var ps []*process
	for i := range n {
		dir := t.TempDir()
		name := fmt.Sprintf("m%d", i)
		ep := "http://" + hostPort(ports[2*i])
		logPath := filepath.Join(dir, "etcd.log")
		p := newProcess(t, "etcd "+name+" "+ep, logPath, exe,
			"-name", name,
			"-dir", filepath.Join(dir, "data"),
			"-log", logPath,
			"-client-port", strconv.Itoa(ports[2*i]),
			"-peer-port", strconv.Itoa(ports[2*i+1]),
			"-initial-cluster", strings.Join(peers, ","))
		p.dir = dir
		ms = append(ms, &EtcdMember{Endpoint: ep, node: node{t: t, proc: p, ready: func() error { return etcdMemberReady(ep) }}})
		ps = append(ps, p)
	}
	// Members shut down gracefully would wait for each other (a leader
	// tries for seconds to hand its leadership over): kill them together.
	t.Cleanup(func() { killAll(ps) })
	for _, p := range ps {
		if err := p.start(); err != nil {
			t.Fatalf("testserver: %v", err)
		}
	}
	for _, m := range ms {
		if err := m.proc.waitReady(m.ready); err != nil {
			exited := m.proc.hasExited()
			killAll(ps)
			if exited {
				return nil, err
			}
			t.Fatalf("testserver: etcd: %v", err)
		}
	}
	return ms, nil
}
