// Package testserver starts real stores for tests: each on a free 127.0.0.1
// port in the test's temp dir, waited for until it answers, stopped by PID
// when the test ends, its log dumped when the test failed.
//
// # Servers
//
//   - [Redis], [RedisNodes] (independent nodes, for Redlock), [RedisCluster]
//     (three masters), [RedisReplica] and [RedisSentinel].
//   - [Etcd], in the test process with go.etcd.io/etcd/server/v3/embed, and
//     [EtcdCluster], whose members run in processes of their own.
//   - [ZooKeeper] and [ZooKeeperEnsemble], from Debian's zookeeper package.
//   - [Postgres] and [MariaDB], each with a fresh database per call.
//
// Every server process a test started (a [RedisServer],
// [RedisSentinelServer], [ZooKeeperServer], [EtcdMember], [PostgresServer]
// or [MariaDBServer]) can be stopped, killed (SIGKILL), paused (SIGSTOP
// until Resume) and restarted on the same address with its data (Redis
// keeps none); the in-process [EtcdServer] can be stopped and restarted.
//
// Start a server once per top-level test and share it among its subtests.
//
// # Where a server comes from
//
// An address in an environment variable wins; else the local binary,
// installed by scripts/install-test-deps.sh; else, when a Docker engine
// answers, the official image, run with the docker CLI (testcontainers-go
// would add the Docker client's dependency tree to the module for a path
// our machines never take). When none can be had the test skips saying
// what is missing and how to install it, except when the environment
// variable CI is set: then it fails.
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
// processes under it. The members of an [EtcdCluster] are the test binary
// itself, executed again: an init function in this package turns such a
// process into an etcd member before any test runs.
package testserver
