package zookeeper

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
)

// TestKinds runs the tests of semaphores, read/write locks, inspection and
// locks kept alive by the session against one standalone server.
func TestKinds(t *testing.T) {
	zs := testserver.ZooKeeper(t)
	run(t, []string{zs.Addr}, []namedTest{
		{"SemaphoreFirstWaiterAnyRelease", testSemaphoreFirstWaiterAnyRelease},
		{"SemaphoreGrantMark", testSemaphoreGrantMark},
		{"SemaphoreMismatchLeavesNothing", testSemaphoreMismatchLeavesNothing},
		{"InspectBesideFailingPermit", testInspectBesideFailingPermit},
		{"ReadersQueueBehindWriter", testReadersQueueBehindWriter},
		{"KeptAlive", testKeptAlive},
		{"KeptAliveNoRequestPerLock", testKeptAliveNoRequestPerLock},
		{"InspectTimeLeft", testInspectTimeLeft},
	})
}

func kindLease(key string, kind backend.Kind, limit int) *backend.Lease {
	l := lease(key, ttl)
	l.Kind, l.Limit = kind, int32(limit)
	return l
}

func mustAcquire(t *testing.T, r *Resource, l *backend.Lease) {
	t.Helper()
	if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
		t.Fatalf("Acquire %v of %q: %v", l.Kind, l.Key, err)
	}
}

func mustRelease(t *testing.T, r *Resource, l *backend.Lease) {
	t.Helper()
	if err := r.Release(context.Background(), l); err != nil {
		t.Fatalf("Release %v of %q: %v", l.Kind, l.Key, err)
	}
}

// granted waits for the result of an acquire that must succeed.
func granted(t *testing.T, what string, ch <-chan error) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not granted within 10s", what)
	}
}

// notYet checks that an acquire is still waiting, a little while after
// the change that must not grant it.
func notYet(t *testing.T, what string, ch <-chan error) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s returned (%v); want it still waiting", what, err)
	case <-time.After(200 * time.Millisecond): // a check of a wait, not synchronisation
	}
}

// queued waits until the queue of key's lock of kind has n children.
func queued(t *testing.T, conn *zk.Conn, r *Resource, key string, kind backend.Kind, n int) {
	t.Helper()
	waitFor(t, 5*time.Second, "the queue to grow", func() bool {
		cs, _, err := conn.Children(r.kindParent(key, kind))
		return err == nil && len(cs) == n
	})
}

// testSemaphoreFirstWaiterAnyRelease: the first waiter of a semaphore gets
// in when any holder lets go, not only the one limit places before it:
// with limit 3, releasing the middle holder grants it.
func testSemaphoreFirstWaiterAnyRelease(t *testing.T, addrs []string) {
	r, conn := newResource(t, addrs)
	key := uniqueKey(t)
	var hs []*backend.Lease
	for range 3 {
		l := kindLease(key, backend.KindSemaphore, 3)
		mustAcquire(t, r, l)
		hs = append(hs, l)
	}
	w := kindLease(key, backend.KindSemaphore, 3)
	done := acquireAsync(t.Context(), r, w, time.Now().Add(time.Minute))
	queued(t, conn, r, key, backend.KindSemaphore, 4)
	notYet(t, "the fourth permit of three", done)
	mustRelease(t, r, hs[1])
	granted(t, "the waiter after the middle holder's release", done)
	for _, l := range []*backend.Lease{hs[0], hs[2]} {
		if w.Token <= l.Token {
			t.Errorf("the waiter's token %d <= a holder's %d", w.Token, l.Token)
		}
		mustRelease(t, r, l)
	}
	mustRelease(t, r, w)
}

// testSemaphoreGrantMark: a waiter behind the first one waits for its
// predecessor's grant, which the predecessor marks: once the first
// waiter holds, the second becomes the first and gets in at the next
// release, while the one before it still holds.
func testSemaphoreGrantMark(t *testing.T, addrs []string) {
	r, conn := newResource(t, addrs)
	r2, _ := newResource(t, addrs)
	key := uniqueKey(t)
	h1, h2 := kindLease(key, backend.KindSemaphore, 2), kindLease(key, backend.KindSemaphore, 2)
	mustAcquire(t, r, h1)
	mustAcquire(t, r, h2)
	w1, w2 := kindLease(key, backend.KindSemaphore, 2), kindLease(key, backend.KindSemaphore, 2)
	d1 := acquireAsync(t.Context(), r2, w1, time.Now().Add(time.Minute))
	queued(t, conn, r, key, backend.KindSemaphore, 3)
	d2 := acquireAsync(t.Context(), r2, w2, time.Now().Add(time.Minute))
	queued(t, conn, r, key, backend.KindSemaphore, 4)
	mustRelease(t, r, h1)
	granted(t, "the first waiter", d1)
	notYet(t, "the second waiter, with two holders", d2)
	mustRelease(t, r, h2)
	granted(t, "the second waiter, while the first still holds", d2)
	mustRelease(t, r2, w1)
	mustRelease(t, r2, w2)
}

// testSemaphoreMismatchLeavesNothing: an acquire with another limit than
// the holders' fails with ErrLimitMismatch, waiting or not, and leaves
// its child behind neither.
func testSemaphoreMismatchLeavesNothing(t *testing.T, addrs []string) {
	r, conn := newResource(t, addrs)
	key := uniqueKey(t)
	h := kindLease(key, backend.KindSemaphore, 2)
	mustAcquire(t, r, h)
	for _, deadline := range []time.Time{{}, time.Now().Add(time.Minute)} {
		l := kindLease(key, backend.KindSemaphore, 3)
		if err := r.Acquire(t.Context(), l, deadline); !errors.Is(err, backend.ErrLimitMismatch) {
			t.Errorf("Acquire with limit 3 while held with 2 = %v; want ErrLimitMismatch", err)
		}
	}
	if cs := mustChildren(t, conn, r, key); len(cs) != 0 {
		t.Errorf("the mutex queue of the key = %v; want it empty (kinds apart)", cs)
	}
	cs, _, err := conn.Children(r.kindParent(key, backend.KindSemaphore))
	if err != nil || len(cs) != 1 || r.kindParent(key, backend.KindSemaphore)+"/"+cs[0] != pathOf(h) {
		t.Errorf("the semaphore's children = %v, %v; want only the holder's", cs, err)
	}
	mustRelease(t, r, h)
}

// testInspectBesideFailingPermit: a permit of another limit
// queued behind the holders, as a failing acquire's znode is until its
// deletion lands, gives Inspect neither the limit nor a holder; an
// acquire of the holders' limit queued behind it fails (the package
// doc's rule: a child of another limit before it), and leaves nothing.
func testInspectBesideFailingPermit(t *testing.T, addrs []string) {
	r, conn := newResource(t, addrs)
	key := uniqueKey(t)
	h := kindLease(key, backend.KindSemaphore, 2)
	mustAcquire(t, r, h)
	parent := r.kindParent(key, backend.KindSemaphore)
	failing, err := conn.Create(parent+"/"+guidPrefix+"ffffffffffffffffffffffffffffffff"+"-"+semTag+"5-", nil, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	in, err := r.Inspect(t.Context(), key, backend.KindSemaphore)
	if err != nil || in.Limit != 2 || len(in.Holders) != 1 || in.Holders[0].Token != h.Token {
		t.Errorf("Inspect = %+v, %v; want the holder (token %d) alone, with limit 2", in, err, h.Token)
	}
	if err := r.Acquire(t.Context(), kindLease(key, backend.KindSemaphore, 2), time.Time{}); !errors.Is(err, backend.ErrLimitMismatch) {
		t.Errorf("Acquire of limit 2 behind a child of limit 5 = %v; want ErrLimitMismatch", err)
	}
	if err := conn.Delete(failing, -1); err != nil {
		t.Fatal(err)
	}
	cs, _, err := conn.Children(parent)
	if err != nil || len(cs) != 1 || parent+"/"+cs[0] != pathOf(h) {
		t.Errorf("the semaphore's children = %v, %v; want only the holder's", cs, err)
	}
	mustRelease(t, r, h)
}

// testReadersQueueBehindWriter: a reader arriving after a waiting writer
// waits for it; the writer gets in when the readers before it are gone,
// the reader when the writer is.
func testReadersQueueBehindWriter(t *testing.T, addrs []string) {
	r, conn := newResource(t, addrs)
	key := uniqueKey(t)
	r1 := kindLease(key, backend.KindRead, 0)
	mustAcquire(t, r, r1)
	w := kindLease(key, backend.KindWrite, 0)
	dw := acquireAsync(t.Context(), r, w, time.Now().Add(time.Minute))
	queued(t, conn, r, key, backend.KindWrite, 2)
	if err := r.Acquire(t.Context(), kindLease(key, backend.KindRead, 0), time.Time{}); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("a reader behind a waiting writer = %v; want ErrNotAcquired", err)
	}
	r2 := kindLease(key, backend.KindRead, 0)
	dr := acquireAsync(t.Context(), r, r2, time.Now().Add(time.Minute))
	queued(t, conn, r, key, backend.KindWrite, 3)
	mustRelease(t, r, r1)
	granted(t, "the writer", dw)
	notYet(t, "the reader behind the writer", dr)
	mustRelease(t, r, w)
	granted(t, "the reader", dr)
	if r2.Token <= w.Token || w.Token <= r1.Token {
		t.Errorf("tokens read %d, write %d, read %d; want them rising", r1.Token, w.Token, r2.Token)
	}
	mustRelease(t, r, r2)
}

// testKeptAlive: a lock taken with AutoRenew is kept by the session: no
// TTL runs (it outlives its TTL), the queue changing leaves it held, no
// watch is set until something waits for its loss, and then its znode
// deleted by another client closes Lost; a deletion from before the
// first Done closes it too (DeletedBeforeDone).
func testKeptAlive(t *testing.T, addrs []string) {
	r, conn := newResource(t, addrs, WithSessionTimeout(sessionTimeout))
	admin := connect(t, addrs)
	for _, kind := range []backend.Kind{backend.KindMutex, backend.KindSemaphore, backend.KindRead} {
		t.Run(kind.String(), func(t *testing.T) {
			key := uniqueKey(t)
			l := kindLease(key, kind, 2)
			l.TTL, l.AutoRenew = 100*time.Millisecond, true
			mustAcquire(t, r, l)
			if !l.KeptAlive {
				t.Fatal("KeptAlive not set for a lock taken with AutoRenew")
			}
			// The queue changes: another contender comes and goes.
			other := kindLease(key, kind, 2)
			if kind == backend.KindRead {
				other.Kind = backend.KindWrite
			}
			if err := r.Acquire(t.Context(), other, time.Time{}); err == nil {
				mustRelease(t, r, other)
			}
			path := pathOf(l)
			if n := pathWatchers(t, conn, path); n != 0 {
				t.Fatalf("%d watches on the znode before anything waited for a loss; want 0", n)
			}
			time.Sleep(5 * l.TTL) // past the TTL: a check of the TTL, not synchronisation
			if l.Lost().Closed() {
				t.Fatal("Lost closed: the TTL ran for a lock the session keeps")
			}
			if err := r.Refresh(t.Context(), l); err != nil {
				t.Fatalf("Refresh (Extend) of a kept lock: %v", err)
			}
			if _, st, err := conn.Exists(path); err != nil || st.Version != 0 {
				t.Errorf("znode after the Refresh of a kept lock: version %v, %v; want 0 (no write)", st, err)
			}
			// Nobody waited on Lost: no channel was made (a held lock
			// costs none); Done makes it now, closed with the loss.
			lostMu.Lock()
			made := l.Handle.(*held).lost != nil
			lostMu.Unlock()
			if made {
				t.Error("a Lost channel was made before anybody asked for it")
			}
			lost := l.Lost().Done()
			waitFor(t, 5*time.Second, "a watch on the znode once Done was asked", func() bool { return pathWatchers(t, conn, path) == 1 })
			if err := admin.Delete(path, -1); err != nil {
				t.Fatal(err)
			}
			select {
			case <-lost:
			case <-time.After(5 * time.Second):
				t.Fatal("Lost still open 5s after the znode was deleted")
			}
			if !l.Lost().Closed() {
				t.Error("Lost's channel closed but Closed reports false")
			}
			if err := r.Release(t.Context(), l); !errors.Is(err, backend.ErrNotHeld) {
				t.Errorf("Release of the deleted lock = %v; want ErrNotHeld", err)
			}
		})
	}
	t.Run("DeletedBeforeDone", func(t *testing.T) {
		l := kindLease(uniqueKey(t), backend.KindMutex, 0)
		l.TTL, l.AutoRenew = 100*time.Millisecond, true
		mustAcquire(t, r, l)
		if err := admin.Delete(pathOf(l), -1); err != nil {
			t.Fatal(err)
		}
		select {
		case <-l.Lost().Done():
		case <-time.After(5 * time.Second):
			t.Fatal("Lost still open 5s after Done was asked of a lock whose znode was deleted before")
		}
		if err := r.Release(t.Context(), l); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Release of the deleted lock = %v; want ErrNotHeld", err)
		}
	})
}

// testKeptAliveNoRequestPerLock: the locks the session keeps cost no
// request while held: over a window, the server hears the session's pings
// and the resource's probes, not a request per lock.
func testKeptAliveNoRequestPerLock(t *testing.T, addrs []string) {
	r, _ := newResource(t, addrs, WithSessionTimeout(sessionTimeout))
	const n = 50
	var ls []*backend.Lease
	for range n {
		l := lease(uniqueKey(t), 200*time.Millisecond)
		l.AutoRenew = true
		mustAcquire(t, r, l)
		ls = append(ls, l)
	}
	window := 2 * time.Second // 10 TTLs: a refresh per lock would be 50 x 30 requests
	before := packets(t, addrs[0])
	time.Sleep(window) // the window counted: not synchronisation
	got := packets(t, addrs[0]) - before
	// go-zookeeper pings every third of the session timeout; the resource
	// probes as often; the test's own mntr connections count too.
	if limit := int64(4 * window / (sessionTimeout / 3)); got > limit {
		t.Errorf("%d requests in %v while holding %d kept locks; want at most %d (pings and probes)", got, window, n, limit)
	}
	t.Logf("%d requests in %v while holding %d kept locks", got, window, n)
	for _, l := range ls {
		if l.Lost().Closed() {
			t.Fatalf("a kept lock lost within %v", window)
		}
		mustRelease(t, r, l)
	}
}

// testInspectTimeLeft: inspection shows a TTL lock's time left from its
// data (its TTL from the znode's mtime), moved by a Refresh to another
// TTL, and no time for a lock the session keeps; tokens and labels are
// the holder's.
func testInspectTimeLeft(t *testing.T, addrs []string) {
	r, _ := newResource(t, addrs)
	key := uniqueKey(t)
	l := lease(key, 30*time.Second)
	l.Label = "host-a:123"
	mustAcquire(t, r, l)
	in, err := r.Inspect(t.Context(), key, backend.KindMutex)
	if err != nil || len(in.Holders) != 1 {
		t.Fatalf("Inspect = %+v, %v; want one holder", in, err)
	}
	hd := in.Holders[0]
	// The server's and this process's clocks are one clock here.
	if hd.TTL > l.TTL || hd.TTL < l.TTL-5*time.Second || hd.Token != l.Token || hd.Label != l.Label || hd.Kind != backend.KindMutex {
		t.Errorf("holder = %+v; want token %d, label %q, TTL about %v", hd, l.Token, l.Label, l.TTL)
	}
	l.TTL = time.Hour
	if err := r.Refresh(t.Context(), l); err != nil {
		t.Fatal(err)
	}
	in, err = r.Inspect(t.Context(), key, backend.KindMutex)
	if err != nil || len(in.Holders) != 1 || in.Holders[0].TTL < 59*time.Minute {
		t.Errorf("Inspect after a Refresh to 1h = %+v, %v; want about 1h left", in, err)
	}
	mustRelease(t, r, l)

	k := lease(key, 30*time.Second)
	k.AutoRenew = true
	mustAcquire(t, r, k)
	in, err = r.Inspect(t.Context(), key, backend.KindMutex)
	if err != nil || len(in.Holders) != 1 || in.Holders[0].TTL != 0 || in.Holders[0].Token != k.Token {
		t.Errorf("Inspect of a kept lock = %+v, %v; want its token and no time left (the session keeps it)", in, err)
	}
	mustRelease(t, r, k)

	// A semaphore: its holders, not its waiter; the limit.
	var ls []*backend.Lease
	for range 2 {
		s := kindLease(key, backend.KindSemaphore, 2)
		mustAcquire(t, r, s)
		ls = append(ls, s)
	}
	w := kindLease(key, backend.KindSemaphore, 2)
	done := acquireAsync(t.Context(), r, w, time.Now().Add(time.Minute))
	in, err = r.Inspect(t.Context(), key, backend.KindSemaphore)
	if err != nil || len(in.Holders) != 2 || in.Limit != 2 || in.Holders[0].Token != ls[0].Token || in.Holders[1].Token != ls[1].Token {
		t.Errorf("Inspect of a semaphore of 2 with a waiter = %+v, %v; want its two holders", in, err)
	}
	mustRelease(t, r, ls[0])
	granted(t, "the waiter", done)
	mustRelease(t, r, ls[1])
	mustRelease(t, r, w)
	if in, err := r.Inspect(t.Context(), key, backend.KindSemaphore); err != nil || len(in.Holders) != 0 {
		t.Errorf("Inspect of a free semaphore = %+v, %v", in, err)
	}
}
