package testserver

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

var etcdKind = kind{
	name:    "etcd",
	envVar:  "DISTLOCK_TEST_ETCD",
	binary:  "etcd (it runs in the test process)",
	install: "nothing: etcd is a Go module dependency",
}

// EtcdServer is a one-member etcd for one test, running inside the test
// process. Stop and Restart close it and start it again on the same
// endpoint with the same data; they skip the test for an external server
// (fail it when CI is set).
type EtcdServer struct {
	// Endpoints are the client URLs, e.g. "http://127.0.0.1:2379".
	Endpoints []string

	t   testing.TB
	cfg *embed.Config // nil for an external server

	mu sync.Mutex
	e  *embed.Etcd
}

// Etcd starts a one-member etcd inside the test process
// (go.etcd.io/etcd/server/v3/embed) in a temp dir and stops it when t
// ends. DISTLOCK_TEST_ETCD=http://host:port[,...] makes it use a running
// server instead.
func Etcd(t testing.TB) *EtcdServer {
	t.Helper()
	src, env := etcdKind.choose(t, true)
	if src == sourceEnv {
		return &EtcdServer{Endpoints: splitList(env), t: t}
	}
	dir := t.TempDir()
	logPath := filepath.Join(dir, "etcd.log")
	s := &EtcdServer{t: t}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			p := &process{t: t, name: "etcd", log: logPath}
			p.dumpLog()
		}
	})
	var lastErr error
	for range 3 {
		ports, release, err := reservePorts(2)
		if err != nil {
			t.Fatalf("testserver: %v", err)
		}
		release()
		cfg := etcdConfig("default", filepath.Join(dir, "data"), logPath, ports[0], ports[1])
		cfg.InitialCluster = fmt.Sprintf("default=http://%s", hostPort(ports[1]))
		s.cfg = cfg
		if lastErr = s.start(); lastErr == nil {
			s.Endpoints = []string{"http://" + hostPort(ports[0])}
			return s
		}
	}
	t.Fatalf("testserver: etcd: %v", lastErr)
	return nil
}

// etcdConfig is the configuration of one member; the caller sets
// InitialCluster.
func etcdConfig(name, dataDir, logPath string, clientPort, peerPort int) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = dataDir
	cu := url.URL{Scheme: "http", Host: hostPort(clientPort)}
	pu := url.URL{Scheme: "http", Host: hostPort(peerPort)}
	cfg.ListenClientUrls = []url.URL{cu}
	cfg.AdvertiseClientUrls = []url.URL{cu}
	cfg.ListenPeerUrls = []url.URL{pu}
	cfg.AdvertisePeerUrls = []url.URL{pu}
	cfg.LogOutputs = []string{logPath}
	cfg.LogLevel = "info"
	cfg.UnsafeNoFsync = true
	cfg.InitialClusterToken = "distlock-test"
	return cfg
}

func (s *EtcdServer) start() error {
	e, err := startEmbed(s.cfg)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.e = e
	s.mu.Unlock()
	return nil
}

// startEmbed starts an embedded member and waits until it serves.
func startEmbed(cfg *embed.Config) (*embed.Etcd, error) {
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, err
	case <-time.After(startTimeout):
		e.Close()
		return nil, fmt.Errorf("not ready within %v", startTimeout)
	}
}

// Stop closes the server; its clients see the endpoint refuse connections.
// Stopping a stopped server does nothing.
func (s *EtcdServer) Stop() {
	if s.cfg == nil {
		s.t.Helper()
		notControllable(s.t, "stop", etcdKind.envVar)
	}
	s.mu.Lock()
	e := s.e
	s.e = nil
	s.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Restart stops the server if it runs and starts it again on the same
// endpoint with the same data.
func (s *EtcdServer) Restart() {
	s.t.Helper()
	s.Stop()
	var err error
	// The old listeners may take a moment to let go of the ports.
	if perr := pollReady(func() error { err = s.start(); return err }); perr != nil {
		s.t.Fatalf("testserver: etcd restart: %v", err)
	}
}

// etcdLeader returns the index in endpoints of the member that is leader.
func etcdLeader(ctx context.Context, endpoints []string) (int, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, Logger: nopZap})
	if err != nil {
		return -1, err
	}
	defer c.Close()
	var lastErr error
	for i, ep := range endpoints {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := c.Status(ctx, ep)
		cancel()
		if err != nil {
			lastErr = err
			continue
		}
		if st.Leader != 0 && st.Leader == st.Header.MemberId {
			return i, nil
		}
	}
	if lastErr == nil {
		lastErr = fmt.Errorf("no member is leader")
	}
	return -1, fmt.Errorf("etcd: no leader among %v: %w", endpoints, lastErr)
}

// nopZap silences the clients testserver makes for itself.
var nopZap = zap.NewNop()
