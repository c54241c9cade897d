package testsuite_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/testsuite"
)

// The facade's goroutine-leak test lives here rather than in the root
// package: it runs this suite's workload, and the root module requires
// nothing, tests included.

// TestNoGoroutineLeak checks that no goroutine of the facade outlives
// Close: after the common workload, and after the paths that end a lock
// other than Unlock (loss under renewal, a lost lock inside Do, a handle
// never unlocked, a Lost channel never closed).
func TestNoGoroutineLeak(t *testing.T) {
	before := goleak.IgnoreCurrent()
	store := memory.New()
	testsuite.Exercise(t, store, store, 300*time.Millisecond)

	const ttl = 100 * time.Millisecond
	d, err := distlock.New(store, distlock.WithDefaultTTL(ttl), distlock.WithAutoRenew(), distlock.WithSpin(time.Millisecond, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	// Lost under renewal: the renewer ends by itself.
	lk, err := d.TryLock(ctx, "lost", 0)
	if err != nil {
		t.Fatal(err)
	}
	store.Evict("lost")
	<-lk.Done()
	// Lost inside Do: fn's context ends, Do's watcher goroutine too.
	err = d.Do(ctx, "do", 0, func(ctx context.Context, _ *distlock.Lock) error {
		store.Evict("do")
		<-ctx.Done()
		return nil
	})
	if !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("Do after loss = %v; want ErrNotHeld", err)
	}
	// Never unlocked, with Done watched and a backend Lost channel: Close ends both.
	lost := make(chan struct{})
	dl, err := distlock.New(lostStore{store, lost}, distlock.WithDefaultTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"kept1", "kept2"} {
		lk, err := dl.TryLock(ctx, k, 0)
		if err != nil {
			t.Fatal(err)
		}
		_ = lk.Done()
	}
	kept, err := d.TryLock(ctx, "kept3", 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = kept.Done()
	if err := d.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := dl.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	verifyNoLeak(t, before)
	if n := store.Len(); n != 0 {
		t.Errorf("store holds %d keys after Close; want 0", n)
	}
}

// lostStore gives every lease a Lost channel, as etcd and ZooKeeper do.
type lostStore struct {
	*memory.Store
	lost chan struct{}
}

func (s lostStore) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	ok, ttl, err := s.Store.TryAcquire(ctx, l)
	if ok {
		l.Handle = backend.LostChan(s.lost)
	}
	return ok, ttl, err
}

// verifyNoLeak fails t if goroutines other than those opts ignore are
// still running after a few seconds' grace for the ones already ending.
func verifyNoLeak(t *testing.T, opts ...goleak.Option) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); goleak.Find(opts...) != nil && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	goleak.VerifyNone(t, opts...)
}
