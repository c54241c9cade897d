// Command etcdmember runs one etcd member (go.etcd.io/etcd/server/v3/embed)
// for package testserver until SIGTERM or SIGINT. testserver builds it from
// this directory when a test first needs etcd, so that the etcd server is
// a dependency of this helper only, never of the modules whose tests start
// etcd.
//
//	etcdmember -name m0 -dir DATA -log FILE -client-port P -peer-port Q \
//		-initial-cluster m0=http://127.0.0.1:Q,...
package main

import (
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	var (
		name           = flag.String("name", "default", "member name")
		dir            = flag.String("dir", "", "data directory")
		logPath        = flag.String("log", "", "log file (default: stderr)")
		clientPort     = flag.Int("client-port", 0, "client port on 127.0.0.1")
		peerPort       = flag.Int("peer-port", 0, "peer port on 127.0.0.1")
		initialCluster = flag.String("initial-cluster", "", "name=peer-url,... (default: this member alone)")
	)
	flag.Parse()
	if *dir == "" || *clientPort == 0 || *peerPort == 0 {
		fmt.Fprintln(os.Stderr, "etcdmember: -dir, -client-port and -peer-port are required")
		os.Exit(2)
	}
	if err := run(*name, *dir, *logPath, *clientPort, *peerPort, *initialCluster); err != nil {
		fmt.Fprintf(os.Stderr, "etcdmember: %v\n", err)
		os.Exit(1)
	}
}

func run(name, dir, logPath string, clientPort, peerPort int, initialCluster string) error {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	cu := url.URL{Scheme: "http", Host: hostPort(clientPort)}
	pu := url.URL{Scheme: "http", Host: hostPort(peerPort)}
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{cu}
	cfg.AdvertiseClientUrls = []url.URL{cu}
	cfg.ListenPeerUrls = []url.URL{pu}
	cfg.AdvertisePeerUrls = []url.URL{pu}
	if logPath != "" {
		cfg.LogOutputs = []string{logPath}
	}
	cfg.LogLevel = "info"
	cfg.UnsafeNoFsync = true
	cfg.InitialClusterToken = "distlock-test"
	if initialCluster == "" {
		initialCluster = name + "=" + pu.String()
	}
	cfg.InitialCluster = initialCluster
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

func hostPort(port int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}
