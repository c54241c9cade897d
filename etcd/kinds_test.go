package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
)

func kindLease(key string, kind backend.Kind, limit int, ttl time.Duration) *backend.Lease {
	l := lease(key, ttl)
	l.Kind, l.Limit = kind, int32(limit)
	return l
}

// acquireAsync starts an Acquire and returns the channel its error comes on.
func acquireAsync(ctx context.Context, r *Resource, l *backend.Lease, wait time.Duration) <-chan error {
	errc := make(chan error, 1)
	go func() { errc <- r.Acquire(ctx, l, time.Now().Add(wait)) }()
	return errc
}

// granted waits for errc to give nil.
func granted(t *testing.T, what string, errc <-chan error) {
	t.Helper()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("%s: Acquire = %v; want the lock", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not granted within 10s", what)
	}
}

// waiting checks that errc has given nothing yet: its Acquire still waits.
// A grant that should not come may come late; the next steps' checks (the
// order of grants) catch it then.
func waiting(t *testing.T, what string, errc <-chan error) {
	t.Helper()
	select {
	case err := <-errc:
		t.Fatalf("%s: Acquire = %v while it should wait", what, err)
	default:
	}
}

// TestSemaphoreQueue: a semaphore of limit 2 with two holders and four
// waiters grants the waiters in their order of arrival, one permit per
// release, and a release wakes at most two waiters (the first waiter,
// which watches the queue, and the one behind it, which watches the
// first and looks again when the first puts its key once it holds): no
// herd, whatever the number of waiters. Two releases at once let two
// waiters in.
func TestSemaphoreQueue(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			const limit = 2
			ctx := t.Context()
			key := uniqueKey(t)
			a := newResource(t, endpoints, m.opts...)
			w := newResource(t, endpoints, m.opts...) // every waiter: one wake-up counter
			var holders []*backend.Lease
			for range limit {
				l := kindLease(key, backend.KindSemaphore, limit, 10*time.Second)
				if err := a.Acquire(ctx, l, time.Time{}); err != nil {
					t.Fatal(err)
				}
				holders = append(holders, l)
			}
			if err := a.Acquire(ctx, kindLease(key, backend.KindSemaphore, limit, 10*time.Second), time.Time{}); err != backend.ErrNotAcquired {
				t.Fatalf("a third permit with a zero wait = %v; want ErrNotAcquired", err)
			}
			var ls []*backend.Lease
			var errcs []<-chan error
			for i := range 4 {
				l := kindLease(key, backend.KindSemaphore, limit, 10*time.Second)
				ls = append(ls, l)
				errcs = append(errcs, acquireAsync(ctx, w, l, time.Minute))
				waitKeys(t, a, key, limit+i+1)
			}
			step := func(what string, by *Resource, free []*backend.Lease, in []int) {
				t.Helper()
				before := w.wakeups.Load()
				for _, l := range free {
					if err := by.Release(ctx, l); err != nil {
						t.Fatalf("%s: Release: %v", what, err)
					}
				}
				for _, i := range in {
					granted(t, fmt.Sprintf("%s: waiter %d", what, i), errcs[i])
				}
				// Let a wrong grant, or a herd, show itself.
				time.Sleep(100 * time.Millisecond) // not synchronisation: a window for events that must not come
				for i := in[len(in)-1] + 1; i < len(errcs); i++ {
					waiting(t, fmt.Sprintf("%s: waiter %d", what, i), errcs[i])
				}
				if woke := w.wakeups.Load() - before; woke > int64(2*len(free)) {
					t.Errorf("%s: %d wake-ups for %d releases; want at most 2 each (no herd)", what, woke, len(free))
				}
			}
			step("first holder leaves", a, holders[:1], []int{0})
			step("second holder leaves", a, holders[1:], []int{1})
			step("both waiters granted leave at once", w, ls[:2], []int{2, 3})
			for _, l := range ls[2:] {
				if err := w.Release(ctx, l); err != nil {
					t.Fatal(err)
				}
			}
			for i := 1; i < len(ls); i++ {
				if ls[i].Token <= ls[i-1].Token {
					t.Errorf("token %d of waiter %d after %d", ls[i].Token, i, ls[i-1].Token)
				}
			}
			waitKeys(t, a, key, 0)
		})
	}
}

// TestReadWriteQueue: a read/write lock serves in order of arrival,
// readers together: a reader arriving behind a waiting writer waits for it
// (a zero wait fails), the writer gets the lock when the reader before it
// leaves, the reader behind it when it leaves, and a reader arriving then
// shares with that reader. Each release wakes one waiter.
func TestReadWriteQueue(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			ctx := t.Context()
			key := uniqueKey(t)
			a := newResource(t, endpoints, m.opts...)
			w := newResource(t, endpoints, m.opts...)
			r1 := kindLease(key, backend.KindRead, 0, 10*time.Second)
			if err := a.Acquire(ctx, r1, time.Time{}); err != nil {
				t.Fatal(err)
			}
			w1 := kindLease(key, backend.KindWrite, 0, 10*time.Second)
			wc := acquireAsync(ctx, w, w1, time.Minute)
			waitKeys(t, a, key, 2)
			if err := a.Acquire(ctx, kindLease(key, backend.KindRead, 0, 10*time.Second), time.Time{}); err != backend.ErrNotAcquired {
				t.Fatalf("a reader behind a waiting writer, zero wait = %v; want ErrNotAcquired", err)
			}
			r2 := kindLease(key, backend.KindRead, 0, 10*time.Second)
			rc := acquireAsync(ctx, w, r2, time.Minute)
			waitKeys(t, a, key, 3)
			before := w.wakeups.Load()
			if err := a.Release(ctx, r1); err != nil {
				t.Fatal(err)
			}
			granted(t, "the writer", wc)
			waiting(t, "the reader behind the writer", rc)
			if err := w.Release(ctx, w1); err != nil {
				t.Fatal(err)
			}
			granted(t, "the reader behind the writer", rc)
			if woke := w.wakeups.Load() - before; woke != 2 {
				t.Errorf("%d wake-ups for 2 releases; want one each", woke)
			}
			r3 := kindLease(key, backend.KindRead, 0, 10*time.Second)
			if err := a.Acquire(ctx, r3, time.Time{}); err != nil {
				t.Fatalf("a reader beside a reader = %v; want the lock", err)
			}
			if !(r1.Token < w1.Token && w1.Token < r2.Token && r2.Token < r3.Token) {
				t.Errorf("tokens r1 %d, w1 %d, r2 %d, r3 %d; want increasing", r1.Token, w1.Token, r2.Token, r3.Token)
			}
			for _, c := range []struct {
				r *Resource
				l *backend.Lease
			}{{w, r2}, {a, r3}} {
				if err := c.r.Release(ctx, c.l); err != nil {
					t.Fatal(err)
				}
			}
			waitKeys(t, a, key, 0)
		})
	}
}

// TestLimitMismatch: an acquire of a semaphore with another limit than
// its oldest key's fails with ErrLimitMismatch and leaves nothing, in both
// lease modes, whether it would have held or waited.
func TestLimitMismatch(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			ctx := t.Context()
			key := uniqueKey(t)
			a := newResource(t, endpoints, m.opts...)
			b := newResource(t, endpoints, m.opts...)
			l := kindLease(key, backend.KindSemaphore, 3, 10*time.Second)
			if err := a.Acquire(ctx, l, time.Time{}); err != nil {
				t.Fatal(err)
			}
			for _, wait := range []time.Duration{0, time.Second} {
				other := kindLease(key, backend.KindSemaphore, 2, 10*time.Second)
				deadline := time.Time{}
				if wait > 0 {
					deadline = time.Now().Add(wait)
				}
				if err := b.Acquire(ctx, other, deadline); !errors.Is(err, backend.ErrLimitMismatch) {
					t.Errorf("Acquire with limit 2 while held with 3 (wait %v) = %v; want ErrLimitMismatch", wait, err)
				}
				waitKeys(t, a, key, 1)
			}
			if err := a.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
			waitKeys(t, a, key, 0)
		})
	}
}

// TestLimitAgainstEveryKey: a semaphore's limit is checked
// against every key of its queue, and a failing acquire of another limit
// leaves no key that others would take for the queue's limit. A (limit
// 5) holds; M (limit 1) fails, and is held just after its transaction
// (where a key could stay until its clean-up); C (5)
// holds; A releases; N (1) must fail at once, though the queue's oldest
// key may then be M's; T (5) holds beside C. An N checked against M's key
// alone would wait and be granted beside T once C released: two holders
// of limits 1 and 5, and Inspect showing only N, with Limit 1.
func TestLimitAgainstEveryKey(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			ctx := t.Context()
			key := uniqueKey(t)
			r := newResource(t, endpoints, m.opts...)
			rm := newResource(t, endpoints, m.opts...)
			reached, proceed := make(chan struct{}), make(chan struct{})
			rm.hook = func(point string) {
				if point == "enqueued" {
					close(reached)
					<-proceed
				}
			}
			sem := func(limit int) *backend.Lease { return kindLease(key, backend.KindSemaphore, limit, 10*time.Second) }
			a := sem(5)
			if err := r.Acquire(ctx, a, time.Time{}); err != nil {
				t.Fatal(err)
			}
			mErr := make(chan error, 1)
			go func() { mErr <- rm.Acquire(ctx, sem(1), time.Now().Add(5*time.Second)) }()
			<-reached
			c := sem(5)
			if err := r.Acquire(ctx, c, time.Time{}); err != nil {
				close(proceed)
				t.Fatalf("C (limit 5) beside A (5), while M (1) fails: %v", err)
			}
			if err := r.Release(ctx, a); err != nil {
				t.Fatal(err)
			}
			nErr := make(chan error, 1)
			n := sem(1)
			go func() { nErr <- r.Acquire(ctx, n, time.Now().Add(5*time.Second)) }()
			var errN error
			select {
			case errN = <-nErr:
			case <-time.After(time.Second):
			}
			close(proceed)
			if err := <-mErr; !errors.Is(err, backend.ErrLimitMismatch) {
				t.Errorf("M (limit 1) beside A (5) = %v; want ErrLimitMismatch", err)
			}
			tl := sem(5)
			if err := r.Acquire(ctx, tl, time.Time{}); err != nil {
				t.Errorf("T (limit 5) beside C (5) = %v; want the permit", err)
			}
			if err := r.Release(ctx, c); err != nil {
				t.Fatal(err)
			}
			if errN == nil {
				select {
				case errN = <-nErr:
				case <-time.After(5 * time.Second):
					t.Fatal("N's Acquire did not return")
				}
			}
			if !errors.Is(errN, backend.ErrLimitMismatch) {
				t.Errorf("N (limit 1) while C (5) holds = %v; want ErrLimitMismatch at once", errN)
				if errN == nil {
					defer r.Release(ctx, n)
				}
			}
			in, err := r.Inspect(ctx, key, backend.KindSemaphore)
			if err != nil {
				t.Fatal(err)
			}
			if in.Limit != 5 || len(in.Holders) != 1 || in.Holders[0].Token != tl.Token {
				t.Errorf("Inspect = %+v; want T (token %d) alone, with limit 5", in, tl.Token)
			}
			if err := r.Release(ctx, tl); err != nil {
				t.Fatal(err)
			}
			waitKeys(t, r, key, 0)
		})
	}
}

// TestMixedLimitsRandomized: clients of two lease modes take permits of
// one semaphore with limits 1 and 3 at random, with random waits and
// holds, for a few seconds. Checked, at every grant: every holder asked
// for the same limit, and there are no more holders than it; nothing is
// left. Each acquire pauses up to 3ms after its transaction returns (a
// slow client), where an acquire failing for its limit used to leave its
// key for others to see. The seed is logged.
func TestMixedLimitsRandomized(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	intn := newSeeded(t, 30).intn
	var rs []*Resource
	for i := range 4 {
		r := newResource(t, endpoints, modes[i%2].opts...)
		r.hook = func(point string) {
			if point == "enqueued" {
				time.Sleep(time.Duration(intn(3000)) * time.Microsecond) // the fault: a slow client
			}
		}
		rs = append(rs, r)
	}
	key := uniqueKey(t)
	var (
		mu                           sync.Mutex
		holders                      = map[int]int{} // limit -> holders
		failures                     []string
		grants, mismatches, timeouts atomic.Int64
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	end := time.Now().Add(4 * time.Second)
	var wg sync.WaitGroup
	for i := range 8 {
		r := rs[i%len(rs)]
		wg.Go(func() {
			for time.Now().Before(end) {
				limit := 1 + 2*intn(2)
				l := kindLease(key, backend.KindSemaphore, limit, time.Minute)
				l.AutoRenew = intn(2) == 0
				deadline := time.Time{}
				if intn(3) > 0 {
					deadline = time.Now().Add(time.Duration(intn(100)) * time.Millisecond)
				}
				err := r.Acquire(context.Background(), l, deadline)
				switch {
				case errors.Is(err, backend.ErrNotAcquired):
					timeouts.Add(1)
					continue
				case errors.Is(err, backend.ErrLimitMismatch):
					mismatches.Add(1)
					continue
				case err != nil:
					fail("Acquire(limit %d) = %v", limit, err)
					continue
				}
				grants.Add(1)
				mu.Lock()
				for other, n := range holders {
					if other != limit && n > 0 {
						failures = append(failures, fmt.Sprintf("a permit of limit %d granted while %d of limit %d hold", limit, n, other))
					}
				}
				if holders[limit]++; holders[limit] > limit {
					failures = append(failures, fmt.Sprintf("%d permits of a semaphore of %d", holders[limit], limit))
				}
				mu.Unlock()
				time.Sleep(time.Duration(intn(3000)) * time.Microsecond) // the hold: work, not synchronisation
				mu.Lock()
				holders[limit]--
				mu.Unlock()
				if err := r.Release(context.Background(), l); err != nil {
					fail("Release(limit %d) = %v", limit, err)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d grants, %d limit mismatches, %d ended at their deadline", grants.Load(), mismatches.Load(), timeouts.Load())
	for _, f := range failures {
		t.Error(f)
	}
	if grants.Load() == 0 || mismatches.Load() == 0 {
		t.Errorf("the run tested too little")
	}
	waitKeys(t, rs[0], key, 0)
}

// TestEntryValue: a queue key's value reads back whatever bytes the owner
// value and the label hold, separators included.
func TestEntryValue(t *testing.T) {
	for _, c := range []struct {
		owner, label string
		limit        int
		ttl          time.Duration
	}{
		{"v", "", 0, time.Second}, {"v", "host-1", 3, time.Minute}, {"a|b|", "|1|2|", 7, 2 * time.Second},
		{"", "", 0, time.Second}, {"\x00\xff", "ключ", 1 << 40, MaxTTL},
	} {
		v := entryValue(c.owner, c.label, c.limit, c.ttl)
		owner, e, ok := parseEntry([]byte(v))
		if !ok || owner != c.owner || e.label != c.label || e.limit != c.limit || e.ttl != c.ttl {
			t.Errorf("parseEntry(entryValue(%q, %q, %d, %v)) = %q, %+v, %v", c.owner, c.label, c.limit, c.ttl, owner, e, ok)
		}
	}
	for _, bad := range []string{"", "v", "v|", "v|x|1|1", "v|5|1|1", "v|-1|1|1", "v|0|1", "v|0|0|fffffffffffffff"} {
		if _, _, ok := parseEntry([]byte(bad)); ok {
			t.Errorf("parseEntry(%q) ok; want not", bad)
		}
	}
}

func FuzzEntryValue(f *testing.F) {
	f.Add("owner", "label", 3, int64(60))
	f.Add("a|b", "|", 0, int64(1))
	f.Fuzz(func(t *testing.T, owner, label string, limit int, secs int64) {
		if limit < 0 || secs < 1 || secs > int64(MaxTTL/time.Second) {
			return
		}
		ttl := time.Duration(secs) * time.Second
		o, e, ok := parseEntry([]byte(entryValue(owner, label, limit, ttl)))
		if !ok || o != owner || e.label != label || e.limit != limit || e.ttl != ttl {
			t.Errorf("round trip of %q, %q, %d, %v = %q, %+v, %v", owner, label, limit, ttl, o, e, ok)
		}
	})
}

// TestKindsRandomized runs semaphore holders (limit 2) and readers and
// writers of one read/write lock from four Resources, both lease modes,
// with random waits, holds and cancellations, for a few seconds. The
// holdings are counted from Acquire's return to the call of Release, a
// part of what the store grants. Checked: never more than 2 permits, never
// a writer with a reader or another writer, a write grant's token above
// every grant's that returned before it, a read grant's above every write
// grant's that returned before it, and nothing left. The seed is logged.
func TestKindsRandomized(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	intn := newSeeded(t, 24).intn
	var rs []*Resource
	for i := range 4 {
		rs = append(rs, newResource(t, endpoints, modes[i%2].opts...))
	}
	semKey, rwKey := uniqueKey(t), uniqueKey(t)
	const limit = 2
	var (
		mu                        sync.Mutex
		permits, readers          int
		writer                    bool
		maxAny, maxWrite          uint64
		failures                  []string
		grants, cancels, timeouts atomic.Int64
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	end := time.Now().Add(4 * time.Second)
	var wg sync.WaitGroup
	for i := range 12 {
		r := rs[i%len(rs)]
		wg.Go(func() {
			for time.Now().Before(end) {
				var l *backend.Lease
				switch i % 3 {
				case 0:
					l = kindLease(semKey, backend.KindSemaphore, limit, time.Minute)
				case 1:
					l = kindLease(rwKey, backend.KindRead, 0, time.Minute)
				default:
					l = kindLease(rwKey, backend.KindWrite, 0, time.Minute)
				}
				l.AutoRenew = intn(2) == 0
				ctx, cancel := context.WithCancel(context.Background())
				if intn(4) == 0 {
					time.AfterFunc(time.Duration(intn(30))*time.Millisecond, cancel)
				}
				deadline := time.Time{}
				if intn(5) > 0 {
					deadline = time.Now().Add(time.Duration(intn(200)) * time.Millisecond)
				}
				err := r.Acquire(ctx, l, deadline)
				cancel()
				switch {
				case errors.Is(err, backend.ErrNotAcquired):
					timeouts.Add(1)
					continue
				case errors.Is(err, context.Canceled):
					cancels.Add(1)
					continue
				case err != nil:
					fail("Acquire(%v) = %v", l.Kind, err)
					continue
				}
				grants.Add(1)
				mu.Lock()
				switch l.Kind {
				case backend.KindSemaphore:
					if permits++; permits > limit {
						fail("%d permits of a semaphore of %d", permits, limit)
					}
				case backend.KindRead:
					if readers++; writer {
						fail("a reader holds with a writer")
					}
					if l.Token <= maxWrite {
						fail("read token %d after a write's %d", l.Token, maxWrite)
					}
					maxAny = max(maxAny, l.Token)
				case backend.KindWrite:
					if writer || readers > 0 {
						fail("a writer holds with a writer (%v) or %d readers", writer, readers)
					}
					writer = true
					if l.Token <= maxAny {
						fail("write token %d after a grant's %d", l.Token, maxAny)
					}
					maxAny, maxWrite = l.Token, l.Token
				}
				mu.Unlock()
				time.Sleep(time.Duration(intn(5000)) * time.Microsecond) // the hold: work, not synchronisation
				mu.Lock()
				switch l.Kind {
				case backend.KindSemaphore:
					permits--
				case backend.KindRead:
					readers--
				case backend.KindWrite:
					writer = false
				}
				mu.Unlock()
				if err := r.Release(context.Background(), l); err != nil {
					fail("Release(%v) = %v", l.Kind, err)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d grants, %d waits cancelled, %d ended at their deadline", grants.Load(), cancels.Load(), timeouts.Load())
	for _, f := range failures {
		t.Error(f)
	}
	if grants.Load() == 0 || cancels.Load() == 0 || timeouts.Load() == 0 {
		t.Errorf("the run tested too little")
	}
	for _, k := range []string{semKey, rwKey} {
		waitKeys(t, rs[0], k, 0)
	}
}

// TestInspect: Inspect lists the holders of each kind, not the waiters:
// a mutex's first key, a semaphore's oldest Limit keys, a read/write
// lock's writer alone or its readers up to the first writer; each with
// its token, label and time left (on a shared lease, at most the lock's
// TTL), in both lease modes. It touches nothing.
func TestInspect(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			ctx := t.Context()
			r := newResource(t, endpoints, m.opts...)
			w := newResource(t, endpoints, m.opts...)
			take := func(key string, kind backend.Kind, limit int, label string) *backend.Lease {
				t.Helper()
				l := kindLease(key, kind, limit, 5*time.Second)
				l.Label = label
				if err := r.Acquire(ctx, l, time.Time{}); err != nil {
					t.Fatalf("Acquire(%v %q): %v", kind, label, err)
				}
				return l
			}
			queue := func(key string, kind backend.Kind, limit, n int) {
				t.Helper()
				l := kindLease(key, kind, limit, 5*time.Second)
				l.Label = "waiter"
				wctx, cancel := context.WithCancel(ctx)
				t.Cleanup(cancel)
				go func() { _ = w.Acquire(wctx, l, time.Now().Add(time.Minute)) }()
				waitKeys(t, r, key, n)
			}
			check := func(what, key string, kind backend.Kind, limit int, want ...*backend.Lease) {
				t.Helper()
				before, _ := r.Leftovers(ctx, key)
				in, err := r.Inspect(ctx, key, kind)
				if err != nil {
					t.Fatalf("%s: Inspect = %v", what, err)
				}
				if in.Limit != limit || len(in.Holders) != len(want) {
					t.Fatalf("%s: Inspect = %+v; want %d holders, limit %d", what, in, len(want), limit)
				}
				for i, l := range want {
					hd := in.Holders[i]
					if hd.Token != l.Token || hd.Label != l.Label || hd.Kind != l.Kind || hd.TTL < 0 || hd.TTL > l.TTL {
						t.Errorf("%s: holder %d = %+v; want token %d, label %q, kind %v, TTL in [0, %v]", what, i, hd, l.Token, l.Label, l.Kind, l.TTL)
					}
				}
				if after, _ := r.Leftovers(ctx, key); !slices.Equal(before, after) {
					t.Errorf("%s: Inspect changed the queue: %q, then %q", what, before, after)
				}
			}
			key := uniqueKey(t)
			check("a free mutex", key, backend.KindMutex, 0)
			mu := take(key, backend.KindMutex, 0, "holder")
			queue(key, backend.KindMutex, 0, 2)
			check("a mutex with a waiter", key, backend.KindMutex, 0, mu)

			s1, s2 := take(key, backend.KindSemaphore, 2, "s1"), take(key, backend.KindSemaphore, 2, "s2")
			queue(key, backend.KindSemaphore, 2, 5)
			check("a semaphore of 2 with a waiter", key, backend.KindSemaphore, 2, s1, s2)

			rw := uniqueKey(t)
			wr := take(rw, backend.KindWrite, 0, "writer")
			queue(rw, backend.KindRead, 0, 2)
			check("a writer with a reader waiting", rw, backend.KindWrite, 0, wr)
			check("the same, asked as a read", rw, backend.KindRead, 0, wr)

			rd := uniqueKey(t)
			r1, r2 := take(rd, backend.KindRead, 0, "r1"), take(rd, backend.KindRead, 0, "r2")
			queue(rd, backend.KindWrite, 0, 3)
			queue(rd, backend.KindRead, 0, 4)
			check("two readers, a writer and a reader waiting", rd, backend.KindWrite, 0, r1, r2)
		})
	}
}

// TestSemTag: a semaphore key's tag reads back its limit, and every tag
// is as long as every other (none is a prefix of another).
func TestSemTag(t *testing.T) {
	for _, limit := range []int{1, 2, 15, 16, 1<<31 - 1, 1 << 40, 1<<63 - 1} {
		tag := semTag(limit)
		if len(tag) != semTagLen {
			t.Errorf("semTag(%d) = %q: %d bytes; want %d", limit, tag, len(tag), semTagLen)
		}
		if got, ok := semTagLimit(tag + "rid-0"); !ok || got != limit {
			t.Errorf("semTagLimit(semTag(%d)) = %d, %v", limit, got, ok)
		}
	}
	for _, bad := range []string{"", "rid-0", "000000000000000g-x", "0000000000000001x", "8000000000000000-x"} {
		if _, ok := semTagLimit(bad); ok {
			t.Errorf("semTagLimit(%q) ok; want not", bad)
		}
	}
}
