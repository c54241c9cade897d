package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
)

// TestFaults injects the faults of the network between a client and one
// standalone server.
func TestFaults(t *testing.T) {
	zs := testserver.ZooKeeper(t)
	run(t, []string{zs.Addr}, []namedTest{
		{"CreateReplyLost", testCreateReplyLost},
		{"CreateRequestLandsLate", testCreateRequestLandsLate},
		{"SessionExpiry", testSessionExpiry},
		{"SessionChangeIsLoss", testSessionChangeIsLoss},
		{"DisconnectionIsLossByDefault", testDisconnectionIsLossByDefault},
		{"ShortDisconnectionRidden", testShortDisconnectionRidden},
		{"ReleaseDuringReconnection", testReleaseDuringReconnection},
		{"SilentPartition", testSilentPartition},
	})
}

// negotiated returns the session timeout the server granted conn, which
// go-zookeeper keeps to itself (the server clamps the request to its
// tickTime bounds).
func negotiated(t testing.TB, conn *zk.Conn) time.Duration {
	t.Helper()
	f := reflect.ValueOf(conn).Elem().FieldByName("sessionTimeoutMs")
	if !f.IsValid() {
		t.Fatal("go-zookeeper changed: no Conn.sessionTimeoutMs")
	}
	return time.Duration(f.Int()) * time.Millisecond
}

// faultyResource returns a resource over a connection whose network the
// test controls.
func faultyResource(t testing.TB, addrs []string, opts ...Option) (*Resource, *zk.Conn, *faultDialer) {
	t.Helper()
	fd := &faultDialer{}
	conn := connectWith(t, addrs, connOpts{dialer: fd.dial})
	r := mustNew(t, conn, opts...)
	t.Cleanup(func() { _ = r.Close() })
	t.Cleanup(fd.closeDetached)
	return r, conn, fd
}

// TestCreateReplyLost drops the connection after the server applied our
// create but before its reply arrived: the resource must find its znode by
// the guid in its name, and use it or delete it, never orphan it.
func testCreateReplyLost(t *testing.T, addrs []string) {
	r, _, fd := faultyResource(t, addrs)
	other, admin := newResource(t, addrs)

	t.Run("Free", func(t *testing.T) {
		key := uniqueKey(t)
		l := lease(key, ttl)
		fd.dropCreateReply.Store(true)
		before := fd.dropped.Load()
		if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
			t.Fatalf("Acquire with the create reply lost: %v", err)
		}
		if fd.dropped.Load() != before+1 {
			t.Fatal("the create reply was not dropped: the test proves nothing")
		}
		got := mustChildren(t, admin, r, key)
		if len(got) != 1 || r.parentPath(key)+"/"+got[0] != pathOf(l) {
			t.Fatalf("children = %v; want exactly our %v", got, pathOf(l))
		}
		if err := r.Release(t.Context(), l); err != nil {
			t.Fatal(err)
		}
		if got := mustChildren(t, admin, r, key); len(got) != 0 {
			t.Errorf("children after release = %v; want none", got)
		}
	})

	t.Run("Held", func(t *testing.T) {
		key := uniqueKey(t)
		holder := lease(key, ttl)
		if err := other.Acquire(t.Context(), holder, time.Time{}); err != nil {
			t.Fatal(err)
		}
		fd.dropCreateReply.Store(true)
		before := fd.dropped.Load()
		if err := r.Acquire(t.Context(), lease(key, ttl), time.Time{}); !errors.Is(err, backend.ErrNotAcquired) {
			t.Fatalf("Acquire of a held key with the create reply lost = %v; want ErrNotAcquired", err)
		}
		if fd.dropped.Load() != before+1 {
			t.Fatal("the create reply was not dropped: the test proves nothing")
		}
		if got := mustChildren(t, admin, r, key); len(got) != 1 || r.parentPath(key)+"/"+got[0] != pathOf(holder) {
			t.Errorf("children = %v; want only the holder's %v", got, pathOf(holder))
		}
		if err := other.Release(t.Context(), holder); err != nil {
			t.Fatal(err)
		}
	})
}

// TestSessionExpiry cuts a holder off the network until the server expires
// its session: Done (Lease.Lost()) of every lock of the session closes
// within the session timeout plus a margin, and another client gets the
// lock.
func testSessionExpiry(t *testing.T, addrs []string) {
	probe := connect(t, addrs)
	timeout := negotiated(t, probe)
	const margin = 2 * time.Second
	r, conn, fd := faultyResource(t, addrs, WithSessionTimeout(timeout))
	other, _ := newResource(t, addrs)

	k1, k2 := uniqueKey(t), uniqueKey(t)
	l1, l2 := lease(k1, time.Hour), lease(k2, time.Hour)
	for _, l := range []*backend.Lease{l1, l2} {
		if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	// And one through the facade, whose Done follows Lost.
	d, err := distlock.New(r, distlock.WithDefaultTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	lk, err := d.TryLock(t.Context(), uniqueKey(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	sid := conn.SessionID()
	start := time.Now()
	fd.block()
	for _, ch := range []<-chan struct{}{l1.Lost().Done(), l2.Lost().Done(), lk.Done()} {
		select {
		case <-ch:
		case <-time.After(time.Until(start.Add(timeout + margin))):
			t.Fatalf("a lock still held %v after the disconnection (session timeout %v)", time.Since(start), timeout)
		}
	}
	next := lease(k1, ttl)
	if err := other.Acquire(t.Context(), next, start.Add(timeout+margin+2*time.Second)); err != nil {
		t.Fatalf("another client's Acquire after the session expired: %v", err)
	}
	if err := other.Release(t.Context(), next); err != nil {
		t.Fatal(err)
	}

	fd.unblock()
	waitFor(t, 10*time.Second, "a new session", func() bool {
		return conn.State() == zk.StateHasSession && conn.SessionID() != sid
	})
	for _, l := range []*backend.Lease{l1, l2} {
		if err := r.Release(t.Context(), l); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Release of %q after the session expired = %v; want ErrNotHeld", l.Key, err)
		}
	}
	if err := lk.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("Unlock after the session expired = %v; want ErrNotHeld", err)
	}
	// The new session works.
	l3 := lease(k2, ttl)
	if err := r.Acquire(t.Context(), l3, time.Now().Add(5*time.Second)); err != nil {
		t.Fatalf("Acquire on the new session: %v", err)
	}
	if err := r.Release(t.Context(), l3); err != nil {
		t.Fatal(err)
	}
}

// TestSessionChangeIsLoss trusts the connection through any disconnection
// (a huge WithSessionTimeout) so that only the changed session id after
// the reconnection can tell the loss.
func testSessionChangeIsLoss(t *testing.T, addrs []string) {
	r, conn, fd := faultyResource(t, addrs, WithSessionTimeout(time.Hour))
	other, _ := newResource(t, addrs)
	timeout := negotiated(t, conn)
	key := uniqueKey(t)
	l := lease(key, time.Hour)
	if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	fd.block()
	next := lease(key, ttl)
	if err := other.Acquire(t.Context(), next, start.Add(timeout+5*time.Second)); err != nil {
		t.Fatalf("Acquire after the holder's session expired: %v", err)
	}
	fd.unblock()
	select {
	case <-l.Lost().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Lost open after the client came back to an expired session")
	}
	if err := other.Release(t.Context(), next); err != nil {
		t.Fatal(err)
	}
}

// TestDisconnectionIsLossByDefault: without WithSessionTimeout the
// resource cannot know how long the session outlives a disconnection, so
// it reports the loss at once, and deletes the znode when the connection
// comes back within the session, so the lock is not held by nobody.
func testDisconnectionIsLossByDefault(t *testing.T, addrs []string) {
	r, conn, fd := faultyResource(t, addrs)
	key := uniqueKey(t)
	l := lease(key, time.Hour)
	if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
		t.Fatal(err)
	}
	sid := conn.SessionID()
	fd.block()
	select {
	case <-l.Lost().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost open after the connection dropped")
	}
	fd.unblock()
	waitFor(t, 10*time.Second, "the reconnection", func() bool { return conn.State() == zk.StateHasSession })
	if conn.SessionID() != sid {
		t.Log("the session expired meanwhile: the znode went with it")
	}
	waitFor(t, 10*time.Second, "the lost lock's znode to go", func() bool { return len(mustChildren(t, conn, r, key)) == 0 })
	if err := r.Release(t.Context(), l); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release after the loss = %v; want ErrNotHeld", err)
	}
}

// TestShortDisconnectionRidden: with WithSessionTimeout, a disconnection
// after which the client is back in its session before the loss deadline
// (9/10 of the session timeout after the server last answered) keeps the
// lock. go-zookeeper waits a second before it dials again.
func testShortDisconnectionRidden(t *testing.T, addrs []string) {
	probe := connect(t, addrs)
	timeout := negotiated(t, probe)
	r, conn, fd := faultyResource(t, addrs, WithSessionTimeout(timeout))
	key := uniqueKey(t)
	l := lease(key, time.Hour)
	if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
		t.Fatal(err)
	}
	sid := conn.SessionID()
	fd.block()
	waitFor(t, 5*time.Second, "the disconnection", func() bool { return conn.State() != zk.StateHasSession })
	time.Sleep(timeout / 4) // the fault lasts this long; not synchronisation
	fd.unblock()
	waitFor(t, 10*time.Second, "the reconnection", func() bool { return conn.State() == zk.StateHasSession })
	if conn.SessionID() != sid {
		t.Fatalf("session changed over a %v disconnection (timeout %v)", timeout/4, timeout)
	}
	if l.Lost().Closed() {
		t.Error("Lost closed by a disconnection shorter than the session timeout")
	}
	if err := r.Refresh(t.Context(), l); err != nil {
		t.Errorf("Refresh after the short disconnection: %v", err)
	}
	if err := r.Release(t.Context(), l); err != nil {
		t.Errorf("Release after the short disconnection: %v", err)
	}
}

// testCreateRequestLandsLate holds our create request in the network
// while the client gives its connection up (the reply is lost, as far as
// the client knows), reconnects with the same session, looks for the
// node, creates it again and gets the lock. Only then does the held
// request go on to the server over the old connection: it must not land,
// or it would leave a second node of ours behind the last listing, which
// nobody would delete until the session ends. It does not land because
// the server closed the old connection when the session moved to the new
// one (ZooKeeper's CLIENT_RECONNECT; in an ensemble, the leader refuses a
// moved session's requests from the old server).
func testCreateRequestLandsLate(t *testing.T, addrs []string) {
	r, _, fd := faultyResource(t, addrs)
	other, admin := newResource(t, addrs)

	for _, mode := range []string{"Free", "Held", "Cancelled"} {
		t.Run(mode, func(t *testing.T) {
			key := uniqueKey(t)
			var holder *backend.Lease
			if mode == "Held" {
				holder = lease(key, ttl)
				if err := other.Acquire(t.Context(), holder, time.Time{}); err != nil {
					t.Fatal(err)
				}
			}
			ctx := t.Context()
			if mode == "Cancelled" {
				// The context ends while the client reconnects: the create
				// gives up, and the clean-up by guid runs in the background.
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
			}
			fd.holdCreate.Store(true)
			l := lease(key, ttl)
			err := r.Acquire(ctx, l, time.Time{})
			switch {
			case mode == "Free" && err != nil:
				t.Fatalf("Acquire with its first create held: %v", err)
			case mode == "Held" && !errors.Is(err, backend.ErrNotAcquired):
				t.Fatalf("Acquire of a held key, its first create held = %v; want ErrNotAcquired", err)
			case mode == "Cancelled" && !errors.Is(err, context.DeadlineExceeded):
				t.Fatalf("Acquire whose context ended, its first create held = %v; want DeadlineExceeded", err)
			}
			gone := fd.takeDetached()
			if len(gone) != 1 {
				t.Fatalf("%d connections given up with a create held; want 1: the test proves nothing", len(gone))
			}
			c := gone[0]
			if !c.serverClosed(5 * time.Second) {
				t.Error("the server kept the old connection open after the session moved")
			}
			_ = c.release() // too late: the server closed that connection
			_ = c.Conn.Close()
			// A sync, then the listing: whatever the server applied is in it.
			if _, err := admin.Sync(r.parentPath(key)); err != nil && !errors.Is(err, zk.ErrNoNode) {
				t.Fatal(err)
			}
			got := mustChildren(t, admin, r, key)
			switch mode {
			case "Free":
				if len(got) != 1 || r.parentPath(key)+"/"+got[0] != pathOf(l) {
					t.Fatalf("children = %v; want only our %v", got, pathOf(l))
				}
				if err := r.Release(t.Context(), l); err != nil {
					t.Fatal(err)
				}
				if got := mustChildren(t, admin, r, key); len(got) != 0 {
					t.Errorf("children after release = %v; want none", got)
				}
			case "Held":
				if len(got) != 1 || r.parentPath(key)+"/"+got[0] != pathOf(holder) {
					t.Errorf("children = %v; want only the holder's %v", got, pathOf(holder))
				}
				if err := other.Release(t.Context(), holder); err != nil {
					t.Fatal(err)
				}
			case "Cancelled":
				if len(got) != 0 {
					t.Errorf("children = %v; want none", got)
				}
			}
		})
	}
}

// testSilentPartition drops every byte between a holder and the server
// while the connections stay open, as a partition does that sends no
// reset. The server expires the holder's session one session timeout
// after it last heard from it, and another client gets the lock: the
// holder's Lost must be closed by then. With WithSessionTimeout the loss
// deadline counts from the last request the server answered, not from
// the moment the client notices (its receive timeout, 2/3 of the session
// timeout, later); without it, that notice is the loss.
func testSilentPartition(t *testing.T, addrs []string) {
	probe := connect(t, addrs)
	timeout := negotiated(t, probe)
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"WithSessionTimeout", []Option{WithSessionTimeout(timeout)}},
		{"Default", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, conn, fd := faultyResource(t, addrs, tc.opts...)
			other, _ := newResource(t, addrs)
			key := uniqueKey(t)
			l := lease(key, time.Hour)
			if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
				t.Fatal(err)
			}
			sid := conn.SessionID()
			lostAt := make(chan time.Time, 1)
			go func() { <-l.Lost().Done(); lostAt <- time.Now() }()

			start := time.Now()
			fd.silence()
			next := lease(key, ttl)
			if err := other.Acquire(t.Context(), next, start.Add(timeout+10*time.Second)); err != nil {
				t.Fatalf("another client's Acquire after the holder went silent: %v", err)
			}
			granted := time.Now()
			select {
			case at := <-lostAt:
				t.Logf("Lost closed %v after the silence began, %v before the other client's grant (session timeout %v)",
					at.Sub(start).Round(time.Millisecond), granted.Sub(at).Round(time.Millisecond), timeout)
			default:
				t.Errorf("another client got the lock %v after the holder went silent, and the holder's Lost is still open (session timeout %v)",
					granted.Sub(start).Round(time.Millisecond), timeout)
			}
			fd.speak()
			waitFor(t, 20*time.Second, "a new session", func() bool {
				return conn.State() == zk.StateHasSession && conn.SessionID() != sid
			})
			select {
			case <-l.Lost().Done():
			case <-time.After(10 * time.Second):
				t.Fatal("Lost still open after the session expired")
			}
			if err := other.Release(t.Context(), next); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestHandoffAfterLongWait: a waiter granted the lock by its only
// predecessor's deletion after waiting longer than the session timeout
// holds it, with a resource that counts the loss deadline
// (WithSessionTimeout): Lost stays open for a session timeout after the
// grant, and the znode is there. With a deadline counted from the
// listing made before the wait (a session watcher probing only while
// locks are held), the first poll after the grant would find it passed,
// close Lost and delete the znode of a healthy session, 26ms after
// Acquire returned (leader election by waiting on a lock never held).
func TestHandoffAfterLongWait(t *testing.T) {
	addrs := []string{testserver.ZooKeeper(t).Addr}
	for _, kept := range []bool{true, false} {
		t.Run(fmt.Sprintf("AutoRenew=%v", kept), func(t *testing.T) {
			ctx := t.Context()
			a, _ := newResource(t, addrs, WithSessionTimeout(sessionTimeout))
			b, admin := newResource(t, addrs, WithSessionTimeout(sessionTimeout))
			key := uniqueKey(t)
			la, lb := lease(key, time.Minute), lease(key, time.Minute)
			la.AutoRenew, lb.AutoRenew = kept, kept
			if err := a.Acquire(ctx, la, time.Time{}); err != nil {
				t.Fatal(err)
			}
			errc := make(chan error, 1)
			go func() { errc <- b.Acquire(ctx, lb, time.Now().Add(time.Minute)) }()
			waitFor(t, 10*time.Second, "the waiter to queue", func() bool { return len(mustChildren(t, admin, a, key)) == 2 })
			time.Sleep(2 * sessionTimeout) // the fault: a wait longer than the session timeout
			if err := a.Release(ctx, la); err != nil {
				t.Fatal(err)
			}
			var err error
			select {
			case err = <-errc:
			case <-time.After(10 * time.Second):
				t.Fatal("the waiter was not granted the lock")
			}
			if err != nil {
				t.Fatalf("the waiter's Acquire = %v", err)
			}
			granted := time.Now()
			select {
			case <-lb.Lost().Done():
				t.Fatalf("Lost closed %v after the grant, the session alive", time.Since(granted))
			case <-time.After(sessionTimeout):
			}
			if got := mustChildren(t, admin, b, key); len(got) != 1 || b.parentPath(key)+"/"+got[0] != pathOf(lb) {
				t.Fatalf("children = %v; want the waiter's znode %s", got, pathOf(lb))
			}
			if err := b.Release(ctx, lb); err != nil {
				t.Errorf("Release = %v; want nil", err)
			}
		})
	}
}

// testReleaseDuringReconnection releases a lock while the client cannot
// reach the server but its session lives on: go-zookeeper fails the
// unsent delete with ErrNoServer after a round of refused dials, and
// Release must send it again once the client has its session back,
// within its context, instead of failing with the lock still held.
func testReleaseDuringReconnection(t *testing.T, addrs []string) {
	const timeout = 20 * time.Second // the session outlives the fault
	fd := &faultDialer{}
	conn := connectWith(t, addrs, connOpts{dialer: fd.dial, timeout: timeout})
	if got := negotiated(t, conn); got < timeout/2 {
		t.Fatalf("negotiated session timeout %v; the test needs about %v", got, timeout)
	}
	r := mustNew(t, conn, WithSessionTimeout(timeout))
	t.Cleanup(func() { _ = r.Close() })
	_, admin := newResource(t, addrs)
	key := uniqueKey(t)
	l := lease(key, time.Hour)
	if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
		t.Fatal(err)
	}
	sid := conn.SessionID()
	fd.block()
	waitFor(t, 5*time.Second, "a refused dial", func() bool { return fd.refused.Load() >= 1 })
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	released := make(chan error, 1)
	go func() { released <- r.Release(ctx, l) }()
	// Two more refused dials: go-zookeeper flushed its unsent requests,
	// the delete among them, with ErrNoServer in between.
	waitFor(t, 10*time.Second, "two more refused dials", func() bool { return fd.refused.Load() >= 3 })
	fd.unblock()
	select {
	case err := <-released:
		if err != nil {
			t.Fatalf("Release across a reconnection = %v; want nil", err)
		}
	case <-ctx.Done():
		t.Fatal("Release did not return within its context")
	}
	if conn.SessionID() != sid {
		t.Fatal("the session changed: the test proves nothing")
	}
	if got := mustChildren(t, admin, r, key); len(got) != 0 {
		t.Errorf("children after the release = %v; want none", got)
	}
}
