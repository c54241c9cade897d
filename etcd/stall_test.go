package etcd

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/testsuite"
)

// stallWatchdog ends a stall that a call did not return from: code that
// waits for the server would otherwise wait as long as the test.
const stallWatchdog = 8 * time.Second

// stalled freezes the server (SIGSTOP) and returns a function that
// continues it (SIGCONT), once; the watchdog continues it on its own
// after stallWatchdog, and the test's cleanup at the latest.
func stalled(t *testing.T, srv *testserver.EtcdServer) (resume func()) {
	t.Helper()
	srv.Pause()
	var once sync.Once
	cont := func() { once.Do(srv.Resume) }
	dog := time.AfterFunc(stallWatchdog, cont)
	resume = func() { dog.Stop(); cont() }
	t.Cleanup(resume)
	return resume
}

// TestFenceStopsLateEnqueue: the clean-up of an acquisition on a shared
// lease whose transaction may still be on its way (its reply was lost)
// deletes the key if the transaction landed before it, and keeps it from
// landing after: the transaction, sent again as the server would apply it
// late, makes nothing. The clean-up fails no other name's transaction in
// flight; an acquisition that knew its name's fence from before it moved
// learns where it went and gets the lock.
func TestFenceStopsLateEnqueue(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	r := newResource(t, endpoints, WithSharedLease())
	ctx := t.Context()
	key := uniqueKey(t)
	s, err := r.session(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	type abandonedAcq struct {
		*handle
		n     qname
		value string
	}
	abandoned := func(owner string) abandonedAcq {
		h := r.newHandle(&backend.Lease{Key: key, Value: owner}, s, 0, 0)
		return abandonedAcq{h, r.name(h), h.value(owner, "")}
	}

	// The transaction landed before the clean-up: the clean-up deletes it.
	h := abandoned("landed-before")
	epoch := s.epoch(h.queueKey())
	if resp, err := r.enqueueTxn(ctx, h.handle, h.n, h.value, epoch); err != nil || !resp.Succeeded {
		t.Fatalf("enqueue = %v, %v; want the key made", resp, err)
	}
	waitKeys(t, r, key, 1)
	if !r.discarder(h.handle, h.value)(ctx) {
		t.Fatal("the clean-up failed")
	}
	waitKeys(t, r, key, 0)
	if got := s.epoch(h.queueKey()); got <= epoch {
		t.Errorf("the fence did not move: epoch %d, before %d", got, epoch)
	}

	// The transaction lands after the clean-up: it makes nothing. Another
	// name's, in flight meanwhile, is not touched.
	h = abandoned("landed-after")
	other := abandoned("another acquisition")
	epoch, otherEpoch := s.epoch(h.queueKey()), s.epoch(other.queueKey())
	if !r.discarder(h.handle, h.value)(ctx) {
		t.Fatal("the clean-up failed")
	}
	if !h.freed() {
		t.Error("the clean-up did not give the name back")
	}
	resp, err := r.enqueueTxn(ctx, h.handle, h.n, h.value, epoch)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Succeeded {
		t.Error("a transaction that landed after its clean-up made its key")
	}
	if resp, err := r.enqueueTxn(ctx, other.handle, other.n, other.value, otherEpoch); err != nil || !resp.Succeeded {
		t.Errorf("another name's enqueue after the clean-up = %v, %v; want the key made", resp, err)
	} else if _, err := r.deleteOurs(ctx, &handle{lockKey: key, sess: s, slot: other.slot, rev: resp.Header.Revision}); err != nil {
		t.Fatal(err)
	}
	r.free(other.handle)
	waitKeys(t, r, key, 0)

	// An acquisition that knows its name's fence from before it moved.
	s.fenced(h.queueKey(), epoch, true)
	l := lease(key, time.Minute)
	if err := r.Acquire(ctx, l, time.Time{}); err != nil {
		t.Fatalf("Acquire with a stale fence = %v; want the lock", err)
	}
	if l.Handle.(*handle).queueKey() != h.queueKey() {
		t.Fatalf("the acquisition made %s; the test needs the fenced name %s", l.Handle.(*handle).queueKey(), h.queueKey())
	}
	if err := r.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	waitKeys(t, r, key, 0)
}

// TestRandomizedStalls runs testsuite.RunRandomStalls over clients in
// both lease modes, whose locks are auto-renewed or not and now and then
// of a TTL that makes a new shared lease: requests are abandoned in
// flight at every step, the grant, the enqueue, the wait, the
// keep-alive, the delete, the revoke.
func TestRandomizedStalls(t *testing.T) {
	srv := testserver.Etcd(t)
	endpoints := srv.Endpoints
	var clients []testsuite.StallingWaiter
	for i := range 4 {
		clients = append(clients, newResource(t, endpoints, modes[i%2].opts...))
	}
	admin := newResource(t, endpoints)
	testsuite.RunRandomStalls(t, testsuite.RandomStalls{
		Clients: clients,
		Seed:    uint64(time.Now().UnixNano()),
		Pause:   srv.Pause,
		Resume:  srv.Resume,
		Lease: func(l *backend.Lease, intn func(int) int) {
			if intn(8) == 0 {
				l.TTL = time.Duration(50+intn(5)) * time.Second // a new shared lease now and then
			}
			l.AutoRenew = intn(2) == 0
		},
		Name: func(l *backend.Lease) string { return l.Handle.(*handle).queueKey() },
		// Revokes of released locks' leases may still run: only keys count.
		Empty: func(t *testing.T, key string) { waitKeys(t, admin, key, 0) },
	})
}

// TestRenewalSurvivesStallInLastThird: the server stalls
// (SIGSTOP) just after a renewal of a shared lease and answers again
// before the lease could expire, late in its life: past two thirds of it
// for a lease of AutoRenew locks alone (3s, renewed every second, the
// stall 2.2s), past 70% for one with WithSharedLease (4s for a TTL of
// 3s). The renewal sent during the stall must succeed when the server
// answers and the locks stay held: Lost open, the key still there, and
// no one else granted. A renewal that gave up after one period without
// an answer, the next coming a period later, would pass the loss
// deadline: Lost closed 2.97s after the last renewal, 760ms after the
// server answered again, while the lease had 2s left.
func TestRenewalSurvivesStallInLastThird(t *testing.T) {
	srv := testserver.Etcd(t)
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			r := newResource(t, srv.Endpoints, m.opts...)
			renewed := make(chan time.Time, 64)
			r.onRenew = func() {
				select {
				case renewed <- time.Now():
				default:
				}
			}
			other := newResource(t, srv.Endpoints)
			ctx := t.Context()
			key := uniqueKey(t)
			l := lease(key, 3*time.Second)
			l.AutoRenew = true
			if err := r.Acquire(ctx, l, time.Time{}); err != nil {
				t.Fatal(err)
			}
			s := l.Handle.(*handle).sess
			stall := s.life * 73 / 100
			// Drain the renewals so far, then stall right after the next.
			for len(renewed) > 0 {
				<-renewed
			}
			var last time.Time
			select {
			case last = <-renewed:
			case <-time.After(2 * s.period):
				t.Fatalf("no renewal within two periods (%v)", 2*s.period)
			}
			resume := stalled(t, srv)
			stallStart := time.Now()
			select {
			case <-l.Lost().Done():
				resume()
				t.Fatalf("Lost closed %v into the stall (the lease lives %v)", time.Since(stallStart), s.life)
			case <-time.After(stall):
			}
			resume()
			answered := time.Now()
			t.Logf("stalled %v, %v after the renewal at %v (lease life %v, renewed every %v)",
				answered.Sub(stallStart).Round(time.Millisecond), stallStart.Sub(last).Round(time.Millisecond),
				last.Format("15:04:05.000"), s.life, s.period)
			// The next renewals land before the loss deadline that the last
			// renewal before the stall set.
			for range 2 {
				select {
				case at := <-renewed:
					t.Logf("renewed %v after the server answered again", at.Sub(answered).Round(time.Millisecond))
				case <-l.Lost().Done():
					t.Fatalf("Lost closed %v after the last renewal before the stall, %v after the server answered again",
						time.Since(last).Round(time.Millisecond), time.Since(answered).Round(time.Millisecond))
				case <-time.After(s.life):
					t.Fatalf("no renewal within %v of the server answering again", s.life)
				}
			}
			if l.Lost().Closed() {
				t.Fatal("Lost closed")
			}
			in, err := other.Inspect(ctx, key, backend.KindMutex)
			if err != nil {
				t.Fatal(err)
			}
			if len(in.Holders) != 1 || in.Holders[0].Token != l.Token {
				t.Errorf("Inspect = %+v; want the holder with token %d", in, l.Token)
			}
			if err := other.Acquire(ctx, lease(key, time.Second), time.Time{}); !errors.Is(err, backend.ErrNotAcquired) {
				t.Errorf("another client's Acquire = %v; want ErrNotAcquired", err)
			}
			if err := r.Release(ctx, l); err != nil {
				t.Errorf("Release = %v", err)
			}
			waitKeys(t, other, key, 0)
		})
	}
}
