// Package distlock is a distributed lock with one API over many stores.
//
// Build a [DistributeLock] over a backend once, then lock keys:
//
//	res, err := redis.New(client) // or another store, below
//	if err != nil { ... }
//	d, err := distlock.New(res)
//	if err != nil { ... }
//	lk, err := d.TryLock(ctx, "order:42", 3*time.Second)
//	if errors.Is(err, distlock.ErrNotAcquired) { return } // someone else has it
//	if err != nil { return err }                         // the store failed: lk is nil
//	defer lk.Unlock(ctx)
//	write(ctx, lk.Token(), ...) // the resource refuses stale tokens
//
// or let [DistributeLock.Do] hold the lock around a function. Each lock has
// a TTL, [WithDefaultTTL] or per call with [ContextWithTTL]; [WithAutoRenew]
// extends it while held. [Lock.Token] is a fencing token and [Lock.Done]
// closes when the lock is known lost.
//
// # More than one lock at a time, and inspection
//
// [DistributeLock.TryLockAll] takes several keys, all or none, as one lock.
// [Lock.Extend] extends a lock by hand and [Lock.Deadline] says when its
// validity ends. [DistributeLock.Inspect] tells who holds a key, with the
// holders' labels ([WithLabel]). [WaitForever] waits until the context
// ends.
//
// # Semaphores and read/write locks
//
// [DistributeLock.Semaphore] gives a semaphore of a key: at most limit
// holders at once, each permit a [*Lock] with its own TTL, token and Done.
// [DistributeLock.RWMutex] gives a read/write lock: many readers or one
// writer, served in order of arrival, readers together, so neither side
// starves the other. A key's mutex, semaphore and read/write lock are
// distinct locks. Stores that cannot hold them (Redlock) return
// [ErrUnsupported] before any I/O.
//
// # Waiting in line
//
// The waiters of a lock are granted it in order of arrival, across
// processes, on the stores that queue them: etcd and ZooKeeper by nature,
// and the pull stores that implement backend.Queuer (their mutexes and
// semaphores; read/write locks always). There a release wakes the waiter
// at the head of the line only, the others make a request only to keep
// their place (at most every third of the TTL), and a waiter that gives
// up leaves the line before TryLock returns. A head that died is passed
// over within its TTL. Redlock keeps no line: after a release, whichever
// waiter tries first gets the lock.
//
// # Elections
//
// [DistributeLock.Election] gives the leader election of a name: one
// leader at a time among its candidates, across processes.
// [Election.Campaign] waits until elected and returns the leadership as a
// [*Lock]: its Token is the term, which fences the leader's writes, its
// Done closes when the leadership is lost, and Unlock resigns.
// [Election.Proclaim] changes the leader's published value,
// [Election.Leader] reads the leader, [Election.Observe] follows the
// changes, and [Election.Run] runs a function while leader and campaigns
// again after it ends, as Curator's LeaderSelector and client-go's
// leaderelection do.
//
// # Backends
//
// Each store is a module of its own, so that an application downloads the
// client of the store it uses and nothing else; pkg.go.dev lists them
// apart from this package. The constructors of the stores over a network
// all return (store, error), an error wrapping [ErrInvalid] for a nil
// client or a bad option:
//
//   - [github.com/distlock/distlock/backend/memory]: in-process, for tests,
//     examples and one process (in this module).
//   - [github.com/distlock/distlock/redis]: one Redis (standalone,
//     Sentinel or Cluster) over go-redis; fencing tokens, release notices.
//   - [github.com/distlock/distlock/redlock]: Redlock over N independent
//     Redis masters, a majority quorum; mutexes only, no tokens.
//   - [github.com/distlock/distlock/etcd]: etcd v3, a lease and a queue
//     ordered by create revision, waiters woken by a watch.
//   - [github.com/distlock/distlock/zookeeper]: ZooKeeper's lock recipe,
//     ephemeral sequential znodes, over go-zookeeper.
//   - [github.com/distlock/distlock/sqldb]: a table in PostgreSQL (pgx) or
//     MySQL/MariaDB (database/sql).
//
// Handlers live beside them: [github.com/distlock/distlock/hotspot] and
// [github.com/distlock/distlock/accesslog] in this module,
// [github.com/distlock/distlock/metrics] and
// [github.com/distlock/distlock/tracing] in modules of their own.
//
// A backend implements the small contract of package
// [github.com/distlock/distlock/backend]. Pull stores (Redis, SQL databases,
// the in-process [github.com/distlock/distlock/backend/memory] store) offer
// an atomic add-if-absent with TTL and a compare-and-delete; the facade
// spins between attempts, sleeping a random time in [min, min+random)
// ([WithSpin]) and waking early when the store announces a release. Push
// stores (etcd, ZooKeeper) queue waiters and wake them with a watch. Redlock
// takes a majority of independent Redis nodes.
//
// Every backend keeps the same rules, checked by one conformance suite
// (package testsuite): a fresh owner value per acquisition, the release is a
// compare-and-delete, a cancelled wait leaves nothing in the store, tokens
// strictly increase across holders, and bad input fails before any I/O.
//
// # Handlers
//
// [WithHandlers] installs a chain of [Handler]s in front of the backend,
// composed once, the first outermost: an in-process lock for hot keys
// (package hotspot), metrics, or your own. A handler sees each [Request]
// (key, owner value, TTL, deadline, remote attempts, token) and its outcome,
// and may short-circuit. On release the order nests: a handler that acted
// before the store on acquire acts after it on release.
//
// # Lifecycle
//
// A lock is held once TryLock returns it: the whole handler chain returned
// success, and only then is it counted as held, renewed and visible to
// Close. An acquisition that Close or a loss overtakes before that is
// rolled back through exactly the handlers that acquired. A held lock ends
// once: released by its last Unlock (or by Close), or lost (its validity
// ended without renewal, a renewal found it gone, or the store reported
// the loss of its session or lease); Done closes then, and every handler
// that acquired sees exactly one Release. A release that fails with a store
// error leaves the lock held, and Unlock may be called again. TryLock,
// Unlock and Close return when their context, wait or bound ends, even when
// the store stops answering.
//
// # Reentrancy
//
// A context can carry the locks it holds ([ContextWithLock]; Do does it for
// its function). TryLock of a key the context already holds on the same
// DistributeLock returns a new handle at once, with no I/O; the lock is
// released when its last handle is. [WithMaxReentrancy] limits or forbids it.
//
// # Errors
//
// Contention is not failure. TryLock returns [ErrNotAcquired] when another
// owner held the key for the whole wait, and errors.Join(ErrNotAcquired,
// ctx.Err()) when the context ended first. Store failures are returned
// wrapped with the operation and key, never as ErrNotAcquired. Unlock
// returns [ErrNotHeld] when the lock had expired or was taken over, and for
// a second Unlock of the same handle, touching nothing. Bad input (empty
// key, negative wait, TTL <= 0, nil resource) returns an error wrapping
// [ErrInvalid] and does no I/O. Use errors.Is for all of them.
//
// # Safety
//
// A lock with a TTL can expire while its holder is paused (GC, swap,
// network), and then two holders overlap. No lock library can prevent that
// alone; the protected resource can, by refusing writes that carry a token
// lower than one it has already accepted. Pass [Lock.Token] along and check
// it there. Watch [Lock.Done] (or use Do, which cancels the function's
// context) to stop work when the lock is known lost.
package distlock
