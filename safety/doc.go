// Package safety measures what distlock does when things break, the way
// Jepsen measured etcd's and Hazelcast's locks, on one machine, against
// real servers started by internal/testserver.
//
// Its tests start worker processes (this test binary executed again, see
// [github.com/distlock/distlock/safety/harness]) that take a lock, write to
// a fenced store and increment an unfenced counter while they hold it
// ([github.com/distlock/distlock/safety/resource]), and record what they
// did ([github.com/distlock/distlock/safety/history]). On the Redis and
// PostgreSQL targets the fenced store is a real one written through
// distlock's public helpers (redis.Fence, fence.Postgres: see
// harness.Fence), on a server of its own. The tests inject a
// fault (a server killed or paused, a holder paused like a long GC pause,
// a stalled network path through [github.com/distlock/distlock/internal/testserver/proxy],
// a failover), then check the history: overlapping holders, stale writes
// the fence accepted, lost increments, tokens out of order, and
// linearizability with porcupine.
//
// The package holds tests only. docs/SAFETY.md has the table of results
// and the command that makes it; `make soak` runs the long version
// (DISTLOCK_SAFETY_SOAK=1).
package safety
