// Package redis is the distlock backend for one Redis deployment: a
// standalone server, a Sentinel-managed master, or a Redis Cluster. It is a
// pull store: [Resource] implements backend.Spinner, and the distlock facade
// spins on it.
//
//	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
//	res, err := redis.New(rdb)
//	if err != nil { ... } // a nil client or option: wraps distlock.ErrInvalid
//	d, err := distlock.New(res)
//
// [New] does no I/O: the first request dials. It takes any goredis.UniversalClient (*goredis.Client from NewClient
// or NewFailoverClient, *goredis.ClusterClient). A *goredis.ClusterClient
// is taken for a Cluster and gets sharded pub/sub (SPUBLISH, SSUBSCRIBE:
// Redis 7.0 or later; on older servers locks work and wake-up falls back to
// spinning). A *goredis.Ring works too (its shards follow the hash tag, so
// a lock and its fence stay together) but without wake-up. The
// caller owns the client;
// [Resource.Close] closes only the subscription connections the Resource
// opened itself.
//
// # Round trips
//
// Every operation is one Lua script run by EVALSHA (falling back to EVAL
// once per server that has not cached the script):
//   - acquire: SET lock value NX PX ttl; on success take the next token
//     from the fence (TIME, then one SET ... GET: see Fencing tokens) and
//     return it; on failure return the holder's PTTL, so the spin loop
//     never sleeps past the holder's expiry;
//   - release: compare-and-delete (a RENAME to the release's trace, see
//     [Resource.Release]), then, when someone waits (see Wake-up),
//     PUBLISH (SPUBLISH on Cluster) a release notice on the key's channel;
//   - refresh: compare-and-PEXPIRE, of the lock and its fence; many locks
//     at once in one script (see Many locks);
//   - relabel (backend.Relabeler, an election's Proclaim): if the lock
//     holds the value, rewrite the holder's label key with the lock's
//     time left.
//
// An acquire whose reply is lost (timeout, broken connection, any error) may
// still have set the key, so TryAcquire then runs the compare-and-delete
// before returning the error, while its context lives. When the context
// ended first (the server stopped answering, say), it does not wait: it
// returns a backend.AbandonedError whose Cleanup the facade runs in the
// background until the server answers it. The request may also still be on
// its way (a cancelled acquire's packets delayed on the network, or queued
// in a frozen server, reach Redis after the clean-up, sent on another
// connection): the clean-up therefore writes,
// in the same script, a tombstone for the owner value, prefix{k'}:dead:value
// living one lease TTL, and the acquire script does not take the lock for a
// value whose tombstone exists. Scripts run one at a time, so whichever of
// the two comes second sees the first: a failed attempt leaves no orphan,
// unless its request is delayed by more than the TTL. The acquire script
// looks for a tombstone only while one can exist: the clean-up also makes
// the lock's tombstone hint, prefix{k'}:dead, live as long as the
// tombstone, and marks the fence (its token negated); a grant reads the
// mark with the token, and asks the hint only when the fence is marked or
// missing. An uncontended cycle thus runs seven commands on the server:
// EVALSHA, SET, TIME and SET of the fence; EVALSHA, GET and RENAME. The
// client itself may
// resend an acquire whose reply it lost (go-redis retries a command after a
// read timeout, up to MaxRetries): the acquire script counts a lock that
// already holds the attempt's own value as acquired, so the resent request
// takes the lock its first run set, instead of finding it "held" and
// leaving it to expire unowned.
//
// # Semaphores and read/write locks
//
// [Resource.CheckKind] accepts every kind of lock: distlock's Semaphore and
// RWMutex work on Redis, each attempt and each release one script call, as
// for a mutex. A key's mutex, semaphore and read/write lock are distinct
// locks, in keys of their own (see Keys), all in the key's hash slot.
//
// A semaphore keeps its holders in a sorted set scored by their expiry on
// the server's clock (TIME, in milliseconds), as Redisson's
// RPermitExpirableSemaphore does, and their tokens and labels, with the
// limit, in a hash. An attempt drops the holders whose expiry has passed,
// then takes a permit when fewer than the limit remain; otherwise it
// returns the time until the first of them expires, so the spin loop does
// not sleep past it. Every permit is a lease: a holder that dies loses its
// permit at its TTL, and renewal (distlock.WithAutoRenew) extends its own
// entry only. The limit lives with the holders: an attempt with another
// limit than the live holders' fails with backend.ErrLimitMismatch
// (distlock.ErrLimitMismatch), writing nothing, and once no holder is left
// the next attempt sets the limit anew.
//
// A read/write lock keeps its holders the same way, each marked reader or
// writer, and serves requests in order of arrival, readers together, as
// backend.KindChecker describes: an attempt that cannot hold records an
// intent, numbered by arrival from the lock's fence, in a sorted set of
// writers' or readers' intents, with an expiry of one TTL that each later
// attempt renews. A writer holds when nobody holds and no intent precedes
// its own; a reader when no writer holds and no writer's intent precedes
// its own. New readers therefore queue behind a waiting writer (a stream
// of readers cannot starve it), and readers that waited for a writer get
// in before the writers that came after them. A request that gives up
// withdraws its intent ([Resource.Withdraw], called by the facade), and
// an intent whose owner stopped trying (its process died) expires with its
// TTL. Tokens of a read/write lock come from one fence, so a write grant's
// token is larger than every earlier grant's and a read grant's larger
// than every earlier write grant's; a semaphore's increase across its
// permits. Both are the hybrid clock of Fencing tokens.
//
// Every release, and every withdrawn intent, publishes a notice on the
// key's channel, the one mutex waiters listen on: waiters of every kind on
// the key retry at once. A failed or abandoned attempt is cleaned up as a
// mutex's is, with a tombstone of its owner value (see Round trips): the
// clean-up drops the value's grant and intent, and a late attempt that
// finds the tombstone takes nothing and records no intent, so a cancelled
// wait leaves nothing behind. Sets and hashes expire with their last
// holder or intent: nothing outlives its TTLs.
//
// # Inspection, labels and several keys
//
// [Resource.Inspect] (backend.Inspector, distlock's Inspect) reads a
// lock's holders with one read-only script: for each, its kind, token,
// time left by the server's clock (PTTL, or its score in the holders' set
// less the server's time) and label. A mutex holder's token is the fence's
// value, since no grant can follow the live one. The label
// (distlock.WithLabel) is never compared: a semaphore's or read/write
// lock's is kept in the holder's record, a mutex holder's beside the lock
// in prefix{k'}:label, written with the lock by the acquire script and
// with the lock's expiry, as "<length of the owner value>:<owner
// value><label>", and shown only when the owner value is the live
// holder's. The key is written only for a lock that has a label: without
// one (the default) no command touches it. A lock deleted from outside
// leaves its label key until the lock's TTL would have ended.
// [Resource.Relabel] rewrites it for the live holder (an election's
// leader publishing a value: distlock.Election.Proclaim).
//
// [Resource.TryAcquireAll] (backend.MultiSpinner, distlock's TryLockAll)
// takes several mutexes, all or none, with one script call that sets
// every lock and takes a token for each, once no key is held by another
// owner and no key has the owner value's tombstone. On Cluster a script
// reaches the keys of one hash slot only: for keys of several slots, and
// for several keys over a *goredis.Ring (whose shards hash keys apart), it
// returns errors.ErrUnsupported before any I/O and the facade takes the
// keys one by one; a standalone server or a Sentinel master takes any set.
// Under [WithWaitReplicas] it does the same, so that every key's grant is
// acknowledged by the replicas (the facade's key-by-key acquire waits for
// each).
//
// # Many locks
//
// [Resource.RefreshAll] (backend.BatchRefresher) extends the locks the
// facade's renewal scheduler finds due together, up to
// backend.MaxRefreshBatch at a time, in one pipeline: on a standalone
// server or Sentinel master one script for all the mutexes
// (compare-and-PEXPIRE each, one result per lock), on Cluster one such
// script per hash slot, sent together (go-redis makes one round trip per
// master); semaphores and read/write locks, and every lock over a
// *goredis.Ring, take a script each in the same pipeline. A lock that is
// no longer held fails alone (backend.ErrNotHeld), and the facade ends it
// as it ends a lock whose own refresh failed. Holding 100,000 locks with
// WithAutoRenew then costs about one request per 500 locks per renewal
// interval (a third of the TTL) instead of one per lock.
//
// A held mutex keeps nothing of the Resource's in its lease: the key
// names and commands an acquisition builds are given up once it
// acquires, and a release or refresh builds its own. Memory per held
// lock is then the facade's alone.
//
// # Natural batching
//
// The acquires, releases, refreshes and inspections of one Resource that
// overlap in time share round trips. A call that finds no request of the
// Resource in flight is sent at once, alone, as it would be without
// batching: a lone caller waits for nothing. Up to four requests of the
// Resource are in flight at once, each on its own connection; calls made
// while four are wait for one to return, and then go together in one
// pipeline (EVALSHA each; those whose script the server had not cached
// again, with EVAL, in a second pipeline): under load each request
// carries every call made while the others were in flight. Each call
// keeps its own reply and error: a script that fails fails only its call,
// and a reply lost after sending is the error of each call of the
// pipeline, handled by each as when sent alone (an acquire cleans up, see
// Round trips). On Cluster and over a Ring, go-redis splits a pipeline by
// node and sends the parts concurrently, each on its node's connection;
// the next batch waits for the slowest node. Acquires under
// [WithWaitReplicas] (the WAIT must follow the script on its connection)
// and [Resource.RefreshAll] (a pipeline already) are not batched.
//
// # Contexts
//
// Every call returns when its context ends, whatever the server does. A
// go-redis client stops at a context's deadline only when created with
// ContextTimeoutEnabled, and never at a cancellation without a deadline.
// The Resource gives a *goredis.Client that bound for its own requests
// (see [New]), so an acquisition's request whose context only its
// deadline can end (the facade's context over a caller's that cannot be
// cancelled: Close is seen between requests) runs in the caller's
// goroutine and returns by its deadline, as does a call alone with a
// context that cannot end at all (context.Background()): an uncontended
// cycle costs no goroutine handoff, timer or context callback. A request
// whose context the caller can cancel runs on a worker goroutine, and the
// caller stops waiting for it when the context ends.
// A call still waiting for the next batch when its context ends is never
// sent. One sent runs on until the client gives up on it (its
// ReadTimeout, 5s by default, or the context's deadline with
// ContextTimeoutEnabled: for a batch, the latest of its calls'
// deadlines), holding one of the client's connections; a request whose
// callers all stopped waiting no longer counts among the four in flight:
// the next batch goes on another connection.
//
// # A server that refuses connections
//
// A request that go-redis could not dial (its last try failed to connect:
// refused, no route) was never sent: TryAcquire returns the error as it
// is, with no clean-up, and distlock's Close has nothing to wait for.
// go-redis retries a failed dial before it says so: by default 5 dials
// 100ms apart (DialerRetries, DialerRetryTimeout) per try, and 4 tries
// (MaxRetries 3), about 1.7s in all, longer than distlock's bound of one
// attempt (1s). Cut by that bound, a request's fate is unknown, and it is
// cleaned up as one whose reply was lost. To have a refused connection
// reported as one, at once, give the client DialerRetries: 1 (the
// distlock command does):
//
//	rdb := goredis.NewClient(&goredis.Options{Addr: addr, DialerRetries: 1, ContextTimeoutEnabled: true})
//
// # Keys
//
// A lock on key k uses prefix{k'} for the lock and prefix{k'}:fence for the
// last token, where k' is k with '%', '{' and '}' percent-escaped. The braces
// are the Cluster hash tag, so both keys live in one slot whatever k
// contains, and distinct keys never share names. The release channel is
// named like the lock key. The prefix is "distlock:" unless [WithPrefix]
// sets another; it is escaped the same way, so its braces never make the
// tag. A failed acquire's tombstone, prefix{k'}:dead:value, lives in the
// same slot for one lease TTL, and the lock's tombstone hint,
// prefix{k'}:dead, as long as its longest-lived tombstone. A mutex holder's label (distlock.WithLabel)
// is kept beside the lock, in prefix{k'}:label, with the lock's expiry. A
// release renames the lock to prefix{k'}:released (see
// [Resource.Release]). The semaphore of k uses prefix{k'}:sem (holders),
// prefix{k'}:sem:h (tokens, labels, limit) and prefix{k'}:sem:fence; the
// read/write lock prefix{k'}:rw, prefix{k'}:rw:h, prefix{k'}:rw:fence
// and, for intents, prefix{k'}:rw:qw, :qr and :qx. Every one of them is
// in k's slot, so a script can reach all of a lock's keys on Cluster. The
// layout and scripts live in internal/redisscript, shared with the
// Redlock backend.
//
// Every one of these keys expires, so what a lock name costs is bounded
// by its use: a program that locks job:<id> for ever new ids does not
// grow Redis. The lock, its label, the sets and hashes of a semaphore or
// read/write lock live as long as their holders' or intents' TTLs; the
// release's trace at most what was left of the lock's TTL (one key per
// lock name); a tombstone one TTL; a fence [redisscript.FenceGrace] (10s)
// longer than the lock it last served (a renewal of a mutex lengthens its
// fence with it). A name locked once leaves nothing once its TTL and the
// grace have passed.
//
// # TTL
//
// The lease TTL becomes PX in whole milliseconds, rounded up (1.2ms is 2ms):
// Redis never holds a lock for less than asked, and TryAcquire writes the
// rounded TTL back into the lease. Expiry runs on the Redis server's clock.
//
// # Fencing tokens
//
// The token is a hybrid clock: each grant takes max(last token + 1, the
// server's time in microseconds, from TIME) inside the acquire script, and
// stores it in the fence key as the new last token. Tokens strictly
// increase across successive holders of a key on one deployment, and they
// are Unix times in microseconds (below 2^53 until the year 2255: a JSON
// number carries them exactly), or one more than the last token when the
// clock lags it.
//
// A lock with a TTL can expire while its holder is paused (GC, swap, a
// slow network) and another process then acquires it; both believe they
// hold it. The protected resource must therefore check the token: remember
// the highest it has seen and refuse writes carrying a lower one. Without
// that check the lock is an efficiency hint, not a guarantee.
//
// The fence expires [redisscript.FenceGrace] after the lock it last
// served would have: the next grant then comes at least that long after
// the last token was issued, and takes the server's time, which has moved
// past every earlier token (the counter runs ahead of the clock by the
// grants within one microsecond only). So tokens never go backwards when
// a fence expires, unless the server's clock was stepped back by more
// than the grace meanwhile.
//
// A grant reads the clock (TIME) even while the fence lives: the one SET
// ... PX ... GET that takes the last token must write the new one, so it
// must know it before it runs, and it must push the fence's expiry past
// the new lock's (Inspect reads a holder's token from the fence). An INCR
// would take the token without the clock but leave the expiry, costing a
// PEXPIRE instead: either way two commands, the uncontended cycle's
// seventh.
//
// The clock is also what keeps tokens from going backwards when the fence
// key is lost. A server without persistence (no AOF, as a cache node is often
// run) restarts empty; a failover can promote a replica that missed the
// last grants; an operator can restore an older snapshot. The next token
// then comes from the server's clock, which has moved on since the lost
// tokens were issued, so it is larger than every one of them. The fault
// suite (docs/SAFETY.md) measures both: after a SIGKILL and restart
// without persistence, and after a failover to a lagging replica, no token
// went backwards and the histories are linearizable (before, tokens
// started again at 1 after the restart, and the promoted replica handed
// out the same token twice).
//
// The assumption, exactly: the token after a loss is larger than every
// earlier one as long as the clock of the server that issues it (after a
// failover: the new master's) reads later than the clock that issued the
// largest lost token read when it issued it. A server clock stepped back
// by d (by an operator, or NTP stepping rather than slewing it), or a new
// master whose clock is d behind the old one's, breaks it for a loss that
// comes within d of the last grant: the first grants after the loss may
// then carry tokens at or below tokens already handed out, and the fenced
// resource refuses the new holder's writes (and would accept a stale
// holder's) until the clock passes them. Clocks kept by NTP agree within
// milliseconds, and a failover takes seconds; run NTP so that it slews
// (chrony without makestep after start-up, ntpd -x), keep masters and
// replicas on the same time source, and alert on a step. A clock that went
// back shows in the data: the fence key (prefix{k'}:fence) then holds a
// token ahead of the server's TIME (tokens run on as a counter until the
// clock catches up), and a token is never expected to lie ahead of the
// time its server reported when it was issued. While it lives (no loss,
// and a grant within the grace of the last lock's end) the fence key
// alone keeps tokens increasing, whatever the clock does.
//
// # Failover
//
// Redis replicates asynchronously. If a master fails after granting a lock
// and before its replica received the grant, Sentinel or Cluster promotes
// a replica that never saw it: a second owner gets the same lock while the
// first still holds it (a double grant). Its token is larger (the hybrid
// clock), so a fenced resource refuses the first owner's writes from then
// on; the overlap itself is not prevented. [WithWaitReplicas] narrows the
// window (WAIT after the acquire, an error when too few replicas
// acknowledged) but does not close it: WAIT does not make Redis a
// consensus system. In the fault suite a failover to a replica that lagged
// behind the grant let a second owner take the lock in 3 of 3 trials, each
// with a larger token, so the first owner's next write was refused, while
// WithWaitReplicas(1, 200ms) turned all 3 into ErrNotReplicated, with no
// double grant. Where an overlap matters even when it is fenced, prefer a
// store with consensus (etcd, ZooKeeper).
//
// # Wake-up
//
// [Resource.Subscribe] implements backend.Notifier: waiters in this process
// retry as soon as the holder releases, instead of sleeping out the spin.
// The Resource keeps one subscription connection (on Cluster, one per master
// that serves a waited-for key, using sharded pub/sub), subscribed to a
// key's channel only while a waiter in this process waits for it. When
// Redis confirms a subscription (the first time, or again after a
// reconnect) the waiters retry once too, so a release that came before the
// subscription is not slept through. A mutex's release publishes only when
// someone waits: an attempt refused the lock marks it as waited for
// (redisscript.WaitedMark appended to the holder's value, one APPEND per
// holder), and an acquisition that was refused once takes the lock marked
// itself, as one likely to be waited for (a waiter may wait for the next
// notice without trying against the holder: hotspot's WithYield). So an
// uncontended lock is released without a PUBLISH; a release of a lock
// whose last refused waiter gave up sends a notice nobody hears. Every
// compare of the value ignores the mark, which is why an owner value
// ending with a NUL byte is refused (backend.ErrInvalid). A semaphore's
// or read/write lock's release always publishes. Notices are hints: a lost or failed subscription
// costs only latency, as the spin loop keeps retrying on its own.
//
// # Waiting in line
//
// The waiters of a mutex and of a semaphore queue in order of arrival
// (backend.Queuer), and a release wakes the head of the line only
// ([Resource.SubscribeHead], backend.HeadNotifier). A refused attempt of
// an acquisition that waits records its intent in the lock's line, two
// sorted sets in the key's hash slot, prefix{k'}:q (owner values by
// arrival) and prefix{k'}:qx (by the expiry of their intent, one TTL from
// the waiter's last attempt, on the server's clock); a semaphore's are
// prefix{k'}:sem:q and prefix{k'}:sem:qx. A mutex's release (one whose
// value carries the waited mark) with a live intent in line does not free
// the key: it keeps it for the head, writing a NUL byte and the head's
// owner value into it for what is left of the head's intent, and
// publishes the head's value as the notice's message; every Resource
// passes a message that names a waiter to that waiter only (or keeps it a
// second, for a waiter that subscribes just after), and an empty one to
// every waiter. A newcomer's SET NX is then refused and queues; the head
// takes the key. A semaphore's attempt holds when fewer intents precede
// its own than permits are free, and its release tells the head. A head
// that does not come (its process died) is passed over when its intent
// lapses: the reservation expires with it, and the next waiter's attempt
// that finds the key free hands it to the new head. A waiter that gives up
// withdraws its intent (and hands a reservation on) before TryLock
// returns; a clean-up of an abandoned attempt does too. An uncontended
// acquire pays nothing for the line: SET NX succeeds and nothing else is
// read; a first attempt that finds the key free takes it even if a line
// remains (its holder expired without a release), which is the one way a
// newcomer gets ahead of the line. An uncontended semaphore attempt pays
// one EXISTS of the line. An owner value starting with a NUL byte is
// refused (backend.ErrInvalid): it could be taken for a reservation.
//
// A subscription connection that breaks is dialled again and its channels
// subscribed again. On Cluster the Resource does that itself, one
// SSUBSCRIBE per channel, because go-redis would send them all in one,
// which Redis refuses when they span slots (CROSSSLOT). A connection on
// which Redis refuses a command (CROSSSLOT, MOVED after a slot moved, an
// ACL's NOPERM), that loses a channel (a master unsubscribes its clients
// from the channels of a slot it gives away), or that leaves a PING
// unanswered for 3s, is replaced: its channels are subscribed again on
// the masters that serve them then, after 100ms, doubling up to 30s while
// replacements keep failing.
//
// # Errors
//
// Store errors are wrapped with the operation and key, and keep the
// client's cause ("redis: acquire \"k\": dial tcp 10.0.0.5:6379: connect:
// connection refused"), on one line. Release and Refresh return backend.ErrNotHeld when the key
// expired or holds another owner's value. [Resource.ValidateKey] rejects
// empty keys and keys over [MaxKeyLen] before any I/O.
package redis
