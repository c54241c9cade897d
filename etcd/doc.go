// Package etcd is a distlock backend over etcd v3: a push (watch) lock that
// is strongly consistent (Raft), needs no clock agreement between machines,
// grants waiters in arrival order and wakes one waiter per release.
//
//	res, err := etcd.New(client) // client is a *clientv3.Client; you close it
//	if err != nil { ... }         // a nil client or option: wraps distlock.ErrInvalid
//	d, err := distlock.New(res, distlock.WithAutoRenew())
//
// [New] does no I/O and returns a [*Resource], which implements backend.Waiter,
// backend.Refresher, backend.KindChecker, backend.Inspector,
// backend.KeyValidator and io.Closer. It holds mutexes, semaphores and read/write locks (see
// Semaphores and read/write locks).
//
// # How a lock is taken
//
// Each acquisition gets a lease whose TTL is the lock's (under
// distlock.WithAutoRenew, or with [WithSharedLease]: the Resource's shared
// lease for that TTL, see Shared leases), and creates, in one transaction
// and only if absent, the key
//
//	<prefix><encoded lock key>/<resource ID>-<slot>
//
// bound to that lease (the lease ID is on the key, as etcd shows it). The
// prefix is [DefaultPrefix] unless [WithPrefix] says otherwise; the lock key
// is percent-escaped so that it never contains '/', so every lock key,
// whatever its bytes ("a" and "a/", NUL, unicode), has a directory of its
// own. The resource ID is random per [Resource]; the slot is the smallest
// not in use by the Resource's other acquisitions of the same lock key. A
// name is used again once its key is deleted: etcd keeps deleted keys in
// its index until it compacts, and every acquire reads the directory, so
// names that never repeat (such as lease IDs) make acquires of a busy lock
// slower and slower until the next compaction. The holder is the key with the lowest create
// revision in that directory; the same transaction tells whether that is
// ours. A waiter waits only for the key created just before its own and,
// when that one is deleted, reads again (its predecessor, and its own key:
// a waiter whose lease ended while it queued gets an error wrapping
// rpctypes.ErrLeaseNotFound, never the lock; see etcd issue 11456). While it
// waits it keeps its lease alive. Its watch, one for the whole wait, is on
// its queue's directory, starts "now" and is made before the read that
// decides whether it waits; the waiter ignores every event but the one it
// waits for. The server serves such a watch at once, where a watch that
// starts at a revision already written (concurrency.Mutex's, or one from
// the revision after the read once anything else was written, as under
// contention it always is) is served from the server's 100 ms catch-up
// loop: a handoff takes about a millisecond instead of up to 100.
//
// Release deletes our key in a transaction that compares its create
// revision with the token, then revokes the lease, which holds nothing
// more: backend.ErrNotHeld when our key was already gone, whether its
// lease ended or the key was deleted behind our back (a deleted key leaves
// its lease alive, so revoking alone could not tell). A wait that
// ends by deadline, cancellation or error revokes the lease too: nothing is
// left behind. If the reply to a grant is lost, the lease (whose ID we chose)
// is revoked all the same.
//
// backend.Lease.Lost fires (its channel, made only for a caller that
// waits on it, closes) when the lock's key is deleted by anyone but
// its own Release: its lease revoked or expired, or the key deleted by an
// operator or a tool; for a lock on a shared lease, also when that lease
// is lost. The Resource learns of deletions from one watch on its prefix,
// for deletions only, that serves all its locks, on leases of their own
// and shared (a lock costs its place in a table of names, not a watch).
// The price of one watch for all locks is that the Resource hears of
// every deletion under its prefix, other processes' releases and its own
// included, so the watch starts only when something first waits for a
// loss (the first Done of any lock's Lost: distlock asks for it when the
// lock's Done is asked for, for loss observers, and while a waiter
// queues; or a shared lease lost), and runs from then until
// [Resource.Close] or until the client is closed, after which Lost no
// longer fires for deletions. When it starts it reads the keys of the
// locks then held, in transactions of 64, so a deletion before it is
// reported too. Until then a deletion from
// outside is found by the lock's next Release or Refresh (ErrNotHeld),
// not by Lost: an uncontended lock and unlock that nobody watches cost
// the transaction and the delete alone.
//
// # Clean-up
//
// Every call returns when its context ends, whatever the server does (a
// frozen server, a connection that stopped forwarding): no request runs
// on a context detached from the caller's in the caller's goroutine. An
// acquisition that fails or ends (deadline, cancellation, store error)
// undoes what it made in a clean-up job the Resource runs at once in the
// background, retried (after 50ms, doubling up to 1s) until it succeeds,
// the client is closed, or [Resource.Close]; Acquire waits for it while
// its context lives, and when the context ends first it returns a
// backend.AbandonedError whose Cleanup waits for the job (the facade runs
// it, and its Close waits for it within its bound).
//
// The clean-up makes sure that a request still on its way when the
// context ended, which the server may apply after the clean-up's own,
// never leaves a key: on a lease of its own the clean-up revokes the
// lease, and a transaction that puts a key on a revoked lease fails. On a
// shared lease every transaction that makes a key also compares the fence
// key of the key's name (<prefix>!fence/<lease ID>/<the name without the
// prefix>, bound to the lease); when the reply that would have told
// whether our key was made is lost, the clean-up deletes the key if it is
// there and puts the fence key in one transaction, so that the late
// transaction, if it lands after, makes nothing. The name is not used
// again before that, and other names' transactions are not touched. A
// fence key lives as long as its lease: one per name whose clean-up was in
// doubt, a few per lock key at most, since names are used again. A key that
// lands before the clean-up heads its queue until the clean-up deletes it,
// and is never granted: nobody waits for it. On a shared lease a key
// whose clean-up still fails a TTL after the first try makes the Resource
// give the lease up (the locks on it report themselves lost), so that it
// expires on the server with the key.
//
// A Release cut short by its context returns the context's error; the
// lock is then still held as far as the Resource knows, and Release may
// be called again. The revoke that follows the delete of a lock on a
// lease of its own runs within the caller's context, and in the
// background if that did not do it. [Resource.Close] revokes the shared
// leases within about half a second; a lease it could not revoke expires
// by itself, a third of its TTL (at least a second) after its locks'.
//
// # Semaphores and read/write locks
//
// A key's mutex, semaphore and read/write lock are distinct locks, each
// with a queue in a directory of its own, kept as a mutex's is (a key per
// acquisition, on its lease, ordered by create revision):
//
//	<prefix><encoded key>/<resource ID>-<slot>                 mutex
//	<prefix>!sem/<encoded key>/<limit>-<resource ID>-<slot>    semaphore
//	<prefix>!rw/<encoded key>/r-<resource ID>-<slot>           reader
//	<prefix>!rw/<encoded key>/w-<resource ID>-<slot>           writer
//
// (an encoded key never holds '!'; <limit> is the semaphore's limit in 16
// hex digits). Each queue key's value is the owner
// value, the holder's label (distlock.WithLabel), a semaphore's limit (0
// for the other kinds) and the lock's TTL in seconds, written as owner +
// label + "|" + hex(len(label)) + "|" + hex(limit) + "|" + hex(TTL), which
// reads back from its end whatever bytes the owner value and label hold.
//
// A semaphore's key holds a permit when fewer than Limit keys precede it;
// a writer's when no key precedes it; a reader's when no writer's key
// precedes it. The transaction that makes the key also reads what decides
// that, so an uncontended acquire is one transaction, as for a mutex. A
// waiter is woken only by what it waits for: a writer the key just before
// its own, a reader the newest writer's key before its own (as etcd's
// recipe RWMutex does). A semaphore's waiter cannot: a permit frees when
// any of the Limit holders leaves, in any order. So the first waiter
// (exactly Limit keys before it) watches the queue's deletions, and each
// waiter behind it watches the key just before its own, which its owner
// puts again, unchanged, once it holds: a release wakes the first waiter,
// and through it the next, as the internal lock of Curator's
// InterProcessSemaphoreV2 lets one acquirer at a time watch the leases.
// The transaction that makes a semaphore's key also checks that the
// queue holds no key of another limit (a compare over the directory's
// ranges before and after the names of its own limit, which etcd applies
// to every key of a range): an acquire whose limit differs from the
// queue's fails with backend.ErrLimitMismatch and makes nothing. So every
// key of a semaphore's queue has the same limit, the holders agree on it
// at every revision, no acquire fails for the key of another that is
// failing, and Inspect reads the limit from the oldest key. Once the
// queue is empty, the next acquire sets the limit anew.
//
// Why this is a semaphore and a read/write lock, with tokens as promised.
// A new key's create revision is above every existing key's, so a key
// only ever sees keys before it go: once it holds, it holds until it is
// deleted. Acquire returns a grant only after a read, at one revision,
// found its key holding and present. Call g(k) the first revision at
// which key k holds, and rev(k) its create revision (the token).
//
//   - Semaphore: at any revision the keys that hold are the oldest
//     min(Limit, queue length): never more than Limit. If rev(j) < rev(k),
//     every key before j is before k, and j too: whenever k holds, so
//     does j (if it still exists), so g(j) <= g(k). Grants in the order of
//     the revisions they start at therefore have increasing tokens (keys
//     that start at the same revision, when a revoke deletes several keys
//     at once, are ordered by their tokens).
//   - Read/write lock: a writer holds only as the oldest key, so every
//     other key has a writer before it: no reader, no other writer holds
//     with it. A key k after a writer w (rev(k) > rev(w)) cannot hold
//     while w's key exists, which is from before g(w) until w's release:
//     so every grant that starts before a write grant w has a smaller
//     token than w's, and every write grant that starts before a read
//     grant r (a writer after r cannot hold while r exists) has a smaller
//     token than r's.
//
// The order in which concurrent Acquire calls return can differ from
// g's only among grants that hold together (permits, readers); a write
// grant returns after every grant that started before it and before
// every grant that starts after it, unless a key is deleted from
// outside, which its owner learns through Lost.
//
// # Inspection
//
// [Resource.Inspect] (distlock's Inspect) reads a lock's queue once and
// asks etcd the time left of each holder's lease (TimeToLive, in whole
// seconds rounded down), touching nothing: the holders are the keys that
// hold by the rules above (waiters are not listed), each with its token
// (create revision), its label (kept in its key's value beside the owner
// value, and never compared) and its time left by the server's clock. On a
// shared lease, which its owner keeps alive and which outlives its locks by
// a third of their TTL, the time left is at most the lock's TTL (kept in
// the key's value too): the lock's own deadline is kept by its owner's
// process, which etcd does not know.
//
// # Elections
//
// An election (distlock.Election) is a mutex to the store. [Resource.Relabel]
// (backend.Relabeler, the leader's Proclaim) puts the holder's key again
// with the new label, in a transaction that compares its create revision
// with the token, on the lease the key has: the token and the queue stay,
// and waiters, which wait for deletions, are not woken. [Resource.Watch]
// (backend.Watcher, the observers' Observe) watches the mutex's queue
// directory, every put and deletion, from a goroutine the Resource owns:
// a change of leader reaches an observer with the watch's event, as etcd's
// concurrency.Election.Observe has it.
//
// # TTL
//
// etcd leases count whole seconds: the TTL is rounded up to whole seconds,
// and the server raises it to its minimum lease TTL (1.5 election timeouts
// rounded up: 2s with the default 1s election timeout). The effective TTL is
// what backend.Lease.TTL holds after a successful acquire, and what the
// facade counts the lock's life from. A TTL longer than [MaxTTL] (about 214
// years: etcd's longest lease is 9e9 seconds, and a shared lease lives a
// third longer than its locks) is refused before any I/O. Refresh (called
// by distlock's Lock.Extend; distlock.WithAutoRenew needs none, see Shared
// leases) reads our key, after a keep-alive of the lease when its life
// might fall short of the TTL; on a lease of its own it sends one
// keep-alive and reads our key: backend.ErrNotHeld when either is gone.
//
// # Fencing tokens
//
// The token is the create revision of our key. etcd revisions increase
// with every write to the cluster, so each new holder of a key, and indeed
// each new key created anywhere, gets a larger token. A protected resource
// keeps the newest token it has seen and refuses writes that carry an older
// one. When the protected data lives in etcd too, one transaction does it,
// with the token written as 20 decimal digits so that etcd's byte-wise
// comparison orders it as a number:
//
//	tok := fmt.Sprintf("%020d", lk.Token())
//	resp, err := cli.Txn(ctx).
//		If(clientv3.Compare(clientv3.Value(fenceKey), ">", tok)). // a newer holder wrote
//		Else(clientv3.OpPut(fenceKey, tok), clientv3.OpPut(dataKey, v)).
//		Commit()
//	// resp.Succeeded: refused, this lock is stale.
//
// # What leases cannot do
//
// A lease is a promise by the server, not by the holder's process: a holder
// that pauses (GC, swapping, a frozen VM) or loses the network for longer
// than the TTL has lost the lock without knowing, and another holder may
// already run. No lease-based lock, this one included, can exclude that;
// the fencing token can make the protected resource refuse the stale
// holder's writes.
//
// # Shared leases
//
// [WithSharedLease] makes locks share one lease per TTL, kept alive by the
// Resource, like one concurrency.Session (locks that distlock renews,
// distlock.WithAutoRenew, always do, option or not): an uncontended
// acquire is then one transaction and a release one compare-and-delete,
// as with concurrency.Mutex, instead of a grant and a transaction, then a
// compare-and-delete and a revoke (about 2.5 times faster, measured by
// BenchmarkCycleVsMutex). Every delete of a queue key compares its create
// revision: a name given back may already hold a later acquisition's key.
// The shared lease lives TTL plus a third of it (at least a second) and is
// renewed every half of that third, so a lock taken on it is valid for its
// full TTL. The Resource keeps one lease and one goroutine per TTL in use
// until [Resource.Close] (which distlock's Close calls); Close revokes the
// shared leases, and with them the locks still held on them.
//
// A lock that distlock renews lives as long as the shared lease: Acquire
// sets backend.Lease.KeptAlive, and the facade then neither refreshes it
// nor times it. Holding it costs no request of its own: the lease's one
// keep-alive is every such lock's renewal (100,000 locks held by one
// process cost one keep-alive per renewal period, as concurrency.Session
// does), and the lease's loss is every such lock's loss. Without
// [WithSharedLease] the lease carries only such locks: it lives their TTL
// and is renewed every third of it, over one open stream, as a
// concurrency.Session's. The Resource
// gives the lease up, and closes its locks' Lost, when renewals have
// failed until the lease's life after the last renewal's send, less 1%
// and 2ms, is over: before the server can expire the lease and let
// another holder in. A key deleted from outside closes its lock's Lost
// through the Resource's key watch, without a request, once something
// waits for a loss (see above).
//
// A lock on the shared lease that distlock does not renew (WithSharedLease
// without distlock.WithAutoRenew) keeps its TTL by a timer in the process,
// which deletes it unless refreshed in time; a lock whose process died
// stays up to a third of its TTL (at least a second) longer, until the
// lease expires.
//
// # What the store keeps
//
// Per lock key, only keys bound to leases: the queue keys of the
// acquisitions in progress and of the holders, each gone with its lock's
// release, its TTL, or its lease (a lease of its own: the lock's TTL; a
// shared lease: a third of the TTL, at least a second, after its process
// stopped renewing it), and on a shared lease the fence keys of the names
// whose clean-up was in doubt (see Clean-up): one per such name, gone
// with the lease, at [Resource.Close] or once its process is gone. So a
// lock key used once costs nothing after its lock ends, but for fence
// keys, which a long-lived Resource keeps as long as it lives, one per
// name whose acquisition was cut short while its transaction was in
// flight: a program that cancels acquisitions of ever new keys (job:<id>)
// accumulates them, a few dozen bytes each, until it closes its Resource.
//
// Resources that share a cluster must use prefixes none of which is a
// prefix of another ([WithPrefix]): the keys of a Resource under "/a/b/"
// would sit in the queue directory of the lock key "b" of a Resource
// under "/a/", where that lock's acquisitions would count them as
// contenders (and wait for them) and Inspect would list them. Nothing is
// granted wrongly, but the outer Resource's lock "b" waits on the inner
// Resource's traffic. The Resource cannot see another's prefix to refuse
// it.
//
// # Errors
//
// Store errors are returned wrapped with the operation and the lock key,
// for example "etcd: acquire \"k\": ...". A wait that ends at its deadline
// returns backend.ErrNotAcquired, one that ends with its context returns
// ctx.Err(), each in a backend.AbandonedError when the clean-up of what
// the attempt made had not finished by the context's end. Keys longer than [MaxKeyLen] bytes are refused before any I/O.
// Over a client the application has closed, every call fails at once with
// an error saying so, instead of after the client's retries, seconds later;
// what it cannot clean up (a key, a lease) expires with its lease, and a
// shared lease reports itself lost.
package etcd
