package metrics_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
)

// recorder is a handler that writes what it sees into a shared log.
type recorder struct {
	name string
	log  *[]string
	mu   *sync.Mutex
	// failAcquire short-circuits the acquisition without calling next.
	failAcquire error
	// sawAcquire and sawRelease are the errors next returned.
	sawAcquire, sawRelease error
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	*r.log = append(*r.log, r.name+" "+s)
	r.mu.Unlock()
}

func (r *recorder) Acquire(ctx context.Context, req *distlock.Request, next distlock.AcquireFunc) error {
	r.add("acquire start")
	if r.failAcquire != nil {
		r.add("acquire short-circuit")
		return r.failAcquire
	}
	err := next(ctx, req)
	r.sawAcquire = err
	r.add("acquire end")
	return err
}

func (r *recorder) Release(ctx context.Context, req *distlock.Request, next distlock.ReleaseFunc) error {
	r.add("release start")
	err := next(ctx, req)
	r.sawRelease = err
	r.add("release end")
	return err
}

func recorders(names ...string) ([]*recorder, *[]string) {
	var log []string
	var mu sync.Mutex
	var rs []*recorder
	for _, n := range names {
		rs = append(rs, &recorder{name: n, log: &log, mu: &mu})
	}
	return rs, &log
}

func handlers(rs []*recorder) []distlock.Handler {
	hs := make([]distlock.Handler, len(rs))
	for i, r := range rs {
		hs[i] = r
	}
	return hs
}

func TestChainOrder(t *testing.T) {
	rs, log := recorders("h1", "h2", "h3")
	d, err := distlock.New(memory.New(), distlock.WithHandlers(handlers(rs)...))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	lk, err := d.TryLock(t.Context(), t.Name(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"h1 acquire start", "h2 acquire start", "h3 acquire start",
		"h3 acquire end", "h2 acquire end", "h1 acquire end",
		"h1 release start", "h2 release start", "h3 release start",
		"h3 release end", "h2 release end", "h1 release end",
	}
	if !slices.Equal(*log, want) {
		t.Errorf("got %q;\nwant %q", *log, want)
	}
}

func TestChainShortCircuit(t *testing.T) {
	rs, log := recorders("h1", "h2", "h3")
	refuse := errors.New("refused by policy")
	rs[1].failAcquire = refuse
	store := memory.New()
	d, err := distlock.New(store, distlock.WithHandlers(handlers(rs)...))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.TryLock(t.Context(), t.Name(), 0); !errors.Is(err, refuse) {
		t.Fatalf("TryLock = %v; want the short-circuit error", err)
	}
	want := []string{"h1 acquire start", "h2 acquire start", "h2 acquire short-circuit", "h1 acquire end"}
	if !slices.Equal(*log, want) {
		t.Errorf("got %q;\nwant %q", *log, want)
	}
	if !errors.Is(rs[0].sawAcquire, refuse) {
		t.Errorf("outer handler saw %v; want the inner handler's error", rs[0].sawAcquire)
	}
	if n := store.Len(); n != 0 {
		t.Errorf("store holds %d keys after a short-circuit; want 0", n)
	}
}

func TestChainErrorsReachOuterHandlers(t *testing.T) {
	rs, _ := recorders("h1", "h2")
	store := memory.New()
	d, err := distlock.New(store, distlock.WithHandlers(handlers(rs)...))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	other, err := distlock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	theirs, err := other.TryLock(t.Context(), t.Name(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryLock(t.Context(), t.Name(), 0); !errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("TryLock = %v; want ErrNotAcquired", err)
	}
	for _, r := range rs {
		if !errors.Is(r.sawAcquire, distlock.ErrNotAcquired) {
			t.Errorf("%s saw %v on acquire; want ErrNotAcquired", r.name, r.sawAcquire)
		}
	}
	if err := theirs.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}

	// Release: the store no longer holds the lock, and every handler sees it.
	lk, err := d.TryLock(t.Context(), t.Name(), 0)
	if err != nil {
		t.Fatal(err)
	}
	store.Evict(t.Name())
	if err := lk.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Fatalf("Unlock after eviction = %v; want ErrNotHeld", err)
	}
	for _, r := range rs {
		if !errors.Is(r.sawRelease, distlock.ErrNotHeld) {
			t.Errorf("%s saw %v on release; want ErrNotHeld", r.name, r.sawRelease)
		}
	}
}
