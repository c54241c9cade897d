package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
)

// countedClient counts the requests a client sends: unary calls (reads,
// transactions, grants, revokes), keep-alive streams opened, and the
// keep-alive requests sent on them; it holds keep-alives (new streams and
// requests on open ones) while stallKeepAlives is set, as a connection
// that stopped forwarding them would: the fault a real server cannot give
// to one client alone.
type countedClient struct {
	*clientv3.Client
	unary, keepAlives, keepAliveMsgs, watches atomic.Int64
	stallKeepAlives                           atomic.Bool
}

// stalledStream is a keep-alive stream of a countedClient.
type stalledStream struct {
	grpc.ClientStream
	ctx context.Context
	cc  *countedClient
}

func (s stalledStream) SendMsg(m any) error {
	s.cc.keepAliveMsgs.Add(1)
	if s.cc.stallKeepAlives.Load() {
		<-s.ctx.Done()
		return s.ctx.Err()
	}
	return s.ClientStream.SendMsg(m)
}

func newCountedClient(t testing.TB, endpoints []string) *countedClient {
	cc := &countedClient{}
	unary := func(ctx context.Context, method string, req, reply any, conn *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		cc.unary.Add(1)
		return invoker(ctx, method, req, reply, conn, opts...)
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, conn *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if method == "/etcdserverpb.Watch/Watch" {
			cc.watches.Add(1)
		}
		if method == "/etcdserverpb.Lease/LeaseKeepAlive" {
			cc.keepAlives.Add(1)
			if cc.stallKeepAlives.Load() {
				<-ctx.Done()
				return nil, ctx.Err()
			}
		}
		st, err := streamer(ctx, desc, conn, method, opts...)
		if err != nil || method != "/etcdserverpb.Lease/LeaseKeepAlive" {
			return st, err
		}
		return stalledStream{ClientStream: st, ctx: ctx, cc: cc}, nil
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(unary), grpc.WithChainStreamInterceptor(stream)}})
	if err != nil {
		t.Fatalf("clientv3.New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	cc.Client = c
	return cc
}

// TestKeptAliveNoRequests: 200 locks the facade renews (WithAutoRenew) on
// the shared lease are kept alive by the lease's keep-alive alone: while
// they are held for a few renewal periods, the Resource sends no request
// but the lease's keep-alives (no refresh, no read per lock), and the
// facade sees them kept alive (Deadline zero): no lock is refreshed,
// with a read of its key, every TTL/3. The keep-alives go
// over one stream that stays open (one message per renewal), not a
// stream per renewal, which the server counts as two messages.
func TestKeptAliveNoRequests(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	cc := newCountedClient(t, endpoints)
	d, err := distlock.New(newResourceOn(t, cc.Client), distlock.WithAutoRenew(), distlock.WithDefaultTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	ctx := t.Context()
	base := uniqueKey(t)
	var locks []*distlock.Lock
	for i := range 200 {
		lk, err := d.TryLock(ctx, fmt.Sprintf("%s-%d", base, i), 0)
		if err != nil {
			t.Fatal(err)
		}
		if !lk.Deadline().IsZero() {
			t.Fatalf("lock %d: Deadline = %v; want zero (kept alive by the store)", i, lk.Deadline())
		}
		locks = append(locks, lk)
	}
	unary, keepAlives, msgs := cc.unary.Load(), cc.keepAlives.Load(), cc.keepAliveMsgs.Load()
	const hold = 3 * time.Second // the lease lives 2s, renewed every 667ms
	time.Sleep(hold)             // the hold: the measurement window, not synchronisation
	if n := cc.unary.Load() - unary; n != 0 {
		t.Errorf("%d requests while 200 locks were held; want none (no refresh, no read per lock)", n)
	}
	if n := cc.keepAliveMsgs.Load() - msgs; n < 2 || n > int64(hold/(500*time.Millisecond))+2 {
		t.Errorf("%d keep-alives in %v; want about one per 667ms, for all the locks", n, hold)
	}
	if n := cc.keepAlives.Load() - keepAlives; n > 1 {
		t.Errorf("%d keep-alive streams opened in %v; want the one stream kept open", n, hold)
	}
	for i, lk := range locks {
		select {
		case <-lk.Done():
			t.Errorf("lock %d lost while held", i)
		default:
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Errorf("Unlock %d: %v", i, err)
		}
	}
}

// TestKeptAliveKeyDeleted: a kept-alive lock whose key is deleted from
// outside learns it through the Resource's key watch: its Lost closes at
// once, without a request of the Resource (no polling), Release reports
// ErrNotHeld, and the name is used again. The lease's other locks are
// not touched. Nothing runs for it before somebody waits: no Lost
// channel and no watch until the first Done.
func TestKeptAliveKeyDeleted(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	admin := newClient(t, endpoints)
	cc := newCountedClient(t, endpoints)
	r := newResourceOn(t, cc.Client)
	ctx := t.Context()
	key := uniqueKey(t)
	l, other := lease(key, 2*time.Second), lease(key+"-other", 2*time.Second)
	for _, x := range []*backend.Lease{l, other} {
		x.AutoRenew = true
		if err := r.Acquire(ctx, x, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if !x.KeptAlive || x.Lost() == nil {
			t.Fatalf("KeptAlive = %v, Lost = %v; want true and a channel", x.KeptAlive, x.Lost())
		}
	}
	// Nobody waits on Lost yet: no channel is made and no watch runs (a
	// held lock costs neither).
	for _, x := range []*backend.Lease{l, other} {
		lostMu.Lock()
		made := x.Handle.(*handle).lost != nil
		lostMu.Unlock()
		if made {
			t.Errorf("%s: a Lost channel was made before anybody asked for it", x.Key)
		}
	}
	if n := cc.watches.Load(); n != 0 || r.watchReady() != nil {
		t.Errorf("%d watches opened before anybody waited for a loss; want none", n)
	}
	lost := l.Lost().Done() // starts the watch, which reads the held keys once
	select {
	case <-r.watchReady():
	case <-time.After(5 * time.Second):
		t.Fatal("the key watch is not ready 5s after the first Done")
	}
	if l.Lost().Closed() || other.Lost().Closed() {
		t.Fatal("Lost closed on a lock whose key is there")
	}
	unary := cc.unary.Load()
	if _, err := admin.Delete(ctx, l.Handle.(*handle).queueKey()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("Lost still open 5s after the key was deleted")
	}
	if n := cc.unary.Load() - unary; n != 0 {
		t.Errorf("the Resource sent %d requests before Lost closed; want none (a watch, not polling)", n)
	}
	if n := cc.watches.Load(); n != 1 {
		t.Errorf("%d watches opened; want the Resource's one", n)
	}
	select {
	case <-other.Lost().Done():
		t.Error("the lease's other lock reported lost")
	default:
	}
	if err := r.Release(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release of the deleted lock = %v; want ErrNotHeld", err)
	}
	again := lease(key, 2*time.Second)
	again.AutoRenew = true
	if err := r.Acquire(ctx, again, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if again.Handle.(*handle).queueKey() != l.Handle.(*handle).queueKey() {
		t.Errorf("the next acquisition made %s; want the name given back, %s", again.Handle.(*handle).queueKey(), l.Handle.(*handle).queueKey())
	}
	for _, x := range []*backend.Lease{again, other} {
		if err := r.Release(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	waitKeys(t, r, key, 0)
}

// TestKeyWatchStartsOnDone: the key watch starts with the first wait for a
// loss, and finds the deletions before it: a lock whose key was deleted
// while nobody waited is reported lost by its first Done, in one read of
// the held keys, not one per key.
func TestKeyWatchStartsOnDone(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	admin := newClient(t, endpoints)
	cc := newCountedClient(t, endpoints)
	r := newResourceOn(t, cc.Client)
	ctx := t.Context()
	base := uniqueKey(t)
	var ls []*backend.Lease
	for i := range 3 {
		l := lease(fmt.Sprintf("%s-%d", base, i), 10*time.Second)
		l.AutoRenew = i > 0 // both kinds of lease: its own and the shared one
		if err := r.Acquire(ctx, l, time.Time{}); err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	for i := range 50 { // uncontended cycles: no watch
		l := lease(base+"-cycle", 10*time.Second)
		l.AutoRenew = i%2 == 0
		if err := r.Acquire(ctx, l, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if err := r.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	if n := cc.watches.Load(); n != 0 {
		t.Fatalf("%d watches opened by acquires and releases; want none", n)
	}
	for _, i := range []int{0, 2} {
		if _, err := admin.Delete(ctx, ls[i].Handle.(*handle).queueKey()); err != nil {
			t.Fatal(err)
		}
	}
	unary := cc.unary.Load()
	select {
	case <-ls[2].Lost().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost of a lock deleted before the first Done still open 5s after it")
	}
	<-r.watchReady()
	if n := cc.unary.Load() - unary; n != 1 {
		t.Errorf("%d requests to start the watch; want 1 (the held keys read in one transaction)", n)
	}
	if !ls[0].Lost().Closed() {
		t.Error("Lost of the other deleted lock (nobody waits on it) not fired once the watch started")
	}
	if ls[1].Lost().Closed() {
		t.Error("Lost of the lock still held fired")
	}
	for i, l := range ls {
		err := r.Release(ctx, l)
		if want := i != 1; want != errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Release %d = %v", i, err)
		}
	}
	waitKeys(t, r, base+"-0", 0)
}

// TestKeptAliveLostBeforeExpiry: when the shared lease's keep-alives stop
// getting through, its locks' Lost closes before the server can expire
// the lease (its life after the send of the last renewal that succeeded),
// so before another client can be granted the lock; that client then
// gets it.
func TestKeptAliveLostBeforeExpiry(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	cc := newCountedClient(t, endpoints)
	r := newResourceOn(t, cc.Client)
	next := newResource(t, endpoints)
	ctx := t.Context()
	key := uniqueKey(t)
	l := lease(key, 2*time.Second)
	l.AutoRenew = true
	if err := r.Acquire(ctx, l, time.Time{}); err != nil {
		t.Fatal(err)
	}
	s := l.Handle.(*handle).sess
	granted := make(chan time.Time, 1)
	ln := lease(key, 2*time.Second)
	go func() {
		if err := next.Acquire(ctx, ln, time.Now().Add(time.Minute)); err != nil {
			t.Errorf("the next client's Acquire: %v", err)
		}
		granted <- time.Now()
	}()
	waitKeys(t, next, key, 2)
	cc.stallKeepAlives.Store(true)
	var lostAt time.Time
	select {
	case <-l.Lost().Done():
		lostAt = time.Now()
	case <-time.After(10 * time.Second):
		t.Fatal("Lost still open 10s after the keep-alives stopped")
	}
	expiry := s.until() // the last renewal's send plus the lease's life
	if !lostAt.Before(expiry) {
		t.Errorf("Lost closed %v after the server could expire the lease", lostAt.Sub(expiry))
	}
	select {
	case at := <-granted:
		if !lostAt.Before(at) {
			t.Errorf("the next client was granted the lock %v before Lost closed", lostAt.Sub(at))
		}
		t.Logf("Lost closed %v before the lease could expire, %v before the next client's grant", expiry.Sub(lostAt), at.Sub(lostAt))
	case <-time.After(20 * time.Second):
		t.Fatal("the next client was not granted the lock")
	}
	cc.stallKeepAlives.Store(false)
	if err := r.Release(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release of the lost lock = %v; want ErrNotHeld", err)
	}
	if err := next.Release(ctx, ln); err != nil {
		t.Fatal(err)
	}
	waitKeys(t, next, key, 0)
}

// TestKeptAliveLeaseLivesTTL: without WithSharedLease the shared lease
// carries only locks it keeps alive, so it lives their TTL, as a
// concurrency.Session's (a lock of a process that died stays no longer),
// and is renewed every third of it; with WithSharedLease it lives a
// margin longer, for the locks its keep-alive does not keep.
func TestKeptAliveLeaseLivesTTL(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	admin := newClient(t, endpoints)
	ctx := t.Context()
	for _, c := range []struct {
		name string
		opts []Option
		want int64
	}{{"own", nil, 3}, {"shared", []Option{WithSharedLease()}, 4}} {
		t.Run(c.name, func(t *testing.T) {
			r := newResource(t, endpoints, c.opts...)
			l := lease(uniqueKey(t), 3*time.Second)
			l.AutoRenew = true
			if err := r.Acquire(ctx, l, time.Time{}); err != nil {
				t.Fatal(err)
			}
			s := l.Handle.(*handle).sess
			resp, err := admin.TimeToLive(ctx, s.id)
			if err != nil {
				t.Fatal(err)
			}
			if resp.GrantedTTL != c.want {
				t.Errorf("shared lease granted for %ds; want %ds", resp.GrantedTTL, c.want)
			}
			if s.period <= 0 || s.period > time.Duration(resp.GrantedTTL)*time.Second/3 {
				t.Errorf("renewed every %v; want at most a third of the lease's life", s.period)
			}
			if err := r.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
		})
	}
}
