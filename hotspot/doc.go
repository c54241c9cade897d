// Package hotspot is a [distlock.Handler] that puts an in-process lock in
// front of hot keys, so that only one goroutine of this process at a time
// reaches the store for each of them.
//
// Without it, every goroutine that wants a busy key spins against the store
// on its own: N goroutines in P processes make N*P calls per spin interval.
// (Over a store with release notices the facade wakes one goroutine per
// process for each release, but every goroutine's fallback sleep still
// ends in an attempt.) With it, the goroutines of one process queue on a local lock (FIFO, no
// I/O) and only the winner spins, so the store sees at most P callers. In
// the reference workload (3 processes x 4 goroutines on one key) this cuts
// the store's add-if-absent commands by about 70%.
//
//	hot := hotspot.New("inventory:sku-1", "inventory:sku-2")
//	d, err := distlock.New(res, distlock.WithHandlers(met, hot))
//
// # Static and adaptive keys
//
// [New] takes the hot keys, and [Handler.Register] and [Handler.Unregister]
// change them at run time. [NewWithOptions] with [WithAutoDetect] also
// promotes any key that at least threshold goroutines of this process wait
// for at once, keeps at most capacity promoted keys (least recently used
// first out), and demotes promoted keys idle for [WithIdleAfter].
// [Handler.Hot] lists the keys that have a local lock now. Only those keys
// have one: memory stays bounded by the registered keys plus capacity (and
// by the goroutines in flight, whose entries are freed when they leave).
//
// # Release notices and taking turns
//
// With a hotspot handler, each process has at most one goroutine at the
// store per key, and a release notice (Redis pub/sub) wakes one waiter per
// other process: a handoff costs one attempt per waiting process, the
// releasing process's next waiter included. [WithNotifier] keeps one
// subscription per key in use, so the store is not asked to subscribe and
// unsubscribe for each waiter. [WithYield] makes the releasing process's
// next waiter give way after a contended release, waiting for the next
// release notice instead of racing the processes the notice woke: a
// handoff then costs one attempt per other waiting process, and processes
// take turns.
//
// On a store that queues waiters in arrival order and wakes only the head
// of the line (backend.Queuer and backend.HeadNotifier: the Redis store)
// the processes take turns by themselves: a release wakes one waiter in
// all, and the others make no attempt until their turn. [WithYield] then
// changes nothing (bench, contended, 3 and 12 processes: 3.1 requests per
// grant with or without it, 3.2 without the handler), and the handler
// only keeps each process's goroutines off the store but one.
//
// # Semantics
//
// The local lock honours the caller's wait budget and context: it is taken
// within the same deadline (a zero deadline makes one attempt, no waiting),
// and when the budget runs out locally the acquisition returns
// [distlock.ErrNotAcquired] (joined with the context's error when the
// context ended), having made no remote attempt. The store is asked only
// with what is left of the budget.
//
// The local lock is released after the remote release returns, whatever
// its outcome, so that a woken goroutine never finds the key still held
// remotely; and at once when the remote acquire fails. While the remote
// lock is held but known lost (its TTL ran out), the local lock stays held
// until Unlock: in-process exclusion outlives the remote lease.
//
// Campaigns of an election (distlock.KindElection) pass through: a
// candidate waits for its leadership at the store, as long as it takes.
//
// # Order
//
// Install the hotspot handler outermost among handlers that may fail an
// acquisition the store granted, or after them: a handler outside it that
// fails after the hotspot returned success would keep the local lock held,
// because the facade gives such a lock straight back to the store. A
// metrics or access-log handler never fails an acquisition, so
//
//	distlock.WithHandlers(metrics, hotspot)
//
// is safe and lets the metrics see local waits as part of the wait time.
package hotspot
