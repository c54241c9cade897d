package distlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
)

// oneByOne is the memory store without its MultiSpinner: the facade takes
// a set's keys one by one.
type oneByOne struct{ s *memory.Store }

func (o oneByOne) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	return o.s.TryAcquire(ctx, l)
}
func (o oneByOne) Release(ctx context.Context, l *backend.Lease) error { return o.s.Release(ctx, l) }
func (o oneByOne) Refresh(ctx context.Context, l *backend.Lease) error { return o.s.Refresh(ctx, l) }

// Taken one by one, a set whose later key is held gives back the earlier
// ones within the attempt: a wait never holds part of a set.
func TestTryLockAllOneByOneGivesBack(t *testing.T) {
	store := memory.New()
	a := mustNew(t, oneByOne{store})
	b := mustNew(t, store)
	held, err := b.TryLock(t.Context(), "c", 0)
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		lk, err := a.TryLockAll(context.Background(), []string{"c", "a", "b"}, 10*time.Second)
		if err == nil {
			err = lk.Unlock(context.Background())
		}
		res <- err
	}()
	// While "c" is held, the waiter holds neither "a" nor "b" between its
	// attempts (it may hold them for the instant of one).
	free := 0
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
		_, _, okA := store.Holder("a")
		_, _, okB := store.Holder("b")
		if !okA && !okB {
			free++
		}
	}
	if free == 0 {
		t.Errorf("the waiter kept part of the set while a key was held")
	}
	held.Unlock(t.Context())
	if err := within(t, res, "TryLockAll"); err != nil {
		t.Fatalf("TryLockAll once the key was free = %v", err)
	}
	if n := store.Len(); n != 0 {
		t.Errorf("store holds %d keys after Unlock", n)
	}
}

// Bad input to TryLockAll costs no I/O.
func TestTryLockAllBadInput(t *testing.T) {
	store := &faultStore{Store: memory.New()}
	d := mustNew(t, store)
	for _, keys := range [][]string{nil, {}, {"a", ""}, {"", ""}} {
		if lk, err := d.TryLockAll(t.Context(), keys, 0); lk != nil || !errors.Is(err, distlock.ErrInvalid) {
			t.Errorf("TryLockAll(%q) = %v, %v; want ErrInvalid", keys, lk, err)
		}
	}
	if _, err := d.TryLockAll(t.Context(), []string{"a", "b"}, -1); !errors.Is(err, distlock.ErrInvalid) {
		t.Errorf("negative wait = %v; want ErrInvalid", err)
	}
	if n := store.calls.Load(); n != 0 {
		t.Errorf("bad input made %d store calls", n)
	}
}
