// Package testserver starts real stores for tests: each on a free 127.0.0.1
// port in the test's temp dir, waited for until it answers, stopped by PID
// when the test ends, its log dumped when the test failed.
//
// # Servers
//
//   - [Redis], [RedisNodes] (independent nodes, for Redlock), [RedisCluster]
//     (three masters) and [RedisReplica]; a [RedisServer] can be stopped,
//     killed, paused and restarted.
//   - [Etcd] and [EtcdCluster], run in the test process with
//     go.etcd.io/etcd/server/v3/embed.
//   - [ZooKeeper] and [ZooKeeperEnsemble], from Debian's zookeeper package.
//   - [Postgres] and [MariaDB], each with a fresh database per call.
//
// Start a server once per top-level test and share it among its subtests.
//
// # Where a server comes from
//
// An address in an environment variable wins (DISTLOCK_TEST_REDIS,
// DISTLOCK_TEST_REDIS_NODES, DISTLOCK_TEST_REDIS_CLUSTER, DISTLOCK_TEST_ETCD,
// DISTLOCK_TEST_ZOOKEEPER, DISTLOCK_TEST_POSTGRES, DISTLOCK_TEST_MARIADB);
// else the local binary, installed by scripts/install-test-deps.sh; else,
// when a Docker engine answers, the official image. When none can be had
// the test skips saying what is missing and how to install it, except when
// the environment variable CI is set: then it fails.
//
// # Processes
//
// Servers run in their own process group with a parent-death signal, so a
// test binary that crashes takes its servers with it. Stopping signals only
// the process group the test started.
package testserver
