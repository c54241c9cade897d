package main

import (
	"context"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/etcd"
)

func init() {
	openers["etcd"] = func(_ context.Context, a addrs) (store, error) {
		return &etcdStore{endpoints: strings.Split(a.etcd, ",")}, nil
	}
}

// etcdStore is one etcd cluster; each instance gets its own client.
type etcdStore struct{ endpoints []string }

func (s *etcdStore) resource(context.Context, bool) (backend.RemoteResource, func() error, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: s.endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, nil, err
	}
	res, err := etcd.New(c)
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	return res, c.Close, nil
}

func (s *etcdStore) commands(context.Context) (map[string]uint64, error) { return nil, nil }

func (s *etcdStore) close() error { return nil }
