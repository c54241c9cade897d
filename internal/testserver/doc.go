// Package testserver starts real stores for tests: each on a free 127.0.0.1
// port in the test's temp dir, waited for until it answers, stopped by PID
// when the test ends, its log dumped when the test failed.
//
// # Servers
//
//   - [Redis], [RedisNodes] (independent nodes, for Redlock), [RedisCluster]
//     (three masters), [RedisReplica] and [RedisSentinel].
//   - [Etcd] and [EtcdCluster], each member in a process of its own (the
//     helper cmd/etcdmember, go.etcd.io/etcd/server/v3/embed).
//   - [ZooKeeper] and [ZooKeeperEnsemble], from Debian's zookeeper package.
//   - [Postgres] and [MariaDB], each with a fresh database per call.
//
// Every server process a test started (a [RedisServer],
// [RedisSentinelServer], [ZooKeeperServer], [EtcdServer], [EtcdMember],
// [PostgresServer] or [MariaDBServer]) can be stopped, killed (SIGKILL),
// paused (SIGSTOP until Resume) and restarted on the same address with its
// data (Redis keeps none).
//
// Start a server once per top-level test and share it among its subtests.
//
// # Where a server comes from
//
// An address in an environment variable wins; else the local binary,
// installed by scripts/install-test-deps.sh; else, when a Docker engine
// answers, the official image in a container started with
// testcontainers-go. When none can be had the test skips saying what is
// missing and how to install it, except when the environment variable CI
// is set: then it fails.
//
// The variables, each a comma-separated list where a starter needs several
// servers:
//
//	DISTLOCK_TEST_REDIS               host:port
//	DISTLOCK_TEST_REDIS_NODES         host:port,... (at least n)
//	DISTLOCK_TEST_REDIS_CLUSTER       host:port,... (the cluster's masters)
//	DISTLOCK_TEST_REDIS_REPLICA       host:port of a replica of the master
//	DISTLOCK_TEST_REDIS_SENTINEL      host:port of a sentinel monitoring "mymaster"
//	DISTLOCK_TEST_ETCD                http://host:port,...
//	DISTLOCK_TEST_ETCD_CLUSTER        http://host:port,...
//	DISTLOCK_TEST_ZOOKEEPER           host:port
//	DISTLOCK_TEST_ZOOKEEPER_ENSEMBLE  host:port,...
//	DISTLOCK_TEST_POSTGRES            postgres://user@host:port/db (a fresh database is created there)
//	DISTLOCK_TEST_MARIADB             user:pass@tcp(host:port)/ (a fresh database is created there)
//
// A server given this way cannot be stopped, killed or paused by the test:
// those calls skip the test (fail it under CI).
//
// # Processes
//
// Servers run in their own process group with a parent-death signal, so a
// test binary that crashes takes its servers with it. Stop, Kill and Pause
// signal only the processes the test started: the server and the
// processes under it.
//
// # Dependencies
//
// This package imports only the standard library: the modules whose tests
// import it (every store's) list nothing more in their go.mod for it, and
// neither does the build list of an application that uses a store.
// What needs more runs in helper programs under cmd/, built from this
// module with the go command the first time a test binary needs them:
// cmd/etcdmember (the etcd server) and cmd/container (testcontainers-go,
// for the Docker fallback). [Postgres] and [MariaDB] use database/sql with
// the "pgx" and "mysql" drivers, which the test binary registers (import
// _ "github.com/jackc/pgx/v5/stdlib" and _ "github.com/go-sql-driver/mysql").
package testserver
