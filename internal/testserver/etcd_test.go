package testserver

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func etcdClient(t *testing.T, endpoints []string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestEtcdPutGet(t *testing.T) {
	s := Etcd(t)
	c := etcdClient(t, s.Endpoints)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, "smoke", "hello"); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Get(ctx, "smoke")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "hello" {
		t.Fatalf("Get(smoke) = %v; want hello", resp.Kvs)
	}

	s.Restart()
	ctx, cancel = context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	resp, err = c.Get(ctx, "smoke")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "hello" {
		t.Fatalf("Get(smoke) after Restart = %v; want hello", resp.Kvs)
	}
}

func TestEtcdClusterSurvivesOneStopped(t *testing.T) {
	start := time.Now()
	c := EtcdCluster(t, 3)
	t.Logf("cluster up in %v", time.Since(start))
	leader, err := c.Leader()
	if err != nil {
		t.Fatal(err)
	}
	cli := etcdClient(t, c.Endpoints())
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "before", "1"); err != nil {
		t.Fatal(err)
	}

	// Killing the leader forces an election; the two left keep a quorum.
	c.Members[leader].Kill()
	for {
		// A request in flight while the leader dies times out; retry.
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := cli.Put(actx, "after", "2")
		acancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("put after the leader was killed: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // polling with a deadline
	}
	if l, err := c.Leader(); err != nil || l == leader {
		t.Fatalf("Leader() = %d, %v; want a new leader", l, err)
	}

	t.Logf("put after kill at %v", time.Since(start))
	c.Members[leader].Restart()
	t.Logf("restarted at %v", time.Since(start))
	solo := etcdClient(t, []string{c.Members[leader].Endpoint})
	resp, err := solo.Get(ctx, "after") // linearizable: goes through the leader
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "2" {
		t.Fatalf("Get(after) on the restarted member = %v; want 2", resp.Kvs)
	}
	t.Logf("done at %v", time.Since(start))
}
