package testsuite

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
)

// unsupported checks, for a kind the harness declares the store does not
// hold, that asking for it fails with ErrUnsupported before any I/O, and
// reports whether the kind is unsupported.
func unsupported(t *testing.T, h *Harness, kind backend.Kind) bool {
	t.Helper()
	reason, ok := h.Unsupported[kind]
	if !ok {
		return false
	}
	r, c := wrapCounting(t, h.NewResource(t))
	d := newLockOver(t, r)
	var err error
	switch kind {
	case backend.KindSemaphore:
		_, err = d.Semaphore(Key(t), 2).TryAcquire(t.Context(), 0)
	case backend.KindRead:
		_, err = d.RWMutex(Key(t)).TryRLock(t.Context(), 0)
	case backend.KindWrite:
		_, err = d.RWMutex(Key(t)).TryLock(t.Context(), 0)
	}
	if !errors.Is(err, distlock.ErrUnsupported) {
		t.Errorf("%v lock on a store that does not hold them (%s) = %v; want ErrUnsupported", kind, reason, err)
	}
	wantNoCalls(t, c, fmt.Sprintf("an unsupported %v lock", kind))
	t.Logf("%v locks: not held by the store (%s)", kind, reason)
	return true
}

// testSemaphore: at most limit holders at once, tokens strictly
// increasing, limits that disagree refused, a frozen holder's permit lost
// at its TTL, cancelled waits leave nothing, bad limits refused before I/O,
// reentrancy through the context.
func testSemaphore(t *testing.T, h *Harness) {
	if unsupported(t, h, backend.KindSemaphore) {
		return
	}
	t.Run("Limit", func(t *testing.T) { testSemaphoreLimit(t, h) })
	t.Run("Tokens", func(t *testing.T) { testSemaphoreTokens(t, h) })
	t.Run("LimitMismatch", func(t *testing.T) { testSemaphoreMismatch(t, h) })
	t.Run("FrozenHolder", func(t *testing.T) { testSemaphoreFrozen(t, h) })
	t.Run("CancelledWait", func(t *testing.T) { testSemaphoreCancelled(t, h) })
	t.Run("BadLimit", func(t *testing.T) { testSemaphoreBadLimit(t, h) })
	t.Run("LimitRange", func(t *testing.T) { testSemaphoreLimitRange(t, h) })
	t.Run("Reentrancy", func(t *testing.T) { testSemaphoreReentrancy(t, h) })
}

// contend runs workers goroutines spread over procs DistributeLocks for
// about d, each taking a lock with take, holding it a few milliseconds
// with the check, and letting go.
func contend(t *testing.T, ds []*distlock.DistributeLock, workers int, d time.Duration,
	take func(d *distlock.DistributeLock, i int) (*distlock.Lock, func(), error)) {
	t.Helper()
	var wg sync.WaitGroup
	var unanswered atomic.Int64
	end := time.Now().Add(d)
	for i := range workers {
		dl := ds[i%len(ds)]
		wg.Go(func() {
			for time.Now().Before(end) {
				lk, leave, err := take(dl, i)
				if errors.Is(err, distlock.ErrNotAcquired) {
					continue
				}
				if errors.Is(err, context.DeadlineExceeded) {
					// No answer within the wait: a time (a loaded
					// machine), not a wrong answer; the facade cleans
					// up after it, and the callers' checks still see
					// every grant.
					unanswered.Add(1)
					continue
				}
				if err != nil {
					t.Errorf("worker %d: %v", i, err)
					return
				}
				time.Sleep(time.Duration(rand.IntN(4000)) * time.Microsecond) // the hold: work, not synchronisation
				leave()
				if err := lk.Unlock(context.Background()); err != nil {
					t.Errorf("worker %d: Unlock = %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := unanswered.Load(); n > 0 {
		t.Logf("%d attempts without an answer within their wait", n)
	}
}

func procs(t *testing.T, h *Harness, n int, opts ...distlock.Option) []*distlock.DistributeLock {
	ds := make([]*distlock.DistributeLock, n)
	for i := range ds {
		ds[i] = newLock(t, h, opts...)
	}
	return ds
}

func testSemaphoreLimit(t *testing.T, h *Harness) {
	const limit = 3
	key := Key(t)
	ds := procs(t, h, 3)
	var in, most atomic.Int64
	var grants atomic.Int64
	contend(t, ds, 12, 2*time.Second, func(d *distlock.DistributeLock, _ int) (*distlock.Lock, func(), error) {
		lk, err := d.Semaphore(key, limit).TryAcquire(context.Background(), time.Second)
		if err != nil {
			return nil, nil, err
		}
		n := in.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if n > limit {
			t.Errorf("%d holders of a semaphore of %d", n, limit)
		}
		grants.Add(1)
		return lk, func() { in.Add(-1) }, nil
	})
	t.Logf("%d grants, at most %d holders at once", grants.Load(), most.Load())
	if most.Load() < 2 {
		t.Errorf("never more than %d holder at once: the semaphore admitted one at a time", most.Load())
	}
	noLeftovers(t, h, key)
}

func testSemaphoreTokens(t *testing.T, h *Harness) {
	if h.NoToken {
		t.Skip("the store makes no tokens (the harness says so)")
	}
	key := Key(t)
	a, b := newLock(t, h), newLock(t, h)
	var last uint64
	held := map[uint64]bool{}
	var locks []*distlock.Lock
	for i := range 6 {
		d := a
		if i%2 == 1 {
			d = b
		}
		lk := must(t)(d.Semaphore(key, 2).TryAcquire(t.Context(), 5*time.Second))
		if lk.Token() <= last || held[lk.Token()] {
			t.Errorf("grant %d: token %d after %d; want strictly increasing", i, lk.Token(), last)
		}
		last = lk.Token()
		held[lk.Token()] = true
		locks = append(locks, lk)
		if len(locks) == 2 { // keep two holders, let the oldest go
			mustUnlock(t, locks[0])
			locks = locks[1:]
		}
	}
	for _, lk := range locks {
		mustUnlock(t, lk)
	}
	noLeftovers(t, h, key)
}

// must returns a function that returns the lock of an acquire's results,
// failing t on an error: must(t)(sem.TryAcquire(ctx, wait)).
func must(t *testing.T) func(*distlock.Lock, error) *distlock.Lock {
	return func(lk *distlock.Lock, err error) *distlock.Lock {
		t.Helper()
		if err != nil {
			t.Fatalf("acquire = %v; want a lock", err)
		}
		return lk
	}
}

func testSemaphoreMismatch(t *testing.T, h *Harness) {
	key := Key(t)
	a, b := newLock(t, h), newLock(t, h)
	lk := must(t)(a.Semaphore(key, 2).TryAcquire(t.Context(), 0))
	got, err := b.Semaphore(key, 3).TryAcquire(t.Context(), 200*time.Millisecond)
	if got != nil || !errors.Is(err, distlock.ErrLimitMismatch) {
		t.Errorf("acquire with limit 3 while held with 2 = %v, %v; want ErrLimitMismatch", got, err)
	}
	mustUnlock(t, lk)
	// With no holder left, the next acquire sets the limit anew.
	lk = must(t)(b.Semaphore(key, 3).TryAcquire(t.Context(), 5*time.Second))
	mustUnlock(t, lk)
	noLeftovers(t, h, key)
}

func testSemaphoreFrozen(t *testing.T, h *Harness) {
	key := Key(t)
	ttl := h.ttl()
	a, b := newLock(t, h), newLock(t, h)
	frozen := must(t)(a.Semaphore(key, 1).TryAcquire(distlock.ContextWithTTL(t.Context(), ttl), 0))
	// The holder does nothing (no renewal): its permit ends with its TTL.
	next := must(t)(b.Semaphore(key, 1).TryAcquire(t.Context(), 10*ttl+5*time.Second))
	waitClosed(t, frozen.Done(), 5*time.Second, "the frozen holder's permit")
	if err := frozen.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("Unlock of the expired permit = %v; want ErrNotHeld", err)
	}
	mustUnlock(t, next)
	noLeftovers(t, h, key)
}

func testSemaphoreCancelled(t *testing.T, h *Harness) {
	key := Key(t)
	a, b := newLock(t, h), newLock(t, h)
	lk := must(t)(a.Semaphore(key, 1).TryAcquire(t.Context(), 0))
	before, err := h.Leftovers(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 150*time.Millisecond)
	got, err := b.Semaphore(key, 1).TryAcquire(ctx, time.Minute)
	cancel()
	if got != nil || !errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled wait = %v, %v; want ErrNotAcquired and DeadlineExceeded", got, err)
	}
	sameLeftovers(t, h, key, before)
	mustUnlock(t, lk)
	noLeftovers(t, h, key)
}

// sameLeftovers asserts the store holds for key what it held before,
// polling for clean-ups that land in the background.
func sameLeftovers(t *testing.T, h *Harness, key string, want []string) {
	t.Helper()
	slices.Sort(want)
	var got []string
	var err error
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		got, err = h.Leftovers(context.Background(), key)
		slices.Sort(got)
		if err == nil && slices.Equal(got, want) {
			return
		}
	}
	t.Fatalf("store holds %q for %q (err %v); want only %q", got, key, err, want)
}

func testSemaphoreBadLimit(t *testing.T, h *Harness) {
	r, c := wrapCounting(t, h.NewResource(t))
	d := newLockOver(t, r)
	for _, limit := range []int{0, -1, -1 << 62} {
		lk, err := d.Semaphore(Key(t), limit).TryAcquire(t.Context(), time.Second)
		wantInvalid(t, fmt.Sprintf("limit %d", limit), lk, err)
	}
	wantNoCalls(t, c, "a bad limit")
}

// testSemaphoreLimitRange: every store holds a semaphore of limit 2^31-1
// (math.MaxInt32) and none of a larger limit: the facade refuses those
// with ErrInvalid before any I/O, the same on every store (not failing
// at the driver or the server, nor taken by one store and not another).
func testSemaphoreLimitRange(t *testing.T, h *Harness) {
	r, c := wrapCounting(t, h.NewResource(t))
	d := newLockOver(t, r)
	key := Key(t)
	lk, err := d.Semaphore(key, math.MaxInt32).TryAcquire(t.Context(), 0)
	if err != nil {
		t.Fatalf("a permit of a semaphore of limit %d = %v; want it", math.MaxInt32, err)
	}
	if err := lk.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	noLeftovers(t, h, key)
	c.calls.Store(0)
	above := int64(math.MaxInt32) + 1
	for _, limit := range []int64{above, 1 << 40, math.MaxInt64} {
		lk, err := d.Semaphore(Key(t), int(limit)).TryAcquire(t.Context(), time.Second)
		wantInvalid(t, fmt.Sprintf("limit %d", limit), lk, err)
	}
	wantNoCalls(t, c, "a limit above 2^31-1")
}

func testSemaphoreReentrancy(t *testing.T, h *Harness) {
	key := Key(t)
	a := newLock(t, h)
	sem := a.Semaphore(key, 1)
	lk := must(t)(sem.TryAcquire(t.Context(), 0))
	nested := must(t)(sem.TryAcquire(distlock.ContextWithLock(t.Context(), lk), 0))
	if nested.Token() != lk.Token() {
		t.Errorf("nested acquire took permit %d; want the held one, %d", nested.Token(), lk.Token())
	}
	mustUnlock(t, nested)
	mustUnlock(t, lk)
	noLeftovers(t, h, key)
}

// testRWMutex: readers share, a writer excludes readers and writers, a
// waiting writer gets in through a stream of readers, tokens as promised,
// a cancelled writer's intent is withdrawn, no upgrade through the context.
func testRWMutex(t *testing.T, h *Harness) {
	readOK := !unsupported(t, h, backend.KindRead)
	writeOK := !unsupported(t, h, backend.KindWrite)
	if !readOK || !writeOK {
		if readOK != writeOK {
			t.Errorf("the harness declares one side of the read/write lock unsupported, not both")
		}
		return
	}
	t.Run("ReadersShare", func(t *testing.T) { testRWReadersShare(t, h) })
	t.Run("Exclusion", func(t *testing.T) { testRWExclusion(t, h) })
	t.Run("WriterNotStarved", func(t *testing.T) { testRWWriterNotStarved(t, h) })
	t.Run("Tokens", func(t *testing.T) { testRWTokens(t, h) })
	t.Run("CancelledWriter", func(t *testing.T) { testRWCancelledWriter(t, h) })
	t.Run("NoUpgrade", func(t *testing.T) { testRWNoUpgrade(t, h) })
	t.Run("ReadersWokenTogether", func(t *testing.T) { testRWReadersWokenTogether(t, h) })
	t.Run("KindsDistinct", func(t *testing.T) { testKindsDistinct(t, h) })
}

func testRWReadersShare(t *testing.T, h *Harness) {
	key := Key(t)
	var locks []*distlock.Lock
	for _, d := range procs(t, h, 3) {
		for range 2 {
			locks = append(locks, must(t)(d.RWMutex(key).TryRLock(t.Context(), 0)))
		}
	}
	w, err := newLock(t, h).RWMutex(key).TryLock(t.Context(), 0)
	wantNotAcquired(t, w, err)
	for _, lk := range locks {
		mustUnlock(t, lk)
	}
	noLeftovers(t, h, key)
}

func testRWExclusion(t *testing.T, h *Harness) {
	key := Key(t)
	var readers, writers, reads, writes atomic.Int64
	contend(t, procs(t, h, 3), 9, 2*time.Second, func(d *distlock.DistributeLock, i int) (*distlock.Lock, func(), error) {
		rw := d.RWMutex(key)
		if i%3 == 0 { // a writer
			lk, err := rw.TryLock(context.Background(), time.Second)
			if err != nil {
				return nil, nil, err
			}
			if w, r := writers.Add(1), readers.Load(); w > 1 || r > 0 {
				t.Errorf("a writer holds with %d writers and %d readers", w, r)
			}
			writes.Add(1)
			return lk, func() { writers.Add(-1) }, nil
		}
		lk, err := rw.TryRLock(context.Background(), time.Second)
		if err != nil {
			return nil, nil, err
		}
		readers.Add(1)
		if w := writers.Load(); w > 0 {
			t.Errorf("a reader holds with %d writers", w)
		}
		reads.Add(1)
		return lk, func() { readers.Add(-1) }, nil
	})
	t.Logf("%d reads, %d writes", reads.Load(), writes.Load())
	if writes.Load() == 0 || reads.Load() == 0 {
		t.Errorf("%d reads and %d writes: both sides must have held", reads.Load(), writes.Load())
	}
	noLeftovers(t, h, key)
}

// testRWWriterNotStarved: readers keep the lock read-held at every moment
// (each takes it again as soon as it lets go, and they overlap); a writer
// that waits still gets it, because new readers queue behind it.
func testRWWriterNotStarved(t *testing.T, h *Harness) {
	key := Key(t)
	ds := procs(t, h, 2)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads atomic.Int64
	for i := range 4 {
		d := ds[i%2]
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				lk, err := d.RWMutex(key).TryRLock(context.Background(), 20*time.Second)
				if err != nil {
					t.Errorf("reader: %v", err)
					return
				}
				reads.Add(1)
				time.Sleep(20 * time.Millisecond) // the read: work, not synchronisation
				if err := lk.Unlock(context.Background()); err != nil {
					t.Errorf("reader Unlock: %v", err)
					return
				}
			}
		})
	}
	for reads.Load() < 8 { // the stream of readers is flowing
		time.Sleep(5 * time.Millisecond)
	}
	w, err := newLock(t, h).RWMutex(key).TryLock(t.Context(), 15*time.Second)
	close(stop)
	if err != nil {
		t.Errorf("a writer waiting behind a stream of readers = %v; want the lock", err)
	} else {
		mustUnlock(t, w)
	}
	wg.Wait()
	noLeftovers(t, h, key)
}

func testRWTokens(t *testing.T, h *Harness) {
	if h.NoToken {
		t.Skip("the store makes no tokens (the harness says so)")
	}
	key := Key(t)
	a, b := newLock(t, h), newLock(t, h)
	var maxAny, maxWrite uint64
	for i := range 8 {
		d := a
		if i%2 == 1 {
			d = b
		}
		if i%3 == 2 {
			lk := must(t)(d.RWMutex(key).TryLock(t.Context(), 5*time.Second))
			if lk.Token() <= maxAny {
				t.Errorf("write token %d after a grant's %d; want larger than every earlier grant's", lk.Token(), maxAny)
			}
			maxAny, maxWrite = lk.Token(), lk.Token()
			mustUnlock(t, lk)
			continue
		}
		r1 := must(t)(d.RWMutex(key).TryRLock(t.Context(), 5*time.Second))
		r2 := must(t)(b.RWMutex(key).TryRLock(t.Context(), 5*time.Second))
		for _, lk := range []*distlock.Lock{r1, r2} {
			if lk.Token() <= maxWrite {
				t.Errorf("read token %d after a write's %d; want larger than every earlier write's", lk.Token(), maxWrite)
			}
			maxAny = max(maxAny, lk.Token())
		}
		mustUnlock(t, r1)
		mustUnlock(t, r2)
	}
	noLeftovers(t, h, key)
}

// testRWCancelledWriter: a writer that gives up withdraws its intent:
// nothing of it is left, and readers get in at once.
func testRWCancelledWriter(t *testing.T, h *Harness) {
	key := Key(t)
	a, b, c := newLock(t, h), newLock(t, h), newLock(t, h)
	r := must(t)(a.RWMutex(key).TryRLock(t.Context(), 0))
	before, err := h.Leftovers(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	w, err := b.RWMutex(key).TryLock(ctx, time.Minute)
	cancel()
	if w != nil || !errors.Is(err, distlock.ErrNotAcquired) {
		t.Errorf("cancelled writer = %v, %v; want ErrNotAcquired", w, err)
	}
	sameLeftovers(t, h, key, before)
	r2 := must(t)(c.RWMutex(key).TryRLock(t.Context(), 5*time.Second))
	mustUnlock(t, r2)
	mustUnlock(t, r)
	noLeftovers(t, h, key)
}

func testRWNoUpgrade(t *testing.T, h *Harness) {
	key := Key(t)
	r, c := wrapCounting(t, h.NewResource(t))
	d := newLockOver(t, r)
	rw := d.RWMutex(key)
	lk := must(t)(rw.TryRLock(t.Context(), 0))
	calls := c.calls.Load()
	w, err := rw.TryLock(distlock.ContextWithLock(t.Context(), lk), time.Minute)
	if w != nil || !errors.Is(err, distlock.ErrReentrancy) {
		t.Errorf("write under a held read with the context = %v, %v; want ErrReentrancy", w, err)
	}
	if n := c.calls.Load() - calls; n != 0 {
		t.Errorf("the refused upgrade made %d store calls; want none", n)
	}
	again := must(t)(rw.TryRLock(distlock.ContextWithLock(t.Context(), lk), 0))
	if again.Token() != lk.Token() {
		t.Errorf("nested read took token %d; want the held %d", again.Token(), lk.Token())
	}
	mustUnlock(t, again)
	mustUnlock(t, lk)
	noLeftovers(t, h, key)
}

// testKindsDistinct: a key's mutex, semaphore and read/write lock are
// distinct locks.
func testKindsDistinct(t *testing.T, h *Harness) {
	key := Key(t)
	a, b := newLock(t, h), newLock(t, h)
	m := mustLock(t, a, t.Context(), key, 0)
	w := must(t)(b.RWMutex(key).TryLock(t.Context(), 0))
	var s *distlock.Lock
	if _, no := h.Unsupported[backend.KindSemaphore]; !no {
		s = must(t)(b.Semaphore(key, 1).TryAcquire(t.Context(), 0))
	}
	for _, lk := range []*distlock.Lock{m, w, s} {
		if lk != nil {
			mustUnlock(t, lk)
		}
	}
	noLeftovers(t, h, key)
}

// testRWReadersWokenTogether: readers of one process queued behind a
// writer all take the lock soon after the writer's release, woken by the
// store (a release notice or a watch), not by their retry timers: the
// spin is a minute, longer than the test allows them. A process whose
// waiters shared one wake-up per notice would let one reader in and leave
// the others asleep.
func testRWReadersWokenTogether(t *testing.T, h *Harness) {
	r := h.NewResource(t)
	key := Key(t)
	notifies := false
	if n, ok := r.(backend.Notifier); ok {
		ch, cancel := n.Subscribe(key)
		cancel()
		notifies = ch != nil
	}
	if _, waits := r.(backend.Waiter); !notifies && !waits {
		t.Skipf("%T sends no release notices here: waiters retry on their timers", r)
	}
	w := must(t)(newLock(t, h).RWMutex(key).TryLock(t.Context(), 0))
	d := newLock(t, h, distlock.WithSpin(time.Minute, 0))
	const readers = 4
	got := make(chan error, readers)
	locks := make(chan *distlock.Lock, readers)
	for range readers {
		go func() {
			lk, err := d.RWMutex(key).TryRLock(t.Context(), time.Minute)
			if err == nil {
				locks <- lk
			}
			got <- err
		}()
	}
	// Let the readers make their first attempt and start waiting; none
	// may return meanwhile. (A reader slower than this takes the lock at
	// its first attempt after the release: the test then checks less, but
	// does not fail for it.)
	queued := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(queued) {
		select {
		case err := <-got:
			t.Fatalf("a reader returned while the writer held: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	mustUnlock(t, w)
	limit := time.After(10 * time.Second)
	for i := range readers {
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("reader %d: %v", i, err)
			}
		case <-limit:
			t.Fatalf("%d of %d readers took the lock within 10s of the writer's release; want all (spin 1m: the others were not woken)", i, readers)
		}
	}
	for range readers {
		mustUnlock(t, <-locks)
	}
	noLeftovers(t, h, key)
}
