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
