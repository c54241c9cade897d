// Package backend is the contract between the distlock facade and the
// stores that hold locks. Application code does not use it; backend authors
// do, the way database/sql/driver serves database/sql.
//
// The facade owns policy: it validates input, resolves the TTL, makes the
// owner value, runs the handler chain, spins with random sleeps, enforces
// deadlines, renews and signals loss. A backend makes single attempts and
// reports their result. It never sees an empty key, a TTL <= 0 or a nil
// lease: the facade guarantees normalized input.
//
// # Families
//
// A pull store implements [Spinner]: one atomic add-if-absent per call. The
// facade calls it in its one spin loop, sleeping a random time in
// [min, min+random) between attempts, never past the caller's deadline nor
// past the holder's remaining TTL when the backend reports it.
//
// A push store implements [Waiter]: one blocking call that queues, waits on a
// watch and returns when the lock is held, the deadline passes or the context
// ends.
//
// Every store implements [RemoteResource] (release) and one of the two.
//
// # Optional abilities
//
// Found by type assertion, as database/sql finds driver.ExecerContext:
//   - [KindChecker]: hold semaphores and read/write locks, not only mutexes;
//   - [Queuer]: queue the waiters of mutexes and semaphores in arrival
//     order, as the read/write lock's are;
//   - [Withdrawer]: withdraw a waiting request's intent;
//   - [Refresher]: extend a held lock (used by WithAutoRenew and Extend);
//   - [BatchRefresher]: extend many locks in one request;
//   - [Inspector]: tell who holds a lock;
//   - [MultiSpinner]: take several keys in one request;
//   - [Notifier]: wake spinning waiters when a key is released;
//   - [HeadNotifier]: wake only the waiter at the head of a key's queue;
//   - [KeyValidator]: reject keys the store cannot hold before any I/O;
//   - [Relabeler]: change the label kept with a held mutex (an election's
//     published value);
//   - [Watcher]: tell when the holder of a mutex may have changed (an
//     election's observers).
//
// A store that can tell when it has lost a lock (an etcd lease or a
// ZooKeeper session ended) sets a [Lease].Handle that is a [LossSignal],
// and fires it.
//
// # Adding a store
//
// In this repository a new store is these; the distlock command and
// examples/contention then take its URL, and the fault suite's harness and
// the bench open it through the same opener, internal/stores:
//   - its module: a directory with its go.mod and one package, a doc.go
//     and a Resource over the store's own client that implements
//     [RemoteResource] and [Spinner] or [Waiter], with the optional
//     abilities above it can offer, each asserted at compile time
//     (var _ backend.Waiter = (*Resource)(nil));
//   - its conformance test, in that module: testsuite.Run and
//     testsuite.RunStalled over a harness that sets Stall, and Requests
//     (or NoLine, saying per kind why its waiters keep no order);
//   - a test-server starter in internal/testserver: a real server on a
//     free 127.0.0.1 port, or the one an environment variable names;
//     a skip that says why when none can be had, a failure when CI is set;
//   - one case in internal/stores: its scheme in Parse, its type
//     (ValidateKey, Open, Proto, Holds, String) and its lines in URLHelp;
//   - go.work: a use line and a replace line like the others' (make
//     test, scripts/tidy.sh and scripts/lint.sh find every module there);
//   - its row in the README's module table and in scripts/deps.go.
//
// The fault suite (safety) and the bench cover a store once it has rows
// there: a Backend kind in safety/harness and the store's fault tests, a
// bench/peers file with its counters.
package backend

import (
	"context"
	"errors"
	"strconv"
	"time"
)

// ErrNotAcquired is returned by [Spinner.TryAcquire] never, and by
// [Waiter.Acquire] when the lock stayed held by another owner until the
// deadline. The facade returns it to callers as distlock.ErrNotAcquired
// (the same value).
var ErrNotAcquired = errors.New("distlock: not acquired")

// ErrNotHeld is returned by [RemoteResource.Release] and [Refresher.Refresh]
// when the store no longer holds the lease's value under its key: it expired,
// or another owner took it. It is the same value as distlock.ErrNotHeld.
var ErrNotHeld = errors.New("distlock: not held")

// ErrInvalid is wrapped by every error about bad input: a nil client or
// a bad option value given to a store's constructor, as much as the
// facade's own checks (an empty key, a TTL <= 0). It is the same value as
// distlock.ErrInvalid, so that a store's errors match errors.Is(err,
// distlock.ErrInvalid) without the store importing the facade. Such
// errors come before any I/O.
var ErrInvalid = errors.New("distlock: invalid argument")

// AbandonedError is returned by [Spinner.TryAcquire] and [Waiter.Acquire]
// when the call gave up, because its context ended, while a request that
// may have taken the lock was in flight (sent, no reply). Err says why, and
// wraps the context's error. Cleanup undoes what the request may have done,
// whenever it lands: a compare-and-delete of the lease's value that also
// keeps a late request from taking the key (a tombstone), a delete of the
// row or znode once the request returns.
//
// The caller does not wait for the clean-up: the facade runs Cleanup in the
// background, owned by the DistributeLock, retrying it with backoff until it
// returns nil or an error wrapping [ErrNotHeld] (nothing left to clean), and
// Close waits for it within its bound. Cleanup's ctx ends at that bound.
type AbandonedError struct {
	Err     error
	Cleanup func(ctx context.Context) error
}

func (e *AbandonedError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *AbandonedError) Unwrap() error { return e.Err }

// Kind is the kind of lock a lease is for. A key's locks of different kinds
// are distinct locks: the mutex "k", the semaphore "k" and the read/write
// lock "k" do not exclude one another (a store keeps them apart, under
// different names or in different structures). Read and Write are the two
// sides of one read/write lock.
type Kind uint8

const (
	// KindMutex: one holder at a time. Every store supports it.
	KindMutex Kind = iota
	// KindSemaphore: at most Lease.Limit holders at once, each with its
	// own value, TTL and token. Holders that disagree on the limit: the
	// acquire of the one whose limit differs from the current holders'
	// fails with ErrLimitMismatch.
	KindSemaphore
	// KindRead: the shared side of a read/write lock: any number of
	// readers at once, and no writer.
	KindRead
	// KindWrite: the exclusive side of a read/write lock: one writer, and
	// no reader. Requests are served in order of arrival, readers
	// together, so a stream of readers cannot starve a writer nor writers
	// readers (see KindChecker).
	KindWrite
	// KindElection is the kind of an election's leadership
	// (distlock.Election) as the facade's handlers see it
	// (distlock.Request.Kind): a leadership is a mutex, and a store never
	// receives this kind. The facade holds a leadership as the mutex
	// (KindMutex) of the election's key, ElectionPrefix + the election's
	// name, with the leader's label and published value in Lease.Label
	// (see Relabeler).
	KindElection
)

// ElectionPrefix starts the key of every election's mutex (see
// KindElection). The facade refuses mutex keys that start with it, so an
// election and a mutex are distinct locks whatever their names.
const ElectionPrefix = "distlock-election:"

func (k Kind) String() string {
	switch k {
	case KindMutex:
		return "mutex"
	case KindSemaphore:
		return "semaphore"
	case KindRead:
		return "read"
	case KindWrite:
		return "write"
	case KindElection:
		return "election"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// ErrLimitMismatch is returned by an acquire of a semaphore whose current
// holders took it with another limit. The facade returns it wrapped; it
// is the same value as distlock.ErrLimitMismatch.
var ErrLimitMismatch = errors.New("distlock: the semaphore is held with a different limit")

// Lease is one acquisition as a backend sees it. The facade fills Key,
// Value and TTL before the first attempt; the backend fills Token and may
// fill Validity and Handle (its loss signal, see [Lease.Lost]) when it
// acquires.
type Lease struct {
	// Key is the caller's lock name. Never empty.
	Key string
	// Value is the owner value: fresh for every acquisition and unique
	// across processes. Release and Refresh compare against it.
	Value string
	// TTL is the lease time for this acquisition, > 0. A store that rounds
	// it (etcd: whole seconds) rounds up and says so in its package doc.
	TTL time.Duration
	// Kind is the kind of lock: KindMutex unless the store said, through
	// [KindChecker], that it holds the kind.
	Kind Kind
	// AutoRenew tells the store that the facade will keep the lock alive
	// (distlock.WithAutoRenew) by calling Refresh every TTL/3 until the
	// release. A store may then hold it in a cheaper way that lives as
	// long as the process renews it (etcd: a lease shared by the locks of
	// one TTL instead of one lease per lock).
	AutoRenew bool
	// Waits is set by the facade when the acquisition may make more than
	// one attempt (a wait > 0 on one key): a store that queues waiters of
	// the lease's kind ([Queuer]) records an intent for a refused attempt
	// only then. A single attempt that cannot hold records nothing.
	Waits bool
	// KeptAlive is set by the store, when it acquires a lock with
	// AutoRenew, to say that it keeps the lock alive itself for as long as
	// the process runs and the store is reachable (etcd: the shared
	// lease's keep-alive; ZooKeeper: the session), and fires Lost when it
	// cannot: the facade then makes no refresh for it and no expiry timer,
	// and its Deadline is unknown (the zero time). A key deleted from
	// outside must fire Lost too (a watch, not polling).
	KeptAlive bool
	// Limit is a semaphore's limit (Kind == KindSemaphore), 1 to
	// math.MaxInt32; 0 for the other kinds. An int32, so that it packs
	// with Kind and the flags above: the facade keeps a Lease in every
	// held lock.
	Limit int32

	// Token is the fencing token: strictly increasing across successive
	// holders of Key on one store. 0 when the store cannot make one. For a
	// semaphore, strictly increasing across the grants of its permits; for
	// a read/write lock, across its grants, read and write, so that a write
	// grant's token is larger than every earlier grant's and a read
	// grant's larger than every earlier write grant's.
	Token uint64
	// Validity, when > 0, is how long the lock is known valid, counted from
	// the start of the successful TryAcquire (for a Waiter: from Acquire's
	// return). 0 means TTL. Redlock sets ttl - elapsed - drift here. A
	// store that rounds the TTL up writes the effective TTL into TTL.
	Validity time.Duration
	// Label is the holder's label (distlock.WithLabel: a host, a pid), at
	// most MaxLabelLen bytes, empty by default. A store keeps it with the
	// grant and returns it from Inspect; it is not part of the owner value
	// and no compare uses it.
	Label string

	// Handle is backend-private state carried from acquire to release and
	// refresh (an etcd lease ID, a znode path). The facade reads it only
	// as the lock's loss signal: a Handle that implements [LossSignal] is
	// the store's signal that it learned the lock is gone (session
	// expired, lease revoked, key deleted from outside), and the facade
	// then closes the lock's Done channel (see [Lease.Lost]). A Handle
	// that does not is no signal: the store cannot tell.
	Handle any
}

// Lost returns the lock's loss signal: l.Handle when it implements
// [LossSignal], else nil (the store cannot tell when it loses the lock).
// One field serves both, so that a Lease, which the facade keeps for every
// held lock, is not 16 bytes larger for stores whose handle is their
// signal.
func (l *Lease) Lost() LossSignal {
	s, _ := l.Handle.(LossSignal)
	return s
}

// LossSignal is how a store that can tell when it lost a lock (an etcd
// lease or a ZooKeeper session ended, the key deleted from outside) says
// so: a [Lease].Handle that implements it ([Lease.Lost]). The signal
// fires at most once, and never goes back.
//
// The facade asks Closed whenever it looks at a lock's state (Unlock,
// Extend, reentry, its scheduler), and calls Done only when somebody
// waits for the loss (the lock's Done was asked for, the
// DistributeLock has loss observers): a store may make the channel on
// that first call, so that a lock nobody waits on costs no channel.
// Both must be safe for concurrent use and must not block on I/O.
type LossSignal interface {
	// Done returns a channel that is closed when the signal fires (at
	// once if it fired already). Every call returns the same channel.
	Done() <-chan struct{}
	// Closed reports whether the signal fired. It makes nothing.
	Closed() bool
}

// LostChan is a [LossSignal] made of a channel the store closes when it
// learns the lock is gone: for a store that makes the channel anyway.
type LostChan <-chan struct{}

// Done returns the channel.
func (c LostChan) Done() <-chan struct{} { return c }

// Closed reports whether the channel is closed.
func (c LostChan) Closed() bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// MaxLabelLen is the longest Lease.Label the facade passes.
const MaxLabelLen = 256

// Holder is one holder of a lock, as [Inspector.Inspect] sees it.
type Holder struct {
	// Kind is the grant's kind: KindRead or KindWrite for a read/write
	// lock, the lock's kind otherwise.
	Kind Kind
	// Token is the holder's fencing token (0 if the store has none).
	Token uint64
	// TTL is the time the holder has left by the store's clock, 0 if the
	// store cannot tell.
	TTL time.Duration
	// Label is the holder's Lease.Label.
	Label string
}

// Inspection is what a store holds of one lock.
type Inspection struct {
	// Holders lists the live holders; empty when the lock is free.
	Holders []Holder
	// Limit is a semaphore's limit while it has holders.
	Limit int
}

// Inspector is implemented by stores that can tell who holds a lock
// without taking it. Inspect reads the lock of key and kind (for a
// read/write lock, KindWrite stands for both sides: it lists readers and
// writers) and touches nothing. Expired holders are not listed.
type Inspector interface {
	Inspect(ctx context.Context, key string, kind Kind) (Inspection, error)
}

// MultiSpinner is implemented by pull stores that can take several keys in
// one request, all or none. TryAcquireAll takes every lease (same owner
// value, kind and TTL; keys distinct, in the facade's canonical order) or
// none, as TryAcquire does for one: on success it sets each lease's Token;
// when a key is held it takes none, and reports the holder's time left. It
// returns errors.ErrUnsupported, before any I/O, for a set it cannot take
// in one request (Redis Cluster: keys of several hash slots); the facade
// then takes the keys one by one.
type MultiSpinner interface {
	TryAcquireAll(ctx context.Context, ls []*Lease) (acquired bool, holderTTL time.Duration, err error)
}

// RemoteResource is what every store implements, together with one of
// [Spinner] or [Waiter]. Implementations must be safe for concurrent use.
type RemoteResource interface {
	// Release deletes the lock if and only if the store still holds
	// l.Value under l.Key (compare-and-delete). It returns ErrNotHeld when
	// the store does not, and touches nothing then; a store that can tell
	// that it released l.Value itself within the lease's TTL (a request
	// its client sent again after the first run's reply was lost: Redis)
	// returns nil for it. Errors from the store are wrapped with the
	// operation and key.
	Release(ctx context.Context, l *Lease) error
}

// Spinner is a pull store: the facade's spin loop calls TryAcquire until it
// succeeds or the wait ends.
type Spinner interface {
	RemoteResource
	// TryAcquire makes exactly one atomic add-if-absent of l.Key with
	// l.Value for l.TTL. On success it sets l.Token (and optionally
	// l.Validity) and returns acquired == true. When another owner holds the
	// key it returns acquired == false with a nil error, and holderTTL set to
	// the holder's remaining time if the store told it (0 if unknown), so
	// the spin loop does not sleep past the holder's expiry.
	//
	// It must not retry or sleep: the facade owns retry policy. It must
	// return when ctx ends (the facade bounds every attempt by the caller's
	// context and wait), and a request that may have reached the store but
	// whose reply did not come must be cleaned up, so a failed attempt
	// never leaves an orphan: at once when that is quick and certain,
	// otherwise by returning an [AbandonedError] whose Cleanup the facade
	// runs in the background.
	TryAcquire(ctx context.Context, l *Lease) (acquired bool, holderTTL time.Duration, err error)
}

// Waiter is a push store: it queues the caller and waits on a watch.
type Waiter interface {
	RemoteResource
	// Acquire blocks until l is held, deadline passes, or ctx ends. A zero
	// deadline means exactly one attempt: hold now or return
	// ErrNotAcquired. On success it fills l.Token (and l.Handle, the loss signal,
	// as needed). When the deadline passes first it returns ErrNotAcquired;
	// when ctx ends first, ctx.Err(). In both cases, and on any error, it
	// leaves nothing behind in the store (no queued key, znode or lease),
	// returning an [AbandonedError] when the clean-up must wait for the
	// store: Acquire returns when ctx ends, whatever the store does.
	Acquire(ctx context.Context, l *Lease, deadline time.Time) error
}

// Refresher is implemented by stores that can extend a held lock.
//
// Release and Refresh of one lease may run concurrently; neither may modify
// the Lease.
type Refresher interface {
	// Refresh extends l for another l.TTL from now if and only if the store
	// still holds l.Value under l.Key (compare-and-expire). ErrNotHeld
	// otherwise. The TTL may differ from the one l was acquired with
	// (distlock's Lock.Extend); a store that cannot change it returns an
	// error wrapping errors.ErrUnsupported before any I/O.
	Refresh(ctx context.Context, l *Lease) error
}

// BatchRefresher is implemented by stores that can extend many locks in
// one request (a script over many keys, one statement). RefreshAll extends
// each lease as Refresh does and returns one error per lease, in order:
// nil, an error wrapping ErrNotHeld, or the store's error (one failed
// lease does not fail the others). The facade's scheduler calls it with the
// locks due for renewal together, at most MaxRefreshBatch at a time.
type BatchRefresher interface {
	RefreshAll(ctx context.Context, ls []*Lease) []error
}

// MaxRefreshBatch is the most leases the facade passes to RefreshAll.
const MaxRefreshBatch = 500

// Notifier is implemented by pull stores that can tell waiters a key was
// released, so they retry at once instead of sleeping out the spin.
type Notifier interface {
	// Subscribe asks for release notices of key. Each notice sends one
	// value on ch without blocking (ch is buffered; a notice that finds it
	// full is dropped). Notices are hints: a lost one costs only latency,
	// because the spin loop keeps sleeping in between. cancel ends the
	// subscription and must be called exactly once. ch is nil when the store
	// cannot subscribe now. Subscribe and cancel must not block (no I/O:
	// the facade calls them under a lock shared by all keys); a store
	// subscribes in the background.
	Subscribe(key string) (ch <-chan struct{}, cancel func())
}

// HeadNotifier is implemented by pull stores that queue waiters
// ([Queuer]) and address a release's notice to the waiter at the head of
// the queue (a Redis PUBLISH or a PostgreSQL NOTIFY whose payload is the
// head's owner value; a store that polls its queue tells the head it
// found).
type HeadNotifier interface {
	Notifier
	// SubscribeHead is Subscribe for the waiter of key with owner value
	// value: ch receives the notices addressed to value (it became the
	// head of the queue, and the lock is free or kept for it) and the
	// notices addressed to nobody in particular (a release with nobody
	// queued, a withdrawn intent); not the notices addressed to another
	// waiter. A notice addressed to value that comes shortly before the
	// subscription (the release raced the attempt that queued) is sent on
	// ch at once. The rules of Subscribe hold: notices are hints, ch is
	// buffered and nil when the store cannot subscribe now, cancel must be
	// called exactly once, and neither blocks.
	SubscribeHead(key, value string) (ch <-chan struct{}, cancel func())
}

// KindChecker is implemented by stores that hold more kinds of lock than
// mutexes. CheckKind returns nil when the store holds locks of kind k, and
// otherwise an error that says why not (Redlock: majorities cannot bound a
// semaphore). The facade calls it before any I/O; a store without it holds
// mutexes only.
//
// For a pull store the kind rides in the lease given to TryAcquire,
// Release and Refresh. A read/write lock serves its requests in order of
// arrival, readers together: an attempt that cannot hold records an intent
// numbered in arrival order, which lasts l.TTL from the attempt, is renewed
// by its next attempt and ends when it acquires or withdraws
// ([Withdrawer]). A writer holds when no grant is held and no intent
// precedes its own (or, without an intent, when there is no intent at
// all); a reader holds when no writer holds and no writer's intent precedes
// its own. So readers arriving after a waiting writer wait for it (a
// stream of readers cannot starve it, as with sync.RWMutex), and readers
// waiting for a writer get in before the writers that arrived after them.
// For a push store its queue gives that order: a reader holds when no
// writer is queued before it, a writer when it is first; a semaphore
// holder when fewer than Limit holders are queued before it. A pull store
// may queue the waiters of mutexes and semaphores in arrival order too:
// see [Queuer].
type KindChecker interface {
	CheckKind(k Kind) error
}

// Withdrawer is implemented by pull stores that record the intents of
// waiting requests: readers and writers (see [KindChecker]), and the
// mutex and semaphore waiters of a store that queues them ([Queuer]). The
// facade calls Withdraw when a wait ends without the lock after the store
// answered an attempt, before the acquire returns (so that the caller's
// next request finds no intent of its own or of a request that left; a
// store slower than a few tens of milliseconds finishes in the
// background): for a read or write request after any such wait, for a
// mutex or semaphore request of a kind the store queues after a wait
// with [Lease].Waits. Withdraw deletes l.Value's intent, if any; when the
// store kept the lock for it (the head of a queue, see [Queuer]) it
// passes the lock on to the next in line; it wakes those it kept
// waiting, and touches nothing else. For a kind the store does not
// queue, Withdraw returns nil without I/O.
type Withdrawer interface {
	Withdraw(ctx context.Context, l *Lease) error
}

// Queuer is implemented by pull stores that queue the waiters of mutexes
// (and of semaphores) in arrival order, the way the read/write lock
// queues its requests (see [KindChecker]) and the push stores' watches do.
// Queues reports whether the store queues the waiters of kind k (KindMutex
// or KindSemaphore; the read/write lock always queues). A store that
// queues a kind implements [Withdrawer] too.
//
// For a kind it queues, an attempt of an acquisition that waits
// ([Lease].Waits) and cannot hold records an intent numbered in arrival
// order, which lasts l.TTL from the attempt, is renewed by each next
// attempt of the acquisition and ends when it holds, when it withdraws
// ([Withdrawer]) or when it lapses. A waiter holds a mutex when the lock
// is free and no live intent precedes its own; a semaphore permit when
// fewer than Limit permits are held and fewer live intents precede its
// own than permits are free. A release of a lock with live intents wakes
// the head of the queue only ([HeadNotifier]) and keeps the lock for it:
// a newcomer is refused (and queues) while the head has not come, for at
// most the life left of the head's intent, so that a head that died or
// never heard its notice is passed over within its TTL. A store may let a
// request without an intent (a first attempt, a single attempt) take a
// free lock without looking at the queue, so that an uncontended acquire
// pays nothing for it (Redis does for mutexes): such a newcomer may then
// take a lock whose holder expired without a release before the head of
// the queue comes back for it. A release that keeps the lock for nobody
// (no live intent) wakes its waiters as [Notifier] says.
//
// The facade, for a kind the store queues: sets [Lease].Waits on the
// attempts of an acquisition that waits; makes the next attempt within a
// third of l.TTL, so that the intent never lapses while the waiter
// lives; withdraws the intent when the wait ends without the lock; and,
// when the store is a [HeadNotifier], subscribes each waiter to the
// notices addressed to it and otherwise sleeps up to a third of l.TTL (at
// most [HeadPoll]): a waiter behind the head makes no request until it
// is the head, but to keep its intent. A store that is a [MinQueueWaiter]
// queues only the acquisitions that wait at least as long as it says.
//
// A store without a queue for a kind (Redlock, whose nodes keep no common
// order) grants it to whichever attempt comes first after a release:
// arrival order is not kept.
type Queuer interface {
	Queues(k Kind) bool
}

// MinQueueWaiter is implemented by a [Queuer] whose line serves only
// the acquisitions that wait at least MinQueueWait(k): the facade treats
// a shorter wait as on a store that does not queue kind k (its attempts
// carry no [Lease].Waits, it withdraws nothing, it subscribes to the
// key's notices), and such a waiter gets the lock only while nobody
// waits in line. A line hands the lock on one waiter at a time, each
// handoff a notice and an attempt: a wait shorter than the handoffs
// ahead of it ends at the head of the line, and the lock kept for it is
// lost to everyone behind.
type MinQueueWaiter interface {
	MinQueueWait(k Kind) time.Duration
}

// HeadPoll is the longest a queued waiter subscribed to notices addressed
// to it ([HeadNotifier]) sleeps between attempts: the bound of the wait a
// lost notice costs it.
const HeadPoll = 2 * time.Second

// Relabeler is implemented by stores that can change the label kept with
// a held mutex ([Lease].Label, which [Inspector] returns): an election's
// leader publishes its value through it (distlock.Election.Proclaim).
type Relabeler interface {
	// Relabel sets the label kept with l's grant to l.Label if and only if
	// the store still holds l.Value under l.Key (compare-and-set), and
	// returns ErrNotHeld otherwise, touching nothing. l is the lease as
	// its acquire left it (Handle, Token), with the new Label; its Kind is
	// KindMutex (a store may refuse another kind with an error wrapping
	// errors.ErrUnsupported, before any I/O). Relabel never shortens the
	// lock's time left and keeps its token; a store whose label record
	// also dates the TTL (ZooKeeper) may extend it as Refresh would.
	//
	// The facade sends no Refresh of the lease while a Relabel is in
	// flight, and passes the new label in the Refresh calls after a
	// Relabel that succeeded. Relabel returns when ctx ends; the store's
	// errors are wrapped with the operation and key.
	Relabel(ctx context.Context, l *Lease) error
}

// Watcher is implemented by push stores that can tell, from their watch,
// when the holder of a mutex may have changed: a grant, a release, an
// expiry or a relabel of key's mutex. Pull stores tell releases through
// [Notifier]; the facade reads the holder ([Inspector]) on every notice,
// and polls as well (a notice may be lost).
type Watcher interface {
	// Watch asks for notices of changes of key's mutex. Each notice sends
	// one value on ch without blocking (ch is buffered; a notice that
	// finds it full is dropped). cancel ends the watch and must be called
	// exactly once. ch is nil when the store cannot watch now. Watch and
	// cancel must not block: a store starts its watch in the background
	// (and sends one notice once the watch is set, so that the reader
	// looks again after what it may have missed before).
	Watch(key string) (ch <-chan struct{}, cancel func())
}

// BoundedContext is implemented by the contexts the facade passes to
// [Spinner.TryAcquire], [Waiter.Acquire] and [MultiSpinner.TryAcquireAll]:
// the caller's context, bounded by the facade (the wait's end, or a
// single attempt's bound) and, for an acquisition that may wait, ended
// by the DistributeLock's Close.
//
// Its Deadline is the bound (or the caller's deadline, if earlier), and
// its Err reports the bound's passing and Close as soon as it is asked.
// Its Done closes at all of these too, but making it costs a timer and
// callbacks: a store whose client bounds its I/O by the context's
// deadline by itself (go-redis with ContextTimeoutEnabled, a connection
// whose deadline the store sets) can watch Cancelled instead, and check
// Err between requests. Cancelled returns a channel closed when the
// caller's context ends, the one end of the context its deadline does not
// tell, or nil when the caller's context cannot end; it costs nothing.
type BoundedContext interface {
	context.Context
	Cancelled() <-chan struct{}
}

// KeyValidator is implemented by stores with limits on keys. The facade
// calls ValidateKey before any I/O and returns its error to the caller.
type KeyValidator interface {
	ValidateKey(key string) error
}
