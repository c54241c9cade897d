package testserver

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
)

// etcdMemberEnv carries an etcd member's configuration to a re-executed
// test binary; see init.
const etcdMemberEnv = "DISTLOCK_TESTSERVER_ETCD_MEMBER"

// EtcdMember is one member of an [EtcdClusterServer]. It runs in a process
// of its own (the test binary executed again), so it can be stopped,
// killed, paused and restarted like any server; it keeps its data across a
// restart and rejoins the cluster.
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

// etcdMemberConfig is what a member process needs to start.
type etcdMemberConfig struct {
	Name           string
	Dir            string
	Log            string
	ClientPort     int
	PeerPort       int
	InitialCluster string
}

// EtcdCluster starts an etcd cluster of n members (n odd) for t, each in a
// process of its own, waits until it has a leader and every member
// answers, and stops it when t ends. The member processes are the test
// binary itself executed again: etcd is linked into every test binary that
// imports this package, and nothing needs installing.
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
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("testserver: etcd cluster: %v", err)
	}
	ports, release, err := reservePorts(2 * n)
	if err != nil {
		t.Fatalf("testserver: %v", err)
	}
	var peers []string
	for i := range n {
		peers = append(peers, fmt.Sprintf("m%d=http://%s", i, hostPort(ports[2*i+1])))
	}
	release()
	for i := range n {
		dir := t.TempDir()
		mc := etcdMemberConfig{
			Name:           fmt.Sprintf("m%d", i),
			Dir:            filepath.Join(dir, "data"),
			Log:            filepath.Join(dir, "etcd.log"),
			ClientPort:     ports[2*i],
			PeerPort:       ports[2*i+1],
			InitialCluster: strings.Join(peers, ","),
		}
		js, err := json.Marshal(mc)
		if err != nil {
			t.Fatalf("testserver: %v", err)
		}
		ep := "http://" + hostPort(mc.ClientPort)
		p := newProcess(t, "etcd "+mc.Name+" "+ep, mc.Log, exe)
		p.dir = dir
		p.env = append(os.Environ(), etcdMemberEnv+"="+string(js))
		m := &EtcdMember{Endpoint: ep, node: node{t: t, proc: p, ready: func() error { return etcdMemberReady(ep) }}}
		c.Members = append(c.Members, m)
	}
	t.Cleanup(func() {
		var ps []*process
		for _, m := range c.Members {
			ps = append(ps, m.proc)
		}
		killAll(ps)
	})
	for _, m := range c.Members {
		if err := m.proc.start(); err != nil {
			t.Fatalf("testserver: %v", err)
		}
	}
	for _, m := range c.Members {
		if err := m.proc.waitReady(m.ready); err != nil {
			t.Fatalf("testserver: etcd cluster: %v", err)
		}
	}
	return c
}

// etcdMemberReady succeeds when the member at ep answers and knows a
// leader.
func etcdMemberReady(ep string) error {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 2 * time.Second, Logger: nopZap})
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := c.Status(ctx, ep)
	if err != nil {
		return err
	}
	if st.Leader == 0 {
		return fmt.Errorf("etcd %s: no leader", ep)
	}
	return nil
}

// init turns a test binary started by EtcdCluster into an etcd member: it
// runs the member until SIGTERM or SIGINT and exits, before any test runs.
func init() {
	js := os.Getenv(etcdMemberEnv)
	if js == "" {
		return
	}
	if err := runEtcdMember(js); err != nil {
		fmt.Fprintf(os.Stderr, "testserver: etcd member: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runEtcdMember(js string) error {
	var mc etcdMemberConfig
	if err := json.Unmarshal([]byte(js), &mc); err != nil {
		return err
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	cfg := etcdConfig(mc.Name, mc.Dir, mc.Log, mc.ClientPort, mc.PeerPort)
	cfg.InitialCluster = mc.InitialCluster
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	defer e.Close()
	select {
	case <-stop:
		return nil
	case err := <-e.Err():
		return err
	}
}
