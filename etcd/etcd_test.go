package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/testsuite"
)

// modes are the two ways a Resource can hold leases; most tests run both.
var modes = []struct {
	name string
	opts []Option
	// refusedCause is what an attempt's error says when the server
	// refuses connections: a lease of its own is granted by the
	// attempt, which gets gRPC's error; the shared lease in the
	// background, which outlives the attempt.
	refusedCause string
}{
	{"LeasePerLock", nil, "connection refused"},
	{"SharedLease", []Option{WithSharedLease()}, "TRANSIENT_FAILURE"},
}

func newClient(t testing.TB, endpoints []string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("clientv3.New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// newResource returns a Resource over a client of its own, as another
// process would have it, closed at cleanup.
func newResource(t testing.TB, endpoints []string, opts ...Option) *Resource {
	t.Helper()
	return newResourceOn(t, newClient(t, endpoints), opts...)
}

// mustNew returns New(c, opts...), failing t on an error.
func mustNew(t testing.TB, c *clientv3.Client, opts ...Option) *Resource {
	t.Helper()
	r, err := New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// newResourceOn returns a Resource over c, closed at cleanup.
func newResourceOn(t testing.TB, c *clientv3.Client, opts ...Option) *Resource {
	t.Helper()
	r := mustNew(t, c, opts...)
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

func TestConformance(t *testing.T) {
	srv := testserver.Etcd(t)
	endpoints := srv.Endpoints
	admin := newClient(t, endpoints)
	probe := mustNew(t, admin)
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			testsuite.Run(t, testsuite.Harness{
				FixedTTL: "an etcd lease keeps the TTL it was granted with",
				NewResource: func(t *testing.T) backend.RemoteResource {
					return newResource(t, endpoints, m.opts...)
				},
				Leftovers: probe.Leftovers,
				// Holders and waiters alike are keys under the lock's
				// prefix (the ArrivalOrder case uses a key of one kind).
				Requests: func(ctx context.Context, key string, _ backend.Kind) (int, error) {
					ks, err := probe.Leftovers(ctx, key)
					return len(ks), err
				},
				// An operator's delete, not the holder's: testsuite's
				// DoCancelsOnLoss passes the lock's own context, which the
				// key watch ends as soon as the delete lands, often before
				// its reply.
				Evict: func(ctx context.Context, key string) error {
					ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
					defer cancel()
					return mustNew(t, admin).evict(ctx, key)
				},
				TTL:       time.Second,
				MaxKeyLen: MaxKeyLen,
				// The server frozen (SIGSTOP) answers nobody until SIGCONT;
				// its connections stay open.
				Stall: func(t *testing.T) func() {
					srv.Pause()
					var once sync.Once
					resume := func() { once.Do(srv.Resume) }
					t.Cleanup(resume)
					return resume
				},
				// Nothing listens at the endpoint: every dial is refused.
				NewRefusedResource: func(t *testing.T) backend.RemoteResource {
					c, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + testsuite.RefusingAddr(t)}, Logger: zap.NewNop()})
					if err != nil {
						t.Fatalf("clientv3.New: %v", err)
					}
					t.Cleanup(func() { _ = c.Close() })
					return newResourceOn(t, c, m.opts...)
				},
				RefusedCause: m.refusedCause,
				NewClosedResource: func(t *testing.T) backend.RemoteResource {
					c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
					if err != nil {
						t.Fatalf("clientv3.New: %v", err)
					}
					r := mustNew(t, c, m.opts...)
					t.Cleanup(func() { _ = r.Close() })
					if err := c.Close(); err != nil {
						t.Fatalf("closing the client: %v", err)
					}
					return r
				},
			})
		})
	}
}

func TestEncodeKey(t *testing.T) {
	keys := []string{"a", "a/", "/a", "a/b", "a%2F", "a%", "", "a\x00", "a\x00b", "ключ", "鍵", "a b", "%00", "\xff"}
	seen := map[string]string{}
	for _, k := range keys {
		e := encodeKey(k)
		if strings.Contains(e, "/") {
			t.Errorf("encodeKey(%q) = %q; contains '/'", k, e)
		}
		if other, dup := seen[e]; dup {
			t.Errorf("encodeKey(%q) = encodeKey(%q) = %q", k, other, e)
		}
		seen[e] = k
	}
	for _, a := range keys {
		for _, b := range keys {
			if a != b && strings.HasPrefix(encodeKey(b)+"/", encodeKey(a)+"/") {
				t.Errorf("prefix of %q is a prefix of %q's", a, b)
			}
		}
	}
	if got := encodeKey("plain-key_1.x~"); got != "plain-key_1.x~" {
		t.Errorf("encodeKey(plain) = %q; want it unchanged", got)
	}
}

func TestBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    *clientv3.Client
		opts []Option
	}{
		{"nil client", nil, nil},
		{"nil option", &clientv3.Client{}, []Option{nil}},
	} {
		if r, err := New(tc.c, tc.opts...); r != nil || !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("%s: New = %v, %v; want nil, an ErrInvalid error", tc.name, r, err)
		}
	}
	var nilRes *Resource
	if err := nilRes.ValidateKey("k"); err == nil {
		t.Errorf("ValidateKey on a nil Resource = nil; want an error")
	}
	if err := nilRes.Acquire(t.Context(), &backend.Lease{Key: "k", Value: "v", TTL: time.Second}, time.Time{}); err == nil {
		t.Errorf("Acquire on a nil Resource = nil; want an error")
	}
	if err := nilRes.Release(t.Context(), &backend.Lease{Key: "k"}); err == nil {
		t.Errorf("Release on a nil Resource = nil; want an error")
	}
	if err := mustNew(t, &clientv3.Client{}).ValidateKey(strings.Repeat("k", MaxKeyLen+1)); err == nil {
		t.Errorf("ValidateKey(too long) = nil; want an error")
	}
	if err := mustNew(t, &clientv3.Client{}).ValidateKey(strings.Repeat("k", MaxKeyLen)); err != nil {
		t.Errorf("ValidateKey(MaxKeyLen bytes) = %v; want nil", err)
	}
	// A lease from elsewhere is not ours to release.
	if err := mustNew(t, &clientv3.Client{}).Release(t.Context(), &backend.Lease{Key: "k", Handle: "x"}); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release(foreign handle) = %v; want ErrNotHeld", err)
	}
}

func lease(key string, ttl time.Duration) *backend.Lease {
	return &backend.Lease{Key: key, Value: fmt.Sprintf("owner-%d", time.Now().UnixNano()), TTL: ttl}
}

func uniqueKey(t testing.TB) string { return testsuite.Key(t) }

func TestTTLRoundsUp(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			r := newResource(t, endpoints, m.opts...)
			for _, c := range []struct{ ttl, min time.Duration }{
				{time.Nanosecond, time.Second},
				{1500 * time.Millisecond, 2 * time.Second},
				{3 * time.Second, 3 * time.Second},
			} {
				l := lease(uniqueKey(t), c.ttl)
				if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
					t.Fatalf("Acquire(TTL %v): %v", c.ttl, err)
				}
				if l.TTL < c.min || l.TTL%time.Second != 0 {
					t.Errorf("TTL %v became %v; want whole seconds >= %v", c.ttl, l.TTL, c.min)
				}
				if l.Validity <= 0 || l.Validity > l.TTL {
					t.Errorf("Validity = %v; want in (0, %v]", l.Validity, l.TTL)
				}
				if err := r.Release(t.Context(), l); err != nil {
					t.Fatalf("Release: %v", err)
				}
				if err := r.Release(t.Context(), l); !errors.Is(err, backend.ErrNotHeld) {
					t.Errorf("second Release = %v; want ErrNotHeld", err)
				}
			}
		})
	}
}

// waitKeys polls until the queue of key holds n keys.
func waitKeys(t *testing.T, r *Resource, key string, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		keys, err := r.Leftovers(ctx, key)
		if err == nil && len(keys) == n {
			return keys
		}
		select {
		case <-ctx.Done():
			t.Fatalf("queue of %q holds %q (err %v); want %d keys", key, keys, err, n)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestFIFO queues waiters one after another and checks that they are
// granted the lock in that order, each woken once: one release wakes one
// waiter, not the herd.
func TestFIFO(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			const waiters = 5
			key := uniqueKey(t)
			holder := newResource(t, endpoints, m.opts...)
			r := newResource(t, endpoints, m.opts...) // all waiters: one wake-up counter
			first := lease(key, 10*time.Second)
			if err := holder.Acquire(t.Context(), first, time.Time{}); err != nil {
				t.Fatal(err)
			}
			var (
				mu    sync.Mutex
				order []int
				wg    sync.WaitGroup
			)
			for i := range waiters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					l := lease(key, 10*time.Second)
					if err := r.Acquire(t.Context(), l, time.Now().Add(time.Minute)); err != nil {
						t.Errorf("waiter %d: %v", i, err)
						return
					}
					mu.Lock()
					order = append(order, i)
					mu.Unlock()
					if err := r.Release(context.Background(), l); err != nil {
						t.Errorf("waiter %d: Release: %v", i, err)
					}
				}()
				waitKeys(t, r, key, i+2) // queued before the next one starts
			}
			if err := holder.Release(t.Context(), first); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			if want := []int{0, 1, 2, 3, 4}; !slices.Equal(order, want) {
				t.Errorf("granted in order %v; want %v", order, want)
			}
			if got := r.wakeups.Load(); got != waiters {
				t.Errorf("%d wake-ups for %d releases; want one each (no herd)", got, waiters)
			}
			waitKeys(t, r, key, 0)
		})
	}
}

// TestRevokedWaiter is the Jepsen etcd 3.4.3 case (etcd issue 11456): a
// waiter whose lease ends while it is queued must get an error when its
// predecessor goes, never the lock.
func TestRevokedWaiter(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	admin := newClient(t, endpoints)
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			key := uniqueKey(t)
			a := newResource(t, endpoints, m.opts...)
			b := newResource(t, endpoints, m.opts...)
			la := lease(key, 10*time.Second)
			if err := a.Acquire(t.Context(), la, time.Time{}); err != nil {
				t.Fatal(err)
			}
			lb := lease(key, 10*time.Second)
			errc := make(chan error, 1)
			go func() { errc <- b.Acquire(t.Context(), lb, time.Now().Add(time.Minute)) }()
			keys := waitKeys(t, a, key, 2)
			resp, err := admin.Get(t.Context(), keys[1])
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("Get(%s) = %v, %v", keys[1], resp, err)
			}
			if _, err := admin.Revoke(t.Context(), clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
				t.Fatalf("Revoke: %v", err)
			}
			if err := a.Release(t.Context(), la); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-errc:
				if err == nil {
					t.Fatalf("waiter with a revoked lease got the lock (token %d)", lb.Token)
				}
				if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
					t.Errorf("waiter's error = %v; want it to wrap ErrLeaseNotFound", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("waiter still waiting after its lease was revoked and the holder left")
			}
			waitKeys(t, a, key, 0)
		})
	}
}

// TestCancelledWaitsLeaveNothing lists keys and leases after waits that
// ended by cancel, by context deadline, by wait deadline and after a zero
// wait: only the holder's remain.
func TestCancelledWaitsLeaveNothing(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	admin := newClient(t, endpoints)
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			key := uniqueKey(t)
			a := mustNew(t, newClient(t, endpoints), m.opts...)
			b := mustNew(t, newClient(t, endpoints), m.opts...)
			la := lease(key, 10*time.Second)
			if err := a.Acquire(t.Context(), la, time.Time{}); err != nil {
				t.Fatal(err)
			}
			before := leases(t, admin)

			cctx, cancel := context.WithCancel(t.Context())
			go func() { waitKeys(t, a, key, 2); cancel() }()
			if err := b.Acquire(cctx, lease(key, 10*time.Second), time.Now().Add(time.Minute)); !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled wait = %v; want context.Canceled", err)
			}
			dctx, dcancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
			defer dcancel()
			if err := b.Acquire(dctx, lease(key, 10*time.Second), time.Now().Add(time.Minute)); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("wait past ctx deadline = %v; want context.DeadlineExceeded", err)
			}
			if err := b.Acquire(t.Context(), lease(key, 10*time.Second), time.Now().Add(100*time.Millisecond)); err != backend.ErrNotAcquired {
				t.Errorf("wait past deadline = %v; want ErrNotAcquired", err)
			}
			if err := b.Acquire(t.Context(), lease(key, 10*time.Second), time.Time{}); err != backend.ErrNotAcquired {
				t.Errorf("zero wait = %v; want ErrNotAcquired", err)
			}
			if keys := waitKeys(t, a, key, 1); keys[0] != la.Handle.(*handle).queueKey() {
				t.Errorf("queue holds %q; want only the holder's key", keys)
			}
			if m.name == "SharedLease" {
				// b's shared lease lives on, with no key: it goes on Close.
				if err := b.Close(); err != nil {
					t.Fatal(err)
				}
			}
			// The cancelled waits' leases are revoked in the background.
			waitLeases(t, admin, before)
			if err := a.Release(t.Context(), la); err != nil {
				t.Fatal(err)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if got := leases(t, admin); len(got) != 0 {
				t.Errorf("leases left after release and Close: %v", got)
			}
			waitKeys(t, a, key, 0)
		})
	}
}

// waitLeases polls until the cluster's leases are want.
func waitLeases(t *testing.T, c *clientv3.Client, want []int64) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("the leases to be %v", want), func() bool {
		return slices.Equal(leases(t, c), want)
	})
}

func leases(t *testing.T, c *clientv3.Client) []int64 {
	t.Helper()
	resp, err := c.Leases(t.Context())
	if err != nil {
		t.Fatalf("Leases: %v", err)
	}
	var ids []int64
	for _, l := range resp.Leases {
		ids = append(ids, int64(l.ID))
	}
	slices.Sort(ids)
	return ids
}

// TestTokens checks that tokens increase across holders of one key, and
// across keys, as create revisions do cluster-wide.
func TestTokens(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			r := newResource(t, endpoints, m.opts...)
			var last uint64
			for i := range 6 {
				l := lease(fmt.Sprintf("%s-%d", uniqueKey(t), i%2), 5*time.Second)
				if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
					t.Fatal(err)
				}
				if l.Token <= last {
					t.Errorf("token %d <= previous %d", l.Token, last)
				}
				last = l.Token
				if err := r.Release(t.Context(), l); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestFencingRecipe checks the package documentation's recipe: a write
// guarded by a fence key refuses a holder whose token is older than one
// already seen.
func TestFencingRecipe(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	c := newClient(t, endpoints)
	r := newResource(t, endpoints)
	key := uniqueKey(t)
	fence, data := "/app/fence/"+key, "/app/data/"+key
	// write is the recipe: the fence holds the newest token as 20 digits.
	write := func(token uint64, v string) bool {
		tok := fmt.Sprintf("%020d", token)
		resp, err := c.Txn(t.Context()).
			If(clientv3.Compare(clientv3.Value(fence), ">", tok)).
			Else(clientv3.OpPut(fence, tok), clientv3.OpPut(data, v)).
			Commit()
		if err != nil {
			t.Fatalf("Txn: %v", err)
		}
		return !resp.Succeeded
	}
	old := lease(key, 2*time.Second)
	if err := r.Acquire(t.Context(), old, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if !write(old.Token, "old") || !write(old.Token, "old again") {
		t.Fatal("the holder's writes were refused")
	}
	// The old holder's lock is lost (evicted); a new holder writes.
	if err := r.Release(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	cur := lease(key, 2*time.Second)
	if err := r.Acquire(t.Context(), cur, time.Time{}); err != nil {
		t.Fatal(err)
	}
	defer r.Release(context.Background(), cur)
	if !write(cur.Token, "new") {
		t.Fatal("the new holder's write was refused")
	}
	if write(old.Token, "stale") {
		t.Fatal("a write with the old token was accepted")
	}
	resp, err := c.Get(t.Context(), data)
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "new" {
		t.Fatalf("data = %v, %v; want \"new\"", resp, err)
	}
}

// TestLongKey takes a lock on the longest key allowed, made of bytes that
// all need escaping: it must fit in one etcd request.
func TestLongKey(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	r := newResource(t, endpoints)
	l := lease(strings.Repeat("/", MaxKeyLen), time.Second)
	if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
		t.Fatalf("Acquire(%d escaped bytes): %v", MaxKeyLen, err)
	}
	if err := r.Release(t.Context(), l); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// TestSharedLeaseLost revokes a shared lease behind the Resource's back:
// Lost closes, Refresh and Release report ErrNotHeld, and the next acquire
// gets a new lease.
func TestSharedLeaseLost(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	admin := newClient(t, endpoints)
	r := newResource(t, endpoints, WithSharedLease())
	key := uniqueKey(t)
	l := lease(key, time.Second)
	if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if l.Lost() == nil {
		t.Fatal("Lost is nil on a shared lease")
	}
	id := l.Handle.(*handle).leaseID()
	if _, err := admin.Revoke(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed after the shared lease was revoked")
	}
	if err := r.Refresh(t.Context(), l); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Refresh after loss = %v; want ErrNotHeld", err)
	}
	if err := r.Release(t.Context(), l); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release after loss = %v; want ErrNotHeld", err)
	}
	l2 := lease(key, time.Second)
	if err := r.Acquire(t.Context(), l2, time.Time{}); err != nil {
		t.Fatalf("Acquire after loss: %v", err)
	}
	if got := l2.Handle.(*handle).leaseID(); got == id {
		t.Errorf("new lock on the revoked lease %x", int64(id))
	}
	if err := r.Release(t.Context(), l2); err != nil {
		t.Fatal(err)
	}
}

// TestSharedLeaseRevokedBetweenAcquires: an acquire that finds its shared
// lease revoked starts a new one instead of failing.
func TestSharedLeaseRevokedBetweenAcquires(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	admin := newClient(t, endpoints)
	r := newResource(t, endpoints, WithSharedLease())
	l := lease(uniqueKey(t), 3*time.Second)
	if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := r.Release(t.Context(), l); err != nil {
		t.Fatal(err)
	}
	id := l.Handle.(*handle).leaseID()
	if _, err := admin.Revoke(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	l2 := lease(l.Key, 3*time.Second)
	if err := r.Acquire(t.Context(), l2, time.Time{}); err != nil {
		t.Fatalf("Acquire after the shared lease was revoked: %v", err)
	}
	if l2.Handle.(*handle).leaseID() == id {
		t.Errorf("acquired on the revoked lease")
	}
	if err := r.Release(t.Context(), l2); err != nil {
		t.Fatal(err)
	}
}

// TestWaitOutlivesTTL queues a waiter with a 1s TTL behind a holder for
// longer than the waiter's lease: the waiter keeps its lease alive while
// it waits, and gets the lock with a full TTL ahead.
func TestWaitOutlivesTTL(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			key := uniqueKey(t)
			a := newResource(t, endpoints, m.opts...)
			b := newResource(t, endpoints, m.opts...)
			la := lease(key, time.Minute)
			if err := a.Acquire(t.Context(), la, time.Time{}); err != nil {
				t.Fatal(err)
			}
			time.AfterFunc(3500*time.Millisecond, func() { _ = a.Release(context.Background(), la) })
			lb := lease(key, time.Second)
			start := time.Now()
			if err := b.Acquire(t.Context(), lb, time.Now().Add(time.Minute)); err != nil {
				t.Fatalf("waiter: %v", err)
			}
			if el := time.Since(start); el < 3*time.Second {
				t.Fatalf("waiter got the lock after %v, before the holder let go", el)
			}
			if lb.Validity < lb.TTL/2 {
				t.Errorf("Validity after a long wait = %v; want about TTL %v", lb.Validity, lb.TTL)
			}
			if err := b.Refresh(t.Context(), lb); err != nil {
				t.Errorf("Refresh: %v", err)
			}
			if err := b.Release(t.Context(), lb); err != nil {
				t.Errorf("Release: %v", err)
			}
		})
	}
}

// TestNamesReused checks that a Resource names its queue keys again once
// they are deleted, and never names two live keys alike.
func TestNamesReused(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			r := newResource(t, endpoints, m.opts...)
			key := uniqueKey(t)
			var first string
			for i := range 3 {
				l := lease(key, 5*time.Second)
				if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
					t.Fatal(err)
				}
				name := l.Handle.(*handle).queueKey()
				if i == 0 {
					first = name
				} else if name != first {
					t.Errorf("cycle %d used %s; want the released %s again", i, name, first)
				}
				if err := r.Release(t.Context(), l); err != nil {
					t.Fatal(err)
				}
			}
			// A waiter of the same Resource gets a name of its own.
			l := lease(key, 5*time.Second)
			if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
				t.Fatal(err)
			}
			w := lease(key, 5*time.Second)
			if err := r.Acquire(t.Context(), w, time.Time{}); err != backend.ErrNotAcquired {
				t.Errorf("second acquire of a held key = %v; want ErrNotAcquired", err)
			}
			if err := r.Release(t.Context(), l); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestReleaseAfterKeyDeleted deletes the holder's key behind its back, as
// an operator or a cleanup tool would, leaving its lease alive: Release
// reports ErrNotHeld, and revokes the lease it had of its own all the same
// (no orphan lease). With WithSharedLease the shared lease stays, for the
// other locks on it.
func TestReleaseAfterKeyDeleted(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	admin := newClient(t, endpoints)
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			r := newResource(t, endpoints, m.opts...)
			l := lease(uniqueKey(t), 10*time.Second)
			if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
				t.Fatal(err)
			}
			h := l.Handle.(*handle)
			if resp, err := admin.Delete(t.Context(), h.queueKey()); err != nil || resp.Deleted != 1 {
				t.Fatalf("Delete(%s) = %v, %v; want 1 key deleted", h.queueKey(), resp, err)
			}
			if err := r.Release(t.Context(), l); !errors.Is(err, backend.ErrNotHeld) {
				t.Errorf("Release after the key was deleted = %v; want ErrNotHeld", err)
			}
			ttl, err := admin.TimeToLive(t.Context(), h.leaseID())
			if err != nil {
				t.Fatalf("TimeToLive: %v", err)
			}
			if gone := ttl.TTL == -1; gone != (h.sess == nil) {
				t.Errorf("lease %x after Release: TTL %ds; want it revoked only when it was the lock's own", int64(h.leaseID()), ttl.TTL)
			}
			// The name is free again: the next acquire reuses it.
			l2 := lease(l.Key, 10*time.Second)
			if err := r.Acquire(t.Context(), l2, time.Time{}); err != nil {
				t.Fatal(err)
			}
			if got := l2.Handle.(*handle).queueKey(); got != h.queueKey() {
				t.Errorf("next acquire made %s; want the freed name %s", got, h.queueKey())
			}
			if err := r.Release(t.Context(), l2); err != nil {
				t.Errorf("Release: %v", err)
			}
			waitKeys(t, r, l.Key, 0)
		})
	}
}

// TestAutoRenewTakesSharedLease: locks the facade renews
// (backend.Lease.AutoRenew) share the Resource's lease for their TTL, as
// with WithSharedLease; others get a lease each.
func TestAutoRenewTakesSharedLease(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	admin := newClient(t, endpoints)
	r := newResource(t, endpoints)
	before := leases(t, admin)
	var renewed []*backend.Lease
	for i := range 2 {
		l := lease(fmt.Sprintf("%s-%d", uniqueKey(t), i), 5*time.Second)
		l.AutoRenew = true
		if err := r.Acquire(t.Context(), l, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if l.Lost() == nil {
			t.Errorf("lock %d on the shared lease has no Lost channel", i)
		}
		renewed = append(renewed, l)
	}
	shared := leases(t, admin)
	if got := len(shared) - len(before); got != 1 {
		t.Fatalf("two renewed locks made %d leases; want 1 shared", got)
	}
	own := lease(uniqueKey(t), 5*time.Second)
	if err := r.Acquire(t.Context(), own, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if got := len(leases(t, admin)) - len(shared); got != 1 {
		t.Errorf("a lock not renewed made %d leases; want its own 1", got)
	}
	for _, l := range append(renewed, own) {
		if err := r.Refresh(t.Context(), l); err != nil {
			t.Errorf("Refresh %q: %v", l.Key, err)
		}
		if err := r.Release(t.Context(), l); err != nil {
			t.Errorf("Release %q: %v", l.Key, err)
		}
	}
	if got := len(leases(t, admin)); got != len(shared) {
		t.Errorf("after the releases %d leases; want the shared one left (%d)", got, len(shared))
	}
}

// evict deletes every key of every kind of the lock key, as an operator
// would: a test's Evict.
func (r *Resource) evict(ctx context.Context, key string) error {
	var ops []clientv3.Op
	for _, k := range queueKinds {
		ops = append(ops, clientv3.OpDelete(r.queueDir(k, key), clientv3.WithPrefix()))
	}
	_, err := r.c.Txn(ctx).Then(ops...).Commit()
	return err
}

// TestNestedPrefixes pins what the package doc says of Resources whose
// prefixes nest (a Resource cannot see another's prefix): the keys of the inner one ("/a/b/") sit in the queue
// of the outer one's lock "b" ("/a/"), whose acquisitions wait for them;
// nothing is granted beside them, and the lock is granted once they go.
func TestNestedPrefixes(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	ctx := t.Context()
	base := "/" + uniqueKey(t) + "/"
	outer := newResource(t, endpoints, WithPrefix(base))
	inner := newResource(t, endpoints, WithPrefix(base+"b/"))
	li := lease("x", time.Minute)
	if err := inner.Acquire(ctx, li, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if keys := waitKeys(t, outer, "b", 1); !strings.HasPrefix(keys[0], base+"b/x/") {
		t.Fatalf("the outer Resource's queue of \"b\" = %q; want the inner Resource's key", keys)
	}
	lo := lease("b", time.Minute)
	if err := outer.Acquire(ctx, lo, time.Time{}); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("the outer Resource's lock \"b\" beside the inner one's key = %v; want ErrNotAcquired", err)
	}
	if err := inner.Release(ctx, li); err != nil {
		t.Fatal(err)
	}
	if err := outer.Acquire(ctx, lo, time.Time{}); err != nil {
		t.Fatalf("the outer Resource's lock \"b\" once the inner one's key is gone = %v", err)
	}
	if err := outer.Release(ctx, lo); err != nil {
		t.Fatal(err)
	}
}

// queueKey is h's queue key (see Resource.name).
func (h *handle) queueKey() string { return h.resource().name(h).key }
