// Package zookeeper keeps distlock locks in ZooKeeper, over the
// github.com/go-zookeeper/zk client. [New] returns a [*Resource], a push
// store (backend.Waiter) for distlock.New:
//
//	conn, _, err := zk.Connect([]string{"127.0.0.1:2181"}, 10*time.Second)
//	...
//	res, err := zookeeper.New(conn, zookeeper.WithSessionTimeout(10*time.Second))
//	if err != nil { ... } // a nil conn or a bad option: wraps distlock.ErrInvalid
//	d, err := distlock.New(res)
//
// [New] does no I/O.
// The caller owns conn: [Resource.Close] deletes the locks still held
// through the resource and stops its goroutines, and never closes conn.
// Close conn after the resource: deletions the server has not answered
// go on until it answers or conn is closed.
//
// # The recipe
//
// This is ZooKeeper's own lock recipe, as Curator's InterProcessMutex
// implements it. A key maps to one parent znode under the root
// ([DefaultRoot], or [WithRoot]): the key escaped into a legal znode name,
// injectively (letters, digits and "-_.:@=+,~" stand for themselves,
// every other byte is %XX). Root and parents are container znodes, which
// the server deletes once they are empty again.
//
// To acquire, a client creates an EPHEMERAL_SEQUENTIAL child named
// "_c_<guid>-lock-<sequence>", holding a small record of its holder (see
// "Inspection"). The create is a multi-op with a write of the parent's
// (empty) data, whose reply is the parent's new stat: its mzxid is the
// child's czxid, the fencing token, and its number of children says
// whether the child is alone. A child created alone holds the lock at
// once: one request. Otherwise the client lists the children: the lowest
// sequence holds the lock, and any other client sets a watch on its
// immediate predecessor only and waits for its deletion, the deadline or
// the context, then lists again; but when its predecessor was the only
// child before it, the deletion alone grants it the lock, with no
// listing, since no child queues before a child once it is made. Because
// each waiter watches a different znode, one release wakes exactly one
// waiter: no thundering herd, and the queue is FIFO. A grant after a
// wait costs four or five requests: the create, a listing, the watch, a
// second listing unless the predecessor was the only child before it
// (for a lock the session keeps alive, a watch on its own node instead,
// sent with the other watch), and the release; an uncontended lock costs
// two, the create and the release. A waiter that gives up (deadline, context, error) deletes its own child,
// so nothing is left behind in the store (in the background when its
// context has ended: see below). Its watch stays armed until the
// predecessor changes (the protocol go-zookeeper speaks cannot remove a
// watch); the next wait on the same predecessor through the resource
// uses it instead of setting another, so repeated waits on a long-held
// lock keep one watch, not one each.
//
// # Semaphores and read/write locks
//
// [Resource.CheckKind] accepts every kind: a key's semaphore and
// read/write lock queue on the same recipe, under parents of their own,
// "<key>%sem" and "<key>%rw" (an escaped key never holds '%' followed by
// a lowercase letter), so that the mutex, the semaphore and the
// read/write lock of a key are distinct locks. The child's name says
// what it asks for: "_c_<guid>-read-<sequence>", "-write-", or
// "-sem<limit>-" with the semaphore's limit, so that one listing tells a
// waiter all it needs, with no read of another child's data.
//
//   - A reader holds when no writer is queued before it, and watches the
//     last writer before it (etcd's recipe RWMutex); a writer holds when
//     it is first, and watches its immediate predecessor, as a mutex
//     does. Readers that arrive after a waiting writer queue behind it:
//     a stream of readers cannot starve it, as with sync.RWMutex.
//   - A permit of a semaphore of limit L holds when fewer than L children
//     precede it. No single child's deletion is needed for that (any of
//     the L holders' lets the next in), so a waiter cannot watch one
//     child only, as the L-th child before it: when another holder goes,
//     a permit would stay idle while the waiter waits for that one. The
//     first waiter (L children before it, all holders) waits for any
//     change of the queue, through the child watch of its listing, as the
//     lease holder of Curator's InterProcessSemaphoreV2 waits for a change
//     of the leases; the waiters behind it wait for their immediate
//     predecessor, which marks its grant, when it gets the permit, by a
//     write of its own data, or goes. A permit with a waiter behind it
//     costs that one write; a semaphore of limit 1 is a mutex.
//   - A permit whose limit differs from that of a child queued before it
//     fails with backend.ErrLimitMismatch (its child deleted at once):
//     the holders agree on one limit at any moment, and after the last
//     holder has gone the next acquire sets the limit anew. So an acquire
//     may also fail while an acquire of another limit, queued before it,
//     has not yet withdrawn after failing so.
//
// Each rule grants a prefix of the queue: the store grants in queue
// order (see "Fencing token"). A model of the rules with arrivals,
// releases and give-ups in random order and the reactions of the waiters
// delayed at random (TestQueueModel) checks that the holders never
// exceed what the kind allows and that no child the queue grants waits.
//
// The guid in the name (32 hex digits: 64 random bits that name the
// Resource, and a count of its creates) makes creation safe when the
// connection drops after the request was sent: the client lists the parent and finds its
// node again instead of orphaning it (Curator's "protected" mode). If it
// is not there, the client creates it again under the same guid; the
// first request cannot land later: when the session reconnects, the
// server closes its old connection (an ensemble's leader refuses the
// requests of a session that moved to another server), and the session's
// requests are applied in order, so the listing after the second create
// shows the first if it landed, and the waiter deletes it; when every
// create failed, the clean-up syncs before it lists. A deletion
// that fails on a broken connection is retried in the background until
// it succeeds or the session, and with it the ephemeral node, ends.
//
// # A server that does not answer
//
// go-zookeeper takes no context: a request returns when the server
// answers or the client gives the connection up (its receive timeout is
// 2/3 of the session timeout, and a frozen server can hold a
// reconnection for ten times that). The resource sends every request from
// a goroutine of its own and waits for it only until the call's context
// ends, so Acquire, Release and Refresh return then, whatever the server
// does; the request goes on and completes on its own.
//
// An Acquire cut short that way may leave a znode behind: a create sent
// but not answered, or a znode whose deletion was not answered. It
// returns a backend.AbandonedError, whose Cleanup the facade runs in the
// background (Close waits for it within its bound), and deletes the
// znode as soon as the server answers: once the create's reply comes, by
// its path, or, if the reply was lost, by the guid in its name. The
// deletion does not stop at Close, since a create may land after it;
// it ends when nothing is left, or when the connection is closed (the
// session, and its ephemeral znodes, end with it). An abandoned attempt
// is never granted the lock: nothing can return its grant, and its znode
// goes as soon as the server lets it. A Release cut short returns an
// error wrapping the context's; its delete goes on, retried in the
// background if it fails, and calling Release again sends another.
//
// # Session and TTL
//
// An ephemeral znode lives as long as the client's session. With
// distlock.WithAutoRenew the session keeps the lock (the resource sets
// backend.Lease.KeptAlive): no TTL runs, and the facade makes no renewal,
// so a held lock costs no request; after a crash of the client process,
// the server frees it when it expires the session. Without it, the TTL
// of an acquisition (distlock.ContextWithTTL, distlock.WithDefaultTTL) is
// enforced by the client: when it runs out, the resource deletes its
// znode, unless Lock.Extend ([Resource.Refresh], which writes the new
// TTL into the znode) pushed it back; after a crash, the session timeout,
// not the TTL, frees the lock.
//
// The resource reports a lock lost (fires backend.Lease.Lost, and so
// closes the lock's Done channel) when its TTL deleted it, when the session changed
// (the old one expired, with its ephemeral nodes), when the server may be
// about to expire the session, and, for a lock the session keeps, when
// another client deleted its znode:
//
//   - With [WithSessionTimeout](d), where d is the negotiated session
//     timeout: the server expires a session no sooner than d after it
//     last heard from the client, so the resource, while locks are held
//     or waits are in progress, asks the server for a small read when
//     none of its requests sent in the last d/3 was answered (go-zookeeper's own pings, as frequent,
//     are answered out of its sight), and closes Lost when 0.9 x d have
//     passed since it sent the last request the server answered (it
//     looks every 25ms from 0.9 x d - 25ms on). Lost closes d/10 before
//     the earliest moment the server can expire the session and another
//     client can be granted the lock, however the connection failed:
//     refused, reset, or silent with the connection left open (which
//     go-zookeeper notices only after its receive timeout, 2/3 of d).
//     That tenth absorbs the lateness of the resource's timers and
//     scheduling. A lock survives a disconnection if the client is back
//     in its session before that deadline. Holding locks thus costs a
//     read per d/3 for all of them, as many as the session's pings, and
//     so does waiting: a waiter granted the lock by an event, after a
//     wait of any length, then finds the deadline counted from a request
//     answered less than d/3 before, not from the listing that began its
//     wait (which, for a wait longer than 0.9 x d, would give a lock lost
//     as soon as granted).
//   - Without it, go-zookeeper does not expose the negotiated timeout and
//     any disconnection is loss. A silent connection is noticed after
//     go-zookeeper's receive timeout, 2/3 of the session timeout after the
//     last reply; its pings, every third of the timeout, keep that about a
//     third of the timeout ahead of the session's expiry.
//   - A lock the session keeps has a watch, which fires when its znode is
//     deleted, once something waits for its loss (its Lost's Done: the
//     facade's Lock.Done, a loss callback): a data watch on the znode, set
//     while it waited, or by the first Done (one request, whose read finds
//     a deletion from before it), or else the child watch that the listing
//     granting it set on its parent at no cost (which fires at the first
//     change of the queue, after which the resource sets a data watch on
//     the znode: one request, only for a lock held while its queue
//     changed). A lock created alone costs no watch until then: its
//     grant is one request, and until something waits for its loss a
//     deletion by another client is found by Refresh or Release
//     (ErrNotHeld), as for a lock with a TTL; its session's end is always
//     noticed (below). The session watcher looks at the watches every
//     100ms: Lost closes within that, and a round trip, of the deletion.
//     The resource keeps, per such lock, its record (64 bytes, and 8 in
//     its list of locks; the znode's path is made again from the lease's
//     key when a request needs it; the facade's grant and owner value add
//     about 210: BenchmarkHeldFacade), go-zookeeper's registration of the
//     watch once there is one (about 250 bytes), a Lost channel only once
//     somebody waits on it, and no goroutine or timer. A lock with a TTL notices a
//     deletion by another client at its next Refresh or Release, as
//     ErrNotHeld.
//
// The connection is sampled every 25 ms while locks are held or waits are
// in progress; the
// resource does not need the event channel of zk.Connect, which stays the
// caller's. Locking on a connection that has no session yet is fine:
// go-zookeeper queues the requests until the session is established.
//
// go-zookeeper v1.0.4 has a data race of its own: when it reconnects with
// watches set, it reads the last zxid it saw while its receive loop may
// write it (go-zookeeper/zk#35). A program run with -race whose
// connection drops while it holds or waits for locks can see the race
// detector report it; on 64-bit platforms the read is not torn. This
// repository's tests run a copy with the fix (third_party/go-zookeeper/zk).
//
// # Fencing token
//
// The token is the czxid of the holder's znode: the zxid of its create,
// the id ZooKeeper gives every transaction, global to the ensemble and
// strictly increasing, across leader changes. The multi-op that creates
// the znode tells it (see "The recipe"); a create found again by its guid
// after its reply was lost reads it.
//
// Tokens increase with the grants of a lock, of every kind, in the order
// in which the store grants them: each rule grants a prefix of the queue
// (for a mutex or a writer, the first child; for readers, the children
// before the first writer; for a semaphore, the first L), and a prefix
// can only grow at its end as children are deleted, so children are
// granted in the order of their sequence numbers, which is the order of
// their creates, and so of their czxids. That holds across the parent's
// lives too: the server deletes an empty container parent only, and a
// new parent's children are created after the old one's were all
// deleted. A grant here is the transaction after which the queue grants
// the child (the deletion that made it a holder, or its own create): the
// client learns of it a little later, so that two readers or two permits
// granted by one deletion may return to their callers in either order.
// So: a holder's token is larger than that of every lock granted before
// it; a writer's (or a mutex holder's) larger than that of every grant
// before it, in real time too, since nothing behind it in the queue can
// be granted while it waits; a reader's larger than that of every writer
// granted before it; and a lock acquired after another returned has the
// larger token.
//
// A holder that is frozen (a long GC pause, a stopped process) past the
// session timeout, or a WithSessionTimeout larger than the negotiated
// timeout, lets another client hold the lock while the first still
// believes it does: protect the resource with the token.
//
// # Inspection
//
// [Resource.Inspect] lists a key's queue of one kind and reads the data
// of the children that hold it by the rules above: one listing and one
// read per holder, the reads sent together; it takes and changes
// nothing. Each holder's token is its czxid, its label the one its
// acquire wrote (distlock.WithLabel), its kind read or write for a
// read/write lock, and a semaphore's limit is its holders'. A child's
// data is a small record (a URL query, readable in zkCli:
// "label=host-a%3A123&ttl=600&v=1&value=..."); no compare reads it.
//
// The time left is the TTL from the record, counted from the znode's
// mtime (the server's clock at its create, its grant mark, or the last
// Refresh, which writes the TTL), against the clock of the inspecting
// process. The holder's client counts the TTL from its grant, after the
// create, so the time shown is at most the time left, short by about a
// round trip for a lock taken at once and by the wait for one that
// queued; and the two clocks' difference adds to it. It is 0 when the
// holder's session keeps the lock (no TTL runs: the lock lives as long
// as the session) and when that time has passed while the znode is
// still there (a lock that queued long, or a holder that died, which the
// server frees at the session's expiry): a znode in the queue's granted
// prefix is always listed, since it keeps others out.
//
// # What the store keeps
//
// Per lock key and kind, one parent znode, a container, which the server
// deletes once it is empty (ZooKeeper 3.5 and later; on 3.4, which has
// no containers, the parents are persistent and stay), and one ephemeral
// child per acquisition in progress or held, gone with its lock's
// release, its TTL (deleted by its holder's process), or its session. So
// a key locked once leaves nothing once its lock has ended and the
// server's container check has run (every minute by default,
// znode.container.checkIntervalMs), however many distinct keys are used.
// The root ([WithRoot]) stays: it is a container too, but holds the
// parents while any is in use.
//
// # Elections
//
// An election (distlock.Election) is a mutex to the store.
// [Resource.Relabel] (backend.Relabeler, the leader's Proclaim) writes
// the holder's record again with the new label, if its znode is still
// there under its session; the czxid (token) and the queue stay, and a
// lock with a TTL has it pushed back, as by Refresh, since the record's
// mtime dates it. [Resource.Watch] (backend.Watcher, the observers'
// Observe) keeps a child watch on the mutex's queue and a data watch on
// its head set again each time one fires, as Curator's LeaderLatch
// watches the latch's children: a change of leader reaches an observer
// with the event.
//
// # Errors
//
// Acquire returns backend.ErrNotAcquired at its deadline,
// backend.ErrLimitMismatch for a semaphore's permit whose limit differs
// from a child's queued before it, ctx.Err() when the context ends (in a
// backend.AbandonedError when a znode may be left to delete), [ErrClosed]
// after Close, and go-zookeeper's errors wrapped with the operation and
// key. Release and Refresh return
// backend.ErrNotHeld when the znode is gone or the lock was reported
// lost. Keys longer than [MaxKeyLen] bytes are rejected before any I/O
// ([Resource.ValidateKey]).
package zookeeper
