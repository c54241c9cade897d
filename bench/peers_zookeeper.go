package main

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock"
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
			return openZKDistlock(s, o)
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

type silentLogger struct{}

func (silentLogger) Printf(string, ...any) {}

func zkConnect(s *servers) (*zk.Conn, error) {
	addr, err := s.zkAddr()
	if err != nil {
		return nil, err
	}
	conn, _, err := zk.Connect([]string{addr}, zkSessionTimeout, zk.WithLogger(silentLogger{}))
	if err != nil {
		return nil, err
	}
	// Wait for the session, so that the first measured call does not.
	deadline := time.Now().Add(10 * time.Second)
	for conn.State() != zk.StateHasSession {
		if time.Now().After(deadline) {
			conn.Close()
			return nil, errors.New("zookeeper: no session after 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return conn, nil
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

func openZKDistlock(s *servers, o openOpts) (instance, error) {
	conn, err := zkConnect(s)
	if err != nil {
		return nil, err
	}
	res, err := zookeeper.New(conn, zookeeper.WithSessionTimeout(zkSessionTimeout))
	if err != nil {
		conn.Close()
		return nil, err
	}
	p := zkProbe{conn: conn, dir: func(key string) string { return zookeeper.DefaultRoot + "/" + key }}
	o.autoRenew = true
	return newDLInstance(res, o, p, []distlock.Option{}, func() error { conn.Close(); return nil })
}

// --- zk.Lock ---

const zkLockRoot = "/bench-zklock/"

type zkLock struct {
	zkProbe
	conn *zk.Conn

	mu    sync.Mutex
	locks map[string]*zk.Lock // cycle's, reused per key
}

func openZKLock(_ context.Context, s *servers, _ openOpts) (instance, error) {
	conn, err := zkConnect(s)
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
