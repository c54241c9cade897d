package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // testserver.Postgres speaks database/sql
	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/internal/testserver"
)

// servers starts the stores the chosen peers need, once each, through
// internal/testserver (the tests' own starters: same flags, free ports,
// temp dirs, stopped by PID at the end). An address in the testserver
// environment variables (DISTLOCK_TEST_REDIS, ...) is used instead, as in
// the tests; the -redis, -etcd, ... flags set those variables.
type servers struct {
	tb *serverTB

	mu     sync.Mutex
	redis  []*testserver.RedisServer // one standalone node, then the Redlock nodes
	etcd   *testserver.EtcdClusterServer
	zk     *testserver.ZooKeeperServer
	pg     *testserver.PostgresServer
	pgStat *pgx.Conn // reads pg_stat_statements, once enabled; nil before
	my     *testserver.MariaDBServer
	myDB   *sql.DB // reads the server's status (myQuestions)
	failed map[string]error
}

func newServers() *servers {
	return &servers{tb: newServerTB("bench"), failed: map[string]error{}}
}

func (s *servers) close() { s.tb.close() }

// redisAddrs returns the addresses of n independent Redis servers: the
// first is the one every single-node peer uses.
func (s *servers) redisAddrs(n int) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.failed["redis"]; err != nil {
		return nil, err
	}
	if len(s.redis) == 0 {
		r, err := startWith(s.tb, func(t testing.TB) *testserver.RedisServer { return testserver.Redis(t) })
		if err != nil {
			s.failed["redis"] = fmt.Errorf("redis: %w", err)
			return nil, s.failed["redis"]
		}
		s.redis = append(s.redis, r)
	}
	if len(s.redis) < n {
		nodes, err := startWith(s.tb, func(t testing.TB) []*testserver.RedisServer {
			return testserver.RedisNodes(t, n-len(s.redis))
		})
		if err != nil {
			return nil, fmt.Errorf("redis nodes: %w", err)
		}
		s.redis = append(s.redis, nodes...)
	}
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = s.redis[i].Addr
	}
	return addrs, nil
}

// etcdEndpoints starts a one-member etcd in a process of its own
// (testserver's etcdmember helper), so that its CPU and allocations are
// not counted as the client's, as for the other stores.
func (s *servers) etcdEndpoints() ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.failed["etcd"]; err != nil {
		return nil, err
	}
	if s.etcd == nil {
		e, err := startWith(s.tb, func(t testing.TB) *testserver.EtcdClusterServer { return testserver.EtcdCluster(t, 1) })
		if err != nil {
			s.failed["etcd"] = fmt.Errorf("etcd: %w", err)
			return nil, s.failed["etcd"]
		}
		s.etcd = e
	}
	return s.etcd.Endpoints(), nil
}

func (s *servers) zkAddr() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.failed["zookeeper"]; err != nil {
		return "", err
	}
	if s.zk == nil {
		z, err := startWith(s.tb, func(t testing.TB) *testserver.ZooKeeperServer { return testserver.ZooKeeper(t) })
		if err != nil {
			s.failed["zookeeper"] = fmt.Errorf("zookeeper: %w", err)
			return "", s.failed["zookeeper"]
		}
		s.zk = z
	}
	return s.zk.Addr, nil
}

func (s *servers) postgresDSN() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.failed["postgres"]; err != nil {
		return "", err
	}
	if s.pg == nil {
		pg, err := startWith(s.tb, func(t testing.TB) *testserver.PostgresServer { return testserver.Postgres(t) })
		if err != nil {
			s.failed["postgres"] = fmt.Errorf("postgres: %w", err)
			return "", s.failed["postgres"]
		}
		s.pg = pg
	}
	return s.pg.DSN, nil
}

// mysqlDSN returns the go-sql-driver DSN of the MariaDB database the
// MySQL peers use, starting the server on first use.
func (s *servers) mysqlDSN() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.failed["mysql"]; err != nil {
		return "", err
	}
	if s.my == nil {
		my, err := startWith(s.tb, func(t testing.TB) *testserver.MariaDBServer { return testserver.MariaDB(t) })
		if err != nil {
			s.failed["mysql"] = fmt.Errorf("mysql: %w", err)
			return "", s.failed["mysql"]
		}
		s.my = my
	}
	return s.my.DSN, nil
}

// mysqlAdmin returns the program's own connection pool to the MariaDB
// server, for its status counters.
func (s *servers) mysqlAdmin() (*sql.DB, error) {
	dsn, err := s.mysqlDSN()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.myDB == nil {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			return nil, err
		}
		db.SetMaxOpenConns(1)
		s.myDB = db
		s.tb.Cleanup(func() { db.Close() })
	}
	return s.myDB, nil
}

// enablePGStatements turns on pg_stat_statements on the PostgreSQL server
// this program started (preloaded, which takes a restart: the scale
// workload, which needs it, runs last), so that the server counts the
// statements it executes. Other workloads run without it.
func (s *servers) enablePGStatements(ctx context.Context) error {
	dsn, err := s.postgresDSN()
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pgStat != nil {
		return nil
	}
	if s.pg.PID() == 0 {
		return errors.New("not a server this program started")
	}
	if err := pgExec(ctx, dsn, "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"); err != nil {
		return err
	}
	if _, err := startWith(s.tb, func(testing.TB) struct{} { s.pg.Restart(); return struct{}{} }); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	if err := pgExec(ctx, dsn, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return err
	}
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	s.pgStat = c
	s.tb.Cleanup(func() { c.Close(context.Background()) })
	return nil
}

// pgStatements returns the statements the PostgreSQL server executed in
// the bench's database (pg_stat_statements calls, this query's own
// excluded), and false before enablePGStatements.
func (s *servers) pgStatements(ctx context.Context) (int64, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pgStat == nil {
		return 0, false, nil
	}
	var n int64
	err := s.pgStat.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
AND query NOT LIKE '%pg_stat_statements%'`).Scan(&n)
	return n, true, err
}

// pgExec runs one statement on a connection of its own.
func pgExec(ctx context.Context, dsn, sql string) error {
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, sql)
	return err
}

// pids returns the process ids of the servers of store (0 for a server
// this program did not start).
func (s *servers) pids(store string) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pids []int
	switch store {
	case "redis":
		for _, r := range s.redis {
			pids = append(pids, r.PID())
		}
	case "etcd":
		if s.etcd != nil {
			for _, m := range s.etcd.Members {
				pids = append(pids, m.PID())
			}
		}
	case "zookeeper":
		if s.zk != nil {
			pids = append(pids, s.zk.PID())
		}
	case "postgres":
		if s.pg != nil {
			pids = append(pids, s.pg.PID())
		}
	case "mysql":
		if s.my != nil {
			pids = append(pids, s.my.PID())
		}
	}
	return pids
}

// redisCommands returns, summed over addrs, the calls of every command in
// INFO commandstats (commands run inside scripts included: that is the
// server's load), less INFO itself; and, apart, the (un)subscribe calls,
// which go-redis sends on its pub/sub connections without its hooks.
func redisCommands(ctx context.Context, addrs []string) (total, subs int64, err error) {
	for _, a := range addrs {
		info, ierr := redisAdmin(a).Info(ctx, "commandstats").Result()
		if ierr != nil {
			return 0, 0, fmt.Errorf("INFO commandstats %s: %w", a, ierr)
		}
		for line := range strings.SplitSeq(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
				continue
			}
			calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
			n, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("INFO commandstats %s: line %q: %w", a, line, err)
			}
			total += n
			if strings.HasSuffix(name, "subscribe") {
				subs += n
			}
		}
	}
	return total, subs, nil
}

var (
	adminMu sync.Mutex
	admins  = map[string]*goredis.Client{}
)

// redisAdmin returns the client that reads addr's statistics: one per
// server, kept, so that reading them adds no connection handshakes
// (HELLO, CLIENT SETINFO) to what is measured.
func redisAdmin(addr string) *goredis.Client {
	adminMu.Lock()
	defer adminMu.Unlock()
	c := admins[addr]
	if c == nil {
		c = goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: 1})
		admins[addr] = c
	}
	return c
}

// etcdRequests returns the gRPC messages the etcd members received
// (grpc_server_msg_received_total over all methods: one per unary call,
// one per stream message such as a watch request or a lease keep-alive),
// read from each member's /metrics.
func etcdRequests(ctx context.Context, endpoints []string) (int64, error) {
	var total int64
	for _, ep := range endpoints {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep+"/metrics", nil)
		if err != nil {
			return 0, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, fmt.Errorf("etcd metrics: %w", err)
		}
		n, err := sumMetric(resp.Body, "grpc_server_msg_received_total")
		resp.Body.Close()
		if err != nil {
			return 0, fmt.Errorf("etcd metrics %s: %w", ep, err)
		}
		total += n
	}
	return total, nil
}

// sumMetric sums every sample of a Prometheus text-format metric.
func sumMetric(r io.Reader, name string) (int64, error) {
	var sum float64
	found := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("line %q: %w", line, err)
		}
		sum += v
		found = true
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("no %s", name)
	}
	return int64(sum), nil
}

// zkPackets returns the packets the ZooKeeper server received (mntr
// zk_packets_received: every request, session pings included).
func zkPackets(addr string) (int64, error) {
	out, err := fourLetter(addr, "mntr")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(out, "\n") {
		if v, ok := strings.CutPrefix(line, "zk_packets_received"); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("zookeeper %s: no zk_packets_received in mntr", addr)
}

// fourLetter sends a ZooKeeper four-letter command and returns the reply.
func fourLetter(addr, cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, cmd); err != nil {
		return "", err
	}
	out, err := io.ReadAll(c)
	return string(out), err
}
