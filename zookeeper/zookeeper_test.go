package zookeeper

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
)

const ttl = 10 * time.Second

// TestResource runs the resource's own tests against one standalone server.
func TestResource(t *testing.T) {
	zs := testserver.ZooKeeper(t)
	run(t, []string{zs.Addr}, []namedTest{
		{"AcquireRelease", testAcquireRelease},
		{"TokenIncreases", testTokenIncreases},
		{"ZeroDeadlineUnderContention", testZeroDeadlineUnderContention},
		{"CancelledWaitsLeaveNoChildren", testCancelledWaitsLeaveNoChildren},
		{"FIFOOneWakeUp", testFIFOOneWakeUp},
		{"TTLDeletesNode", testTTLDeletesNode},
		{"RefreshPushesTTLBack", testRefreshPushesTTLBack},
		{"CloseDeletesHeld", testCloseDeletesHeld},
		{"RootOption", testRootOption},
		{"FreshConnection", testFreshConnection},
		{"TimedOutWaitsLeaveOneWatch", testTimedOutWaitsLeaveOneWatch},
	})
}

func testAcquireRelease(t *testing.T, addrs []string) {
	r, conn := newResource(t, addrs)
	ctx := t.Context()
	key := uniqueKey(t)

	l := lease(key, ttl)
	if err := r.Acquire(ctx, l, time.Time{}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	path := pathOf(l)
	if !strings.HasPrefix(path, r.parentPath(key)+"/_c_") {
		t.Errorf("Handle = %q; want a child of %s", path, r.parentPath(key))
	}
	_, stat, err := conn.Exists(path)
	if err != nil {
		t.Fatal(err)
	}
	// The token is the znode's czxid, read from the create's reply.
	if l.Token == 0 || l.Token != uint64(stat.Czxid) {
		t.Errorf("Token = %d; want the czxid %d", l.Token, stat.Czxid)
	}
	if stat.EphemeralOwner != conn.SessionID() {
		t.Errorf("znode owner = %x; want our session %x", stat.EphemeralOwner, conn.SessionID())
	}
	data, _, err := conn.Get(path)
	if rec := decodeRecord(data); err != nil || rec.value != l.Value || rec.ttl != ttl || rec.kept {
		t.Errorf("znode data = %q (%+v), %v; want a record of the owner value %q and the TTL %v", data, rec, err, l.Value, ttl)
	}
	if l.Lost() == nil || l.Lost().Closed() {
		t.Errorf("Lost = %v; want an open channel", l.Lost())
	}
	if got := mustChildren(t, conn, r, key); len(got) != 1 {
		t.Errorf("children = %v; want one", got)
	}

	if err := r.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if got := mustChildren(t, conn, r, key); len(got) != 0 {
		t.Errorf("children after release = %v; want none", got)
	}
	if err := r.Release(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("second Release = %v; want ErrNotHeld", err)
	}
	if err := r.Refresh(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Refresh after release = %v; want ErrNotHeld", err)
	}
}

func testTokenIncreases(t *testing.T, addrs []string) {
	r1, conn := newResource(t, addrs)
	r2, _ := newResource(t, addrs)
	ctx := t.Context()
	key := uniqueKey(t)

	var last uint64
	for i := range 6 {
		r := r1
		if i%2 == 1 {
			r = r2
		}
		l := lease(key, ttl)
		if err := r.Acquire(ctx, l, time.Time{}); err != nil {
			t.Fatalf("Acquire %d: %v", i, err)
		}
		if l.Token <= last {
			t.Errorf("token %d = %d; want > %d", i, l.Token, last)
		}
		last = l.Token
		if err := r.Release(ctx, l); err != nil {
			t.Fatalf("Release %d: %v", i, err)
		}
		if i == 2 {
			// The parent goes away and comes back: sequence numbers restart,
			// tokens must not.
			if err := conn.Delete(r.parentPath(key), -1); err != nil {
				t.Fatalf("delete parent: %v", err)
			}
		}
	}
}

func testZeroDeadlineUnderContention(t *testing.T, addrs []string) {
	r1, conn := newResource(t, addrs)
	r2, _ := newResource(t, addrs)
	ctx := t.Context()
	key := uniqueKey(t)

	holder := lease(key, ttl)
	if err := r1.Acquire(ctx, holder, time.Time{}); err != nil {
		t.Fatal(err)
	}
	l := lease(key, ttl)
	if err := r2.Acquire(ctx, l, time.Time{}); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("Acquire while held = %v; want ErrNotAcquired", err)
	}
	if err := r2.Acquire(ctx, l, time.Now().Add(100*time.Millisecond)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("Acquire with a short wait = %v; want ErrNotAcquired", err)
	}
	if got := mustChildren(t, conn, r1, key); len(got) != 1 || got[0] != pathOf(holder)[len(r1.parentPath(key))+1:] {
		t.Errorf("children = %v; want only the holder's %s", got, pathOf(holder))
	}
}

func testCancelledWaitsLeaveNoChildren(t *testing.T, addrs []string) {
	r1, conn := newResource(t, addrs)
	r2, _ := newResource(t, addrs)
	key := uniqueKey(t)

	holder := lease(key, ttl)
	if err := r1.Acquire(t.Context(), holder, time.Time{}); err != nil {
		t.Fatal(err)
	}
	// Several waiters queue behind the holder, then all give up: by
	// cancellation, by deadline.
	ctx, cancel := context.WithCancel(t.Context())
	var results []<-chan error
	for range 3 {
		results = append(results, acquireAsync(ctx, r2, lease(key, ttl), time.Now().Add(time.Minute)))
	}
	short := acquireAsync(t.Context(), r2, lease(key, ttl), time.Now().Add(300*time.Millisecond))
	waitFor(t, 5*time.Second, "five children", func() bool { return len(mustChildren(t, conn, r1, key)) == 5 })
	if err := <-short; !errors.Is(err, backend.ErrNotAcquired) {
		t.Errorf("Acquire past its deadline = %v; want ErrNotAcquired", err)
	}
	cancel()
	for _, ch := range results {
		err := <-ch
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled Acquire = %v; want context.Canceled", err)
		}
		// A cancelled Acquire returns at once; its znode is deleted in
		// the background, which the error's Cleanup waits for.
		var ab *backend.AbandonedError
		if errors.As(err, &ab) {
			cctx, ccancel := context.WithTimeout(t.Context(), 10*time.Second)
			if err := ab.Cleanup(cctx); err != nil {
				t.Errorf("Cleanup of a cancelled Acquire = %v; want nil", err)
			}
			ccancel()
		}
	}
	if got := mustChildren(t, conn, r1, key); len(got) != 1 {
		t.Errorf("children after the waiters gave up = %v; want only the holder's", got)
	}
	if err := r1.Release(t.Context(), holder); err != nil {
		t.Fatal(err)
	}
	if got := mustChildren(t, conn, r1, key); len(got) != 0 {
		t.Errorf("children after release = %v; want none", got)
	}
}

// TestFIFOOneWakeUp queues waiters in a known order, each on its own
// connection, and releases the lock down the line: the grants follow the
// queue, and each release sends exactly one watch notification.
func testFIFOOneWakeUp(t *testing.T, addrs []string) {
	const n = 5
	key := uniqueKey(t)
	var wakeups atomic.Int32
	countDeletes := func(ev zk.Event) {
		if ev.Type == zk.EventNodeDeleted {
			wakeups.Add(1)
		}
	}

	r0, conn := newResource(t, addrs)
	holder := lease(key, ttl)
	if err := r0.Acquire(t.Context(), holder, time.Time{}); err != nil {
		t.Fatal(err)
	}
	leases := make([]*backend.Lease, n)
	res := make([]*Resource, n)
	results := make([]<-chan error, n)
	for i := range n {
		res[i] = mustNew(t, connectWith(t, addrs, connOpts{events: countDeletes}))
		t.Cleanup(func() { _ = res[i].Close() })
		leases[i] = lease(key, ttl)
		results[i] = acquireAsync(t.Context(), res[i], leases[i], time.Now().Add(time.Minute))
		waitFor(t, 5*time.Second, "the waiter to queue", func() bool { return len(mustChildren(t, conn, r0, key)) == i+2 })
	}

	prev, prevRes := holder, r0
	for i := range n {
		before := wakeups.Load()
		if err := prevRes.Release(t.Context(), prev); err != nil {
			t.Fatalf("release before grant %d: %v", i, err)
		}
		select {
		case err := <-results[i]:
			if err != nil {
				t.Fatalf("waiter %d: %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter %d not granted after its predecessor's release", i)
		}
		if leases[i].Token <= prev.Token {
			t.Errorf("grant %d: token %d <= the previous holder's %d", i, leases[i].Token, prev.Token)
		}
		if got := wakeups.Load() - before; got != 1 {
			t.Errorf("release %d woke %d waiters; want 1", i, got)
		}
		for j := i + 1; j < n; j++ {
			select {
			case err := <-results[j]:
				t.Fatalf("waiter %d returned out of order (%v) after release %d", j, err, i)
			default:
			}
		}
		prev, prevRes = leases[i], res[i]
	}
	if err := prevRes.Release(t.Context(), prev); err != nil {
		t.Fatal(err)
	}
	// Alone again: the token comes from the listing, and still rises.
	alone := lease(key, ttl)
	if err := r0.Acquire(t.Context(), alone, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if alone.Token <= prev.Token {
		t.Errorf("token alone %d <= the last queued holder's %d", alone.Token, prev.Token)
	}
	if err := r0.Release(t.Context(), alone); err != nil {
		t.Fatal(err)
	}
}

func testTTLDeletesNode(t *testing.T, addrs []string) {
	r1, conn := newResource(t, addrs)
	r2, _ := newResource(t, addrs)
	key := uniqueKey(t)

	l := lease(key, 200*time.Millisecond)
	if err := r1.Acquire(t.Context(), l, time.Time{}); err != nil {
		t.Fatal(err)
	}
	// A waiter gets the lock when the TTL runs out.
	next := lease(key, ttl)
	if err := r2.Acquire(t.Context(), next, time.Now().Add(5*time.Second)); err != nil {
		t.Fatalf("Acquire after the holder's TTL: %v", err)
	}
	if !l.Lost().Closed() {
		t.Error("Lost still open after the TTL deleted the znode")
	}
	if ok, _, err := conn.Exists(pathOf(l)); ok || err != nil {
		t.Errorf("expired znode exists = %v, %v; want deleted", ok, err)
	}
	if err := r1.Release(t.Context(), l); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release after the TTL = %v; want ErrNotHeld", err)
	}
	if err := r1.Refresh(t.Context(), l); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Refresh after the TTL = %v; want ErrNotHeld", err)
	}
	if err := r2.Release(t.Context(), next); err != nil {
		t.Fatal(err)
	}
}

func testRefreshPushesTTLBack(t *testing.T, addrs []string) {
	r, conn := newResource(t, addrs)
	key := uniqueKey(t)
	// A refresh writes the TTL into the znode (a write, synced to disk by
	// the server): it must land within the TTL, here 3/4 of it, on a
	// loaded machine.
	const short = time.Second

	l := lease(key, short)
	if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(3 * short)
	for time.Now().Before(end) {
		if err := r.Refresh(t.Context(), l); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		select {
		case <-l.Lost().Done():
			t.Fatal("lock lost while refreshed")
		case <-time.After(short / 4):
		}
	}
	if ok, _, err := conn.Exists(pathOf(l)); !ok || err != nil {
		t.Fatalf("refreshed znode exists = %v, %v; want it there", ok, err)
	}
	// Without refreshes the TTL runs out.
	select {
	case <-l.Lost().Done():
	case <-time.After(5 * short):
		t.Fatal("Lost not closed after the TTL ran out")
	}
	waitFor(t, 2*time.Second, "the expired znode to go", func() bool { return len(mustChildren(t, conn, r, key)) == 0 })

	// Refresh finds a znode deleted behind its back.
	l2 := lease(key, ttl)
	if err := r.Acquire(t.Context(), l2, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := conn.Delete(pathOf(l2), -1); err != nil {
		t.Fatal(err)
	}
	if err := r.Refresh(t.Context(), l2); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Refresh of a deleted znode = %v; want ErrNotHeld", err)
	}
	if !l2.Lost().Closed() {
		t.Error("Lost open after Refresh found the znode gone")
	}
}

func testCloseDeletesHeld(t *testing.T, addrs []string) {
	conn := connect(t, addrs)
	r := mustNew(t, conn)
	key := uniqueKey(t)
	l := lease(key, ttl)
	if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !l.Lost().Closed() {
		t.Error("Lost open after Close")
	}
	if got := mustChildren(t, conn, r, key); len(got) != 0 {
		t.Errorf("children after Close = %v; want none", got)
	}
	if err := r.Acquire(t.Context(), lease(key, ttl), time.Time{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Acquire after Close = %v; want ErrClosed", err)
	}
	if conn.State() != zk.StateHasSession {
		t.Errorf("connection state after Close = %v; want it left open", conn.State())
	}
}

func TestBadInputNoIO(t *testing.T) {
	ctx := t.Context()
	conn := &zk.Conn{} // never connected: a call that did I/O would panic
	for _, tt := range []struct {
		name string
		conn *zk.Conn
		opts []Option
	}{
		{"nil conn", nil, nil},
		{"relative root", conn, []Option{WithRoot("locks")}},
		{"root /", conn, []Option{WithRoot("/")}},
		{"reserved root", conn, []Option{WithRoot("/zookeeper/x")}},
		{"root with ..", conn, []Option{WithRoot("/a/../b")}},
		{"empty ACL", conn, []Option{WithACL()}},
		{"negative session timeout", conn, []Option{WithSessionTimeout(-1)}},
		{"nil option", conn, []Option{nil}},
	} {
		r, err := New(tt.conn, tt.opts...)
		if r != nil || !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("%s: New = %v, %v; want nil, an ErrInvalid error", tt.name, r, err)
		}
	}
	long := strings.Repeat("k", MaxKeyLen+1)
	for _, tt := range []struct {
		name string
		r    *Resource
		key  string
	}{
		{"not made by New", &Resource{}, "k"},
		{"empty key", mustNew(t, conn), ""},
		{"long key", mustNew(t, conn), long},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.r.ValidateKey(tt.key); err == nil {
				t.Error("ValidateKey = nil; want an error")
			}
			if err := tt.r.Acquire(ctx, lease(tt.key, ttl), time.Time{}); err == nil {
				t.Error("Acquire = nil; want an error")
			}
		})
	}
	r := mustNew(t, &zk.Conn{})
	if err := r.ValidateKey(strings.Repeat("k", MaxKeyLen)); err != nil {
		t.Errorf("ValidateKey of %d bytes = %v; want nil", MaxKeyLen, err)
	}
	other := mustNew(t, &zk.Conn{})
	for _, h := range []any{nil, 42, "/elsewhere/x", DefaultRoot + "/k/_c_x", (*held)(nil),
		&held{key: "k"}, &held{r: other, key: "k"}, &held{r: r, key: "other"},
		&held{r: r, key: "k", kind: backend.KindSemaphore, limit: 1}, &held{r: r, key: "k", kind: backend.KindRead}} {
		l := lease("k", ttl)
		l.Handle = h
		if err := r.Release(ctx, l); err == nil || errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Release with handle %v = %v; want a bad-input error", h, err)
		}
		if err := r.Refresh(ctx, l); err == nil || errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Refresh with handle %v = %v; want a bad-input error", h, err)
		}
	}
}

func testRootOption(t *testing.T, addrs []string) {
	root := "/distlock-test/" + strings.ReplaceAll(uniqueKey(t), "/", "-") + "/locks"
	r, conn := newResource(t, addrs, WithRoot(root))
	l := lease("k", ttl)
	if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if p := pathOf(l); !strings.HasPrefix(p, root+"/k/") {
		t.Errorf("znode %s not under %s/k", p, root)
	}
	_, stat, err := conn.Exists(root)
	if err != nil {
		t.Fatal(err)
	}
	if stat.EphemeralOwner != 0 {
		t.Errorf("root is ephemeral (owner %x)", stat.EphemeralOwner)
	}
	if err := r.Release(t.Context(), l); err != nil {
		t.Fatal(err)
	}
}

// testFreshConnection locks at once on a connection that has no session
// yet, as a user does who calls zk.Connect and then TryLock: go-zookeeper
// queues the requests until the session is established, and the lock
// must be granted, on the resource and through the facade.
func testFreshConnection(t *testing.T, addrs []string) {
	// The dial waits a little, so that the session is surely not there
	// yet when Acquire starts: the fault is the slow network.
	slow := func(network, addr string, timeout time.Duration) (net.Conn, error) {
		time.Sleep(50 * time.Millisecond)
		return net.DialTimeout(network, addr, timeout)
	}
	fresh := func(t *testing.T) *zk.Conn {
		conn, _, err := zk.Connect(addrs, sessionTimeout, zk.WithLogger(silentLogger{}), zk.WithDialer(slow))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.Close)
		if conn.SessionID() != 0 {
			t.Fatal("the session is there already: the test proves nothing")
		}
		return conn
	}
	for i := range 5 {
		conn := fresh(t)
		r := mustNew(t, conn)
		l := lease(uniqueKey(t), ttl)
		if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
			t.Fatalf("try %d: Acquire on a fresh connection: %v", i, err)
		}
		_, stat, err := conn.Exists(pathOf(l))
		if err != nil || stat.EphemeralOwner != conn.SessionID() {
			t.Errorf("try %d: znode owner %x, %v; want our session %x", i, stat.EphemeralOwner, err, conn.SessionID())
		}
		if err := r.Release(t.Context(), l); err != nil {
			t.Errorf("try %d: Release: %v", i, err)
		}
		_ = r.Close()
	}

	r := mustNew(t, fresh(t))
	t.Cleanup(func() { _ = r.Close() })
	d, err := distlock.New(r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	lk, err := d.TryLock(t.Context(), uniqueKey(t), 0)
	if err != nil {
		t.Fatalf("TryLock on a fresh connection: %v", err)
	}
	if err := lk.Unlock(t.Context()); err != nil {
		t.Errorf("Unlock: %v", err)
	}
}

// testTimedOutWaitsLeaveOneWatch makes many waits on a held lock give up
// at their deadline, each after setting its watch on the holder's znode.
// ZooKeeper's protocol as go-zookeeper speaks it cannot remove a watch,
// so a watch stays armed until the holder's znode changes; it must be one
// watch, shared by the waits, not one per wait: a process polling a
// long-held lock must not grow. The next waiter on the same predecessor
// uses it, and is woken by the release.
func testTimedOutWaitsLeaveOneWatch(t *testing.T, addrs []string) {
	r1, _ := newResource(t, addrs)
	r2, conn := newResource(t, addrs)
	key := uniqueKey(t)
	holder := lease(key, ttl)
	if err := r1.Acquire(t.Context(), holder, time.Time{}); err != nil {
		t.Fatal(err)
	}
	const waits = 100
	for i := range waits {
		err := r2.Acquire(t.Context(), lease(key, ttl), time.Now().Add(30*time.Millisecond))
		if !errors.Is(err, backend.ErrNotAcquired) {
			t.Fatalf("wait %d = %v; want ErrNotAcquired", i, err)
		}
	}
	if n := clientWatchers(t, conn); n > 1 {
		t.Errorf("%d watches left in the client after %d timed-out waits on one holder; want at most 1", n, waits)
	}
	if got := mustChildren(t, conn, r1, key); len(got) != 1 {
		t.Errorf("children = %v; want only the holder's", got)
	}

	// The next waiter watches the same predecessor, and is granted the
	// lock on its release.
	next := lease(key, ttl)
	done := acquireAsync(t.Context(), r2, next, time.Now().Add(time.Minute))
	waitFor(t, 5*time.Second, "the waiter to queue", func() bool { return len(mustChildren(t, conn, r1, key)) == 2 })
	if err := r1.Release(t.Context(), holder); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("waiter after the release: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not granted after the release")
	}
	if n := clientWatchers(t, conn); n != 0 {
		t.Errorf("%d watches left in the client once the predecessor went; want 0", n)
	}
	if err := r2.Release(t.Context(), next); err != nil {
		t.Fatal(err)
	}
}
