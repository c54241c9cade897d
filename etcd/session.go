package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/distlock/backend"
)

// session is one lease shared by the locks of one TTL (WithSharedLease).
// Its lease lives ttl+margin and is renewed every margin/2, so that at any
// moment while renewals succeed it is known to live at least ttl more: a
// lock taken on it is valid for its full TTL without a round trip of its
// own. Without WithSharedLease a session carries only locks that distlock
// renews: its lease lives ttl and is renewed every ttl/3, as a
// concurrency.Session's. A lock that distlock renews (AutoRenew) lives as long as the lease
// (backend.Lease.KeptAlive); any other lock's TTL is kept by a local timer
// that deletes the lock's key unless Refresh pushed the deadline on. When
// the lease is lost, or renewals failed until it may expire, done closes
// and every lock on it reports itself lost (Resource.sessionLost).
//
// Every transaction that makes a key on the lease also compares the mod
// revision of the fence key of the key's name with the one the Resource
// knows (0 while the fence key does not exist). The clean-up of an
// acquisition whose transaction may still be on its way (its reply was
// lost, or its caller's context ended) puts that fence key, so that the
// transaction, if it lands later, makes nothing (see fenceOff); the name
// is not used again before that. A fence key per name, not one per
// lease, so that the clean-up fails no other acquisition's transaction.
// Fence keys are bound to the lease and go with it.
type session struct {
	r      *Resource
	ttl    time.Duration // the locks' TTL, whole seconds
	ready  chan struct{} // closed once the grant is done; err then says how
	err    error
	id     clientv3.LeaseID
	fences string        // where the fence keys of the lease's names are, once id is known
	life   time.Duration // granted lease TTL, > ttl
	period time.Duration // between renewals
	done   chan struct{} // closed when the lease is gone or given up
	cancel context.CancelFunc
	given  atomic.Bool // abandon was called: done closes soon

	mu       sync.Mutex
	lastSent time.Time        // send time of the last successful grant or renewal
	epochs   map[string]int64 // queue key name -> its fence key's mod revision, when not 0
}

// session returns the live shared lease for ttl, granting it if needed.
// The grant runs in the background, bounded by cleanupTimeout: callers
// wait for it while their context lives, and a caller whose context ends
// leaves it to the others.
func (r *Resource) session(ctx context.Context, ttl time.Duration) (*session, error) {
	secs := ttlSeconds(ttl)
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, errors.New("resource closed")
	}
	s := r.sessions[secs]
	if s != nil {
		select {
		case <-s.ready:
			if s.err == nil && !s.isDone() && !s.given.Load() {
				r.mu.Unlock()
				return s, nil
			}
			s = nil // dead or failed: replace it
		default:
		}
	}
	if s == nil {
		s = &session{r: r, ttl: time.Duration(secs) * time.Second, ready: make(chan struct{}), done: make(chan struct{})}
		r.sessions[secs] = s
		r.mu.Unlock()
		started := r.background(func(ctx context.Context) {
			gctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
			defer cancel()
			s.start(gctx)
			if s.err != nil {
				r.mu.Lock()
				if r.sessions[secs] == s {
					delete(r.sessions, secs)
				}
				r.mu.Unlock()
			}
		})
		if !started {
			s.err = errors.New("resource closed")
			close(s.done)
			close(s.ready)
		}
	} else {
		r.mu.Unlock()
	}
	select {
	case <-s.ready:
	case <-ctx.Done():
		// The grant's own error comes later, if ever: say at least how
		// the client's connection stands (TRANSIENT_FAILURE: its dials
		// fail).
		state := "unknown"
		if cc := r.c.ActiveConnection(); cc != nil {
			state = cc.GetState().String()
		}
		return nil, fmt.Errorf("shared lease of %v not granted yet (the client's connection is %s): %w", s.ttl, state, ctx.Err())
	}
	if s.err != nil {
		return nil, s.err
	}
	return s, nil
}

// start grants the lease and starts keeping it alive; it closes s.ready.
func (s *session) start(ctx context.Context) {
	defer close(s.ready)
	margin := max(s.ttl/3, time.Second).Round(time.Second)
	if !s.r.shared {
		// Only locks that the lease alone keeps alive (AutoRenew): their
		// validity is the lease's life, so it needs no margin beyond
		// their TTL, and is renewed every third of it, as a
		// concurrency.Session's.
		margin = 0
	}
	sent := time.Now()
	id, life, err := s.r.grant(ctx, s.ttl+margin)
	if err != nil {
		if id != 0 {
			s.r.later(0, s.r.revoker(id, nil))
		}
		s.err = fmt.Errorf("grant shared lease: %w", err)
		close(s.done)
		return
	}
	s.id, s.life, s.lastSent = id, life, sent
	s.fences = fmt.Sprintf("%s!fence/%x/", s.r.prefix, int64(id))
	s.period = (life - s.ttl) / 2
	if margin == 0 {
		s.period = life / 3
	}
	kctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go s.keepAlive(kctx)
}

// fenceKey is the fence key of the queue key name.
func (s *session) fenceKey(name string) string {
	return s.fences + strings.TrimPrefix(name, s.r.prefix)
}

// epoch is the mod revision of name's fence key, as far as we know.
func (s *session) epoch(name string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epochs[name]
}

// fenced records that name's fence key was put at rev (or, with learnt,
// that it was found with mod revision rev).
func (s *session) fenced(name string, rev int64, learnt bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !learnt && rev <= s.epochs[name] {
		return
	}
	if s.epochs == nil {
		s.epochs = make(map[string]int64)
	}
	if rev == 0 {
		delete(s.epochs, name)
		return
	}
	s.epochs[name] = rev
}

// keepAlive renews the lease a period after the send of the last
// successful renewal until ctx ends, the lease is gone, or renewals failed
// for so long that it may expire on the server any moment (loseAt). When
// it returns, done closes and every lock on the lease reports itself
// lost: before the server can expire the lease and let another holder in.
//
// A renewal runs until it is answered or the loss deadline passes: a
// server that stalls (an fsync, a frozen process, a congested link) and
// answers before the lease would expire renews it, whenever in the
// lease's life the stall began. A renewal that fails before the deadline
// (an error, not a timeout) is tried again after renewRetry, doubling up
// to the period, so that a server back after a short outage is renewed
// at once. A hung stream is given up at the loss deadline only; the
// client's own keep-alive (DialKeepAliveTime) is what notices a dead
// connection sooner.
func (s *session) keepAlive(ctx context.Context) {
	defer s.r.sessionLost(s)
	defer close(s.done)
	var ka keepAliveStream
	defer ka.reset()
	t := time.NewTimer(s.period)
	defer t.Stop()
	retry := renewRetry
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sent := time.Now()
		lose := s.loseAt()
		if !sent.Before(lose) {
			return // renewals failed too long: the lease may expire now
		}
		kctx, cancel := context.WithDeadline(ctx, lose)
		err := ka.once(kctx, s.r, s.id)
		cancel()
		switch {
		case err == nil:
			s.mu.Lock()
			if sent.After(s.lastSent) {
				s.lastSent = sent
			}
			s.mu.Unlock()
			if s.r.onRenew != nil {
				s.r.onRenew()
			}
			retry = renewRetry
			t.Reset(time.Until(s.sentAt().Add(s.period)))
			continue
		case errors.Is(err, rpctypes.ErrLeaseNotFound), s.r.clientClosed(), ctx.Err() != nil:
			return // no renewal can succeed any more
		case !time.Now().Before(s.loseAt()):
			return // the lease may expire on the server now
		}
		t.Reset(min(retry, time.Until(s.loseAt())))
		retry = min(2*retry, s.period)
	}
}

// renewRetry is the first pause before a failed renewal is tried again
// (keepAlive); it doubles up to the renewal period.
const renewRetry = 50 * time.Millisecond

// keepAliveStream is a lease keep-alive stream that stays open between
// renewals: a renewal then costs the server one message. KeepAliveOnce
// opens a stream per renewal, which the server counts as two messages (the
// request and the end of the stream). One request at most is in flight:
// a renewal that fails or runs out of time drops the stream, and the next
// one opens another.
type keepAliveStream struct {
	stream  pb.Lease_LeaseKeepAliveClient
	cancel  context.CancelFunc
	replies chan keepAliveReply
}

type keepAliveReply struct {
	resp *pb.LeaseKeepAliveResponse
	err  error
}

// once renews lease id, within ctx, over the stream (opened if needed).
// A lease the server no longer has gives rpctypes.ErrLeaseNotFound.
func (k *keepAliveStream) once(ctx context.Context, r *Resource, id clientv3.LeaseID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if k.stream == nil {
		sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
		stop := context.AfterFunc(ctx, cancel) // opening the stream may wait for a connection
		stream, err := r.leases.LeaseKeepAlive(sctx)
		if !stop() || err != nil {
			cancel()
			if err == nil || ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		replies := make(chan keepAliveReply, 1)
		go func() {
			for {
				resp, err := stream.Recv()
				select {
				case replies <- keepAliveReply{resp, err}:
				case <-sctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		}()
		k.stream, k.cancel, k.replies = stream, cancel, replies
	}
	// Send may block on flow control: ctx ends it by ending the stream.
	stop := context.AfterFunc(ctx, k.cancel)
	var rep keepAliveReply
	if rep.err = k.stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)}); rep.err == nil {
		select {
		case rep = <-k.replies:
		case <-ctx.Done():
			rep.err = ctx.Err()
		}
	}
	if !stop() || rep.err != nil { // the stream was, or is to be, ended
		k.reset()
	}
	switch {
	case rep.err != nil:
		return clientv3.ContextError(ctx, rep.err)
	case rep.resp.TTL <= 0:
		return rpctypes.ErrLeaseNotFound
	}
	return nil
}

// reset drops the stream, if any.
func (k *keepAliveStream) reset() {
	if k.cancel != nil {
		k.cancel()
	}
	*k = keepAliveStream{}
}

// loseAt is when the lease may expire on the server unless renewed: its
// life after the send of the last successful renewal, less an allowance
// for the clocks' drift and this process's timers (as the facade's, 1% +
// 2ms).
func (s *session) loseAt() time.Time {
	return s.until().Add(-s.life/100 - 2*time.Millisecond)
}

func (s *session) sentAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastSent
}

// until is how long the lease is known to live from now.
func (s *session) until() time.Time { return s.sentAt().Add(s.life) }

// isDone reports whether the session has ended (s.done closed).
func (s *session) isDone() bool { return isClosed(s.done) }

// abandon stops renewing: the lease and its keys expire on the server.
func (s *session) abandon() {
	s.given.Store(true)
	if s.cancel != nil {
		s.cancel()
	}
}

// close stops renewing and revokes the lease, deleting its keys. The
// revoke is bounded by closeTimeout: a lease it could not revoke expires.
func (s *session) close() error {
	<-s.ready
	if s.err != nil {
		return nil
	}
	s.cancel()
	<-s.done
	if s.r.clientClosed() {
		return fmt.Errorf("etcd: close: client closed: shared lease %x and its locks are left to expire", int64(s.id))
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if _, err := s.r.c.Revoke(ctx, s.id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("etcd: close: revoke shared lease %x (its locks expire with it, within %v): %w", int64(s.id), s.life, err)
	}
	return nil
}

// acquireShared takes the lock with a key on the shared lease for l.TTL:
// one transaction when uncontended. A lock the facade renews (l.AutoRenew)
// is kept alive by the lease alone (l.KeptAlive): no timer, no refresh.
// Every lock on the lease is registered with the Resource's key watch,
// which closes its Lost when its key is deleted by anyone but its own
// release, and when the lease is lost.
func (r *Resource) acquireShared(ctx context.Context, l *backend.Lease, deadline time.Time, retried bool) (err error) {
	s, err := r.session(ctx, l.TTL)
	if err != nil {
		return acquireErr(l.Key, err)
	}
	start := time.Now()
	h := r.newHandle(l, s, 0, 0)
	n, value := r.name(h), h.value(l.Value, l.Label)
	sent := false // the enqueue was sent: a key may exist
	defer func() {
		if err == nil {
			return
		}
		r.unwatchKey(h)
		switch {
		case h.freed():
		case sent:
			err = r.undo(ctx, err, r.discarder(h, value))
		default:
			r.free(h)
		}
	}()
	if err := r.watchKey(h); err != nil {
		return acquireErr(l.Key, err)
	}
	if s.isDone() { // its locks were told before h was registered
		return fmt.Errorf("etcd: acquire %q: shared lease %x lost", l.Key, int64(s.id))
	}
	sent = true
	isHolder, err := r.enqueue(ctx, h, n, value)
	if r.hook != nil {
		r.hook("enqueued")
	}
	if err != nil {
		if errors.Is(err, backend.ErrLimitMismatch) {
			sent = false // the transaction made nothing, and said so
		}
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			// The shared lease ended behind our back (the transaction
			// created nothing): start a new one, once.
			s.abandon()
			if !retried {
				r.unwatchKey(h)
				r.free(h)
				return r.acquireShared(ctx, l, deadline, true)
			}
		}
		return acquireErr(l.Key, err)
	}
	if !r.keyMade(h, h.rev) {
		return fmt.Errorf("etcd: acquire %q: queue key %s deleted as it was made: %w", l.Key, n.key, rpctypes.ErrLeaseNotFound)
	}
	grant := start
	if !isHolder {
		if deadline.IsZero() || !time.Now().Before(deadline) {
			return backend.ErrNotAcquired
		}
		if err := r.await(ctx, h, n, value, deadline, s.ttl, nil, h.Done()); err != nil {
			if err == backend.ErrNotAcquired {
				return err
			}
			return fmt.Errorf("etcd: acquire %q: %w", l.Key, err)
		}
		grant = time.Now() // no later than the read that found us first
	}
	// Valid for ttl from the grant, as far as the lease is known to live.
	end := grant.Add(s.ttl)
	if u := s.until(); u.Before(end) {
		end = u
	}
	validity := time.Until(end) - clockGuard
	if validity <= 0 || s.isDone() || h.Closed() {
		return fmt.Errorf("etcd: acquire %q: shared lease %x lost", l.Key, int64(s.id))
	}
	if l.AutoRenew {
		l.KeptAlive = true
	} else {
		w := &r.watch
		w.mu.Lock()
		if h.x == nil {
			h.x = &extra{}
		}
		h.x.deadline = end
		h.x.timer = time.AfterFunc(time.Until(end), func() { r.expire(h) })
		w.mu.Unlock()
	}
	l.TTL = s.ttl
	l.Validity = validity
	l.Token = uint64(h.rev)
	l.Handle = h
	return nil
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// expire deletes h's key when its deadline passed without a Refresh.
func (r *Resource) expire(h *handle) {
	w := &r.watch
	w.mu.Lock()
	if h.state() != held {
		w.mu.Unlock()
		return
	}
	if d := time.Until(h.x.deadline); d > 0 {
		h.x.timer.Reset(d)
		w.mu.Unlock()
		return
	}
	h.setState(expired)
	w.mu.Unlock()
	r.releasing(h, true) // our own deletion: Lost stays open (the facade expired the lock already)
	r.unwatchKey(h)
	if _, err := r.deleteKey(context.Background(), h); err == nil {
		r.free(h)
		return
	}
	// Our key would outlive its TTL: let the lease, and every key on it,
	// expire instead, and give the name back once the key is gone.
	h.sess.abandon()
	r.later(firstRetry, r.discarder(h, ""))
}

// deleteKey is deleteOurs once, detached from ctx and bounded by
// cleanupTimeout (the TTL timer's delete, which no caller waits for).
func (r *Resource) deleteKey(ctx context.Context, h *handle) (bool, error) {
	if r.clientClosed() {
		return false, errors.New("client closed")
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return r.deleteOurs(ctx, h)
}

// deleteOurs deletes h's key in a transaction that compares its create
// revision with h's (known: the key was made), so that it never deletes a
// key another acquisition made under the same name once h's name was given
// back. It reports whether it deleted the key.
func (r *Resource) deleteOurs(ctx context.Context, h *handle) (bool, error) {
	key := r.name(h).key
	resp, err := r.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", h.rev)).
		Then(clientv3.OpDelete(key)).
		Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// releaseShared deletes our key if it is still ours.
func (r *Resource) releaseShared(ctx context.Context, l *backend.Lease, h *handle) error {
	w := &r.watch
	w.mu.Lock()
	state := h.state()
	w.mu.Unlock()
	if state != held {
		return backend.ErrNotHeld
	}
	if r.hook != nil {
		r.hook("release")
	}
	// The TTL timer may expire the lock and give its name back from here
	// on, and the next acquisition may make a key under that name: the
	// delete compares the create revision.
	r.releasing(h, true)
	deleted, err := r.deleteOurs(ctx, h)
	if err != nil {
		// Still held as far as we know: the timer, if any, deletes the
		// key at its deadline unless a retry does first.
		r.releasing(h, false)
		return fmt.Errorf("etcd: release %q: %w", l.Key, err)
	}
	w.mu.Lock()
	wasHeld := h.state() == held
	h.setState(released)
	if h.x != nil && h.x.timer != nil {
		h.x.timer.Stop()
	}
	w.mu.Unlock()
	if wasHeld { // else expire deletes and frees
		r.unwatchKey(h)
		r.free(h)
	}
	if !deleted || !wasHeld {
		return backend.ErrNotHeld
	}
	return nil
}

// refreshShared pushes h's deadline on by its TTL when the shared lease is
// known to live that long; otherwise it renews the lease first.
func (r *Resource) refreshShared(ctx context.Context, l *backend.Lease, h *handle) error {
	s := h.sess
	w := &r.watch
	w.mu.Lock()
	state := h.state()
	w.mu.Unlock()
	if state != held || s.isDone() {
		return backend.ErrNotHeld
	}
	now := time.Now()
	if s.until().Before(now.Add(s.ttl)) {
		if _, err := r.c.KeepAliveOnce(ctx, s.id); err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				s.abandon()
				return backend.ErrNotHeld
			}
			return fmt.Errorf("etcd: refresh %q: %w", l.Key, err)
		}
		s.mu.Lock()
		if now.After(s.lastSent) {
			s.lastSent = now
		}
		s.mu.Unlock()
	}
	ok, err := r.keyExists(ctx, h)
	if err != nil {
		return fmt.Errorf("etcd: refresh %q: %w", l.Key, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if h.state() != held {
		return backend.ErrNotHeld
	}
	if !ok { // deleted behind our back
		h.setState(expired)
		if h.x != nil && h.x.timer != nil {
			h.x.timer.Stop()
		}
		r.unwatchLocked(h)
		r.freeLocked(h)
		return backend.ErrNotHeld
	}
	if h.x != nil && h.x.timer != nil {
		h.x.deadline = now.Add(s.ttl)
	}
	return nil
}
