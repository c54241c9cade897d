package gocron_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/gocron"
)

func newLock(t *testing.T, store *memory.Store, opts ...distlock.Option) *distlock.DistributeLock {
	t.Helper()
	d, err := distlock.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// waitFor polls cond every 5ms for up to 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// One of two Electors leads; when it closes (resigns), the other leads;
// a leadership lost behind the leader's back stops IsLeader at once.
func TestElectorFailover(t *testing.T) {
	store := memory.New()
	ctx := t.Context()
	var els [2]*gocron.Elector
	for i := range els {
		d := newLock(t, store, distlock.WithAutoRenew(), distlock.WithDefaultTTL(300*time.Millisecond))
		el, err := gocron.NewElector(d.Election("jobs"), "r", distlock.WithRunBackoff(10*time.Millisecond, 50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		els[i] = el
	}
	leader := func() int {
		n, who := 0, -1
		for i, el := range els {
			if el != nil && el.IsLeader(ctx) == nil {
				n, who = n+1, i
			}
		}
		if n > 1 {
			t.Fatalf("%d electors lead at once", n)
		}
		return who
	}
	waitFor(t, "a leader", func() bool { return leader() >= 0 })
	first := leader()
	if lead := els[first].Leadership(); lead == nil || lead.Token() == 0 {
		t.Fatalf("the leader's Leadership() = %v; want a lock with a term", lead)
	}
	term := els[first].Leadership().Token()
	if err := els[1-first].IsLeader(ctx); !errors.Is(err, gocron.ErrNotLeader) {
		t.Errorf("the follower's IsLeader = %v; want ErrNotLeader", err)
	}
	if err := els[first].Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := els[first].IsLeader(ctx); !errors.Is(err, gocron.ErrNotLeader) {
		t.Errorf("a closed elector's IsLeader = %v; want ErrNotLeader", err)
	}
	els[first] = nil
	second := 1 - first
	waitFor(t, "the other to lead", func() bool { return leader() == second })
	if got := els[second].Leadership().Token(); got <= term {
		t.Errorf("term %d after %d; want larger", got, term)
	}
	// Deleted behind its back: IsLeader stops once the renewal finds it
	// gone, and the elector campaigns again.
	lost := els[second].Leadership()
	store.Evict(backend.ElectionPrefix + "jobs")
	waitFor(t, "the loss to be seen", func() bool {
		select {
		case <-lost.Done():
			return true
		default:
			return false
		}
	})
	if els[second].Leadership() == lost && els[second].IsLeader(ctx) == nil {
		t.Error("IsLeader = nil with the leadership lost")
	}
	waitFor(t, "the elector to lead again", func() bool { return leader() == second })
	if err := els[second].Close(); err != nil {
		t.Fatal(err)
	}
	if n := store.Len(); n != 0 {
		t.Errorf("the store holds %d grants after every elector closed", n)
	}
}

// A bad election name fails the campaign: IsLeader and Close say why.
func TestElectorBadInput(t *testing.T) {
	d := newLock(t, memory.New())
	el, err := gocron.NewElector(d.Election(""), "v")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the campaign to end", func() bool { return errors.Is(el.IsLeader(t.Context()), distlock.ErrInvalid) })
	if err := el.Close(); !errors.Is(err, distlock.ErrInvalid) {
		t.Errorf("Close = %v; want ErrInvalid", err)
	}
	if _, err := gocron.NewElector(nil, "v"); !errors.Is(err, distlock.ErrInvalid) {
		t.Errorf("NewElector(nil) = %v; want ErrInvalid", err)
	}
}

// The Locker fails fast while another replica holds the job's key, and
// with WithMinHold keeps the key held after a short run.
func TestLocker(t *testing.T) {
	store := memory.New()
	a, err := gocron.NewLocker(newLock(t, store), gocron.WithMinHold(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	b, err := gocron.NewLocker(newLock(t, store))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	lk, err := a.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := b.Lock(ctx, "job"); !errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("Lock of a held job = %v; want ErrNotAcquired at once", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	if _, _, held := store.Holder("gocron:job"); !held && time.Since(start) < 150*time.Millisecond {
		t.Error("the key was released before the minimum hold")
	}
	var got error
	waitFor(t, "the key after the minimum hold", func() bool {
		var lk2 interface{ Unlock(context.Context) error }
		lk2, got = b.Lock(ctx, "job")
		if got == nil {
			_ = lk2.Unlock(ctx)
		}
		return got == nil
	})
	if err := lk.Unlock(ctx); err == nil {
		t.Error("a second Unlock = nil; want an error")
	}
	for _, opt := range []gocron.LockerOption{nil, gocron.WithMinHold(-time.Second)} {
		if _, err := gocron.NewLocker(newLock(t, store), opt); !errors.Is(err, distlock.ErrInvalid) {
			t.Errorf("NewLocker with a bad option = %v; want ErrInvalid", err)
		}
	}
	if _, err := gocron.NewLocker(nil); !errors.Is(err, distlock.ErrInvalid) {
		t.Errorf("NewLocker(nil) = %v; want ErrInvalid", err)
	}
}
