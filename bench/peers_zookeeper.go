package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock/internal/stores"
	"github.com/distlock/distlock/zookeeper"
)

// zkSessionTimeout is every instance's session timeout.
const zkSessionTimeout = 10 * time.Second

func init() {
	register(&peer{
		name: "zk.Lock", store: "zookeeper", ref: true,
		note:     "github.com/go-zookeeper/zk Lock: protected ephemeral sequential znode, watch on the predecessor; no wait limit (Lock blocks until held)",
		renewal:  "session pings: a lock lives as long as the session",
		open:     openZKLock,
		counters: zkCounters,
	})
	register(&peer{
		name: "distlock", store: "zookeeper", elects: true,
		note:    "zookeeper.New, WithAutoRenew: ephemeral sequential znode (a multi-op create that tells its czxid and whether it is alone), watch on the predecessor; the session keeps the lock",
		renewal: "WithAutoRenew: the session keeps the locks (pings), plus a read per third of the session timeout for the loss deadline",
		open: func(ctx context.Context, s *servers, o openOpts) (instance, error) {
			return openZKDistlock(ctx, s, o)
		},
		counters: zkCounters,
	})
}

func zkCounters(_ context.Context, s *servers) (counts, error) {
	addr, err := s.zkAddr()
	if err != nil {
		return counts{}, err
	}
	n, err := zkPackets(addr)
	return counts{rt: n, cmds: n}, err
}

// zkDial bounds the wait for a session, so that the first measured call
// does not wait for one.
const zkDial = 10 * time.Second

func zkConnect(ctx context.Context, s *servers) (*zk.Conn, error) {
	addr, err := s.zkAddr()
	if err != nil {
		return nil, err
	}
	conn, _, err := stores.ConnectZooKeeper(ctx, []string{addr}, zkSessionTimeout, zkDial)
	return conn, err
}

// zkProbe: a waiter waits once its znode is queued behind the holder's.
type zkProbe struct {
	conn *zk.Conn
	dir  func(key string) string
}

func (zkProbe) mark(string) int64 { return 0 }

func (p zkProbe) waiting(_ context.Context, key string, _ int64) bool {
	cs, _, err := p.conn.Children(p.dir(key))
	if err != nil {
		return false
	}
	n := 0
	for _, c := range cs {
		if strings.Contains(c, "lock-") {
			n++
		}
	}
	return n >= 2
}

func openZKDistlock(ctx context.Context, s *servers, o openOpts) (instance, error) {
	addr, err := s.zkAddr()
	if err != nil {
		return nil, err
	}
	// The probe lists the queue through the instance's own connection.
	p := &zkProbe{dir: func(key string) string { return zookeeper.DefaultRoot + "/" + key }}
	o.autoRenew = true
	raw := fmt.Sprintf("zk://%s?session_timeout=%v&dial_timeout=%v", addr, zkSessionTimeout, zkDial)
	return openDistlock(ctx, raw, o, p, stores.Options{
		ZooKeeper:     []zookeeper.Option{zookeeper.WithSessionTimeout(zkSessionTimeout)},
		ZooKeeperConn: func(c *zk.Conn) { p.conn = c },
	})
}

// --- zk.Lock ---

const zkLockRoot = "/bench-zklock/"

type zkLock struct {
	zkProbe
	conn *zk.Conn

	mu    sync.Mutex
	locks map[string]*zk.Lock // cycle's, reused per key
}

func openZKLock(ctx context.Context, s *servers, _ openOpts) (instance, error) {
	conn, err := zkConnect(ctx, s)
	if err != nil {
		return nil, err
	}
	return &zkLock{
		zkProbe: zkProbe{conn: conn, dir: func(key string) string { return zkLockRoot + key }},
		conn:    conn,
		locks:   map[string]*zk.Lock{},
	}, nil
}

func (z *zkLock) cycle(_ context.Context, key string) error {
	z.mu.Lock()
	l := z.locks[key]
	if l == nil {
		l = zk.NewLock(z.conn, zkLockRoot+key, zk.WorldACL(zk.PermAll))
		z.locks[key] = l
	}
	z.mu.Unlock()
	if err := l.Lock(); err != nil {
		return err
	}
	return l.Unlock()
}

func (z *zkLock) worker(context.Context) (locker, error) { return z, nil }

// lock ignores wait: zk.Lock has no timeout and no context.
func (z *zkLock) lock(_ context.Context, key string, _ time.Duration) (held, error) {
	l := zk.NewLock(z.conn, zkLockRoot+key, zk.WorldACL(zk.PermAll))
	if err := l.Lock(); err != nil {
		return nil, err
	}
	return zkHeld{l}, nil
}

// zkHeld is a held *zk.Lock.
type zkHeld struct{ l *zk.Lock }

func (h zkHeld) unlock(context.Context) error { return h.l.Unlock() }

func (z *zkLock) close() error { z.conn.Close(); return nil }
