package stores

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/internal/testserver"
)

// TestOpen opens every store from its URL against a real server, takes
// and releases a lock through it, and checks that the hooks of Options
// saw the clients Open made.
func TestOpen(t *testing.T) {
	type hooks struct {
		redis, postgres atomic.Int64
		zkConn          atomic.Pointer[zk.Conn]
	}
	for _, tc := range []struct {
		name  string
		url   func(t *testing.T) string
		check func(t *testing.T, s Store, h *hooks)
	}{
		{"redis", func(t *testing.T) string { return "redis://" + testserver.Redis(t).Addr },
			func(t *testing.T, _ Store, h *hooks) {
				if h.redis.Load() == 0 {
					t.Error("RedisHook saw no command")
				}
			}},
		{"redlock", func(t *testing.T) string {
			var urls []string
			for _, n := range testserver.RedisNodes(t, 3) {
				urls = append(urls, "redis://"+n.Addr)
			}
			return "redlock:" + strings.Join(urls, ",")
		}, func(t *testing.T, _ Store, h *hooks) {
			if h.redis.Load() < 3 {
				t.Errorf("RedisHook saw %d commands; want one per node at least", h.redis.Load())
			}
		}},
		{"etcd", func(t *testing.T) string {
			return "etcd://" + strings.ReplaceAll(strings.Join(testserver.Etcd(t).Endpoints, ","), "http://", "")
		}, nil},
		{"zookeeper", func(t *testing.T) string { return "zk://" + testserver.ZooKeeper(t).Addr + "/stores-test" },
			func(t *testing.T, s Store, h *hooks) {
				c := h.zkConn.Load()
				if c == nil {
					t.Fatal("ZooKeeperConn was not called")
				}
				if st := c.State(); st != zk.StateHasSession {
					t.Errorf("ZooKeeperConn's connection in state %v; want a session", st)
				}
				if got := s.Holds(time.Second); !strings.Contains(got, "which times out") {
					t.Errorf("Holds = %q; want the session timeout the server granted", got)
				}
			}},
		{"postgres", func(t *testing.T) string { return testserver.Postgres(t).DSN },
			func(t *testing.T, _ Store, h *hooks) {
				if h.postgres.Load() == 0 {
					t.Error("PostgresTracer saw no query")
				}
			}},
		{"mysql", func(t *testing.T) string { return "mysql://" + testserver.MariaDB(t).DSN }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h hooks
			o := Options{
				RedisHook:      countHook{&h.redis},
				PostgresTracer: countTracer{&h.postgres},
				ZooKeeperConn:  func(c *zk.Conn) { h.zkConn.Store(c) },
			}
			s, err := Parse(tc.url(t), o)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			res, closeClients, err := s.Open(ctx, 10*time.Second)
			if err != nil {
				t.Fatalf("Open %s: %v", s, err)
			}
			defer closeClients()
			d, err := distlock.New(res)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			lk, err := d.TryLock(ctx, t.Name(), 0)
			if err != nil {
				t.Fatalf("TryLock through %s: %v", s, err)
			}
			if err := lk.Unlock(ctx); err != nil {
				t.Fatalf("Unlock through %s: %v", s, err)
			}
			if tc.check != nil {
				tc.check(t, s, &h)
			}
		})
	}
}

// TestOpenUnreachable: Open reports a store that does not answer within
// the URL's dial timeout, saying which and how long it waited.
func TestOpenUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // refused from now on
	for _, raw := range []string{
		"zk://" + addr + "?dial_timeout=300ms",
		"etcd://" + addr + "?dial_timeout=300ms",
	} {
		start := time.Now()
		_, _, err := Open(t.Context(), raw, time.Second, Options{})
		if err == nil {
			t.Fatalf("Open(%s) = nil; want an error", raw)
		}
		if !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "300ms") {
			t.Errorf("Open(%s) = %v; want it to name %s and the 300ms it waited", raw, err, addr)
		}
		if el := time.Since(start); el > 10*time.Second {
			t.Errorf("Open(%s) took %v; want about the dial timeout", raw, el)
		}
	}
}

// countHook counts the commands (and pipelines) a Redis client sends.
type countHook struct{ n *atomic.Int64 }

func (countHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h countHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h countHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// countTracer counts the queries a PostgreSQL pool runs.
type countTracer struct{ n *atomic.Int64 }

func (c countTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (countTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
