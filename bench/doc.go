// Command bench measures distlock against the lock libraries users would
// pick instead, side by side in one run: same servers, same machine, the
// peers alternating round by round so that machine noise hits all alike.
// It writes a markdown table per workload (bench/RESULTS.md) and an SVG
// chart of the ratios against each store's reference.
//
//	cd bench && go run . -workload uncontended,handoff -store redis
//	cd bench && go run . -out RESULTS.md -svg ratios.svg    # the default run, a few minutes
//
// Servers are started through internal/testserver, the tests' own
// starters (redis-server, ZooKeeper from Debian's package, etcd in a
// process of its own), on free 127.0.0.1 ports, and stopped at the end. To
// use running servers instead, set the testserver variables
// (DISTLOCK_TEST_REDIS, DISTLOCK_TEST_REDIS_NODES, DISTLOCK_TEST_ETCD_CLUSTER,
// DISTLOCK_TEST_ZOOKEEPER), or the -redis, -redis-nodes, -etcd and
// -zookeeper flags, which set them.
//
// Workloads: uncontended (one goroutine, lock+unlock cycles on one key,
// pinned), parallel (16 goroutines, distinct keys), contended (the seed
// workload: instances x workers x attempts on one key, in two variants),
// handoff (release to a blocked waiter's acquire), scale (10,000 locks held
// at once; 1,000 goroutines on one key), semaphore (a semaphore of limit
// 3, 3 instances x 4 goroutines on one key) and read-mostly (a read/write
// lock, 90% reads, same shape).
//
// The semaphore and read-mostly workloads (kinds.go) run distlock against
// a floor per store that polls a bare script (Redis) or upsert
// (PostgreSQL) every 10ms keeping the same rule, the peers alternating
// round by round; each table gives grants/s and store requests per grant,
// with their ratios to the floor, and the violations of the rule the
// goroutines counted (must be 0). Their flags are -kinds-rounds,
// -kinds-slice, -kinds-hold, -kinds-wait, -sem-limit and -read-share:
//
//	cd bench && go run . -workload semaphore,read-mostly -store memory,redis,postgres -out RESULTS.md
//
// The scale workload measures the scale targets, each store's distlock
// against its native peer in the same run: how long taking the locks
// takes, the heap a held lock costs, the requests per second to the store
// while the locks are merely held (counted at the server where it can
// tell requests apart: PostgreSQL's pg_stat_statements, which the bench
// enables on the server it starts, etcd's metrics, ZooKeeper's mntr;
// Redis's INFO commandstats counts the commands inside scripts too, so
// its requests are the clients'), and the locks lost. It also runs on the
// in-process memory store (the facade's own cost). Its tables say which
// targets are met:
//
//	cd bench && go run . -workload scale -out RESULTS.md                 # 10,000 locks, every store
//	cd bench && go run . -workload scale -store redis -scale-locks 100000 -out RESULTS.md
//
// A run of some workloads or stores only updates the -out file: its
// tables replace the same tables there, each saying which run it comes
// from, and the rest of the file stays.
//
// This is a module of its own (bench/go.mod), tied to the library's
// modules by the repository's go.work, so the peers never enter the
// library's dependencies. scripts/tidy.sh tidies it with the others.
package main
