package distlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	distlock "github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
)

// queueing is the memory store declared to queue mutex and semaphore
// waiters (backend.Queuer), with what the facade asks of such a store
// recorded: the Waits flag of each attempt, the withdrawals, and the
// subscriptions, addressed or not. Instrumentation around the real store:
// its locks are the memory store's.
type queueing struct {
	*memory.Store
	mu        sync.Mutex
	waits     map[string][]bool // owner value -> Waits of each attempt
	withdrawn []string          // owner values, in order
	heads     []string          // SubscribeHead's values
	plain     atomic.Int32      // Subscribe calls
}

var (
	_ backend.Queuer       = (*queueing)(nil)
	_ backend.HeadNotifier = (*queueing)(nil)
	_ backend.Withdrawer   = (*queueing)(nil)
)

func newQueueing() *queueing {
	return &queueing{Store: memory.New(), waits: make(map[string][]bool)}
}

func (q *queueing) Queues(k backend.Kind) bool {
	return k == backend.KindMutex || k == backend.KindSemaphore
}

func (q *queueing) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	q.mu.Lock()
	q.waits[l.Value] = append(q.waits[l.Value], l.Waits)
	q.mu.Unlock()
	return q.Store.TryAcquire(ctx, l)
}

func (q *queueing) Withdraw(ctx context.Context, l *backend.Lease) error {
	q.mu.Lock()
	q.withdrawn = append(q.withdrawn, l.Value)
	q.mu.Unlock()
	return q.Store.Withdraw(ctx, l)
}

func (q *queueing) Subscribe(key string) (<-chan struct{}, func()) {
	q.plain.Add(1)
	return q.Store.Subscribe(key)
}

// SubscribeHead gets the memory store's notices, which are addressed to
// nobody in particular (the contract lets those through).
func (q *queueing) SubscribeHead(key, value string) (<-chan struct{}, func()) {
	q.mu.Lock()
	q.heads = append(q.heads, value)
	q.mu.Unlock()
	return q.Store.Subscribe(key)
}

// attempts returns the Waits flags of the attempts made by every owner
// value other than skip.
func (q *queueing) attempts(skip string) []bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []bool
	for v, w := range q.waits {
		if v != skip {
			out = append(out, w...)
		}
	}
	return out
}

// values returns the owner values that made attempts, but skip.
func (q *queueing) values(skip string) []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []string
	for v := range q.waits {
		if v != skip {
			out = append(out, v)
		}
	}
	return out
}

// holderValue returns the owner value of the lock a single acquisition
// made on q: the one value with attempts at the time.
func holderValue(t *testing.T, q *queueing) string {
	t.Helper()
	vs := q.values("")
	if len(vs) != 1 {
		t.Fatalf("%d owner values tried; want 1", len(vs))
	}
	return vs[0]
}

// TestQueuedWaitWithdraws: on a store that queues mutex and semaphore
// waiters, the attempts of a wait carry Lease.Waits, and a wait that ends
// without the lock withdraws its intent before TryLock returns, as a read
// or write wait does; a single attempt carries no Waits and withdraws
// nothing (it records no intent).
func TestQueuedWaitWithdraws(t *testing.T) {
	for _, kind := range []string{"mutex", "semaphore"} {
		t.Run(kind, func(t *testing.T) {
			store := newQueueing()
			d, err := distlock.New(store, distlock.WithSpin(5*time.Millisecond, 5*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			ctx := t.Context()
			lock := func(wait time.Duration) (*distlock.Lock, error) {
				if kind == "mutex" {
					return d.TryLock(ctx, "k", wait)
				}
				return d.Semaphore("k", 1).TryAcquire(ctx, wait)
			}
			holder, err := lock(0)
			if err != nil {
				t.Fatal(err)
			}
			hv := holderValue(t, store)

			if _, err := lock(0); !errors.Is(err, distlock.ErrNotAcquired) {
				t.Fatalf("single attempt: %v; want ErrNotAcquired", err)
			}
			if got := store.attempts(hv); len(got) != 1 || got[0] {
				t.Errorf("single attempt: Waits of its attempts = %v; want [false]", got)
			}
			store.mu.Lock()
			if len(store.withdrawn) != 0 {
				t.Errorf("single attempt withdrew %v; want nothing", store.withdrawn)
			}
			store.mu.Unlock()

			store.mu.Lock()
			clear(store.waits)
			store.waits[hv] = nil
			store.mu.Unlock()
			if _, err := lock(60 * time.Millisecond); !errors.Is(err, distlock.ErrNotAcquired) {
				t.Fatalf("wait: %v; want ErrNotAcquired", err)
			}
			got := store.attempts(hv)
			if len(got) == 0 {
				t.Fatal("the wait made no attempt")
			}
			for i, w := range got {
				if !w {
					t.Errorf("attempt %d of the wait: Waits false; want true", i)
				}
			}
			// TryLock waits 50ms for the withdrawal; a loaded machine
			// may take longer, and it goes on in the background.
			vs := store.values(hv)
			var withdrawn []string
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
				store.mu.Lock()
				withdrawn = append([]string(nil), store.withdrawn...)
				store.mu.Unlock()
				if len(withdrawn) > 0 || time.Now().After(deadline) {
					break
				}
			}
			if len(vs) != 1 || len(withdrawn) != 1 || withdrawn[0] != vs[0] {
				t.Errorf("withdrawn: %q; want the waiter's value %q", withdrawn, vs)
			}
			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestQueuedWaiterKeepsIntent: a queued waiter comes back within a third
// of its TTL whatever the spin policy says, so that its intent, which
// lasts one TTL from each attempt, never lapses while it waits. With a TTL
// of 300ms, a spin of an hour and notices that never come, a wait of
// 600ms makes an attempt at least every 100ms: the first, 4 more before
// the last at the deadline. Without the queue it makes 2 (1 when the
// first took the whole wait, on a loaded machine).
func TestQueuedWaiterKeepsIntent(t *testing.T) {
	for _, queued := range []bool{true, false} {
		var store backend.RemoteResource
		q := &deafQueue{queueing: newQueueing()}
		store = q
		if !queued {
			store = &counting{Store: q.Store}
		}
		d, err := distlock.New(store, distlock.WithSpin(longSpin, 0))
		if err != nil {
			t.Fatal(err)
		}
		ctx := distlock.ContextWithTTL(t.Context(), 300*time.Millisecond)
		holder, err := d.TryLock(distlock.ContextWithTTL(t.Context(), time.Minute), "k", 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.TryLock(ctx, "k", 600*time.Millisecond); !errors.Is(err, distlock.ErrNotAcquired) {
			t.Fatalf("queued=%v: %v; want ErrNotAcquired", queued, err)
		}
		if queued {
			// At most every 100ms: 7 at most, >= 5 on time; a loaded
			// machine's late timers may cost one.
			if n := len(q.attempts("")) - 1; n < 4 {
				t.Errorf("queued waiter made %d attempts in 600ms with a 300ms TTL; want >= 4 (one per 100ms)", n)
			}
			if q.plain.Load() != 0 || len(q.heads) != 1 {
				t.Errorf("queued waiter subscribed %d times, %d addressed; want once, addressed", q.plain.Load(), len(q.heads))
			}
		} else if n := store.(*counting).attempts.Load() - 1; n > 2 {
			t.Errorf("unqueued waiter made %d attempts; want at most 2 (first, and at the deadline)", n)
		}
		_ = holder.Unlock(t.Context())
		d.Close()
	}
}

// deafQueue is queueing whose notices never arrive (a fault: lost).
type deafQueue struct{ *queueing }

func (d *deafQueue) SubscribeHead(key, value string) (<-chan struct{}, func()) {
	d.mu.Lock()
	d.heads = append(d.heads, value)
	d.mu.Unlock()
	return make(chan struct{}), func() {}
}

// TestQueuedWaiterWokenByItsNotice: a queued waiter subscribes to the
// notices addressed to it (HeadNotifier.SubscribeHead with its owner
// value), not to the key's shared ones, and sleeps until one comes (up to
// backend.HeadPoll, 2s, with a long TTL): a release's notice wakes it at
// once. Its context ends 1.5s after the release: only the notice can get
// it the lock before then.
func TestQueuedWaiterWokenByItsNotice(t *testing.T) {
	store := newQueueing()
	d, err := distlock.New(store, distlock.WithSpin(longSpin, 0), distlock.WithDefaultTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	holder, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	got := make(chan error, 1)
	go func() {
		lk, err := d.TryLock(ctx, "k", distlock.WaitForever)
		if err == nil {
			err = lk.Unlock(t.Context())
		}
		got <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		store.mu.Lock()
		n := len(store.heads)
		store.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter did not subscribe to its notices")
		}
		time.Sleep(time.Millisecond)
	}
	if err := holder.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(1500*time.Millisecond, cancel)
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v; want the lock, woken by the release's notice", err)
	}
	if v := store.values(""); len(store.heads) != 1 || (store.heads[0] != v[0] && store.heads[0] != v[1]) || store.plain.Load() != 0 {
		t.Errorf("subscriptions: addressed %q, plain %d; want one addressed to the waiter's value", store.heads, store.plain.Load())
	}
}

// TestQueuedWaiterNoLastAttempt: a queued waiter behind the head (no
// notice addressed to it comes) sleeps to the end of its wait and makes
// no attempt there: it is not the head, so the attempt would find the
// lock held or kept for another. (Every waiter behind the head made one
// as its wait ended, each with only the facade's grace to be answered
// in; on a loaded PostgreSQL those were cut off, each cut-off closed its
// pooled connection, and the line stalled waiting for new ones.)
func TestQueuedWaiterNoLastAttempt(t *testing.T) {
	store := &deafQueue{newQueueing()}
	d, err := distlock.New(store, distlock.WithSpin(longSpin, 0), distlock.WithDefaultTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	holder, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Unlock(context.Background())
	skip := holderValue(t, store.queueing)
	if _, err := d.TryLock(t.Context(), "k", 300*time.Millisecond); !errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("waiter: %v; want ErrNotAcquired", err)
	}
	if got := store.attempts(skip); len(got) != 1 {
		t.Errorf("the waiter made %d attempts; want 1: the first, none at the end of its wait", len(got))
	}
}

// shortLine is queueing whose line serves only waits of a second or more
// (backend.MinQueueWaiter).
type shortLine struct{ *queueing }

func (s *shortLine) MinQueueWait(backend.Kind) time.Duration { return time.Second }

// TestShortWaitDoesNotQueue: on a store whose line serves only waits of
// at least MinQueueWait, a shorter wait is served as on a store without
// a line: no Lease.Waits on its attempts, no withdrawal, the key's
// notices; a wait that long queues.
func TestShortWaitDoesNotQueue(t *testing.T) {
	store := &shortLine{newQueueing()}
	d, err := distlock.New(store, distlock.WithSpin(5*time.Millisecond, 5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	holder, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Unlock(context.Background())
	skip := holderValue(t, store.queueing)
	if _, err := d.TryLock(t.Context(), "k", 100*time.Millisecond); !errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("short waiter: %v; want ErrNotAcquired", err)
	}
	store.mu.Lock()
	withdrawn, heads := len(store.withdrawn), len(store.heads)
	store.mu.Unlock()
	for _, w := range store.attempts(skip) {
		if w {
			t.Fatal("an attempt of a 100ms wait carried Lease.Waits; want none below MinQueueWait (1s)")
		}
	}
	if withdrawn != 0 || heads != 0 || store.plain.Load() == 0 {
		t.Errorf("a 100ms wait withdrew %d times and subscribed %d times addressed, %d plain; want 0, 0 and the key's notices", withdrawn, heads, store.plain.Load())
	}
	if _, err := d.TryLock(t.Context(), "k", 1100*time.Millisecond); !errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("long waiter: %v; want ErrNotAcquired", err)
	}
	store.mu.Lock()
	withdrawn, heads = len(store.withdrawn), len(store.heads)
	store.mu.Unlock()
	if withdrawn != 1 || heads != 1 {
		t.Errorf("a 1.1s wait withdrew %d times and subscribed %d times addressed; want once each: it queues", withdrawn, heads)
	}
}
