package harness

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/etcd"
	"github.com/distlock/distlock/internal/stores"
	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/zookeeper"
)

// Backend says which store a worker locks in and how it connects. It is
// passed to worker processes as JSON.
type Backend struct {
	// Kind is "redis", "redlock", "etcd", "zookeeper", "postgres" or
	// "mysql".
	Kind string
	// Addrs are the servers: host:port (Redis, Redlock's nodes,
	// ZooKeeper), URLs (etcd), or one DSN (postgres://..., or
	// go-sql-driver's for mysql).
	Addrs []string
	// Timeout bounds a client's dial and each request's reply, where the
	// client has such a setting (Redis dial and read/write timeouts, etcd
	// dial, PostgreSQL connect in whole seconds). Default 1s.
	Timeout time.Duration
	// WaitReplicas and WaitTimeout are redis.WithWaitReplicas.
	WaitReplicas int
	WaitTimeout  time.Duration
	// SessionTimeout is the ZooKeeper session timeout, also given to
	// zookeeper.WithSessionTimeout. Default 1s.
	SessionTimeout time.Duration
	// Table is the lock table of postgres and mysql, given to
	// sqldb.WithTable as written. Default sqldb.DefaultTable.
	Table string
	// SharedLease gives etcd.WithSharedLease to an etcd resource: every
	// lock on the shared lease of its TTL, not only auto-renewed ones.
	SharedLease bool
}

func (b Backend) timeout() time.Duration {
	if b.Timeout > 0 {
		return b.Timeout
	}
	return time.Second
}

// Open connects to the store and returns a resource over it and a
// function that closes the resource and what Open opened. It opens
// through internal/stores, with the URL and options url gives.
func (b Backend) Open(ctx context.Context) (backend.RemoteResource, func(), error) {
	raw, o, err := b.url()
	if err != nil {
		return nil, nil, err
	}
	// The TTL only sizes a ZooKeeper session, and url names that.
	res, closeClients, err := stores.Open(ctx, raw, b.sessionTimeout(), o)
	if err != nil {
		return nil, nil, fmt.Errorf("harness: %w", err)
	}
	return res, func() {
		if c, ok := res.(io.Closer); ok {
			_ = c.Close()
		}
		closeClients()
	}, nil
}

// url is b as a store URL and the options that say what a URL does not.
func (b Backend) url() (string, stores.Options, error) {
	var o stores.Options
	if len(b.Addrs) == 0 {
		return "", o, fmt.Errorf("harness: backend %q has no address", b.Kind)
	}
	t := b.timeout().String()
	// go-redis's URL options: each request's bounds, as a client under
	// faults needs them.
	redisQuery := "?dial_timeout=" + t + "&read_timeout=" + t + "&write_timeout=" + t
	switch b.Kind {
	case "redis":
		if b.WaitReplicas > 0 {
			o.Redis = append(o.Redis, redis.WithWaitReplicas(b.WaitReplicas, b.WaitTimeout))
		}
		return "redis://" + b.Addrs[0] + redisQuery, o, nil
	case "redlock":
		nodes := make([]string, len(b.Addrs))
		for i, a := range b.Addrs {
			nodes[i] = "redis://" + a + redisQuery + "&max_retries=-1"
		}
		return "redlock:" + strings.Join(nodes, ","), o, nil
	case "etcd":
		hosts := make([]string, len(b.Addrs))
		for i, a := range b.Addrs {
			hosts[i] = strings.TrimPrefix(a, "http://")
		}
		if b.SharedLease {
			o.Etcd = append(o.Etcd, etcd.WithSharedLease())
		}
		return "etcd://" + strings.Join(hosts, ",") + "?dial_timeout=" + t, o, nil
	case "zookeeper":
		// The wait for a session: as long as a worker gives Open (30s),
		// or less when the caller's ctx ends sooner.
		o.ZooKeeper = append(o.ZooKeeper, zookeeper.WithSessionTimeout(b.sessionTimeout()))
		return "zk://" + strings.Join(b.Addrs, ",") + "?session_timeout=" + b.sessionTimeout().String() + "&dial_timeout=30s", o, nil
	case "postgres":
		u, err := url.Parse(b.Addrs[0])
		if err != nil {
			return "", o, fmt.Errorf("harness: postgres DSN: %w", err)
		}
		q := u.Query()
		q.Set("connect_timeout", strconv.Itoa(int((b.timeout()+time.Second-1)/time.Second))) // whole seconds
		u.RawQuery = q.Encode()
		o.Table, o.TableSet = b.Table, b.Table != ""
		return u.String(), o, nil
	case "mysql":
		o.Table, o.TableSet = b.Table, b.Table != ""
		return "mysql://" + b.Addrs[0], o, nil
	}
	return "", o, fmt.Errorf("harness: unknown backend %q", b.Kind)
}

func (b Backend) sessionTimeout() time.Duration {
	if b.SessionTimeout > 0 {
		return b.SessionTimeout
	}
	return time.Second
}
