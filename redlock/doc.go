// Package redlock is the distlock backend for Redlock: one lock taken on N
// independent Redis masters, held while a majority of them hold it. It is a
// pull store: [Resource] implements backend.Spinner, and the distlock
// facade spins on it.
//
//	nodes := []goredis.UniversalClient{c1, c2, c3, c4, c5} // independent masters
//	res, err := redlock.New(nodes)
//	if err != nil { ... }
//	d, err := distlock.New(res)
//
// N must be odd and at least 3, no client nil ([New] fails otherwise, as
// for a bad option, with an error wrapping distlock.ErrInvalid and no
// I/O). The nodes must fail independently: not replicas of one another,
// not shards of one Cluster, ideally not on one host. The caller owns the
// clients; create them with ContextTimeoutEnabled: true and DialerRetries:
// 1 (see [New] and Clients).
//
// # Algorithm
//
// Acquire ([Resource.TryAcquire]) sends the same request, the Redis
// backend's acquire script (SET lock value NX PX ttl, with the same value
// everywhere), to every node at once. Each node gets a per-node
// timeout far below the TTL: by default 5% of it, at least 5ms
// ([WithNodeTimeout]). The round is decided as soon as a majority set the
// key, else when every node answered or the timeout passed. Elapsed time
// is measured with the monotonic clock from the start of the round. The
// lock is held if and only if
//
//	yes >= N/2+1  and  validity = ttl - elapsed - drift > 0
//
// where drift = ttl x 0.01 + 2ms ([WithDrift]) allows for node clocks
// running at slightly different rates. The lock is then known valid until
// start + ttl - drift (no node can expire it sooner, since none set it
// before the start); the facade closes the lock's Done channel then unless
// it was renewed ([Resource.Refresh], distlock.WithAutoRenew). Otherwise
// the key is deleted again on every node (those that timed out too: their
// SET may have landed) and the attempt fails:
// contention (the spin loop tries again; distlock.ErrNotAcquired at the
// end of the wait) when other owners hold it, an error wrapping
// [ErrNoQuorum] that names the failed nodes when fewer than a majority
// answered. A node that is down or paused costs nothing while a majority
// answers yes, and at most one per-node timeout per round otherwise (a
// failed acquire has two rounds: the attempt and its cleanup).
//
// "None set it before the start" holds because every round stores a value
// of its own: the owner value, '#', and the round's number within the
// acquisition ("3f...9a#2"; the spin loop makes a round per attempt).
// A node's yes is then the work of this round's request, sent after the
// start. Were the value the same in every round, a request of an earlier
// round delayed on the network could set the key after that round's
// cleanup, with an expiry from its arrival, and the next round would
// count the key as its own: the node would free it before the validity
// ends, and another owner could take a majority with it while we hold the
// lock. Setting the expiry again when a round finds its own value (which
// the acquire script also does, for the single-Redis backend) would fix
// the expiry but not the earlier round's cleanup: delayed too, it could
// delete the next round's key. A value per round rules out both: no round
// counts, extends or deletes another round's key.
//
// Release is a compare-and-delete on every node at once; it succeeds as
// soon as a majority deleted our value (the rest finish in the
// background), and returns backend.ErrNotHeld when fewer than a majority
// could have held it. Refresh is a compare-and-PEXPIRE on every node at
// once and succeeds only with a majority within the new validity.
//
// The scripts and the key layout are the Redis backend's
// (package internal/redisscript): a lock on key k is the string key
// prefix{k'} holding the owner value, with k' the key with '%', '{' and '}'
// escaped. No fence counter is kept.
//
// # What it promises, and what it does not
//
// Redlock keeps two holders apart only under timing assumptions: that a
// process is not paused, and that the network does not delay a request,
// for longer than the lock's validity, and that node clocks advance at
// about the same rate (within the drift allowance; a clock that jumps, by
// an operator or NTP stepping it, breaks the lock on that node). Martin
// Kleppmann's critique ("How to do distributed locking", 2016) shows a
// holder that pauses (GC, swap, a stalled VM) past the validity, then
// writes to the protected resource while a second holder does too; Salvatore
// Sanfilippo's answer ("Is Redlock safe?", 2016) defends the timing model
// and points at the same fix: the protected resource must reject stale
// holders.
//
// That fix is a fencing token, and Redlock cannot make a sound one. The
// lease's Token is always 0 (distlock's Lock.Token returns 0). A token
// must be larger than the token of every earlier holder, and successive
// holders are granted by different majorities, which share as little as
// one node. The Redis backend's token, a hybrid clock per server
// (max(last token + 1, the server's time in microseconds)), does not carry
// over:
//   - each node could hand out such a token with its yes, and the holder
//     take the largest of its majority; the next holder's majority shares
//     a node with it, whose token is larger than the one it gave the
//     earlier holder, but the earlier holder's token may have come from
//     another node, whose clock is ahead: the next token is then smaller.
//     Strict increase would need every two nodes' clocks to agree within
//     the time between two grants (down to the round trip of a release
//     and the next acquire), an assumption on clock offsets that Redlock
//     otherwise does not make (it allows for clocks running at different
//     rates, not for clocks set apart);
//   - writing the holder's token back to a majority before the acquire
//     returns (a second round, as a replicated register does) makes every
//     later majority see it, with no clock at all, but it doubles the cost
//     of every acquisition, and a node restarted empty within that majority
//     loses it again: the clock would be back as the only guard, with the
//     same offset assumption, on exactly the failure the token is for.
//
// A token that can go backwards is worse than none: a resource that trusts
// it refuses the current holder and accepts a stale one. So Redlock makes
// none. Use Redlock where an occasional overlap costs efficiency, not
// correctness (work done twice, a cache filled twice). Where overlap would
// corrupt data, use a store with consensus that makes tokens, the etcd or
// ZooKeeper backend of this module, or the Redis backend on one
// deployment, and have the resource check them.
//
// # Restarts: stay out for one TTL
//
// A node restarted without persistence comes back empty, and may then
// grant our lock to someone else: if it was one of a bare majority, two
// owners each hold a majority. Operators must keep a restarted node out of
// service (not answering clients) for at least the longest TTL in use
// (delayed restart), or run it with AOF persistence and appendfsync
// always. The package cannot enforce this; it is the deployment's job.
//
// # Ambiguity and cleanup
//
// A request that timed out may still have set the key. A failed acquire
// therefore deletes the key on every node (compare-and-delete). It waits
// for the deletes while the caller's context lives and every node answered
// the round; otherwise it does not hold the caller: it returns a
// backend.AbandonedError whose Cleanup the facade runs in the background,
// sending the deletes again until every node that may hold the key (it
// said it set it, or its reply did not come or did not tell) confirmed.
// A contended round (no error) waits only for the nodes that set the key;
// when their deletes do not come back in time, it is abandoned as well,
// and its Cleanup waits, as any other's, for every node that may hold the
// key, those that did not answer the round included: once it has
// succeeded, no node holds the round's value, and a request of the round
// still on its way meets the tombstone described below. A contended round
// that returns (no Cleanup follows it) sends a node that did not answer
// the round its delete again, spaced by the per-node timeout, while the
// delete fails without saying what happened and until the round's key
// would expire (or [Resource.Close]): a request that landed late does not
// keep that node from other owners for the TTL.
// Requests are not cut when the caller gives up or a majority has decided:
// they run on, bounded by the per-node timeout, and a reply that arrives
// late still counts. When it says the key was set after a delete of it (a
// release, or the cleanup of a failed acquire) was sent, and that delete
// found nothing there, the key is deleted once more. A SET that lands
// later still, unseen (its reply lost or timed out), is caught by a
// tombstone: the cleanup of a round in which a node did not answer, or
// that failed with an error, also writes, in the same script on each
// node, a key naming the round's value (living one TTL) that makes the
// acquire script refuse to set the lock for that value. The round's value
// is not used again (the next round has its own), so burying it costs
// nothing but the key. A contended round whose every node answered has
// no request on its way and writes none (a crowd of waiters spinning on a
// held lock would otherwise leave a key per round and node, each living a
// TTL); nor does a release: a SET that lands unseen after those (a copy
// a proxy kept after its sender's connection closed, say) is counted by
// no round and expires with its TTL.
//
// Requests to the nodes run on worker goroutines, per node, that exit
// after two idle seconds; [Resource.Close] (called by distlock's Close)
// stops the idle ones at once. A burst of concurrent calls starts as many
// workers as it needs.
//
// # Clients
//
// A down node costs what go-redis takes to fail a request (its dial and
// command retries, DialerRetries and MaxRetries), at most the per-node
// timeout. With ContextTimeoutEnabled, go-redis also stops reading from a
// slow node at that timeout; without it the Resource still stops waiting
// then, and the request ends within the client's ReadTimeout. Every call
// returns when its context ends, whatever the nodes do.
//
// A node whose request go-redis could not dial was sent nothing; when no
// node could be dialled, a failed acquire sends no clean-up round. By
// default go-redis retries a refused dial for about 1.7s (5 dials per try,
// 4 tries), past the per-node timeout (5% of the TTL): such a node then
// counts as one that did not answer. Create the clients with
// DialerRetries: 1 to have a refused node reported as one at once, with
// its cause (see the redis package's "A server that refuses
// connections").
//
// # Mutexes only
//
// Redlock holds mutexes, not semaphores nor read/write locks
// ([Resource.CheckKind]; the facade returns distlock.ErrUnsupported before
// any I/O). Majorities cannot bound a semaphore: each node only knows the
// permits it granted, and majorities overlap, so with a limit of 2 on three
// nodes, holders on nodes {1,2}, {2,3} and {1,3} are three, while no node
// counts more than two. Readers and writers have the same flaw.
//
// # Inspection
//
// [Resource.Inspect] (distlock's Inspect) reads the lock on every node at
// once and reports as holder the value a majority of them hold: two
// majorities share a node, so at most one value can be on a majority at
// a time. Its time left is the time until fewer than a majority hold it
// (the majority-th longest PTTL among them), its token 0, and its label
// (distlock.WithLabel) the one the acquire script keeps beside the lock on
// each node (the Redis backend's label key, released and extended with
// the lock). The nodes are read one round trip apart, not at one instant:
// the answer is a snapshot, as any inspection is. Fewer than a majority
// answering is an error wrapping [ErrNoQuorum].
//
// # Elections
//
// An election (distlock.Election) is a mutex, which Redlock holds: a
// candidate campaigns by spinning, and Leader and Observe read the leader
// by inspection. Its term is 0, as every Redlock token is: nothing can
// fence a leader paused past its TTL, and observers tell leaders apart by
// their label and published value only. Proclaim is not supported (the
// Resource does not implement backend.Relabeler: a label rewritten on a
// majority could read back differently from another majority), so the
// value a leader publishes is its campaign's.
//
// # Errors
//
// Store errors are wrapped with the operation and key ("redlock: acquire
// \"k\": ..."). [ErrNoQuorum]: fewer than a majority of nodes answered
// (the error lists each failed node's error, with its index and address,
// on one line, separated by "; ").
// [ErrNoValidity]: a majority answered too late. Release and Refresh
// return errors wrapping backend.ErrNotHeld when the lock expired or was
// taken. [Resource.ValidateKey] rejects empty keys and keys over
// [MaxKeyLen] before any I/O.
package redlock
