package etcd

// Temporary: a three-member cluster in process until
// testserver.EtcdCluster lands on main.

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

func freeURL(t testing.TB) url.URL {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return url.URL{Scheme: "http", Host: addr}
}

func TestFailoverTmp(t *testing.T) {
	const n = 3
	cfgs := make([]*embed.Config, n)
	var ic []string
	var endpoints []string
	for i := range cfgs {
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.Dir = t.TempDir()
		cu, pu := freeURL(t), freeURL(t)
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		cfg.UnsafeNoFsync = true
		ic = append(ic, cfg.Name+"="+pu.String())
		endpoints = append(endpoints, cu.String())
		cfgs[i] = cfg
	}
	es := make([]*embed.Etcd, n)
	errc := make(chan error, n)
	for i, cfg := range cfgs {
		cfg.InitialCluster = strings.Join(ic, ",")
		go func() {
			e, err := embed.StartEtcd(cfg)
			es[i] = e
			errc <- err
		}()
	}
	for range n {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, e := range es {
			if e != nil {
				e.Close()
			}
		}
	})
	for _, e := range es {
		<-e.Server.ReadyNotify()
	}
	stopLeader := func() func() {
		for i, e := range es {
			if e != nil && e.Server.Leader() == e.Server.MemberID() {
				e.Close()
				es[i] = nil
				return func() {
					cfgs[i].ClusterState = embed.ClusterStateFlagExisting
					ne, err := embed.StartEtcd(cfgs[i])
					if err != nil {
						t.Errorf("restart: %v", err)
						return
					}
					cfgs[i].ClusterState = embed.ClusterStateFlagExisting
					es[i] = ne
					select {
					case <-ne.Server.ReadyNotify():
					case <-time.After(20 * time.Second):
						t.Errorf("restarted member not ready")
					}
				}
			}
		}
		t.Fatal("no leader")
		return nil
	}
	testFailover(t, endpoints, stopLeader)
}
