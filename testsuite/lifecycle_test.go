package testsuite_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/hotspot"
	"github.com/distlock/distlock/metrics"
)

// TestLifecycleModel drives the lock lifecycle with random schedules of
// TryLock, nested TryLock, Unlock, Do, Close, renewal failures, backend
// losses, expiries, evictions and slow or failing stores, over two
// DistributeLocks ("processes") on one store, each with a chain of hotspot
// (shared by both), metrics and a recording handler, and checks after every
// step:
//
//   - no key has two owners the facade reports held: a lock whose Deadline
//     is still ahead is the store's holder;
//   - every handler sees at most one Release per Acquire that returned nil,
//     and at the end exactly one;
//   - a loss is reported at most once per lock, never for a lock whose
//     release had begun, and a lock whose Done closed without its release
//     was reported lost;
//   - Close returns within its bound;
//   - at the end: metrics' Held gauge is 0, the store holds nothing, and no
//     goroutine is left behind.
//
// make test runs a short version (DISTLOCK_LIFECYCLE_CHECKS, default 20);
// -rapid.checks=N runs more.
func TestLifecycleModel(t *testing.T) {
	if f := flag.Lookup("rapid.checks"); f != nil && f.Value.String() == "100" { // not set on the command line
		n := "20"
		if v := os.Getenv("DISTLOCK_LIFECYCLE_CHECKS"); v != "" {
			n = v
		}
		f.Value.Set(n)
		defer f.Value.Set("100")
	}
	var checks atomic.Int64
	rapid.Check(t, func(rt *rapid.T) {
		checks.Add(1)
		ignore := goleak.IgnoreCurrent()
		m := newModel(rt)
		rt.Repeat(map[string]func(*rapid.T){
			"lock":        m.lock,
			"nested":      m.nested,
			"unlock":      m.unlock,
			"do":          m.do,
			"close":       m.close,
			"evict":       m.evict,
			"slowAcquire": m.slowAcquire,
			"slowChain":   m.slowChain,
			"failRelease": m.failRelease,
			"failRefresh": m.failRefresh,
			"backendLoss": m.backendLoss,
			"pass":        m.pass,
			"settle":      func(*rapid.T) { m.settle() },
			"":            m.check,
		})
		m.teardown(rt)
		noGoroutinesLeft(rt, ignore)
	})
	t.Logf("%d schedules explored", checks.Load())
}

const (
	closeBound = 300 * time.Millisecond
	boundSlack = 3 * time.Second // a loaded 2-core machine under -race
)

var keys = []string{"a", "b"}

type model struct {
	store   *faultyStore
	hot     *hotspot.Handler
	procs   [2]*proc
	retired []*proc // closed processes, checked at the end
	locks   []*modelLock

	wg      sync.WaitGroup // operations running in the background
	mu      sync.Mutex     // guards locks appended by them, failures and reentries
	failure error
	// Nested TryLocks by token: in flight, and begun. A reentry adds a
	// handle before the model knows it (siblingsLive).
	reentries, reentryGen map[uint64]int
}

type proc struct {
	d       *distlock.DistributeLock
	met     *metrics.Handler
	rec     *recorder
	slow    *slowHandler
	renew   bool
	closing atomic.Bool
}

// modelLock is a handle the model holds.
type modelLock struct {
	p         *proc
	lk        *distlock.Lock
	key       string
	value     string
	token     uint64
	unlocking atomic.Bool // Unlock called (the facade may still hold it after a failed one)
	released  atomic.Bool // Unlock returned nil or ErrNotHeld
	evicted   atomic.Bool // taken away behind the facade's back
	nested    bool

	callsMu  sync.Mutex
	calls    int // Unlock calls of the handle in flight
	overlaps int // Unlock calls begun while another was in flight
}

// beginUnlock counts an Unlock call of the handle in; endUnlock counts it
// out and reports whether another Unlock call of the handle ran at any
// time during it.
func (ml *modelLock) beginUnlock() (overlapped bool, mark int) {
	ml.callsMu.Lock()
	defer ml.callsMu.Unlock()
	ml.calls++
	if ml.calls > 1 {
		ml.overlaps++
	}
	return ml.calls > 1, ml.overlaps
}

func (ml *modelLock) endUnlock(overlapped bool, mark int) bool {
	ml.callsMu.Lock()
	defer ml.callsMu.Unlock()
	ml.calls--
	return overlapped || ml.calls > 0 || ml.overlaps != mark
}

func newModel(t *rapid.T) *model {
	m := &model{store: newFaultyStore(), hot: hotspot.New(keys[0]),
		reentries: map[uint64]int{}, reentryGen: map[uint64]int{}}
	m.store.kept = rapid.Bool().Draw(t, "kept")
	for i := range m.procs {
		m.procs[i] = m.newProc(t, rapid.Bool().Draw(t, fmt.Sprintf("renew%d", i)))
	}
	return m
}

func (m *model) newProc(t *rapid.T, renew bool) *proc {
	p := &proc{met: metrics.New(), rec: newRecorder(), slow: &slowHandler{}, renew: renew}
	opts := []distlock.Option{
		distlock.WithHandlers(m.hot, p.met, p.slow, p.rec),
		distlock.WithSpin(time.Millisecond, 2*time.Millisecond),
		distlock.WithCloseTimeout(closeBound),
		distlock.WithDefaultTTL(10 * time.Second),
	}
	if renew {
		opts = append(opts, distlock.WithAutoRenew())
	}
	d, err := distlock.New(m.store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	p.d = d
	return p
}

func (m *model) fail(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failure == nil {
		m.failure = fmt.Errorf(format, args...)
	}
}

func (m *model) async(t *rapid.T, fn func()) {
	if rapid.Bool().Draw(t, "async") {
		m.wg.Go(fn)
		return
	}
	fn()
}

func (m *model) settle() { m.wg.Wait() }

func (m *model) drawProc(t *rapid.T) *proc {
	return m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(t, "proc")]
}

func (m *model) drawLock(t *rapid.T) *modelLock {
	m.mu.Lock()
	n := len(m.locks)
	m.mu.Unlock()
	if n == 0 {
		t.Skip("no lock yet")
	}
	i := rapid.IntRange(0, n-1).Draw(t, "lock")
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.locks[i]
}

func (m *model) drawTTL(t *rapid.T) time.Duration {
	if rapid.Bool().Draw(t, "shortTTL") {
		return time.Duration(rapid.IntRange(30, 120).Draw(t, "ttlms")) * time.Millisecond
	}
	return 10 * time.Second
}

func (m *model) add(ml *modelLock) {
	m.mu.Lock()
	m.locks = append(m.locks, ml)
	m.mu.Unlock()
}

// lock: TryLock with a random wait and TTL.
func (m *model) lock(t *rapid.T) {
	p := m.drawProc(t)
	key := rapid.SampledFrom(keys).Draw(t, "key")
	wait := time.Duration(rapid.IntRange(0, 150).Draw(t, "waitms")) * time.Millisecond
	ctx := distlock.ContextWithTTL(context.Background(), m.drawTTL(t))
	m.async(t, func() {
		lk, err := p.d.TryLock(ctx, key, wait)
		switch {
		case err == nil:
			v, _ := m.store.value(lk.Token())
			m.add(&modelLock{p: p, lk: lk, key: key, value: v, token: lk.Token()})
		case errors.Is(err, distlock.ErrNotAcquired), errors.Is(err, distlock.ErrClosed),
			errors.Is(err, distlock.ErrNotHeld): // expired before it could be returned
		default:
			if !m.store.faulty() {
				m.fail("TryLock(%q) = %v on a healthy store", key, err)
			}
		}
	})
}

// nested: TryLock of a held key with the context carrying it.
func (m *model) nested(t *rapid.T) {
	ml := m.drawLock(t)
	m.beginReentry(ml.token)
	defer m.endReentry(ml.token)
	calls := m.store.marked.Load()
	before := ml.lk.Deadline()
	ctx := context.WithValue(distlock.ContextWithLock(context.Background(), ml.lk), marker{}, true)
	lk, err := ml.p.d.TryLock(ctx, ml.key, 0)
	after := time.Now()
	if n := m.store.marked.Load() - calls; err != nil && n != 0 && (errors.Is(err, distlock.ErrNotHeld) || errors.Is(err, distlock.ErrReentrancy)) {
		t.Fatalf("nested TryLock refused after %d store calls; want none", n)
	}
	if err == nil && lk.Token() == ml.token {
		if !before.IsZero() && !after.Before(before) && !ml.evicted.Load() {
			// Reentered although the validity seen just before had ended.
			t.Fatalf("nested TryLock of %q succeeded after its deadline %v", ml.key, before)
		}
		m.add(&modelLock{p: ml.p, lk: lk, key: ml.key, value: ml.value, token: ml.token, nested: true})
		return
	}
	if err == nil { // the outer lock was released: a fresh acquisition
		v, _ := m.store.value(lk.Token())
		m.add(&modelLock{p: ml.p, lk: lk, key: ml.key, value: v, token: lk.Token()})
		return
	}
	if errors.Is(err, distlock.ErrNotHeld) {
		// Done closes once the loss observers were told, right after.
		select {
		case <-ml.lk.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("nested TryLock = %v, but Done stays open", err)
		}
	}
}

// unlock: Unlock a handle, once or twice.
func (m *model) unlock(t *rapid.T) {
	ml := m.drawLock(t)
	m.async(t, func() {
		ml.unlocking.Store(true)
		overlapped, mark := ml.beginUnlock()
		gen := m.reentryMark(ml.token)
		err := ml.lk.Unlock(context.Background())
		// A second Unlock of the handle while the first is in flight
		// returns ErrNotHeld ("already unlocked") before the first
		// closes Done, or fails and leaves the lock held.
		if ml.endUnlock(overlapped, mark) && errors.Is(err, distlock.ErrNotHeld) {
			return // that call tells how the release went
		}
		if err == nil || errors.Is(err, distlock.ErrNotHeld) {
			ml.released.Store(true)
			// A nested TryLock during the Unlock may have added a
			// handle the model did not know of yet: the Unlock then
			// was not the last.
			if !ml.nested && !siblingsLive(m, ml) && !m.reentryRaced(ml.token, gen) {
				select {
				case <-ml.lk.Done():
				default:
					m.fail("Unlock(%q) = %v, and Done is still open", ml.key, err)
				}
			}
			return
		}
		// The fault may have been switched off since the store failed.
		if !m.store.faulty() && !errors.Is(err, errReleaseFault) {
			m.fail("Unlock(%q) = %v on a healthy store", ml.key, err)
		}
	})
}

// beginReentry and endReentry count a nested TryLock of token in and out.
func (m *model) beginReentry(token uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reentries[token]++
	m.reentryGen[token]++
}

func (m *model) endReentry(token uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reentries[token]--
}

// reentryMark and reentryRaced tell whether a nested TryLock of token ran
// at any time between them.
func (m *model) reentryMark(token uint64) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.reentries[token] > 0 {
		return -1
	}
	return m.reentryGen[token]
}

func (m *model) reentryRaced(token uint64, mark int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return mark < 0 || m.reentries[token] > 0 || m.reentryGen[token] != mark
}

// siblingsLive reports whether another handle of ml's lock is not yet unlocked.
func siblingsLive(m *model, ml *modelLock) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, o := range m.locks {
		if o != ml && o.token == ml.token && o.p == ml.p && !o.released.Load() {
			return true
		}
	}
	return false
}

// do: Do around a function that checks it holds the key.
func (m *model) do(t *rapid.T) {
	p := m.drawProc(t)
	key := rapid.SampledFrom(keys).Draw(t, "key")
	ctx := distlock.ContextWithTTL(context.Background(), m.drawTTL(t))
	m.async(t, func() {
		_ = p.d.Do(ctx, key, 50*time.Millisecond, func(ctx context.Context, lk *distlock.Lock) error {
			// The store first: see check.
			v, ok := m.store.holder(key)
			dl := lk.Deadline()
			if now := time.Now(); now.Before(dl) && !m.store.wasEvicted(lk.Token()) {
				if want, _ := m.store.value(lk.Token()); !ok || v != want {
					m.fail("Do(%q): the store's holder is %q, not the lock's %q, before its deadline", key, v, want)
				}
			}
			return nil
		})
	})
}

// close: Close a process (bounded), then start it again.
func (m *model) close(t *rapid.T) {
	i := rapid.IntRange(0, len(m.procs)-1).Draw(t, "proc")
	p := m.procs[i]
	if !p.closing.CompareAndSwap(false, true) {
		return
	}
	renew := p.renew
	m.async(t, func() {
		start := time.Now()
		p.d.Close()
		if el := time.Since(start); el > closeBound+boundSlack {
			m.fail("Close took %v; its bound is %v", el, closeBound)
		}
	})
	np := m.newProc(t, renew)
	m.mu.Lock()
	m.procs[i] = np
	m.retired = append(m.retired, p)
	m.mu.Unlock()
}

// evict: an operator deletes a key behind its holder's back.
func (m *model) evict(t *rapid.T) {
	key := rapid.SampledFrom(keys).Draw(t, "key")
	// No acquisition lands between the look and the eviction: the
	// holder marked evicted is the one evicted.
	m.store.evictMu.Lock()
	defer m.store.evictMu.Unlock()
	if v, ok := m.store.holder(key); ok {
		m.store.markEvicted(v)
		m.mu.Lock()
		for _, ml := range m.locks {
			if ml.key == key && ml.value == v {
				ml.evicted.Store(true)
			}
		}
		m.mu.Unlock()
	}
	m.store.Evict(key)
}

func (m *model) slowAcquire(t *rapid.T) {
	m.store.slow.Store(int64(rapid.IntRange(1, 80).Draw(t, "slowms")) * int64(time.Millisecond))
}

func (m *model) slowChain(t *rapid.T) {
	p := m.drawProc(t)
	p.slow.delay.Store(int64(rapid.IntRange(1, 80).Draw(t, "chainms")) * int64(time.Millisecond))
}

func (m *model) failRelease(t *rapid.T) {
	m.store.failRelease.Store(rapid.Bool().Draw(t, "on"))
}

func (m *model) failRefresh(t *rapid.T) {
	m.store.failRefresh.Store(rapid.Bool().Draw(t, "on"))
}

// backendLoss: the backend reports a lock's lease lost.
func (m *model) backendLoss(t *rapid.T) {
	ml := m.drawLock(t)
	m.store.loseLease(ml.value)
	ml.evicted.Store(true) // the facade may take the loss in after this step
}

// pass lets time pass: expiries, renewals.
func (m *model) pass(t *rapid.T) {
	time.Sleep(time.Duration(rapid.IntRange(1, 60).Draw(t, "ms")) * time.Millisecond)
}

// check is run after every step.
func (m *model) check(t *rapid.T) {
	m.mu.Lock()
	failure := m.failure
	locks := append([]*modelLock(nil), m.locks...)
	m.mu.Unlock()
	if failure != nil {
		t.Fatal(failure)
	}
	for _, ml := range locks {
		if ml.unlocking.Load() || ml.evicted.Load() || m.store.wasEvicted(ml.token) {
			continue
		}
		select {
		case <-ml.lk.Done():
			if !ml.p.rec.ended(ml.token) {
				t.Fatalf("%q: Done closed, but the lock was neither reported lost nor released", ml.key)
			}
		default:
		}
		// The store first, then the facade: a release (an async Unlock or
		// Close) makes Deadline zero before it deletes the key, and an
		// acquisition writes the key before TryLock returns, so in this
		// order only two owners at once look like two owners.
		v, ok := m.store.holder(ml.key)
		dl := ml.lk.Deadline()
		if now := time.Now(); now.Before(dl) && (!ok || v != ml.value) && !m.store.wasEvicted(ml.token) {
			t.Fatalf("%q: the facade holds it (deadline %v ahead) for %q but the store's holder is %q (held %v)",
				ml.key, dl.Sub(now), ml.value, v, ok)
		}
	}
	for _, p := range m.allProcs() {
		if err := p.rec.check(false); err != nil {
			t.Fatal(err)
		}
	}
}

func (m *model) allProcs() []*proc {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append(append([]*proc(nil), m.procs[:]...), m.retired...)
}

// teardown heals the store, closes every process and checks what must
// hold at the end.
func (m *model) teardown(t *rapid.T) {
	m.store.failRelease.Store(false)
	m.store.failRefresh.Store(false)
	for _, p := range m.allProcs() {
		if p.closing.CompareAndSwap(false, true) {
			start := time.Now()
			p.d.Close()
			if el := time.Since(start); el > closeBound+boundSlack {
				t.Errorf("Close took %v; its bound is %v", el, closeBound)
			}
		}
	}
	m.settle()
	// A lock Close could not release (the store failed) stays held until
	// its owner unlocks it: do so now that the store is healthy.
	m.mu.Lock()
	locks := append([]*modelLock(nil), m.locks...)
	m.mu.Unlock()
	for _, ml := range locks {
		if !ml.released.Load() {
			if err := ml.lk.Unlock(context.Background()); err != nil && !errors.Is(err, distlock.ErrNotHeld) {
				t.Errorf("final Unlock(%q) on a healthy store = %v", ml.key, err)
			}
			ml.released.Store(true)
		}
	}
	m.check(t)
	// Work that outlived a Close's bound (Close reported it) finishes in
	// the background: poll for the end state.
	var err error
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err = m.balanced(); err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatal(err)
		}
	}
	// A lock whose release failed until Close's bound stays in the store
	// until its TTL (Close reported it): delete what nobody holds.
	for end := time.Now().Add(15 * time.Second); m.store.Len() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the store still holds %d keys after every process closed", m.store.Len())
		}
		for _, k := range keys {
			if v, ok := m.store.holder(k); ok && m.store.closedFailed(v) {
				m.store.Evict(k)
			}
		}
	}
}

// balanced checks the end state of every process's handlers.
func (m *model) balanced() error {
	for _, p := range m.allProcs() {
		if err := p.rec.check(true); err != nil {
			return err
		}
		// Held counts what is not released; Close gave up only on the
		// releases the store failed until its bound (it said so).
		if s, want := p.met.Stats(), p.rec.unreleased(); s.Held != want {
			return fmt.Errorf("metrics: Held = %d after Close; want %d", s.Held, want)
		}
	}
	return nil
}

// recorder is a handler that checks the chain's contract from the inside:
// one Release per Acquire that returned nil, losses reported once and
// never during or after a release.
type recorder struct {
	mu      sync.Mutex
	reqs    map[*distlock.Request]*reqRecord
	byToken map[uint64]*reqRecord
}

type reqRecord struct {
	acquired, released, lost int
	releasing                bool
	calls                    []string // Release calls' errors, for the failure message
}

func newRecorder() *recorder {
	return &recorder{reqs: make(map[*distlock.Request]*reqRecord), byToken: make(map[uint64]*reqRecord)}
}

// ended reports whether the lock of token was reported lost or released.
func (h *recorder) ended(token uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	rr := h.byToken[token]
	return rr != nil && (rr.lost > 0 || rr.released > 0)
}

func (h *recorder) rec(r *distlock.Request) *reqRecord {
	rr := h.reqs[r]
	if rr == nil {
		rr = &reqRecord{}
		h.reqs[r] = rr
	}
	return rr
}

func (h *recorder) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	err := next(ctx, r)
	if err == nil {
		h.mu.Lock()
		rr := h.rec(r)
		rr.acquired++
		h.byToken[r.Token] = rr
		h.mu.Unlock()
	}
	return err
}

func (h *recorder) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	h.mu.Lock()
	h.rec(r).releasing = true
	h.mu.Unlock()
	err := next(ctx, r)
	h.mu.Lock()
	rr := h.rec(r)
	rr.releasing = false
	rr.calls = append(rr.calls, fmt.Sprint(err))
	if err == nil || errors.Is(err, distlock.ErrNotHeld) {
		rr.released++
	}
	h.mu.Unlock()
	return err
}

func (h *recorder) LockLost(r *distlock.Request, _ error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	rr := h.rec(r)
	rr.lost++
	if rr.releasing || rr.released > 0 {
		rr.lost += 100 // reported during or after a release: check says so
	}
}

// failedOnly reports whether every Release call of the request failed
// with the injected fault: the release Close gave up on at its bound.
func (rr *reqRecord) failedOnly() bool {
	for _, c := range rr.calls {
		if c != errReleaseFault.Error() {
			return false
		}
	}
	return len(rr.calls) > 0 && rr.released == 0
}

// unreleased counts the requests whose release failed for good.
func (h *recorder) unreleased() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var n int64
	for _, rr := range h.reqs {
		if rr.acquired > rr.released && rr.failedOnly() {
			n++
		}
	}
	return n
}

func (h *recorder) check(final bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for r, rr := range h.reqs {
		switch {
		case rr.acquired > 1:
			return fmt.Errorf("%q: Acquire returned nil %d times for one request", r.Key, rr.acquired)
		case rr.released > rr.acquired:
			return fmt.Errorf("%q: %d Releases for %d Acquires", r.Key, rr.released, rr.acquired)
		case rr.lost >= 100:
			return fmt.Errorf("%q: loss reported during or after its release", r.Key)
		case rr.lost > 1:
			return fmt.Errorf("%q: loss reported %d times", r.Key, rr.lost)
		case final && rr.released != rr.acquired && !rr.failedOnly():
			return fmt.Errorf("%q (token %d): %d Releases for %d Acquires after Close; Release calls: %q", r.Key, r.Token, rr.released, rr.acquired, rr.calls)
		}
	}
	return nil
}

// slowHandler delays the chain's return once, when armed: a handler whose
// writer blocks a moment.
type slowHandler struct{ delay atomic.Int64 }

func (h *slowHandler) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	err := next(ctx, r)
	if d := h.delay.Swap(0); d > 0 {
		time.Sleep(time.Duration(d)) // the injected fault: a slow handler
	}
	return err
}

func (h *slowHandler) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	return next(ctx, r)
}

// faultyStore is the memory store with the faults the model injects: a
// slow reply, failing releases and renewals, and a backend loss signal.
type faultyStore struct {
	*memory.Store
	slow        atomic.Int64 // the next successful acquisition's reply is this late
	failRelease atomic.Bool
	failRefresh atomic.Bool
	// kept: the store keeps renewed locks alive itself (etcd's shared
	// lease, ZooKeeper's session): it sets Lease.KeptAlive, and the
	// facade neither renews nor times them.
	kept    bool
	marked  atomic.Int64 // acquisition calls whose context carries marker
	evictMu sync.RWMutex // an eviction excludes acquisitions

	mu       sync.Mutex
	values   map[uint64]string        // token -> owner value
	lost     map[string]chan struct{} // owner value -> its Lost channel
	evicted  map[string]bool          // owner values taken away behind the facade
	failures map[string]bool          // owner values whose release failed
}

func newFaultyStore() *faultyStore {
	return &faultyStore{Store: memory.New(), values: map[uint64]string{}, lost: map[string]chan struct{}{},
		evicted: map[string]bool{}, failures: map[string]bool{}}
}

var errReleaseFault = errors.New("fault: release failed")

func (s *faultyStore) faulty() bool { return s.failRelease.Load() || s.failRefresh.Load() }

// marker marks the context of the calls the model counts.
type marker struct{}

func (s *faultyStore) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	if ctx.Value(marker{}) != nil {
		s.marked.Add(1)
	}
	kept := s.kept && l.AutoRenew
	ttl := l.TTL
	if kept {
		l.TTL = time.Hour // what the store keeps alive outlives the schedule
	}
	s.evictMu.RLock()
	ok, holderTTL, err := s.Store.TryAcquire(ctx, l)
	s.evictMu.RUnlock()
	l.TTL = ttl
	if ok {
		l.KeptAlive = kept
		ch := make(chan struct{})
		s.mu.Lock()
		s.values[l.Token] = l.Value
		s.lost[l.Value] = ch
		s.mu.Unlock()
		l.Lost = ch
		if d := s.slow.Swap(0); d > 0 {
			time.Sleep(time.Duration(d)) // the injected fault: a slow reply
		}
	}
	return ok, holderTTL, err
}

func (s *faultyStore) Release(ctx context.Context, l *backend.Lease) error {
	if s.failRelease.Load() {
		s.mu.Lock()
		s.failures[l.Value] = true
		s.mu.Unlock()
		return errReleaseFault
	}
	return s.Store.Release(ctx, l)
}

func (s *faultyStore) Refresh(ctx context.Context, l *backend.Lease) error {
	if s.failRefresh.Load() {
		return errors.New("fault: refresh failed")
	}
	return s.Store.Refresh(ctx, l)
}

func (s *faultyStore) value(token uint64) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.values[token]
	return v, ok
}

func (s *faultyStore) holder(key string) (string, bool) {
	v, _, ok := s.Store.Holder(key)
	return v, ok
}

func (s *faultyStore) markEvicted(value string) {
	s.mu.Lock()
	s.evicted[value] = true
	s.mu.Unlock()
}

func (s *faultyStore) wasEvicted(token uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.evicted[s.values[token]]
}

func (s *faultyStore) closedFailed(value string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failures[value]
}

func (s *faultyStore) loseLease(value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch, ok := s.lost[value]; ok {
		close(ch)
		delete(s.lost, value)
		s.evicted[value] = true
	}
}

// noGoroutinesLeft fails t if goroutines other than those ignore lets pass are
// still running after a grace for the ones already ending.
func noGoroutinesLeft(t *rapid.T, ignore goleak.Option) {
	var err error
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if err = goleak.Find(ignore); err == nil {
			return
		}
	}
	t.Fatalf("goroutines left behind: %v", err)
}
