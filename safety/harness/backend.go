package harness

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	_ "github.com/go-sql-driver/mysql" // database/sql driver "mysql"
	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/etcd"
	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/redlock"
	"github.com/distlock/distlock/sqldb"
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
	// client has such a setting (Redis read/write timeouts, etcd dial).
	// Default 1s.
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
// function that closes what Open opened.
func (b Backend) Open(ctx context.Context) (backend.RemoteResource, func(), error) {
	switch b.Kind {
	case "redis":
		c := goredis.NewClient(&goredis.Options{
			Addr:                  b.Addrs[0],
			DialTimeout:           b.timeout(),
			ReadTimeout:           b.timeout(),
			WriteTimeout:          b.timeout(),
			ContextTimeoutEnabled: true,
		})
		var opts []redis.Option
		if b.WaitReplicas > 0 {
			opts = append(opts, redis.WithWaitReplicas(b.WaitReplicas, b.WaitTimeout))
		}
		r, err := redis.New(c, opts...)
		if err != nil {
			_ = c.Close()
			return nil, nil, err
		}
		return r, func() { _ = r.Close(); _ = c.Close() }, nil
	case "etcd":
		c, err := clientv3.New(clientv3.Config{Endpoints: b.Addrs, DialTimeout: b.timeout(), Logger: zap.NewNop()})
		if err != nil {
			return nil, nil, fmt.Errorf("etcd: %w", err)
		}
		var opts []etcd.Option
		if b.SharedLease {
			opts = append(opts, etcd.WithSharedLease())
		}
		r, err := etcd.New(c, opts...)
		if err != nil {
			_ = c.Close()
			return nil, nil, err
		}
		return r, func() { _ = r.Close(); _ = c.Close() }, nil
	case "zookeeper":
		st := b.SessionTimeout
		if st <= 0 {
			st = time.Second
		}
		conn, events, err := zk.Connect(b.Addrs, st, zk.WithLogger(quiet{}))
		if err != nil {
			return nil, nil, fmt.Errorf("zookeeper: %w", err)
		}
		go func() {
			for range events { // the resource polls the connection state itself
			}
		}()
		// Wait for a session, as the resource needs one.
		for conn.State() != zk.StateHasSession {
			select {
			case <-ctx.Done():
				conn.Close()
				return nil, nil, fmt.Errorf("zookeeper: no session: %w", ctx.Err())
			case <-time.After(5 * time.Millisecond): // polling with the ctx's deadline
			}
		}
		r, err := zookeeper.New(conn, zookeeper.WithSessionTimeout(st))
		if err != nil {
			conn.Close()
			return nil, nil, err
		}
		return r, func() { _ = r.Close(); conn.Close() }, nil
	case "postgres":
		cfg, err := pgxpool.ParseConfig(b.Addrs[0])
		if err != nil {
			return nil, nil, err
		}
		cfg.ConnConfig.ConnectTimeout = b.timeout()
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("postgres: %w", err)
		}
		r, err := sqldb.NewPostgres(ctx, pool, b.sqlOptions()...)
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return r, func() { _ = r.Close(); pool.Close() }, nil
	case "mysql":
		db, err := sql.Open("mysql", b.Addrs[0])
		if err != nil {
			return nil, nil, fmt.Errorf("mysql: %w", err)
		}
		r, err := sqldb.NewMySQL(ctx, db, b.sqlOptions()...)
		if err != nil {
			db.Close()
			return nil, nil, err
		}
		return r, func() { _ = r.Close(); db.Close() }, nil
	case "redlock":
		var nodes []goredis.UniversalClient
		closeAll := func() {
			for _, n := range nodes {
				_ = n.Close()
			}
		}
		for _, a := range b.Addrs {
			nodes = append(nodes, goredis.NewClient(&goredis.Options{
				Addr: a, DialTimeout: b.timeout(), ReadTimeout: b.timeout(), WriteTimeout: b.timeout(),
				ContextTimeoutEnabled: true, MaxRetries: -1,
			}))
		}
		r, err := redlock.New(nodes)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		return r, func() { _ = r.Close(); closeAll() }, nil
	}
	return nil, nil, fmt.Errorf("harness: unknown backend %q", b.Kind)
}

func (b Backend) sqlOptions() []sqldb.Option {
	if b.Table == "" {
		return nil
	}
	return []sqldb.Option{sqldb.WithTable(b.Table)}
}

// quiet drops go-zookeeper's log lines.
type quiet struct{}

// Printf drops the line.
func (quiet) Printf(string, ...any) {}
