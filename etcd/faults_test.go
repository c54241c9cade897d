package etcd

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
)

// waitFor polls cond until it holds, failing t after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("still waiting for %s after %v", what, d)
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

// TestLateReleaseSparesNextHolder: a Release
// on a shared lease that checked the lock's state just before the lock's
// TTL timer expired it must not delete the key of the next acquisition in
// this process, which reuses the name the timer freed. The hook holds the
// Release between its check and its delete until the timer has expired
// the lock and the next acquisition holds the lock under the same name; a
// client elsewhere must then still find the lock held.
func TestLateReleaseSparesNextHolder(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	r := newResource(t, endpoints, WithSharedLease())
	other := newResource(t, endpoints)
	ctx := t.Context()
	key := uniqueKey(t)
	first := lease(key, time.Second)
	if err := r.Acquire(ctx, first, time.Time{}); err != nil {
		t.Fatal(err)
	}
	h1 := first.Handle.(*handle)
	next := lease(key, 10*time.Second)
	hooked := false
	r.hook = func(point string) {
		if point != "release" || hooked {
			return
		}
		hooked = true
		waitFor(t, 10*time.Second, "the TTL timer to expire the first lock", h1.freed)
		if err := r.Acquire(ctx, next, time.Time{}); err != nil {
			t.Fatalf("next Acquire: %v", err)
		}
	}
	if err := r.Release(ctx, first); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release after the timer expired the lock = %v; want ErrNotHeld", err)
	}
	if !hooked {
		t.Fatal("Release did not reach its delete")
	}
	h2 := next.Handle.(*handle)
	if h2.queueKey() != h1.queueKey() {
		t.Fatalf("the next acquisition made %s; the test needs the freed name %s again", h2.queueKey(), h1.queueKey())
	}
	if ok, err := r.keyExists(ctx, h2); err != nil || !ok {
		t.Errorf("the next holder's key exists: %v, %v; want true: the late release deleted it", ok, err)
	}
	intruder := lease(key, time.Second)
	if err := other.Acquire(ctx, intruder, time.Time{}); err != backend.ErrNotAcquired {
		t.Errorf("another client's Acquire while the next holder holds = %v; want ErrNotAcquired", err)
		if err == nil {
			_ = other.Release(context.Background(), intruder)
		}
	}
	if err := r.Refresh(ctx, next); err != nil {
		t.Errorf("Refresh of the next holder's lock = %v; want nil", err)
	}
	if err := r.Release(ctx, next); err != nil {
		t.Errorf("Release of the next holder's lock = %v; want nil", err)
	}
	waitKeys(t, r, key, 0)
}

// failingClient returns a client whose transactions, deletes and lease
// revokes fail at once while fail is set, as requests do when the
// connection drops under them: the fault a real server cannot be asked to
// give at the right moment. Keep-alives and watches (streams) go through.
func failingClient(t testing.TB, endpoints []string, fail *atomic.Bool) *clientv3.Client {
	failed := map[string]bool{
		"/etcdserverpb.KV/Txn":            true,
		"/etcdserverpb.KV/DeleteRange":    true,
		"/etcdserverpb.Lease/LeaseRevoke": true,
	}
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if fail.Load() && failed[method] {
			// Not Unavailable: the client would retry a revoke until
			// its context ends, and this test has no time to lose.
			return status.Error(codes.Aborted, "injected fault: connection lost")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(unary)}})
	if err != nil {
		t.Fatalf("clientv3.New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestFailedCleanupRetried: a waiter cancelled
// while its clean-up requests fail must not leave its queue key blocking
// the lock. On a shared lease the key lived as long as the Resource kept
// the lease alive; on a lease of its own, until the lease's TTL (30s
// here). The clean-up is retried in the background: once requests pass
// again, the key goes and the next waiter gets the lock when the holder
// leaves.
func TestFailedCleanupRetried(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			ctx := t.Context()
			key := uniqueKey(t)
			holder := newResource(t, endpoints, m.opts...)
			next := newResource(t, endpoints, m.opts...)
			var fail atomic.Bool
			waiter := newResourceOn(t, failingClient(t, endpoints, &fail), m.opts...)
			lh := lease(key, 2*time.Second)
			if err := holder.Acquire(ctx, lh, time.Time{}); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithCancel(ctx)
			errc := make(chan error, 1)
			go func() { errc <- waiter.Acquire(wctx, lease(key, 30*time.Second), time.Now().Add(time.Minute)) }()
			waitKeys(t, holder, key, 2)
			fail.Store(true)
			cancel()
			select {
			case err := <-errc:
				if err == nil {
					t.Fatal("the cancelled waiter got the lock")
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the cancelled waiter's Acquire did not return")
			}
			fail.Store(false)
			if err := holder.Release(ctx, lh); err != nil {
				t.Fatal(err)
			}
			ln := lease(key, 2*time.Second)
			if err := next.Acquire(ctx, ln, time.Now().Add(10*time.Second)); err != nil {
				left, _ := holder.Leftovers(ctx, key)
				t.Fatalf("Acquire after the holder left = %v; want the lock (queue: %q)", err, left)
			}
			if err := next.Release(ctx, ln); err != nil {
				t.Fatal(err)
			}
			waitKeys(t, holder, key, 0)
		})
	}
}

// TestCleanupFailingForGood: when a shared-lease key's clean-up keeps
// failing (here every delete and revoke of the waiter's client fails, while
// its keep-alives pass), the Resource gives the lease up a TTL after the
// first try, and the lease expires on the server with the key: the lock is
// free again within about two TTLs, not when the Resource closes. Close
// then ends the retries.
func TestCleanupFailingForGood(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	ctx := t.Context()
	key := uniqueKey(t)
	holder := newResource(t, endpoints)
	next := newResource(t, endpoints)
	var fail atomic.Bool
	waiter := mustNew(t, failingClient(t, endpoints, &fail), WithSharedLease())
	lh := lease(key, 2*time.Second)
	if err := holder.Acquire(ctx, lh, time.Time{}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- waiter.Acquire(wctx, lease(key, 2*time.Second), time.Now().Add(time.Minute)) }()
	waitKeys(t, holder, key, 2)
	fail.Store(true)
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the cancelled waiter got the lock")
	}
	if err := holder.Release(ctx, lh); err != nil {
		t.Fatal(err)
	}
	ln := lease(key, 2*time.Second)
	if err := next.Acquire(ctx, ln, time.Now().Add(20*time.Second)); err != nil {
		left, _ := holder.Leftovers(ctx, key)
		t.Fatalf("Acquire behind a key whose clean-up keeps failing = %v; want the lock once its lease expired (queue: %q)", err, left)
	}
	if err := next.Release(ctx, ln); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- waiter.Close() }()
	select {
	case err := <-closed:
		t.Logf("Close with every revoke failing: %v", err)
	case <-time.After(2 * cleanupTimeout):
		t.Fatal("Close did not end the retries")
	}
	waiter.mu.Lock()
	left := len(waiter.tasks)
	waiter.mu.Unlock()
	if left != 0 {
		t.Errorf("%d clean-ups still retried after Close; want 0", left)
	}
}

// TestOwnLeaseLost: a lock on a lease of its own reports its loss through
// Lost when its lease is revoked or its key deleted from outside, instead
// of going unnoticed until its TTL; Release then reports ErrNotHeld, and
// the name is used again. A released lock's Lost stays open.
func TestOwnLeaseLost(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	admin := newClient(t, endpoints)
	r := newResource(t, endpoints)
	ctx := t.Context()
	for _, c := range []struct {
		name string
		end  func(h *handle) error
	}{
		{"LeaseRevoked", func(h *handle) error { _, err := admin.Revoke(ctx, h.leaseID()); return err }},
		{"KeyDeleted", func(h *handle) error { _, err := admin.Delete(ctx, h.queueKey()); return err }},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := uniqueKey(t)
			l := lease(key, time.Minute)
			if err := r.Acquire(ctx, l, time.Time{}); err != nil {
				t.Fatal(err)
			}
			if l.Lost() == nil {
				t.Fatal("Lost is nil on a lock with a lease of its own")
			}
			h := l.Handle.(*handle)
			if err := c.end(h); err != nil {
				t.Fatal(err)
			}
			select {
			case <-l.Lost().Done():
			case <-time.After(10 * time.Second):
				t.Fatal("Lost not closed 10s after the lock ended on the server")
			}
			if err := r.Release(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
				t.Errorf("Release after the loss = %v; want ErrNotHeld", err)
			}
			l2 := lease(key, time.Minute)
			if err := r.Acquire(ctx, l2, time.Time{}); err != nil {
				t.Fatal(err)
			}
			if got := l2.Handle.(*handle).queueKey(); got != h.queueKey() {
				t.Errorf("next acquire made %s; want the freed name %s", got, h.queueKey())
			}
			if err := r.Release(ctx, l2); err != nil {
				t.Fatal(err)
			}
			select {
			case <-l2.Lost().Done():
				t.Error("Lost closed by the lock's own release")
			default:
			}
			waitKeys(t, r, key, 0)
		})
	}
}

// freezer dials connections whose reads the test can hold (freeze) and
// then cut: a client that misses what the server sends for a while, then
// reconnects. Data read while frozen is dropped at the cut.
type freezer struct {
	mu     sync.Mutex
	cond   *sync.Cond
	frozen bool
	conns  map[*frozenConn]bool // open connection -> cut
}

type frozenConn struct {
	net.Conn
	f *freezer
}

func newFreezer() *freezer {
	f := &freezer{conns: map[*frozenConn]bool{}}
	f.cond = sync.NewCond(&f.mu)
	return f
}

func (f *freezer) dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	fc := &frozenConn{Conn: c, f: f}
	f.mu.Lock()
	f.conns[fc] = false
	f.mu.Unlock()
	return fc, nil
}

func (c *frozenConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	f := c.f
	f.mu.Lock()
	for f.frozen && !f.conns[c] {
		f.cond.Wait()
	}
	cut := f.conns[c]
	f.mu.Unlock()
	if cut {
		return 0, net.ErrClosed
	}
	return n, err
}

func (f *freezer) freeze() {
	f.mu.Lock()
	f.frozen = true
	f.mu.Unlock()
}

// cut closes every connection, dropping what was read while frozen, and
// lets new connections flow.
func (f *freezer) cut() {
	f.mu.Lock()
	for c := range f.conns {
		f.conns[c] = true
		c.Conn.Close()
	}
	f.frozen = false
	f.cond.Broadcast()
	f.mu.Unlock()
}

// TestKeyWatchAfterCompaction: when the Resource's key watch resumes after
// a break at a revision etcd has compacted, the deletions in between are
// lost; the watch starts afresh and reads every registered key once, so a
// lock whose key went meanwhile still sees Lost closed, and one whose key
// is there does not.
func TestKeyWatchAfterCompaction(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	admin := newClient(t, endpoints)
	f := newFreezer()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(f.dial)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := newResourceOn(t, c)
	ctx := t.Context()
	gone, kept := lease(uniqueKey(t)+"-gone", time.Minute), lease(uniqueKey(t)+"-kept", time.Minute)
	for _, l := range []*backend.Lease{gone, kept} {
		if err := r.Acquire(ctx, l, time.Time{}); err != nil {
			t.Fatal(err)
		}
		l.Lost().Done() // the watch runs
	}
	<-r.watchReady()
	f.freeze()
	if _, err := admin.Delete(ctx, gone.Handle.(*handle).queueKey()); err != nil {
		t.Fatal(err)
	}
	resp, err := admin.Put(ctx, "/"+uniqueKey(t)+"/after", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	f.cut()
	select {
	case <-gone.Lost().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Lost of the lock whose key was deleted while the watch was away: still open after 10s")
	}
	if err := r.Refresh(ctx, kept); err != nil { // a round trip after the fresh start's reads
		t.Fatalf("Refresh of the lock whose key is there: %v", err)
	}
	select {
	case <-kept.Lost().Done():
		t.Error("Lost closed on the lock whose key is still there")
	default:
	}
	if err := r.Release(ctx, kept); err != nil {
		t.Errorf("Release: %v", err)
	}
	if err := r.Release(ctx, gone); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release of the lost lock = %v; want ErrNotHeld", err)
	}
}
