package main

import (
	"context"
	"io"
	"log"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/zookeeper"
)

func init() {
	openers["zookeeper"] = func(_ context.Context, a addrs) (store, error) {
		return &zkStore{servers: strings.Split(a.zookeeper, ",")}, nil
	}
}

// zkStore is one ZooKeeper ensemble; each instance gets its own session.
type zkStore struct{ servers []string }

func (s *zkStore) resource(context.Context, bool) (backend.RemoteResource, func() error, error) {
	conn, _, err := zk.Connect(s.servers, 10*time.Second, zk.WithLogger(log.New(io.Discard, "", 0)))
	if err != nil {
		return nil, nil, err
	}
	res, err := zookeeper.New(conn)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return res, func() error { conn.Close(); return nil }, nil
}

func (s *zkStore) commands(context.Context) (map[string]uint64, error) { return nil, nil }

func (s *zkStore) close() error { return nil }
