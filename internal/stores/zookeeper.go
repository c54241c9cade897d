package stores

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/zookeeper"
)

// zkStore is a ZooKeeper ensemble.
type zkStore struct {
	name    string
	servers []string
	opts    []zookeeper.Option
	session time.Duration // 0: the TTL
	dial    time.Duration
	granted time.Duration  // the session timeout the server granted, once Open
	onConn  func(*zk.Conn) // Options.ZooKeeperConn
}

func parseZooKeeper(raw string, so Options) (*zkStore, error) {
	h, err := parseHostList(raw, 2181, "session_timeout", "dial_timeout")
	if err != nil {
		return nil, err
	}
	if h.user != nil {
		return nil, errors.New("ZooKeeper credentials in the URL are not supported")
	}
	s := &zkStore{name: h.name, servers: h.hosts, onConn: so.ZooKeeperConn}
	if s.session, err = h.duration("session_timeout", 0); err != nil {
		return nil, err
	}
	if s.dial, err = h.duration("dial_timeout", defaultDialTimeout); err != nil {
		return nil, err
	}
	if root := strings.TrimSuffix(h.path, "/"); root != "" {
		s.opts = append(s.opts, zookeeper.WithRoot(root))
	}
	s.opts = append(s.opts, so.ZooKeeper...)
	if _, err := s.protoRes(); err != nil { // a bad root
		return nil, err
	}
	return s, nil
}

// protoRes is a Resource over a connection that was never opened.
func (s *zkStore) protoRes() (*zookeeper.Resource, error) {
	return zookeeper.New(new(zk.Conn), s.opts...)
}

func (s *zkStore) String() string { return s.name }

// ValidateKey asks the ZooKeeper store's own ValidateKey, on a Resource
// over a connection that was never opened: it checks the key and the root.
func (s *zkStore) ValidateKey(key string) error {
	r, err := s.protoRes()
	if err != nil {
		return err
	}
	return r.ValidateKey(key)
}

// Proto is a Resource over a connection that was never opened (parseZooKeeper
// checked that New takes the options).
func (s *zkStore) Proto() backend.RemoteResource {
	r, _ := s.protoRes()
	return r
}

// holds: on ZooKeeper a lock distlock renews lives as long as the
// session, whose timeout the server keeps within its bounds (by default
// 4s to 40s) whatever was asked.
func (s *zkStore) Holds(ttl time.Duration) string {
	asked := cmp.Or(s.session, ttl)
	if s.granted == 0 {
		return fmt.Sprintf("as long as the session, asked to time out after %v", asked)
	}
	return fmt.Sprintf("as long as the session, which times out %v after the server last heard from distlock (asked: %v; the server keeps it within its bounds)", s.granted, asked)
}

func (s *zkStore) Open(ctx context.Context, ttl time.Duration) (backend.RemoteResource, func(), error) {
	conn, granted, err := ConnectZooKeeper(ctx, s.servers, cmp.Or(s.session, ttl), s.dial)
	if err != nil {
		return nil, nil, err
	}
	s.granted = granted
	res, err := zookeeper.New(conn, s.opts...)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	if s.onConn != nil {
		s.onConn(conn)
	}
	return res, conn.Close, nil
}

// ConnectZooKeeper connects to servers (HOST:PORT), asking for a session
// that times out after session, and waits for the session, as
// zookeeper.New needs one: within dial, or until ctx ends if sooner. It
// returns the connection and the session timeout the server granted (it
// keeps it within its bounds, by default 4s to 40s). go-zookeeper's log
// lines are dropped; the error says why no session came when the log did.
// The connection's events are drained: the resource watches the
// connection itself.
func ConnectZooKeeper(ctx context.Context, servers []string, session, dial time.Duration) (*zk.Conn, time.Duration, error) {
	// go-zookeeper tells only its log why it cannot connect, and what
	// session timeout the server granted: listen to it.
	zl := &zkLog{session: make(chan time.Duration, 1)}
	conn, events, err := zk.Connect(servers, session, zk.WithLogger(zl))
	if err != nil {
		return nil, 0, err
	}
	go func() {
		for range events {
		}
	}()
	bound := within(ctx, dial)
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	select {
	case granted := <-zl.session:
		return conn, granted, nil
	case <-ctx.Done():
		conn.Close()
		if last := zl.lastError(); last != "" {
			return nil, 0, fmt.Errorf("no session with %s within %v: %s", strings.Join(servers, ","), bound, last)
		}
		return nil, 0, fmt.Errorf("no session with %s within %v: %w", strings.Join(servers, ","), bound, context.Cause(ctx))
	}
}

// zkLog is go-zookeeper's logger: it keeps the last failure to connect,
// and sends the session timeout the server granted on session.
type zkLog struct {
	mu      sync.Mutex
	last    string
	session chan time.Duration // buffered 1
}

func (l *zkLog) Printf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	switch {
	case strings.HasPrefix(format, "authenticated:"):
		var id int64
		var ms int32
		if _, err := fmt.Sscanf(msg, "authenticated: id=%d, timeout=%d", &id, &ms); err == nil {
			select {
			case l.session <- time.Duration(ms) * time.Millisecond:
			default: // a later session: the first one is what Open waits for
			}
		}
	case strings.HasPrefix(format, "failed to connect"):
		l.mu.Lock()
		l.last = msg
		l.mu.Unlock()
	}
}

func (l *zkLog) lastError() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last
}
