// Package zookeeper keeps distlock locks in ZooKeeper, over the
// github.com/go-zookeeper/zk client. [New] returns a [*Resource], a push
// store (backend.Waiter) for distlock.New:
//
//	conn, _, err := zk.Connect([]string{"127.0.0.1:2181"}, 10*time.Second)
//	...
//	d, err := distlock.New(zookeeper.New(conn, zookeeper.WithSessionTimeout(10*time.Second)))
//
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
// "_c_<guid>-lock-<sequence>" and lists the children. The lowest sequence
// holds the lock. Any other client sets a watch on its immediate
// predecessor only and waits for its deletion, the deadline or the
// context, then lists again. Because each waiter watches a different
// znode, one release wakes exactly one waiter: no thundering herd, and
// the queue is FIFO. A waiter that gives up (deadline, context, error)
// deletes its own child, so nothing is left behind in the store (in the
// background when its context has ended: see below). Its
// watch stays armed until the predecessor changes (the protocol
// go-zookeeper speaks cannot remove a watch); the next wait on the same
// predecessor through the resource uses it instead of setting another,
// so repeated waits on a long-held lock keep one watch, not one each.
//
// The guid in the name makes creation safe when the connection drops
// after the request was sent: the client lists the parent and finds its
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
// An ephemeral znode lives as long as the client's session. The TTL of an
// acquisition (distlock.ContextWithTTL, distlock.WithDefaultTTL) is
// enforced by the client: when it runs out, the resource deletes its
// znode, unless distlock.WithAutoRenew is on, in which case the facade's
// renewals ([Resource.Refresh]) push the deletion back. After a crash of
// the client process nobody deletes the znode: then the session timeout,
// not the TTL, frees the lock, when the server expires the session.
//
// The resource reports a lock lost (closes backend.Lease.Lost, and so the
// lock's Done channel) when its TTL deleted it, when the session changed
// (the old one expired, with its ephemeral nodes), and when the server
// may be about to expire the session:
//
//   - With [WithSessionTimeout](d), where d is the negotiated session
//     timeout: the server expires a session no sooner than d after it
//     last heard from the client, so the resource asks the server for a
//     small read every d/10 while locks are held, and closes Lost when
//     0.9 x d have passed since it sent the last request the server
//     answered (it looks every 25ms from 0.9 x d - 25ms on). Lost closes
//     d/10 before the earliest moment the server can expire the session
//     and another client can be granted the lock, however the connection
//     failed: refused, reset, or silent with the connection left open
//     (which go-zookeeper notices only after its receive timeout, 2/3 of
//     d). That tenth absorbs the lateness of the resource's timers and
//     scheduling. A lock survives a disconnection if the client is back
//     in its session before that deadline.
//   - Without it, go-zookeeper does not expose the negotiated timeout and
//     any disconnection is loss. A silent connection is noticed after
//     go-zookeeper's receive timeout, 2/3 of the session timeout after the
//     last reply; its pings, every third of the timeout, keep that about a
//     third of the timeout ahead of the session's expiry.
//
// The connection is sampled every 25 ms while locks are held; the
// resource does not need the event channel of zk.Connect, which stays the
// caller's. Locking on a connection that has no session yet is fine:
// go-zookeeper queues the requests until the session is established.
//
// # Fencing token
//
// The token is a zxid, the id ZooKeeper gives every transaction: global to
// the ensemble and strictly increasing, across leader changes and when the
// parent znode was deleted and recreated in between. It is the czxid of
// the holder's znode (the zxid of its create) except when the listing that
// granted the lock held that znode alone: then it is the parent's pzxid
// in that listing (the zxid of its last child change, at least our czxid),
// which saves the round trip that reading our czxid costs on the
// uncontended path. Either way successive holders get increasing tokens:
// a later holder's create was not in that listing, so its czxid is higher
// than any zxid the listing shows, and a later holder's own listing comes
// after the deletion of our znode, so its pzxid is higher than our czxid.
//
// A holder that is frozen (a long GC pause, a stopped process) past the
// session timeout, or a WithSessionTimeout larger than the negotiated
// timeout, lets another client hold the lock while the first still
// believes it does: protect the resource with the token.
//
// # Errors
//
// Acquire returns backend.ErrNotAcquired at its deadline, ctx.Err() when
// the context ends (in a backend.AbandonedError when a znode may be left
// to delete), [ErrClosed] after Close, and go-zookeeper's errors wrapped
// with the operation and key. Release and Refresh return
// backend.ErrNotHeld when the znode is gone or the lock was reported
// lost. Keys longer than [MaxKeyLen] bytes are rejected before any I/O
// ([Resource.ValidateKey]).
package zookeeper
