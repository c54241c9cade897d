package etcd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/distlock/distlock/backend"
)

// DefaultPrefix is where a [Resource] keeps its keys unless [WithPrefix]
// says otherwise.
const DefaultPrefix = "/distlock/"

// MaxKeyLen is the longest lock key, in bytes, that a [Resource] accepts.
// Escaping can triple a key and one transaction carries it four times,
// which stays far below etcd's default request limit (1.5 MiB).
const MaxKeyLen = 32 << 10

// MaxTTL is the longest lock TTL a [Resource] takes, about 214 years:
// etcd refuses leases longer than 9e9 seconds, and a shared lease
// ([WithSharedLease]) lives a third longer than its locks. Acquire refuses
// a longer TTL before any I/O, in either mode.
const MaxTTL = 6_750_000_000 * time.Second

// cleanupTimeout bounds each run of a background clean-up (revoke our
// lease, delete our key) and the grant of a shared lease, which no
// caller's context bounds.
const cleanupTimeout = 5 * time.Second

// closeTimeout bounds the revokes of the shared leases by
// [Resource.Close]: a lease it could not revoke expires by itself.
const closeTimeout = 500 * time.Millisecond

// clockGuard is taken off Lease.Validity: the facade counts it from when
// Acquire has returned, a moment after we read the clock.
const clockGuard = time.Millisecond

// Resource is a lock store over an etcd cluster: mutexes, semaphores and
// read/write locks. It implements [backend.Waiter], [backend.Refresher],
// [backend.KindChecker], [backend.Inspector], [backend.KeyValidator] and
// [io.Closer]; it is safe for concurrent use.
type Resource struct {
	c      *clientv3.Client
	leases pb.LeaseClient // for grants with an ID we chose
	prefix string
	shared bool

	mu       sync.Mutex
	closed   bool
	sessions map[int64]*session            // shared leases by lock TTL in seconds
	tasks    map[uint64]context.CancelFunc // background clean-ups, ended by Close
	nextTask uint64
	bg       sync.WaitGroup // the tasks' goroutines

	id      string       // names this Resource's queue keys, with a slot
	watch   keyWatch     // the names in use, and deletions of keys on leases of their own
	wakeups atomic.Int64 // predecessor deletions seen by waiters

	// hook, set only by tests before any use, is called at the named
	// points, so that a test can force an interleaving that timers and
	// the scheduler give only now and then.
	hook func(point string)
	// onRenew, set only by tests before the first acquire, is called by
	// the shared leases' keep-alive goroutines after each renewal.
	onRenew func()
}

var (
	_ backend.Waiter       = (*Resource)(nil)
	_ backend.Refresher    = (*Resource)(nil)
	_ backend.KeyValidator = (*Resource)(nil)
	_ io.Closer            = (*Resource)(nil)
)

// Option configures a [Resource].
type Option func(*Resource)

// WithPrefix puts the Resource's keys under prefix instead of
// [DefaultPrefix]. A prefix that does not end in '/' gets one; an empty
// prefix means the default. Resources on one cluster must use prefixes
// none of which is a prefix of another: the keys under "/a/b/" would sit
// in the queue of the lock key "b" under "/a/" (see "What the store
// keeps" in the package documentation).
func WithPrefix(prefix string) Option {
	return func(r *Resource) {
		if prefix == "" {
			prefix = DefaultPrefix
		}
		if !strings.HasSuffix(prefix, "/") {
			prefix += "/"
		}
		r.prefix = prefix
	}
}

// WithSharedLease makes locks share one lease per TTL (in whole seconds)
// that the Resource keeps alive, as [concurrency.Session] does, instead of
// granting and revoking a lease per lock: an uncontended acquire and release
// cost one round trip each instead of two each. A lock's TTL is then
// kept by a timer in the process, and a lock whose process died stays in
// etcd up to a third of its TTL (at least a second) longer. See the package
// documentation. Off by default, except for locks that distlock renews
// (distlock.WithAutoRenew): they take the shared lease without this
// option, and its keep-alive alone keeps them (backend.Lease.KeptAlive).
//
// [concurrency.Session]: https://pkg.go.dev/go.etcd.io/etcd/client/v3/concurrency#Session
func WithSharedLease() Option {
	return func(r *Resource) { r.shared = true }
}

// New returns a Resource that keeps locks in etcd through c. The caller
// owns c: [Resource.Close] does not close it. New does no I/O.
//
// New returns an error wrapping [backend.ErrInvalid] (distlock.ErrInvalid)
// for a nil c or a nil option.
func New(c *clientv3.Client, opts ...Option) (*Resource, error) {
	if c == nil {
		return nil, fmt.Errorf("etcd: New: %w: nil client", backend.ErrInvalid)
	}
	r := &Resource{c: c, prefix: DefaultPrefix, sessions: make(map[int64]*session),
		tasks: make(map[uint64]context.CancelFunc), id: fmt.Sprintf("%016x", rand.Uint64()),
		leases: clientv3.RetryLeaseClient(c)}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("etcd: New: %w: nil option", backend.ErrInvalid)
		}
		o(r)
	}
	return r, nil
}

var errNilClient = errors.New("etcd: nil client")

// clientClosed reports whether the client was closed (or never opened, as
// a zero clientv3.Client): every request would fail, and only after the
// client's retries, seconds later. Calls then fail at once and cleanups
// are skipped: what they would remove expires with its lease.
func (r *Resource) clientClosed() bool {
	ctx := r.c.Ctx()
	return ctx == nil || ctx.Err() != nil
}

// ValidateKey reports whether key can be a lock name: at most [MaxKeyLen]
// bytes. Any bytes are allowed. It does no I/O.
func (r *Resource) ValidateKey(key string) error {
	if r == nil || r.c == nil {
		return errNilClient
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("etcd: key of %d bytes is longer than %d", len(key), MaxKeyLen)
	}
	return nil
}

// queuePrefix is the directory of key's queue: every waiter's key sits
// directly under it.
func (r *Resource) queuePrefix(key string) string {
	return r.prefix + encodeKey(key) + "/"
}

// Leftovers lists the etcd keys the Resource holds for the lock key, of
// every kind: the mutex's queue, then the semaphore's, then the
// read/write lock's, each in queue order (holders first, then waiters).
// It is meant for tests and debugging.
func (r *Resource) Leftovers(ctx context.Context, key string) ([]string, error) {
	if r == nil || r.c == nil {
		return nil, errNilClient
	}
	var ops []clientv3.Op
	for _, k := range queueKinds {
		ops = append(ops, clientv3.OpGet(r.queueDir(k, key), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)))
	}
	resp, err := r.c.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("etcd: list %q: %w", key, err)
	}
	var keys []string
	for _, op := range resp.Responses {
		for _, kv := range op.GetResponseRange().Kvs {
			keys = append(keys, string(kv.Key))
		}
	}
	return keys, nil
}

// ttlSeconds rounds ttl up to whole seconds, at least one.
func ttlSeconds(ttl time.Duration) int64 {
	s := int64(ttl / time.Second) // ttl+1s-1 would wrap negative near math.MaxInt64
	if ttl%time.Second > 0 {
		s++
	}
	if s < 1 {
		s = 1
	}
	return s
}

// Acquire queues for l.Key and blocks until it holds the lock, the deadline
// passes (ErrNotAcquired) or ctx ends (ctx.Err()); a zero deadline makes one
// attempt. On success it sets l.Token to the create revision of our queue
// key, l.TTL to the effective TTL, l.Validity and l.Handle (its loss signal). It
// returns when ctx ends, whatever the server does. On any failure our key
// and lease are gone, or their clean-up runs on in the background: then,
// if ctx ended first, the error is a [backend.AbandonedError] whose
// Cleanup waits for it (see the package documentation). A TTL longer than
// [MaxTTL] is refused before any I/O.
func (r *Resource) Acquire(ctx context.Context, l *backend.Lease, deadline time.Time) error {
	if r == nil || r.c == nil {
		return errNilClient
	}
	if l.TTL > MaxTTL {
		return fmt.Errorf("etcd: acquire %q: TTL %v is longer than the maximum, %v", l.Key, l.TTL, MaxTTL)
	}
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return fmt.Errorf("etcd: acquire %q: resource closed", l.Key)
	}
	if r.clientClosed() {
		return fmt.Errorf("etcd: acquire %q: client closed", l.Key)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.shared || l.AutoRenew {
		return r.acquireShared(ctx, l, deadline, false)
	}
	return r.acquireOwn(ctx, l, deadline)
}

// acquireOwn takes the lock on a lease of its own: grant, create our key,
// wait; Release deletes our key and revokes the lease. A failed attempt
// revokes the lease it may have granted, which deletes our key if it was
// made and keeps a transaction still on its way from making it.
func (r *Resource) acquireOwn(ctx context.Context, l *backend.Lease, deadline time.Time) (err error) {
	start := time.Now()
	id, ttl, err := r.grant(ctx, l.TTL)
	if err != nil {
		err = fmt.Errorf("etcd: acquire %q: grant lease: %w", l.Key, err)
		if id != 0 { // the grant may have happened
			return r.undo(ctx, err, r.revoker(id, nil))
		}
		return err // never sent: nothing to revoke
	}
	h := r.newHandle(l, nil, id, ttl)
	n, value := r.name(h), h.value(l.Value, l.Label)
	defer func() {
		if err != nil {
			r.unwatchKey(h)
			err = r.undo(ctx, err, r.revoker(id, func() { r.free(h) }))
		}
	}()
	if err := r.watchKey(h); err != nil {
		return acquireErr(l.Key, err)
	}
	isHolder, err := r.enqueue(ctx, h, n, value)
	if r.hook != nil {
		r.hook("enqueued")
	}
	if err != nil {
		return acquireErr(l.Key, err)
	}
	if !r.keyMade(h, h.rev) {
		return fmt.Errorf("etcd: acquire %q: queue key %s deleted as it was made: %w", l.Key, n.key, rpctypes.ErrLeaseNotFound)
	}
	lastSent := start // the grant was sent after this
	if !isHolder {
		if deadline.IsZero() || !time.Now().Before(deadline) {
			return backend.ErrNotAcquired
		}
		renew := func(ctx context.Context) error {
			// KeepAliveOnce retries while no member answers: bound it.
			ctx, cancel := context.WithTimeout(ctx, max(ttl/3, 100*time.Millisecond))
			defer cancel()
			sent := time.Now()
			if _, err := r.c.KeepAliveOnce(ctx, id); err != nil {
				return err
			}
			lastSent = sent // read by this goroutine after await's wait for renew
			return nil
		}
		if err := r.await(ctx, h, n, value, deadline, ttl, renew, h.Done()); err != nil {
			if err == backend.ErrNotAcquired {
				return err
			}
			return fmt.Errorf("etcd: acquire %q: %w", l.Key, err)
		}
	}
	validity := time.Until(lastSent.Add(ttl)) - clockGuard
	if validity <= 0 {
		return fmt.Errorf("etcd: acquire %q: lease %x may have expired while queued", l.Key, int64(id))
	}
	l.TTL = ttl
	l.Validity = validity
	l.Token = uint64(h.rev)
	l.Handle = h
	return nil
}

// grant creates a lease of at least ttl, rounded up to whole seconds, with
// an ID we choose, so that a grant whose reply was lost can be revoked.
// It returns the ID whenever the grant may have happened, and 0 with
// gRPC's error when it was never sent: no try of it (the client retries)
// found a connection to send it on (gRPC records the peer of a try that
// did). It waits for a connection until ctx ends (WaitForReady), so that
// gRPC's error then says why none came (a refused connection, say).
func (r *Resource) grant(ctx context.Context, ttl time.Duration) (clientv3.LeaseID, time.Duration, error) {
	id := rand.Int64N(math.MaxInt64-1) + 1
	var sentTo peer.Peer
	resp, err := r.leases.LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: id, TTL: ttlSeconds(ttl)},
		grpc.WaitForReady(true), grpc.Peer(&sentTo))
	if err != nil {
		if sentTo.Addr == nil { // never sent
			if cerr := ctx.Err(); cerr != nil {
				// The context's own error, and gRPC's word on why no
				// connection came (a refused dial, say).
				if m := status.Convert(err).Message(); m != cerr.Error() {
					return 0, 0, fmt.Errorf("%w: %s", cerr, m)
				}
				return 0, 0, cerr
			}
			return 0, 0, err
		}
		err = clientv3.ContextError(ctx, err)
		if errors.Is(err, rpctypes.ErrLeaseExist) {
			// The client retried a grant that had succeeded: the lease is
			// ours (a clash of random 63-bit IDs is not a concern).
			ttlResp, terr := r.c.TimeToLive(ctx, clientv3.LeaseID(id))
			if terr == nil && ttlResp.GrantedTTL > 0 {
				return clientv3.LeaseID(id), time.Duration(ttlResp.GrantedTTL) * time.Second, nil
			}
		}
		return clientv3.LeaseID(id), 0, err
	}
	if resp.Error != "" {
		return 0, 0, errors.New(resp.Error)
	}
	return clientv3.LeaseID(resp.ID), time.Duration(resp.TTL) * time.Second, nil
}

// revokeNow revokes a lease within ctx. It reports whether the lease is
// known gone.
func (r *Resource) revokeNow(ctx context.Context, id clientv3.LeaseID) bool {
	_, err := r.c.Revoke(ctx, id)
	return err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound)
}

// enqueue creates n, h's key, holding value, on h's lease unless it exists, sets h.rev to its
// create revision and reports whether it holds the lock (see
// standingAfterPut), all in one transaction. On a shared lease the
// transaction also compares the fence of our key's name (see session):
// when it is not where we thought, the transaction made nothing, and is
// sent again. A semaphore's transaction makes nothing, and enqueue fails
// with backend.ErrLimitMismatch, when the queue holds a key of another
// limit (see otherLimits).
func (r *Resource) enqueue(ctx context.Context, h *handle, n qname, value string) (bool, error) {
	for range 100 {
		var epoch int64
		if h.sess != nil {
			epoch = h.sess.epoch(n.key)
		}
		resp, err := r.enqueueTxn(ctx, h, n, value, epoch)
		if err != nil {
			return false, err
		}
		if resp.Succeeded {
			h.rev = resp.Header.Revision
			var rs []*pb.RangeResponse
			for _, op := range resp.Responses[1:] {
				rs = append(rs, op.GetResponseRange())
			}
			return standingAfterPut(h, rs), nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 && h.kind() == backend.KindSemaphore {
			if err := limitMismatch(h, n, resp.Responses[len(resp.Responses)-2:]); err != nil {
				return false, err
			}
		}
		if len(kvs) == 0 && h.sess != nil {
			// The fence moved: learn where to, and try again.
			var rev int64
			if f := resp.Responses[1].GetResponseRange().Kvs; len(f) > 0 {
				rev = f[0].ModRevision
			}
			h.sess.fenced(n.key, rev, true)
			continue
		}
		// Only our own retried request can have made our key.
		if len(kvs) == 0 || kvs[0].Lease != int64(h.leaseID()) {
			return false, fmt.Errorf("queue key %s exists with another lease", n.key)
		}
		h.rev = kvs[0].CreateRevision
		w, _, err := r.standing(ctx, h, n)
		return w.key == "", err
	}
	return false, fmt.Errorf("queue key %s: its fence key keeps moving", n.key)
}

// enqueueTxn is enqueue's transaction, comparing the fence key of h's
// name on its shared lease (if any) with epoch, and for a semaphore that
// no key of another limit exists (otherLimits). Then: the put of our key
// and enqueueReads; else: our key, the fence key, and a key of another
// limit before and after ours (otherLimitReads).
func (r *Resource) enqueueTxn(ctx context.Context, h *handle, n qname, value string, epoch int64) (*clientv3.TxnResponse, error) {
	cmps := make([]clientv3.Cmp, 1, 4)
	cmps[0] = clientv3.Compare(clientv3.CreateRevision(n.key), "=", 0)
	other := make([]clientv3.Op, 1, 4)
	other[0] = clientv3.OpGet(n.key, clientv3.WithKeysOnly())
	if s := h.sess; s != nil {
		f := s.fenceKey(n.key)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(f), "=", epoch))
		other = append(other, clientv3.OpGet(f, clientv3.WithKeysOnly()))
	}
	if h.kind() == backend.KindSemaphore {
		cmps = append(cmps, otherLimits(n)...)
		other = append(other, otherLimitReads(n)...)
	}
	then := append([]clientv3.Op{clientv3.OpPut(n.key, value, clientv3.WithLease(h.leaseID()))}, enqueueReads(h, n)...)
	return r.c.Txn(ctx).If(cmps...).Then(then...).Else(other...).Commit()
}

// await blocks until h holds its lock (see standing). It watches h's
// queue directory, with a watch made before the read that decides
// whether h waits and kept for the whole wait, and is woken only by what
// it waits for (standing's target), so one release wakes one waiter.
// After every wake it reads again, in one transaction, what it waits for
// and our own key: a waiter whose key vanished (its lease expired or was
// revoked) gets an error, never the lock. renew, when set, keeps our
// lease alive every ttl/3 and once more with every re-check; lost, when
// closed, means our lease is gone.
//
// The watch starts "now", and the read follows its creation: etcd serves
// such a watch as synced, sending each event as it happens. A watch made
// after the read, from the revision after it, is served that way only if
// nothing was written in between; under contention something always is
// (a release, another waiter's key), and etcd then serves the watch from
// its catch-up loop, which runs every 100 ms: each hand-off waited up to
// 100 ms for it.
func (r *Resource) await(ctx context.Context, h *handle, n qname, value string, deadline time.Time,
	ttl time.Duration, renew func(context.Context) error, lost <-chan struct{}) error {
	// Requests here must not outlive the deadline.
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var last error // the last transient error: the cause when ctx ends
	stop := func(err error) error {
		if cerr := ctx.Err(); cerr != nil {
			if last != nil {
				return fmt.Errorf("%w: %w", last, cerr)
			}
			return cerr
		}
		if dctx.Err() != nil {
			return backend.ErrNotAcquired
		}
		return err
	}
	var tick <-chan time.Time
	if renew != nil {
		t := time.NewTicker(max(ttl/3, 100*time.Millisecond))
		defer t.Stop()
		tick = t.C
	}
	var (
		wch     clientv3.WatchChan // nil: no watch in place
		wcancel = func() {}
	)
	defer func() { wcancel() }()
	woke := false
	for {
		if wch == nil {
			c, wc, err := r.watchQueue(dctx, h, n, lost)
			if errors.Is(err, errNoWatch) {
				if err := pause(dctx, lost); err != nil { // no leader, the client closing: do not spin
					return stop(err)
				}
				continue
			}
			if err != nil {
				return stop(err)
			}
			wch, wcancel = c, wc
		}
		var renewed chan error
		if woke && renew != nil {
			renewed = make(chan error, 1)
			go func() { renewed <- renew(dctx) }()
		}
		w, rev, err := r.standing(dctx, h, n)
		if renewed != nil {
			if rerr := <-renewed; errors.Is(rerr, rpctypes.ErrLeaseNotFound) && err == nil {
				err = fmt.Errorf("queue key %s: lease %x gone: %w", n.key, int64(h.leaseID()), rerr)
			}
		}
		if err != nil {
			if !transient(err) || dctx.Err() != nil {
				return stop(err)
			}
			last = err
			if err := pause(dctx, lost); err != nil {
				return stop(err)
			}
			woke = false
			continue
		}
		if w.key == "" {
			if h.kind() == backend.KindSemaphore {
				r.touch(h, n, value)
			}
			return nil
		}
		woke = false
	watch:
		for {
			select {
			case wr, ok := <-wch:
				if !ok || wr.Canceled || wr.Err() != nil {
					wcancel()
					wch = nil
					break watch // re-check once a new watch is in place
				}
				for _, ev := range wr.Events {
					if ev.Kv.ModRevision > rev && w.wakes(ev) {
						woke = true
					}
				}
				if woke {
					r.wakeups.Add(1)
					break watch
				}
			case <-tick:
				if err := renew(dctx); err != nil {
					if errors.Is(err, rpctypes.ErrLeaseNotFound) {
						return stop(fmt.Errorf("queue key %s: lease %x gone: %w", n.key, int64(h.leaseID()), err))
					}
				}
			case <-lost:
				return stop(fmt.Errorf("queue key %s gone (lease %x ended, or the key deleted): %w", n.key, int64(h.leaseID()), rpctypes.ErrLeaseNotFound))
			case <-dctx.Done():
				return stop(nil)
			}
		}
		if !woke {
			// The watch ended without news (no leader, compaction):
			// do not spin.
			if err := pause(dctx, lost); err != nil {
				return stop(err)
			}
		}
	}
}

// errNoWatch: a waiter's watch ended before the server made it.
var errNoWatch = errors.New("queue watch not made")

// watchQueue opens a watch on h's queue directory from now on, and
// returns once the server made it (so that a read after it sees every
// change the watch does not send), with the function that ends it. It
// fails with errNoWatch when the watch ends first (no leader, the
// client closing), and with ctx's error or rpctypes.ErrLeaseNotFound
// (lost closed) when it cannot wait any longer.
func (r *Resource) watchQueue(ctx context.Context, h *handle, n qname, lost <-chan struct{}) (clientv3.WatchChan, context.CancelFunc, error) {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCreatedNotify()}
	if h.kind() != backend.KindSemaphore {
		opts = append(opts, clientv3.WithFilterPut()) // only a semaphore waiter wakes on a put (touch)
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	wch := r.c.Watch(wctx, n.dir(), opts...)
	for {
		select {
		case wr, ok := <-wch:
			if !ok || wr.Canceled || wr.Err() != nil {
				cancel()
				return nil, nil, errNoWatch
			}
			if wr.Created {
				return wch, cancel, nil
			}
		case <-lost:
			cancel()
			return nil, nil, fmt.Errorf("queue key %s gone (lease %x ended, or the key deleted): %w", n.key, int64(h.leaseID()), rpctypes.ErrLeaseNotFound)
		case <-ctx.Done():
			cancel()
			return nil, nil, ctx.Err()
		}
	}
}

// acquireErr is err as Acquire returns it: wrapped with the lock key.
func acquireErr(key string, err error) error {
	return fmt.Errorf("etcd: acquire %q: %w", key, err)
}

// pause waits a little before a retry, or returns why it cannot.
func pause(ctx context.Context, lost <-chan struct{}) error {
	t := time.NewTimer(50 * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-lost:
		return rpctypes.ErrLeaseNotFound
	case <-ctx.Done():
		return ctx.Err()
	}
}

// transient reports whether err may pass by itself (no leader, leader
// changed, connection lost): a waiter then retries instead of failing.
func transient(err error) bool {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable
	}
	return status.Code(err) == codes.Unavailable
}

// Release deletes our key if it is still the one we made; with a lease of
// its own it then revokes the lease. ErrNotHeld when the key was already
// gone (or l was not acquired here).
func (r *Resource) Release(ctx context.Context, l *backend.Lease) error {
	if r == nil || r.c == nil {
		return errNilClient
	}
	h, ok := l.Handle.(*handle)
	if !ok || h == nil {
		return backend.ErrNotHeld
	}
	if r.clientClosed() {
		return fmt.Errorf("etcd: release %q: client closed", l.Key)
	}
	if h.sess != nil {
		return r.releaseShared(ctx, l, h)
	}
	// Revoking alone would not do: a key deleted behind our back (by an
	// operator, or by a tool that cleans up) leaves the lease alive, and
	// the revoke would succeed on a lock we no longer hold.
	r.releasing(h, true)
	deleted, err := r.deleteOurs(ctx, h)
	if err != nil {
		r.releasing(h, false)
		return fmt.Errorf("etcd: release %q: %w", l.Key, err)
	}
	r.unwatchKey(h)
	r.free(h) // our key is gone either way: only we make keys of its name
	// The lease now holds no key: revoke it so that it does not linger for
	// its TTL (within ctx, else in the background).
	r.soon(ctx, r.revoker(h.leaseID(), nil))
	if !deleted {
		return backend.ErrNotHeld
	}
	return nil
}

// Refresh extends l for another TTL: KeepAliveOnce on its lease (with
// [WithSharedLease]: only when the shared lease is not already known to
// live that long), then a read of our key. ErrNotHeld when the lease or the
// key is gone.
func (r *Resource) Refresh(ctx context.Context, l *backend.Lease) error {
	if r == nil || r.c == nil {
		return errNilClient
	}
	h, ok := l.Handle.(*handle)
	if !ok || h == nil {
		return backend.ErrNotHeld
	}
	if r.clientClosed() {
		return fmt.Errorf("etcd: refresh %q: client closed", l.Key)
	}
	if ttlSeconds(l.TTL) > ttlSeconds(h.ttl()) {
		// An etcd lease keeps the TTL it was granted with (a shorter
		// one is that TTL rounded up).
		return fmt.Errorf("etcd: refresh %q to %v: %w: a lock keeps its lease's TTL (%v)", l.Key, l.TTL, errors.ErrUnsupported, h.ttl())
	}
	if h.sess != nil {
		return r.refreshShared(ctx, l, h)
	}
	if _, err := r.c.KeepAliveOnce(ctx, h.leaseID()); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return backend.ErrNotHeld
		}
		return fmt.Errorf("etcd: refresh %q: %w", l.Key, err)
	}
	exists, err := r.keyExists(ctx, h)
	if err != nil {
		return fmt.Errorf("etcd: refresh %q: %w", l.Key, err)
	}
	if !exists { // deleted behind our back: the lease alone holds nothing
		r.unwatchKey(h)
		r.free(h)
		r.later(0, r.revoker(h.leaseID(), nil))
		return backend.ErrNotHeld
	}
	return nil
}

// keyExists reports whether h's key is still the one we made.
func (r *Resource) keyExists(ctx context.Context, h *handle) (bool, error) {
	resp, err := r.c.Get(ctx, r.name(h).key, clientv3.WithKeysOnly())
	if err != nil {
		return false, err
	}
	return len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == h.rev, nil
}

// Close stops the Resource: it ends the goroutines it runs (the retries
// of failed clean-ups among them) and revokes its shared leases, which
// releases the locks held on them. It returns within about half a second
// whatever the server does: a shared lease it could not revoke in that time
// expires by itself, with the locks on it, and Close says so. It leaves the
// client open, and locks on leases of their own as they are. Acquire fails
// after Close.
func (r *Resource) Close() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	r.closed = true
	sessions := r.sessions
	r.sessions = make(map[int64]*session)
	r.mu.Unlock()
	r.stopTasks()
	errs := make(chan error, len(sessions))
	for _, s := range sessions {
		go func() { errs <- s.close() }()
	}
	var all []error
	for range sessions {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}
