package testsuite_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/hotspot"
	dlmetrics "github.com/distlock/distlock/metrics"
)

// TestLifecycleModel is the adversarial model of the whole public API. Each
// schedule runs in its own testing/synctest bubble, on a virtual clock,
// against a hostile store (hostile_test.go: the memory store behind a
// network that delays, reorders, fails, loses and stalls requests, and
// that lets a rival take what it frees), with three processes
// (DistributeLocks) whose options are drawn: auto-renewal, spin, handlers
// (hotspot, metrics, a slow handler, a recorder), reentrancy limit, Close
// bound. The store's abilities are drawn too: a pull store (Spinner) or a
// push store (Waiter), with or without batch renewal and multi-key
// acquisition, with or without Lost channels, keeping renewed locks alive
// itself or not.
//
// The operations, drawn, run synchronously or in the background: TryLock,
// TryLockAll of 2-3 keys, a semaphore's TryAcquire, a read/write lock's
// TryLock and TryRLock, nested TryLock through ContextWithLock (of every
// kind, of a TryLockAll set's keys, racing the last Unlock), Extend (also
// two at once, and against renewal), an election's Campaign and Proclaim
// (also two at once: a relabel shares the refresh slot with renewals and
// Extend), Unlock (also twice), Do, Close (then
// a fresh process), a process taking many locks over time (as a job
// runner does), a lock of 600 keys renewed with another, store faults on
// and off, stalls (of the whole store or of some of its shards; of every
// request, or only of those that update a held lock, as a row lock held
// by another transaction does), the store reporting a lease lost, an
// operator evicting a key, a slow handler, and virtual time passing. Two
// probes check the facade's own policies on keys the network leaves
// alone: a refused read/write request leaves nothing that refuses the
// next, and a waiting writer keeps its place in line.
//
// After every step (the bubble settled: every goroutine blocked), and at
// the instant the store frees a holder by expiry, it checks:
//
//   - a key has one open holder (a semaphore at most its limit, a
//     read/write lock readers or one writer): open means Done not closed
//     (its Deadline ahead when the model does not watch Done), release not
//     begun by the caller (an Unlock in flight or done, Close called), and
//     not exempt (evicted, or changed by a request whose reply the facade
//     did not get);
//   - when the store frees a holder by expiry, its lock is not open;
//   - a lock TryLock returns, or a nested TryLock reenters, is held by the
//     store (unless exempt), and was not freed by expiry before;
//   - a lock whose lease the store reported lost has Done closed once no
//     release is in flight;
//   - a lock an Extend or Proclaim found not held (ErrNotHeld) has ended,
//     unless an Unlock of it began: whatever freed the key, an eviction
//     the store does not signal included;
//   - Done closes without a loss only once every handle was unlocked (or
//     Close called); Unlock of the last handle closes it;
//   - Close, TryLock and Unlock return within their bounds; nothing
//     succeeds during or after Close; a nested TryLock reenters without
//     I/O, and every key of a TryLockAll set follows one reentry rule;
//   - each handler sees one Release per Acquire, at most one loss, never
//     during or after a release, and no loss for a lock Close then
//     released;
//   - RefreshAll gets at most backend.MaxRefreshBatch leases; goroutines
//     and store calls per virtual time stay bounded;
//   - after healing the store, closing every process and settling: the
//     store holds nothing (but what a Close that reported an error left),
//     metrics' Held is 0, and no goroutine is left in the bubble.
//
// A real-time watchdog fails the test with a goroutine dump when a
// schedule makes no progress: a facade that spins at one virtual instant
// never lets virtual time advance.
//
// A failure reports its schedule's last steps. rapid then replays the
// schedule to shrink it; goroutines racing at one virtual instant may
// interleave otherwise in a replay, so the first failure is logged as it
// was found ("schedule N failed").
//
// make test runs 200 schedules (DISTLOCK_LIFECYCLE_CHECKS sets another
// number; -rapid.checks=N too); DISTLOCK_LIFECYCLE_SKIP=op,op leaves
// operations out, to focus a run.
func TestLifecycleModel(t *testing.T) {
	if f := flag.Lookup("rapid.checks"); f != nil && f.Value.String() == "100" { // not set on the command line
		n := "200"
		if v := os.Getenv("DISTLOCK_LIFECYCLE_CHECKS"); v != "" {
			n = v
		}
		f.Value.Set(n)
		defer f.Value.Set("100")
	}
	wd := startWatchdog()
	defer wd.stop()
	var schedules atomic.Int64
	var logged atomic.Bool
	rapid.Check(t, func(rt *rapid.T) {
		schedules.Add(1)
		if failure := runSchedule(t, rt, wd); failure != nil {
			// rapid replays a failing schedule to shrink it, and a
			// replay on another interleaving may fail otherwise or not
			// at all: the first failure is told here, as it was.
			if fmt.Sprintf("%T", failure) != "rapid.invalidData" && logged.CompareAndSwap(false, true) {
				t.Errorf("schedule %d failed: %v", schedules.Load(), failure)
			}
			panic(failure)
		}
	})
	t.Logf("%d schedules explored", schedules.Load())
}

// runSchedule runs one schedule in a synctest bubble. rapid's draws and
// failures panic for control flow: they are recovered in the bubble, after
// the teardown ended everything it started, and returned, for the caller
// to raise again.
func runSchedule(t *testing.T, rt *rapid.T, wd *watchdog) (failure any) {
	var leaked string
	func() {
		defer func() {
			// synctest panics here when goroutines outlived the bubble's
			// main goroutine: the model reported them first.
			if r := recover(); r != nil && failure == nil {
				failure = fmt.Sprintf("%v\n%s", r, leaked)
			}
		}()
		synctest.Test(t, func(*testing.T) {
			defer func() {
				if r := recover(); r != nil {
					failure = r
				}
			}()
			m := newModel(rt, wd)
			func() {
				defer m.teardown()
				rt.Repeat(m.actions())
			}()
			leaked = m.leaked()
			if f := m.firstFailure(); f != "" {
				rt.Fatal(f + m.lastSteps())
			}
		})
	}()
	return failure
}

const (
	semLimit = 2
	// slack is how late past its bound a call may return, on the virtual
	// clock: a few scheduling steps, not timer lateness (there is none).
	slack = 5 * time.Millisecond
	// withdrawWait is how long a refused read or write request may wait
	// for the store to withdraw its intent before it returns.
	withdrawWait = 50 * time.Millisecond
	// maxGoroutines bounds the goroutines of a schedule.
	maxGoroutines = 3000
	bigKeys       = 600
	maxTTL        = 30 * time.Second
)

var (
	mutexKeys = []string{"a", "b", "c", "d"}
	semKey    = "s"
	rwKey     = "rw"
	hotKey    = "a"
	// fillKeys are the keys a process takes many of at once.
	fillKeys = func() []string {
		keys := make([]string, 24)
		for i := range keys {
			keys[i] = fmt.Sprintf("f%d", i)
		}
		return keys
	}()
	// hostileKeys are keys the network delays, fails and stalls.
	hostileKeys = append([]string{"a", "b", "c", "d", "s", "rw", "h0", "h1", "h2", backend.ElectionPrefix + electName}, fillKeys...)
	// electName is the election the processes campaign in.
	electName = "e"
)

type model struct {
	rt     *rapid.T
	wd     *watchdog
	s      *hostile
	res    backend.RemoteResource
	waiter bool
	// maxDelay is the longest a request or reply may take (slow ones
	// take ten times the drawn bound).
	maxDelay time.Duration
	procs    [3]*proc
	all      []*proc // every process, by id-1
	baseG    int
	probes   int
	bigged   bool

	wg sync.WaitGroup // operations running in the background

	mu       sync.Mutex
	grants   map[string]*mgrant // by owner value
	handles  []*mhandle
	failures []string
	trace    []string
	// Nested TryLocks by grant: in flight, and begun. A reentry adds a
	// handle before the model knows it.
	reentries, reentryGen map[*mgrant]int
	// notHeld lists the Extends and Proclaims that said ErrNotHeld since
	// the last check.
	notHeld []notHeld
}

// notHeld is an Extend or Proclaim that said ErrNotHeld: g's Unlock
// calls by then.
type notHeld struct {
	op      string // "Extend" or "Proclaim"
	g       *mgrant
	unlocks int
	err     error
}

type proc struct {
	id           int
	d            *distlock.DistributeLock
	rec          *recorder
	met          *dlmetrics.Handler // nil: not installed
	slow         *slowHandler
	renew        bool
	closeTimeout time.Duration
	values       atomic.Int64
	closeCalled  atomic.Bool

	// Under model.mu.
	closeStart, closeEnd time.Time
	closeDone            bool
	closeErr             error
}

// mgrant is a lock the model was given: one grant of the facade, shared by
// its handles.
type mgrant struct {
	p       *proc
	value   string
	kind    distlock.Kind
	keys    []string
	token   uint64
	first   *distlock.Lock
	watched bool            // the model asked for Done
	done    <-chan struct{} // nil unless watched
	kept    bool            // the store keeps it alive (KeptAlive)
	handles []*mhandle
	// lostSignal: the store reported the lease lost (Lost closed).
	lostSignal bool
	extended   bool // Extend was called: its validity may have shrunk
	election   bool // a leadership (Campaign): kind is the store's, a mutex
	unlocks    int  // Unlock calls begun on its handles
}

func (g *mgrant) ids() []holderID {
	ids := make([]holderID, len(g.keys))
	for i, k := range g.keys {
		ids[i] = holderID{g.kind, k, g.value}
	}
	return ids
}

func (g *mgrant) String() string {
	keys := fmt.Sprintf("%q", g.keys)
	if len(g.keys) > 3 {
		keys = fmt.Sprintf("[%q %q ... %d keys]", g.keys[0], g.keys[1], len(g.keys))
	}
	return fmt.Sprintf("%v %s of p%d (%s, token %d)", g.kind, keys, g.p.id, g.value, g.token)
}

// mhandle is one handle (*Lock) of a grant.
type mhandle struct {
	g        *mgrant
	lk       *distlock.Lock
	nested   bool
	calls    int  // Unlock calls in flight (or Do's release)
	overlaps int  // Unlock calls begun while another was in flight
	called   bool // Unlock was called at least once
	unlocked bool // an Unlock returned nil or ErrNotHeld
	do       bool // Do's: Do releases it, not the model
	bg       bool // Do's release failed: Do releases it in the background
}

func newModel(t *rapid.T, wd *watchdog) *model {
	m := &model{rt: t, wd: wd, grants: map[string]*mgrant{}, reentries: map[*mgrant]int{}, reentryGen: map[*mgrant]int{},
		baseG: runtime.NumGoroutine()}
	wd.begin()
	delays := []time.Duration{0, time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond}
	net := netConfig{
		maxReq:   rapid.SampledFrom(delays).Draw(t, "maxRequestDelay"),
		maxReply: rapid.SampledFrom(delays).Draw(t, "maxReplyDelay"),
		pLate:    0.5,
		pSlow:    0.05,
	}
	m.maxDelay = 10 * max(net.maxReq, net.maxReply)
	m.s = newHostile(rapid.Uint64().Draw(t, "seed"), net, wd.call)
	m.s.lostSignal = rapid.Bool().Draw(t, "lostSignal")
	m.s.kept = m.s.lostSignal && rapid.Bool().Draw(t, "kept")
	m.s.pRival = 0.3
	m.s.onExpire = m.onExpire
	m.waiter = rapid.IntRange(0, 3).Draw(t, "waiter") == 0
	m.res = m.s.resource(m.waiter, rapid.Bool().Draw(t, "batch"), rapid.Bool().Draw(t, "multi"))
	// A pull store that queues mutex and semaphore waiters, as Redis does.
	m.s.queued = !m.waiter && rapid.Bool().Draw(t, "queued")
	m.logf("store %T: %+v lostSignal=%v kept=%v queued=%v", m.res, net, m.s.lostSignal, m.s.kept, m.s.queued)
	for i := range m.procs {
		m.procs[i] = m.newProc(t)
	}
	return m
}

func (m *model) newProc(t *rapid.T) *proc {
	p := &proc{id: len(m.all) + 1, rec: newRecorder(), slow: &slowHandler{}}
	m.all = append(m.all, p)
	p.renew = rapid.Bool().Draw(t, "renew")
	spin := rapid.SampledFrom([]time.Duration{time.Millisecond, 10 * time.Millisecond, 60 * time.Millisecond}).Draw(t, "spin")
	p.closeTimeout = rapid.SampledFrom([]time.Duration{300 * time.Millisecond, 2 * time.Second}).Draw(t, "closeTimeout")
	var hs []distlock.Handler
	if rapid.Bool().Draw(t, "hotspot") {
		hs = append(hs, hotspot.New(hotKey))
	}
	if rapid.Bool().Draw(t, "metrics") {
		p.met = dlmetrics.New()
		hs = append(hs, p.met)
	}
	hs = append(hs, p.slow, p.rec)
	opts := []distlock.Option{
		distlock.WithHandlers(hs...),
		distlock.WithSpin(spin, spin),
		distlock.WithCloseTimeout(p.closeTimeout),
		distlock.WithDefaultTTL(time.Second),
		distlock.WithValueFunc(func() string { return fmt.Sprintf("p%d-%d", p.id, p.values.Add(1)) }),
	}
	if rapid.Bool().Draw(t, "reentrancyLimit") {
		opts = append(opts, distlock.WithMaxReentrancy(3))
	}
	if p.renew {
		opts = append(opts, distlock.WithAutoRenew())
	}
	d, err := distlock.New(m.res, opts...)
	if err != nil {
		t.Fatal(err)
	}
	p.d = d
	m.logf("p%d: renew=%v spin=%v close=%v handlers=%d", p.id, p.renew, spin, p.closeTimeout, len(hs))
	return p
}

// actions are the operations, each listed as often as its weight, less
// those DISTLOCK_LIFECYCLE_SKIP names (comma-separated), for focusing.
func (m *model) actions() map[string]func(*rapid.T) {
	ops := []struct {
		name   string
		weight int
		op     func(*rapid.T)
	}{
		{"lock", 3, m.opLock},
		{"lockAll", 2, m.opLockAll},
		{"sem", 1, m.opSem},
		{"rlock", 1, m.opRLock},
		{"wlock", 1, m.opWLock},
		{"fill", 1, m.opFill},
		{"big", 1, m.opBig},
		{"nested", 2, m.opNested},
		{"nestSet", 1, m.opNestedSet},
		{"race", 2, m.opRace},
		{"extend", 3, m.opExtend},
		{"unlock", 3, m.opUnlock},
		{"do", 1, m.opDo},
		{"close", 1, m.opClose},
		{"inspect", 1, m.opInspect},
		{"faults", 2, m.opFaults},
		{"stall", 1, m.opStall},
		{"lose", 3, m.opLose},
		{"evict", 1, m.opEvict},
		{"slow", 1, m.opSlow},
		{"pass", 4, m.opPass},
		{"settle", 1, func(*rapid.T) { m.wg.Wait() }},
		{"refusal", 1, m.opRefusal},
		{"fifo", 1, m.opFIFO},
		{"campaign", 1, m.opCampaign},
		{"proclaim", 2, m.opProclaim},
	}
	skip := strings.Split(os.Getenv("DISTLOCK_LIFECYCLE_SKIP"), ",")
	as := map[string]func(*rapid.T){"": m.check}
	for _, o := range ops {
		if slices.Contains(skip, o.name) {
			continue
		}
		for i := range o.weight {
			as[fmt.Sprintf("%s%d", o.name, i)] = o.op
		}
	}
	return as
}

// logf records a line of the schedule's trace (shown by the watchdog and
// with a failure); errors among args are shortened to a line.
func (m *model) logf(format string, args ...any) {
	for i, a := range args {
		if err, ok := a.(error); ok {
			msg := strings.ReplaceAll(err.Error(), "\n", " | ")
			if len(msg) > 200 {
				msg = msg[:200] + "..."
			}
			args[i] = msg
		}
	}
	line := time.Now().Format("15:04:05.000000") + " " + fmt.Sprintf(format, args...)
	m.mu.Lock()
	m.trace = append(m.trace, line)
	if len(m.trace) > 200 {
		m.trace = m.trace[len(m.trace)-200:]
	}
	tr := strings.Join(m.trace, "\n")
	m.mu.Unlock()
	m.wd.trace.Store(&tr)
	m.wd.steps.Add(1)
}

func (m *model) fail(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.failLocked(format, args...)
}

func (m *model) failLocked(format string, args ...any) {
	m.failures = append(m.failures, time.Now().Format("15:04:05.000000")+" "+fmt.Sprintf(format, args...))
}

func (m *model) firstFailure() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.failures) == 0 {
		return ""
	}
	return m.failures[0]
}

// async runs fn in the background or now, as drawn; nil fn draws the same.
func (m *model) async(t *rapid.T, fn func()) {
	bg := rapid.Bool().Draw(t, "async")
	switch {
	case fn == nil:
	case bg:
		m.wg.Go(fn)
	default:
		fn()
	}
}

func (m *model) drawProc(t *rapid.T) *proc {
	return m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(t, "proc")]
}

// pick draws an index into a collection of n elements, with the same
// draws whatever n is: what the model holds depends on timing, and a
// schedule's draws must not, or rapid cannot replay it. -1 when n == 0.
func pick(t *rapid.T, label string, n int) int {
	i := rapid.IntRange(0, 1<<20).Draw(t, label)
	if n == 0 {
		return -1
	}
	return i % n
}

// drawHandle draws a handle that ok accepts, or nil.
func (m *model) drawHandle(t *rapid.T, ok func(h *mhandle) bool) *mhandle {
	m.mu.Lock()
	var hs []*mhandle
	for _, h := range m.handles {
		if ok == nil || ok(h) {
			hs = append(hs, h)
		}
	}
	m.mu.Unlock()
	if i := pick(t, "handle", len(hs)); i >= 0 {
		return hs[i]
	}
	return nil
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func drawTTL(t *rapid.T) time.Duration {
	switch rapid.IntRange(0, 2).Draw(t, "ttlKind") {
	case 0:
		return ms(rapid.IntRange(20, 300).Draw(t, "ttlms"))
	case 1:
		return ms(rapid.IntRange(300, 3000).Draw(t, "ttlms"))
	}
	return time.Duration(rapid.IntRange(3, int(maxTTL/time.Second)).Draw(t, "ttls")) * time.Second
}

func drawWait(t *rapid.T) time.Duration {
	switch rapid.IntRange(0, 4).Draw(t, "waitKind") {
	case 0, 1:
		return 0
	case 2:
		return ms(rapid.IntRange(1, 100).Draw(t, "waitms"))
	case 3:
		return ms(rapid.IntRange(100, 1500).Draw(t, "waitms"))
	}
	return distlock.WaitForever
}

// drawTimeout draws a context's timeout; 0: none. A wait without end gets
// one always.
func drawTimeout(t *rapid.T, needed bool) time.Duration {
	if !needed && rapid.Bool().Draw(t, "noTimeout") {
		return 0
	}
	return ms(rapid.IntRange(1, 800).Draw(t, "timeoutms"))
}

func withTimeout(timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout <= 0 {
		return context.WithCancel(context.Background())
	}
	return context.WithTimeout(context.Background(), timeout)
}

// which names the lock lk for the trace: its owner value and token.
func (m *model) which(lk *distlock.Lock) string {
	if lk == nil {
		return ""
	}
	v, _ := m.s.valueOf(lk.Token())
	return fmt.Sprintf(" (%s, token %d)", v, lk.Token())
}

// procOf returns the process of an owner value ("p<id>-<n>"), or nil.
func (m *model) procOf(value string) *proc {
	id, _, ok := strings.Cut(strings.TrimPrefix(value, "p"), "-")
	if !ok {
		return nil
	}
	n, err := strconv.Atoi(id)
	if err != nil || n < 1 || n > len(m.all) {
		return nil
	}
	return m.all[n-1]
}

// acquisition is one acquire call the model makes.
type acquisition struct {
	p       *proc
	what    string
	kind    distlock.Kind
	wait    time.Duration
	ttl     time.Duration
	timeout time.Duration
	watch   bool
	call    func(ctx context.Context, wait time.Duration) (*distlock.Lock, error)
}

func (m *model) drawAcquisition(t *rapid.T, p *proc, what string, kind distlock.Kind,
	call func(ctx context.Context, wait time.Duration) (*distlock.Lock, error)) acquisition {
	a := acquisition{p: p, what: what, kind: kind, call: call}
	a.wait = drawWait(t)
	a.ttl = drawTTL(t)
	a.timeout = drawTimeout(t, a.wait == distlock.WaitForever)
	a.watch = rapid.IntRange(0, 3).Draw(t, "watch") > 0
	return a
}

// run makes the acquisition and checks its result and its time.
func (m *model) run(a acquisition) *mhandle {
	ctx, cancel := withTimeout(a.timeout)
	defer cancel()
	ctx = distlock.ContextWithTTL(ctx, a.ttl)
	slow := a.p.slow.fired.Load()
	start := time.Now()
	lk, err := a.call(ctx, a.wait)
	el := time.Since(start)
	m.logf("p%d %s wait=%v ttl=%v timeout=%v: %v after %v%s", a.p.id, a.what, a.wait, a.ttl, a.timeout, err, el, m.which(lk))
	if a.p.slow.fired.Load() == slow {
		bound := max(a.ttl, time.Second) // a single attempt's
		switch a.wait {
		case 0:
		case distlock.WaitForever:
			bound = a.timeout
		default:
			bound = a.wait + 10*time.Millisecond // the wait's end, and the last attempt's grace
		}
		if a.timeout > 0 {
			bound = min(bound, a.timeout)
		}
		if err != nil && (a.kind == distlock.KindRead || a.kind == distlock.KindWrite || (m.s.queued && a.wait > 0)) {
			// A refused request withdraws its place in line before it
			// returns, waiting a few tens of milliseconds for the store
			// (backend.Withdrawer): a reader or writer always, a mutex
			// or semaphore waiter on a store that queues them.
			bound += withdrawWait
		}
		if el > bound+slack {
			m.fail("p%d %s (wait %v, ttl %v, timeout %v) returned after %v; its bound was %v", a.p.id, a.what, a.wait, a.ttl, a.timeout, el, bound)
		}
	}
	switch {
	case err == nil:
		return m.register(a.p, lk, a.kind, nil, a.watch, a.what)
	case errors.Is(err, distlock.ErrInvalid), errors.Is(err, distlock.ErrUnsupported),
		errors.Is(err, distlock.ErrLimitMismatch), errors.Is(err, distlock.ErrReentrancy):
		m.fail("p%d %s = %v", a.p.id, a.what, err)
	}
	return nil
}

// register records a lock the facade returned: a fresh grant, or (parent
// set) a handle of parent's grant that a nested TryLock reentered. It
// checks that the store holds it.
func (m *model) register(p *proc, lk *distlock.Lock, kind distlock.Kind, parent *mgrant, watch bool, what string) *mhandle {
	value, ok := m.s.valueOf(lk.Tokens()[0])
	if !ok {
		m.fail("p%d %s returned token %d, which the store never granted", p.id, what, lk.Token())
		return nil
	}
	fresh := parent == nil || parent.value != value
	var done <-chan struct{}
	if fresh && watch {
		done = lk.Done()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.grants[value]
	if g == nil {
		g = &mgrant{p: p, value: value, kind: kind, keys: lk.Keys(), token: lk.Token(), first: lk,
			watched: watch, done: done, kept: m.s.kept && p.renew}
		m.grants[value] = g
	}
	h := &mhandle{g: g, lk: lk, nested: !fresh}
	g.handles = append(g.handles, h)
	m.handles = append(m.handles, h)
	if ex := m.s.exemption(value); ex != "" {
		return h
	}
	for _, id := range g.ids() {
		if at, freed := m.s.freedAt(id); freed {
			m.failLocked("p%d %s returned %v, which the store had freed by expiry at %v", p.id, what, g, at.Format("15:04:05.000000"))
		} else if !m.s.holds(id) && (!fresh || !m.s.reportedLost(value)) && !p.closeCalled.Load() {
			// (Close, called meanwhile, may have released it since.)
			// A fresh lock the store reported lost after the facade
			// committed it is lost: Done closes. A reentered one is not
			// that lock.
			m.failLocked("p%d %s returned %v, which the store does not hold (%q holds %q)", p.id, what, g, id.key, m.s.mem.Contents(id.key))
		}
	}
	return h
}

// validUntilLocked returns a time until which the facade's clock holds
// the lock of token valid, whatever happened since (renewals only move
// it later): its TTL from its acquisition, less the facade's allowance,
// and less what a push store's reply may have taken; the zero time when
// unknown (Extend may have shortened it).
func (m *model) validUntilLocked(token uint64, acquired time.Time, ttl time.Duration) time.Time {
	var g *mgrant
	for _, o := range m.grants {
		if o.token == token {
			g = o
		}
	}
	switch {
	case g == nil || g.extended:
		return time.Time{}
	case g.kept:
		return acquired.Add(maxTTL * 100)
	}
	v := ttl
	if m.waiter {
		v -= m.maxDelay
	}
	v -= v/100 + 2*time.Millisecond
	if v <= 0 {
		return time.Time{}
	}
	return acquired.Add(v)
}

// releaseBegunLocked reports whether the caller began g's release: an
// Unlock in flight, every handle unlocked, a kept lock released again in
// the background after a failed Unlock, or Close called.
func (m *model) releaseBegunLocked(g *mgrant) bool {
	if g.p.closeCalled.Load() {
		return true
	}
	all := true
	for _, h := range g.handles {
		if h.calls > 0 || g.kept && h.called || h.bg {
			return true
		}
		all = all && h.unlocked
	}
	return all
}

// inFlightLocked reports whether a release of g may be in flight.
func (m *model) inFlightLocked(g *mgrant) bool {
	if g.p.closeCalled.Load() && !g.p.closeDone {
		return true
	}
	for _, h := range g.handles {
		if h.calls > 0 || g.kept && h.called || h.bg {
			return true
		}
	}
	return false
}

// liveLocked reports whether the facade still holds g by what the model
// can see: Done open when it watches Done, else a Deadline ahead.
func (m *model) liveLocked(g *mgrant) bool {
	if g.watched {
		return !isClosed(g.done)
	}
	dl := g.first.Deadline()
	return !dl.IsZero() && time.Now().Before(dl)
}

// openLocked reports whether g is an open holder, bound by the
// guarantees.
func (m *model) openLocked(g *mgrant) bool {
	return !g.lostSignal && m.s.exemption(g.value) == "" && !m.releaseBegunLocked(g) && m.liveLocked(g)
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// onExpire is the rival's check: at the instant the store frees id by
// expiry, its lock's Done is closed (or its release begun).
func (m *model) onExpire(id holderID, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.grants[id.value]
	if g == nil {
		return // not returned: checked if it is
	}
	if m.openLocked(g) {
		m.failLocked("the store freed %v by expiry, but the lock %v is open (Deadline %v); the store's grant and refreshes of it (landed: TTL until): %s",
			id, g, g.first.Deadline().Format("15:04:05.000000"), m.s.history(id))
	}
}

// ---- operations ----

func (m *model) opLock(t *rapid.T) {
	p := m.drawProc(t)
	key := rapid.SampledFrom(mutexKeys).Draw(t, "key")
	a := m.drawAcquisition(t, p, "TryLock "+key, distlock.KindMutex, func(ctx context.Context, wait time.Duration) (*distlock.Lock, error) {
		return p.d.TryLock(ctx, key, wait)
	})
	m.async(t, func() { m.run(a) })
}

func (m *model) opLockAll(t *rapid.T) {
	p := m.drawProc(t)
	keys := rapid.SliceOfNDistinct(rapid.SampledFrom(mutexKeys), 2, 3, rapid.ID[string]).Draw(t, "keys")
	a := m.drawAcquisition(t, p, fmt.Sprintf("TryLockAll %q", keys), distlock.KindMutex, func(ctx context.Context, wait time.Duration) (*distlock.Lock, error) {
		return p.d.TryLockAll(ctx, keys, wait)
	})
	m.async(t, func() { m.run(a) })
}

func (m *model) opSem(t *rapid.T) {
	p := m.drawProc(t)
	a := m.drawAcquisition(t, p, "Semaphore.TryAcquire", distlock.KindSemaphore, func(ctx context.Context, wait time.Duration) (*distlock.Lock, error) {
		return p.d.Semaphore(semKey, semLimit).TryAcquire(ctx, wait)
	})
	m.async(t, func() { m.run(a) })
}

func (m *model) opRLock(t *rapid.T) {
	p := m.drawProc(t)
	a := m.drawAcquisition(t, p, "TryRLock", distlock.KindRead, func(ctx context.Context, wait time.Duration) (*distlock.Lock, error) {
		return p.d.RWMutex(rwKey).TryRLock(ctx, wait)
	})
	m.async(t, func() { m.run(a) })
}

func (m *model) opWLock(t *rapid.T) {
	p := m.drawProc(t)
	a := m.drawAcquisition(t, p, "RWMutex.TryLock", distlock.KindWrite, func(ctx context.Context, wait time.Duration) (*distlock.Lock, error) {
		return p.d.RWMutex(rwKey).TryLock(ctx, wait)
	})
	m.async(t, func() { m.run(a) })
}

// opFill: one process takes many locks over time, in the background:
// each with its own TTL and gap, or, as a job runner does, long leases at
// a steady rate on keys of one shard (a Redis hash tag), then a few short
// ones elsewhere. The long leases' TTLs differ, so their renewals do not
// fall into step (renewals due within half an interval of each other go
// in one batch): while their shard stalls, each renewal hangs in a batch
// of its own, holding one of the process's renewal slots.
func (m *model) opFill(t *rapid.T) {
	p := m.drawProc(t)
	n := rapid.IntRange(4, len(fillKeys)).Draw(t, "locks")
	steady := rapid.Bool().Draw(t, "steady")
	long := ms(rapid.IntRange(300, 3000).Draw(t, "longms"))
	// Apart by about the window within which renewals go together (half
	// their interval, rounded down to a power of two).
	gap := long / time.Duration(rapid.IntRange(5, 8).Draw(t, "gapDiv"))
	var as []acquisition
	var gaps []time.Duration
	for _, key := range fillKeys[:n] {
		if steady {
			key = "{job}" + key
		}
		call := func(ctx context.Context, wait time.Duration) (*distlock.Lock, error) {
			return p.d.TryLock(ctx, key, wait)
		}
		if steady {
			ttl := long + time.Duration(len(as))*long/16
			as = append(as, acquisition{p: p, what: "TryLock " + key, kind: distlock.KindMutex, ttl: ttl, watch: true, call: call})
			gaps = append(gaps, gap)
			continue
		}
		a := m.drawAcquisition(t, p, "TryLock "+key, distlock.KindMutex, call)
		a.wait = 0
		as = append(as, a)
		switch rapid.IntRange(0, 2).Draw(t, "gapKind") {
		case 0:
			gaps = append(gaps, 0)
		case 1:
			gaps = append(gaps, ms(rapid.IntRange(1, 100).Draw(t, "gapms")))
		default:
			gaps = append(gaps, ms(rapid.IntRange(100, 2500).Draw(t, "gapms")))
		}
	}
	if steady {
		short := ms(rapid.IntRange(20, 200).Draw(t, "shortms"))
		for _, key := range []string{"h0", "h1", "h2"} {
			as = append(as, acquisition{p: p, what: "TryLock " + key, kind: distlock.KindMutex, ttl: short, watch: true,
				call: func(ctx context.Context, wait time.Duration) (*distlock.Lock, error) {
					return p.d.TryLock(ctx, key, wait)
				}})
			gaps = append(gaps, gap)
		}
	}
	m.logf("p%d fills %d keys (steady %v: %v apart)", p.id, len(as), steady, gap)
	m.wg.Go(func() {
		for i, a := range as {
			time.Sleep(gaps[i])
			m.run(a)
		}
	})
}

// opBig: a lock of 600 keys and another lock, taken together by one
// process and so renewed together: their renewal must be split into
// batches of at most backend.MaxRefreshBatch leases. Both are released
// within a TTL (renewing 600 keys costs), after a renewal or two.
func (m *model) opBig(t *rapid.T) {
	if m.bigged {
		t.Skip("once per schedule")
	}
	m.bigged = true
	p := m.drawProc(t)
	keys := make([]string, bigKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("%sbig%d", calmPrefix, i)
	}
	ttl := ms(rapid.IntRange(1000, 3000).Draw(t, "ttlms"))
	hold := ttl/2 + ms(rapid.IntRange(0, int(ttl/2/time.Millisecond)).Draw(t, "holdms"))
	var hs []*mhandle
	for _, a := range []acquisition{
		{p: p, what: "TryLockAll of 600 keys", kind: distlock.KindMutex, ttl: ttl, watch: true,
			call: func(ctx context.Context, _ time.Duration) (*distlock.Lock, error) {
				return p.d.TryLockAll(ctx, keys, 0)
			}},
		{p: p, what: "TryLock calm-big", kind: distlock.KindMutex, ttl: ttl, watch: true,
			call: func(ctx context.Context, _ time.Duration) (*distlock.Lock, error) {
				return p.d.TryLock(ctx, calmPrefix+"big", 0)
			}},
	} {
		if h := m.run(a); h != nil {
			hs = append(hs, h)
		}
	}
	m.wg.Go(func() {
		time.Sleep(hold)
		for _, h := range hs {
			m.unlock(h, 0)
		}
	})
}

// nestedCall makes a nested acquisition of h's lock (of key, for a set)
// with a context carrying it, and reports how many store calls it made.
func (m *model) nestedCall(h *mhandle, key string, other bool, wait time.Duration) (*distlock.Lock, int64, error) {
	g := h.g
	io := &ioCount{}
	ctx := context.WithValue(distlock.ContextWithLock(context.Background(), h.lk), ioKey{}, io)
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	d := g.p.d
	var (
		lk  *distlock.Lock
		err error
	)
	switch {
	case g.kind == distlock.KindSemaphore:
		lk, err = d.Semaphore(key, semLimit).TryAcquire(ctx, wait)
	case g.kind == distlock.KindRead && !other, g.kind == distlock.KindWrite && other:
		lk, err = d.RWMutex(key).TryRLock(ctx, wait)
	case g.kind == distlock.KindRead, g.kind == distlock.KindWrite:
		lk, err = d.RWMutex(key).TryLock(ctx, wait)
	default:
		lk, err = d.TryLock(ctx, key, wait)
	}
	return lk, io.n.Load(), err
}

// nested makes a nested TryLock of h's lock and checks its result. It
// reports whether the call took the reentry path: it returned h's lock,
// or refused to, without a store call.
func (m *model) nested(h *mhandle, key string, other bool, wait time.Duration) (reentry bool, io int64) {
	g := h.g
	closing := g.p.closeCalled.Load()
	m.beginReentry(g)
	defer m.endReentry(g) // once the handle it may add is registered
	lk, io, err := m.nestedCall(h, key, other, wait)
	m.logf("p%d nested %v of %v (other=%v): %v after %d store calls%s", g.p.id, key, g, other, err, io, m.which(lk))
	kind := g.kind
	if other {
		kind = distlock.KindRead
		if g.kind == distlock.KindRead {
			kind = distlock.KindWrite
		}
	}
	switch {
	case err == nil && closing:
		m.fail("a nested TryLock of %q on p%d, whose Close was called, returned a lock (token %d); want ErrClosed", key, g.p.id, lk.Token())
	case err == nil && lk.Token() == g.token:
		if io != 0 {
			m.fail("a nested TryLock of %q reentered %v after %d store calls; want none", key, g, io)
		}
		m.register(g.p, lk, kind, g, false, "nested TryLock "+key)
		return true, io
	case io == 0 && (errors.Is(err, distlock.ErrNotHeld) || errors.Is(err, distlock.ErrReentrancy)):
		return true, io
	case err == nil:
		m.register(g.p, lk, kind, g, true, "nested TryLock "+key)
	case errors.Is(err, distlock.ErrReentrancy) && io != 0:
		m.fail("a nested TryLock of %q = %v after %d store calls; want none", key, err, io)
	case errors.Is(err, distlock.ErrInvalid), errors.Is(err, distlock.ErrUnsupported), errors.Is(err, distlock.ErrLimitMismatch):
		m.fail("a nested TryLock of %q = %v", key, err)
	}
	return false, io
}

func (m *model) beginReentry(g *mgrant) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reentries[g]++
	m.reentryGen[g]++
}

func (m *model) endReentry(g *mgrant) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reentries[g]--
}

// opNested: a nested acquisition of a lock the model holds, through a
// context carrying it: of the same kind, or of the other side of a
// read/write lock.
func (m *model) opNested(t *rapid.T) {
	h := m.drawHandle(t, func(h *mhandle) bool { return !h.g.election })
	k := pick(t, "key", 1<<20)
	other := rapid.IntRange(0, 3).Draw(t, "other") == 0
	wait := ms(rapid.SampledFrom([]int{0, 0, 5, 50}).Draw(t, "waitms"))
	if h == nil {
		m.async(t, nil)
		return
	}
	key := h.g.keys[k%len(h.g.keys)]
	other = other && (h.g.kind == distlock.KindRead || h.g.kind == distlock.KindWrite)
	m.async(t, func() { m.nested(h, key, other, wait) })
}

// opNestedSet: a nested TryLock of every key of a TryLockAll set, with a
// context carrying the set: one reentry rule for every key. A key
// reentered, and another acquired anew while the set was live (neither
// released nor lost meanwhile), break it.
func (m *model) opNestedSet(t *rapid.T) {
	h := m.drawHandle(t, func(h *mhandle) bool { return len(h.g.keys) > 1 && len(h.g.keys) < bigKeys })
	rot := pick(t, "first", 1<<20)
	if h == nil {
		return
	}
	keys := slices.Clone(h.g.keys)
	rot %= len(keys)
	keys = append(keys[rot:], keys[:rot]...)
	if h.g.p.closeCalled.Load() {
		return // ErrClosed for every key, whatever the rule
	}
	// live reports whether the set is live with no release begun, and
	// how many Unlocks of it began: a nested call counts as acquired
	// anew while the set was live only if it was so all along.
	live := func() (bool, int) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.liveLocked(h.g) && !m.releaseBegunLocked(h.g), h.g.unlocks
	}
	var reentered, acquired []string
	for _, k := range keys {
		before, u0 := live()
		reentry, io := m.nested(h, k, false, 0)
		after, u1 := live()
		live := before && after && u0 == u1
		switch {
		case reentry:
			reentered = append(reentered, k)
		case io > 0 && live:
			acquired = append(acquired, k)
		}
	}
	if len(reentered) > 0 && len(acquired) > 0 {
		m.fail("nested TryLocks of the keys of the set %v: %q took the reentry path, %q were acquired anew while the set was live: a set follows one reentry rule for every key", h.g, reentered, acquired)
	}
}

// opRace: the last Unlock of a lock and a nested TryLock of it, at once.
func (m *model) opRace(t *rapid.T) {
	h := m.drawHandle(t, func(h *mhandle) bool {
		return len(h.g.handles) == 1 && !h.called && !h.do && !h.g.p.closeCalled.Load() && !h.g.election
	})
	yields := rapid.IntRange(0, 3).Draw(t, "yields")
	if h == nil {
		return
	}
	key := h.g.keys[0]
	start := make(chan struct{})
	m.wg.Go(func() {
		<-start
		m.unlock(h, 0)
	})
	m.wg.Go(func() {
		<-start
		for range yields {
			runtime.Gosched()
		}
		m.nested(h, key, false, 0)
	})
	close(start)
}

// opCampaign: a campaign in the election, until elected or its timeout.
// The leadership is a mutex of the election's key to the store.
func (m *model) opCampaign(t *rapid.T) {
	p := m.drawProc(t)
	value := rapid.SampledFrom([]string{"x", "y"}).Draw(t, "value")
	a := acquisition{p: p, what: "Campaign " + electName, kind: distlock.KindMutex, wait: distlock.WaitForever,
		call: func(ctx context.Context, _ time.Duration) (*distlock.Lock, error) {
			return p.d.Election(electName).Campaign(ctx, value)
		}}
	a.ttl = drawTTL(t)
	a.timeout = drawTimeout(t, true)
	a.watch = rapid.IntRange(0, 3).Draw(t, "watch") > 0
	m.async(t, func() {
		if h := m.run(a); h != nil {
			m.mu.Lock()
			h.g.election = true
			m.mu.Unlock()
		}
	})
}

// opProclaim: Proclaim a new value of a leadership, once or twice at
// once (one relabel at a time with the renewals and Extends).
func (m *model) opProclaim(t *rapid.T) {
	h := m.drawHandle(t, func(h *mhandle) bool { return h.g.election })
	n := rapid.IntRange(1, 2).Draw(t, "proclaims")
	for i := range n {
		timeout := drawTimeout(t, false)
		if h == nil {
			m.async(t, nil)
			continue
		}
		m.mu.Lock()
		unlocks := h.g.unlocks
		m.mu.Unlock()
		value := fmt.Sprintf("v%d", i)
		m.async(t, func() {
			ctx, cancel := withTimeout(timeout)
			defer cancel()
			err := h.g.p.d.Election(electName).Proclaim(ctx, h.lk, value)
			m.logf("p%d Proclaim %q of %v (timeout %v): %v", h.g.p.id, value, h.g, timeout, err)
			if errors.Is(err, distlock.ErrInvalid) || errors.Is(err, distlock.ErrUnsupported) {
				m.fail("Proclaim of %v = %v", h.g, err)
			}
			if errors.Is(err, distlock.ErrNotHeld) {
				// Lost, or released: Done closes, as after an Extend
				// that said so.
				m.mu.Lock()
				m.notHeld = append(m.notHeld, notHeld{"Proclaim", h.g, unlocks, err})
				m.mu.Unlock()
			}
		})
	}
}

// opExtend: Extend, once or twice at once, with drawn TTLs.
func (m *model) opExtend(t *rapid.T) {
	h := m.drawHandle(t, nil)
	n := rapid.IntRange(1, 2).Draw(t, "extends")
	for range n {
		ttl := drawTTL(t)
		timeout := drawTimeout(t, false)
		if h == nil {
			m.async(t, nil)
			continue
		}
		m.mu.Lock()
		h.g.extended = true
		unlocks := h.g.unlocks
		m.mu.Unlock()
		m.async(t, func() {
			ctx, cancel := withTimeout(timeout)
			defer cancel()
			err := h.lk.Extend(ctx, ttl)
			m.logf("p%d Extend %v to %v (timeout %v): %v", h.g.p.id, h.g, ttl, timeout, err)
			if errors.Is(err, distlock.ErrInvalid) || errors.Is(err, distlock.ErrUnsupported) {
				m.fail("Extend(%v) of %v = %v", ttl, h.g, err)
			}
			if errors.Is(err, distlock.ErrNotHeld) {
				// Lost, or released (an Unlock began meanwhile, even one
				// that then failed): Done closes, once the loss is told
				// (checked when the bubble settles).
				m.mu.Lock()
				m.notHeld = append(m.notHeld, notHeld{"Extend", h.g, unlocks, err})
				m.mu.Unlock()
			}
		})
	}
}

// opUnlock: Unlock a handle, once, or twice at once.
func (m *model) opUnlock(t *rapid.T) {
	again := rapid.IntRange(0, 9).Draw(t, "again") == 0
	h := m.drawHandle(t, func(h *mhandle) bool { return !h.do && (!h.unlocked || again) })
	n := 1
	if rapid.IntRange(0, 4).Draw(t, "twice") == 0 {
		n = 2
	}
	for range n {
		timeout := drawTimeout(t, false)
		if h == nil {
			m.async(t, nil)
			continue
		}
		m.async(t, func() { m.unlock(h, timeout) })
	}
}

func (m *model) unlock(h *mhandle, timeout time.Duration) {
	g := h.g
	m.mu.Lock()
	again := h.unlocked // a second Unlock: the first told how it went
	g.unlocks++
	h.calls++
	h.called = true
	overlapped := h.calls > 1
	if overlapped {
		h.overlaps++
	}
	mark := h.overlaps
	gen := m.reentryGen[g]
	if m.reentries[g] > 0 {
		gen = -1
	}
	m.mu.Unlock()
	ctx, cancel := withTimeout(timeout)
	defer cancel()
	start := time.Now()
	err := h.lk.Unlock(ctx)
	el := time.Since(start)
	m.logf("p%d Unlock %v (nested=%v, timeout %v): %v after %v", g.p.id, g, h.nested, timeout, err, el)
	m.mu.Lock()
	defer m.mu.Unlock()
	h.calls--
	overlapped = overlapped || h.calls > 0 || h.overlaps != mark
	if timeout > 0 && el > timeout+slack {
		m.failLocked("Unlock of %v returned after %v; its context ended after %v", g, el, timeout)
	}
	switch {
	case errors.Is(err, distlock.ErrInvalid):
		m.failLocked("Unlock of %v = %v", g, err)
	case err != nil && !errors.Is(err, distlock.ErrNotHeld):
		return // a store error: still held, Unlock may be called again
	case (again || overlapped) && errors.Is(err, distlock.ErrNotHeld):
		return // "already unlocked": the other call tells how it went
	}
	h.unlocked = true
	raced := gen < 0 || m.reentries[g] > 0 || m.reentryGen[g] != gen
	for _, o := range g.handles {
		if !o.unlocked || o.calls > 0 || o.bg {
			return // not the last, or its release goes on elsewhere
		}
	}
	if !raced && m.liveLocked(g) && m.s.exemption(g.value) == "" {
		m.failLocked("Unlock of the last handle of %v = %v, and the lock is still live", g, err)
	}
}

// opDo: Do, of every kind, around a function that holds the lock a while,
// maybe reentering it through its context.
func (m *model) opDo(t *rapid.T) {
	p := m.drawProc(t)
	kind := rapid.SampledFrom([]distlock.Kind{distlock.KindMutex, distlock.KindSemaphore, distlock.KindRead, distlock.KindWrite}).Draw(t, "kind")
	key := rapid.SampledFrom(mutexKeys).Draw(t, "key")
	wait := ms(rapid.IntRange(0, 200).Draw(t, "waitms"))
	ttl := drawTTL(t)
	hold := ms(rapid.IntRange(0, 200).Draw(t, "holdms"))
	reenter := rapid.Bool().Draw(t, "reenter")
	m.async(t, func() {
		var h *mhandle
		fn := func(fctx context.Context, lk *distlock.Lock) error {
			h = m.register(p, lk, kind, nil, true, fmt.Sprintf("Do %v", kind))
			if h == nil {
				return nil
			}
			m.mu.Lock()
			h.do = true
			m.mu.Unlock()
			if reenter {
				m.nestedInDo(h, fctx)
			}
			time.Sleep(hold)
			m.mu.Lock()
			h.calls++ // Do releases it now
			h.called = true
			m.mu.Unlock()
			return nil
		}
		ctx := distlock.ContextWithTTL(context.Background(), ttl)
		var err error
		switch kind {
		case distlock.KindMutex:
			err = p.d.Do(ctx, key, wait, fn)
		case distlock.KindSemaphore:
			err = p.d.Semaphore(semKey, semLimit).Do(ctx, wait, fn)
		case distlock.KindRead:
			err = p.d.RWMutex(rwKey).RDo(ctx, wait, fn)
		case distlock.KindWrite:
			err = p.d.RWMutex(rwKey).Do(ctx, wait, fn)
		}
		m.logf("p%d Do %v: %v", p.id, kind, err)
		if h != nil {
			m.mu.Lock()
			h.calls--
			h.unlocked = true
			// fn returned nil: err is the release's. A store error:
			// Do keeps releasing in the background.
			h.bg = err != nil && !errors.Is(err, distlock.ErrNotHeld)
			m.mu.Unlock()
		}
	})
}

// nestedInDo reenters Do's lock through fn's context, and unlocks it.
func (m *model) nestedInDo(h *mhandle, fctx context.Context) {
	g := h.g
	ctx, cancel := context.WithTimeout(fctx, time.Second)
	defer cancel()
	var (
		lk  *distlock.Lock
		err error
	)
	switch g.kind {
	case distlock.KindSemaphore:
		lk, err = g.p.d.Semaphore(semKey, semLimit).TryAcquire(ctx, 0)
	case distlock.KindRead:
		lk, err = g.p.d.RWMutex(rwKey).TryRLock(ctx, 0)
	case distlock.KindWrite:
		lk, err = g.p.d.RWMutex(rwKey).TryLock(ctx, 0)
	default:
		lk, err = g.p.d.TryLock(ctx, g.keys[0], 0)
	}
	if err != nil {
		return
	}
	h2 := m.register(g.p, lk, g.kind, g, true, "TryLock in Do")
	if h2 != nil {
		m.unlock(h2, 0)
	}
}

// opClose: Close a process, then start a fresh one in its place.
func (m *model) opClose(t *rapid.T) {
	i := rapid.IntRange(0, len(m.procs)-1).Draw(t, "proc")
	p := m.procs[i]
	p.closeCalled.Store(true)
	m.mu.Lock()
	p.closeStart = time.Now()
	m.mu.Unlock()
	m.async(t, func() {
		err := p.d.Close()
		el := time.Since(p.closeStart)
		m.logf("p%d Close: %v after %v", p.id, err, el)
		m.mu.Lock()
		defer m.mu.Unlock()
		p.closeDone, p.closeErr, p.closeEnd = true, err, time.Now()
		if el > p.closeTimeout+slack {
			m.failLocked("Close of p%d took %v; its bound is %v", p.id, el, p.closeTimeout)
		}
	})
	m.procs[i] = m.newProc(t)
}

func (m *model) opInspect(t *rapid.T) {
	p := m.drawProc(t)
	which := rapid.IntRange(0, 2).Draw(t, "which")
	m.async(t, func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var err error
		switch which {
		case 0:
			_, err = p.d.Inspect(ctx, mutexKeys[0])
		case 1:
			_, err = p.d.Semaphore(semKey, semLimit).Inspect(ctx)
		default:
			_, err = p.d.RWMutex(rwKey).Inspect(ctx)
		}
		if errors.Is(err, distlock.ErrInvalid) || errors.Is(err, distlock.ErrUnsupported) {
			m.fail("Inspect = %v", err)
		}
	})
}

func (m *model) opFaults(t *rapid.T) {
	on := rapid.Bool().Draw(t, "on")
	ps := []float64{0, 0.1, 0.3}
	pFail := rapid.SampledFrom(ps).Draw(t, "pFail")
	pLose := rapid.SampledFrom(ps).Draw(t, "pLose")
	pHang := rapid.SampledFrom(ps).Draw(t, "pHang")
	m.logf("faults on=%v fail=%v lose=%v hang=%v", on, pFail, pLose, pHang)
	m.s.setFaults(on, pFail, pLose, pHang)
}

// opStall stalls the store, all of it or some of its shards, every
// request or only those that update a held lock, or ends the stall.
func (m *model) opStall(t *rapid.T) {
	mask := uint8(rapid.IntRange(1, 1<<shards-1).Draw(t, "shards"))
	rows := rapid.Bool().Draw(t, "rowsOnly")
	if !rapid.Bool().Draw(t, "on") {
		mask = 0
	}
	m.logf("stall shards %03b (held rows only: %v)", mask, rows)
	m.s.stall(mask, rows)
}

// opLose: the store loses a lease and says so (its Lost closes), as a
// session or lease that ends does; preferably one being released.
func (m *model) opLose(t *rapid.T) {
	m.mu.Lock()
	var gs, releasing []*mgrant
	for _, g := range m.grants {
		if !g.lostSignal {
			gs = append(gs, g)
			if m.inFlightLocked(g) {
				releasing = append(releasing, g)
			}
		}
	}
	m.mu.Unlock()
	slices.SortFunc(gs, func(a, b *mgrant) int { return strings.Compare(a.value, b.value) })
	slices.SortFunc(releasing, func(a, b *mgrant) int { return strings.Compare(a.value, b.value) })
	if rapid.Bool().Draw(t, "releasing") && len(releasing) > 0 {
		gs = releasing
	}
	i, k := pick(t, "grant", len(gs)), pick(t, "key", 1<<20)
	if i < 0 {
		return
	}
	g := gs[i]
	id := g.ids()[k%len(g.keys)]
	if !m.s.loseLease(id) {
		return
	}
	m.logf("the store lost %v", id)
	m.mu.Lock()
	g.lostSignal = true
	m.mu.Unlock()
}

// opEvict: an operator deletes a key behind its holders' backs.
func (m *model) opEvict(t *rapid.T) {
	key := rapid.SampledFrom(hostileKeys).Draw(t, "key")
	m.logf("evict %q", key)
	m.s.evict(key)
}

// opSlow: a handler of a process blocks a while once, ignoring ctx.
func (m *model) opSlow(t *rapid.T) {
	p := m.drawProc(t)
	d := ms(rapid.IntRange(1, 100).Draw(t, "slowms"))
	m.logf("p%d: a handler will block %v", p.id, d)
	p.slow.delay.Store(int64(d))
}

// opPass lets virtual time pass: renewals, expiries, replies.
func (m *model) opPass(t *rapid.T) {
	var d time.Duration
	switch rapid.IntRange(0, 9).Draw(t, "passKind") {
	case 0, 1:
		d = ms(rapid.IntRange(500, 5000).Draw(t, "passms"))
	case 2, 3, 4:
		d = ms(rapid.IntRange(50, 500).Draw(t, "passms"))
	default:
		d = ms(rapid.IntRange(1, 50).Draw(t, "passms"))
	}
	m.logf("pass %v", d)
	time.Sleep(d)
}

// opRefusal, as Go's own sync.RWMutex test does: a request refused while
// the other side holds leaves nothing that refuses the next request, from
// another process, once the lock is free.
func (m *model) opRefusal(t *rapid.T) {
	if m.waiter {
		t.Skip("the spin loop's policy")
	}
	m.probes++
	key := fmt.Sprintf("%srefusal%d", calmPrefix, m.probes)
	ps := rapid.Permutation(m.procs[:]).Draw(t, "procs")
	writerFirst := rapid.Bool().Draw(t, "writerFirst")
	wait := ms(rapid.SampledFrom([]int{0, 0, 1, 20}).Draw(t, "waitms"))
	thenWrite := rapid.Bool().Draw(t, "thenWrite")
	disarm(ps)
	// The holder outlives the refused request's wait.
	ctx := distlock.ContextWithTTL(context.Background(), 10*time.Second)
	side := func(p *proc, write bool, wait time.Duration) (*distlock.Lock, error) {
		if write {
			return p.d.RWMutex(key).TryLock(ctx, wait)
		}
		return p.d.RWMutex(key).TryRLock(ctx, wait)
	}
	first, err := side(ps[0], writerFirst, 0)
	if err != nil {
		m.fail("probe %q: the first request on a free lock = %v", key, err)
		return
	}
	if lk, err := side(ps[1], !writerFirst, wait); err == nil {
		m.fail("probe %q: a request of the other side got in beside the holder", key)
		lk.Unlock(context.Background())
	} else if !errors.Is(err, distlock.ErrNotAcquired) {
		m.fail("probe %q: a request of the other side = %v; want ErrNotAcquired", key, err)
	}
	if err := first.Unlock(context.Background()); err != nil {
		m.fail("probe %q: Unlock = %v", key, err)
	}
	third, err := side(ps[2], thenWrite, 0)
	if err != nil {
		m.fail("probe %q: once free (write=%v holder released, the other side refused), a request (write=%v) from another process = %v: the refused request left something that keeps the next out",
			key, writerFirst, thenWrite, err)
		return
	}
	third.Unlock(context.Background())
}

// opFIFO: a writer that arrived first among waiters is served before a
// later writer, and before a reader that arrived after it, however short
// its TTL or long its process's spin.
func (m *model) opFIFO(t *rapid.T) {
	if m.waiter {
		t.Skip("the spin loop's policy")
	}
	m.probes++
	key := fmt.Sprintf("%sfifo%d", calmPrefix, m.probes)
	ps := rapid.Permutation(m.procs[:]).Draw(t, "procs")
	hold := ms(rapid.IntRange(0, 300).Draw(t, "holdms"))
	ttl1 := ms(rapid.IntRange(20, 200).Draw(t, "ttl1ms"))
	ttl2 := ms(rapid.IntRange(20, 200).Draw(t, "ttl2ms"))
	reader := rapid.Bool().Draw(t, "reader")
	disarm(ps)
	holder, err := ps[0].d.RWMutex(key).TryRLock(distlock.ContextWithTTL(context.Background(), 10*time.Second), 0)
	if err != nil {
		m.fail("probe %q: TryRLock of a free lock = %v", key, err)
		return
	}
	var (
		mu       sync.Mutex
		order    []string
		firstErr error
		wg       sync.WaitGroup
	)
	wait := hold + 2*time.Second
	waiter := func(name string, p *proc, write bool, ttl time.Duration) {
		wg.Go(func() {
			ctx := distlock.ContextWithTTL(context.Background(), ttl)
			var lk *distlock.Lock
			var err error
			if write {
				lk, err = p.d.RWMutex(key).TryLock(ctx, wait)
			} else {
				lk, err = p.d.RWMutex(key).TryRLock(ctx, wait)
			}
			if err != nil {
				if name == "the first writer" {
					mu.Lock()
					firstErr = err
					mu.Unlock()
				}
				return
			}
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			lk.Unlock(context.Background())
		})
	}
	waiter("the first writer", ps[1], true, ttl1)
	// The second comes once the first is in line.
	for i := 0; i < 100 && m.intentOf(key) == ""; i++ {
		time.Sleep(time.Millisecond)
	}
	waiter("a later writer", ps[2], true, ttl2)
	if reader {
		waiter("a later reader", ps[0], false, ttl2)
	}
	time.Sleep(hold)
	holder.Unlock(context.Background())
	wg.Wait()
	// The first writer comes first, or waited in vain the whole time.
	if len(order) > 0 && order[0] != "the first writer" && (slices.Contains(order, "the first writer") || errors.Is(firstErr, distlock.ErrNotAcquired)) {
		m.fail("probe %q (TTLs %v, %v, held %v): %s was served before the first writer, which waited from the start (served: %q; the first writer: %v)", key, ttl1, ttl2, hold, order[0], order, firstErr)
	}
}

// disarm keeps the slow handlers of ps from blocking the probe's
// acquisitions (one could outlast a short lease).
func disarm(ps []*proc) {
	for _, p := range ps {
		p.slow.delay.Store(0)
	}
}

// intentOf returns the owner value of key's write intent, if any.
func (m *model) intentOf(key string) string {
	for _, c := range m.s.mem.Contents(key) {
		if v, ok := strings.CutPrefix(c, "write intent "); ok {
			return v
		}
	}
	return ""
}

// ---- checks ----

// check runs after every step, once the bubble has settled.
func (m *model) check(t *rapid.T) {
	m.wd.steps.Add(1)
	synctest.Wait()
	m.checkNow()
	if f := m.firstFailure(); f != "" {
		t.Fatal(f + m.lastSteps())
	}
}

// lastSteps returns the end of the schedule's trace, for a failure.
func (m *model) lastSteps() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return "\n\nthe schedule's last steps (virtual time):\n" + strings.Join(m.trace[max(0, len(m.trace)-60):], "\n")
}

func (m *model) checkNow() {
	for _, p := range m.s.problemsSeen() {
		m.fail("%s", p)
	}
	if n := runtime.NumGoroutine() - m.baseG; n > maxGoroutines {
		m.fail("%d goroutines in the schedule; at most %d expected", n, maxGoroutines)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	gs := make([]*mgrant, 0, len(m.grants))
	for _, g := range m.grants {
		gs = append(gs, g)
	}
	slices.SortFunc(gs, func(a, b *mgrant) int { return strings.Compare(a.value, b.value) })
	// One open holder per key, or limit, or readers without a writer.
	mutex := map[string][]*mgrant{}
	var sem, readers, writers []*mgrant
	for _, g := range gs {
		if !m.openLocked(g) {
			continue
		}
		switch g.kind {
		case distlock.KindMutex:
			for _, k := range g.keys {
				mutex[k] = append(mutex[k], g)
			}
		case distlock.KindSemaphore:
			sem = append(sem, g)
		case distlock.KindRead:
			readers = append(readers, g)
		case distlock.KindWrite:
			writers = append(writers, g)
		}
	}
	for k, open := range mutex {
		if len(open) > 1 {
			m.failLocked("mutex %q has %d open holders: %v", k, len(open), open)
		}
	}
	if len(sem) > semLimit {
		m.failLocked("the semaphore has %d open holders; its limit is %d: %v", len(sem), semLimit, sem)
	}
	if len(writers) > 1 || len(writers) == 1 && len(readers) > 0 {
		m.failLocked("the read/write lock has open writers %v and readers %v", writers, readers)
	}
	// An Extend or Proclaim that said ErrNotHeld ended the grant, whatever
	// freed the key: an operator's eviction (which the store may not
	// signal), an expiry, a request whose reply was lost.
	for _, n := range m.notHeld {
		if n.g.unlocks == n.unlocks && !m.releaseBegunLocked(n.g) && m.liveLocked(n.g) {
			m.failLocked("%s of %v = %v, nobody released it, and the lock is still live", n.op, n.g, n.err)
		}
	}
	m.notHeld = nil
	for _, g := range gs {
		closing := g.p.closeCalled.Load() && !g.p.closeDone
		// The store reported the lease lost: once no release is in
		// flight, Done is closed.
		if g.lostSignal && !m.inFlightLocked(g) && !closing && m.s.exemption(g.value) == "" && m.liveLocked(g) {
			m.failLocked("the store reported %v lost, no release is in flight, and the lock is still live", g)
		}
		// Close returned: every lock of it has ended.
		if g.p.closeDone && !m.inFlightLocked(g) && m.liveLocked(g) {
			m.failLocked("Close of p%d returned, and its lock %v is still live", g.p.id, g)
		}
		// Done closed without a loss: every handle was unlocked.
		if g.watched && isClosed(g.done) && !g.p.closeCalled.Load() && !g.p.rec.lostToken(g.token) {
			for _, h := range g.handles {
				if !h.called {
					m.failLocked("the Done of %v closed, without a loss reported, while a handle (nested=%v) of it was never unlocked", g, h.nested)
					break
				}
			}
		}
	}
	for _, p := range m.all {
		if err := p.rec.check(false); err != nil {
			m.failLocked("p%d: %v", p.id, err)
		}
		if p.closeCalled.Load() {
			end := p.closeEnd
			if !p.closeDone {
				end = time.Now()
			}
			if err := p.rec.closeRetryLoss(p.closeStart, end, p.closeStart.Add(p.closeTimeout), m.validUntilLocked); err != nil {
				m.failLocked("p%d: %v", p.id, err)
			}
		}
	}
}

// teardown heals the store, closes every process, and checks the end
// state. It runs even when a step failed, so that the bubble ends.
func (m *model) teardown() {
	m.logf("teardown")
	m.s.heal()
	for _, p := range m.procs {
		p.closeCalled.Store(true)
		m.mu.Lock()
		p.closeStart = time.Now()
		m.mu.Unlock()
		err := p.d.Close()
		el := time.Since(p.closeStart)
		m.mu.Lock()
		p.closeDone, p.closeErr, p.closeEnd = true, err, time.Now()
		m.mu.Unlock()
		if el > p.closeTimeout+slack {
			m.fail("Close of p%d took %v; its bound is %v", p.id, el, p.closeTimeout)
		}
	}
	m.wg.Wait()
	// Nobody waits any more: a place in a line, or a mutex kept for a
	// waiter, of a process whose Close returned nil is one its wait left
	// behind (it keeps the others out until it lapses).
	for value, what := range m.s.inLine() {
		p := m.procOf(value)
		m.mu.Lock()
		cleanly := p != nil && p.closeDone && p.closeErr == nil
		m.mu.Unlock()
		if cleanly {
			m.fail("the store keeps %s for %s of p%d after every process closed, and its Close returned nil", what, value, p.id)
		}
	}
	// A lock Close could not release stays held until its owner unlocks
	// it: the store is healthy now.
	m.mu.Lock()
	hs := slices.Clone(m.handles)
	m.mu.Unlock()
	for _, h := range hs {
		if !h.unlocked {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := h.lk.Unlock(ctx); err != nil && !errors.Is(err, distlock.ErrNotHeld) {
				m.fail("Unlock of %v on a healed store = %v", h.g, err)
			}
			cancel()
		}
	}
	// Let what is on its way land (late acquires meet their tombstones),
	// the rivals' leases run out, and the calls that got no reply end
	// with their contexts: a renewal's ends with its lock's validity.
	time.Sleep(maxTTL + time.Second)
	synctest.Wait()
	m.checkNow()
	for _, p := range m.all {
		if err := p.rec.check(true); err != nil {
			m.fail("p%d at the end: %v", p.id, err)
		}
		if p.met != nil {
			if held := p.met.Stats().Held; held != p.rec.unreleased() {
				m.fail("p%d: metrics' Held = %d after Close; want %d", p.id, held, p.rec.unreleased())
			}
		}
	}
	for key, left := range m.s.leftovers() {
		for _, c := range left {
			value := c[strings.LastIndexByte(c, ' ')+1:]
			if strings.HasPrefix(value, phantomPrefix) {
				continue
			}
			p := m.procOf(value)
			m.mu.Lock()
			cleanly := p == nil || p.closeErr == nil
			m.mu.Unlock()
			if cleanly {
				m.fail("the store still holds %q (%s) after every process closed, and its process's Close returned nil", key, c)
			}
		}
	}
}

// leaked reports the goroutines left in the bubble after the teardown.
func (m *model) leaked() string {
	synctest.Wait()
	if stacks := bubbleStacks(); len(stacks) > 0 {
		all := strings.Join(stacks, "\n\n")
		m.fail("%d goroutines left behind after every process closed:\n%s", len(stacks), all)
		return all
	}
	return ""
}

// bubbleStacks returns the stacks of the goroutines in synctest bubbles,
// but synctest's own and the caller's.
func bubbleStacks() []string {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		header, _, _ := strings.Cut(g, "\n")
		if strings.Contains(header, "synctest bubble") && !strings.Contains(g, "bubbleStacks") &&
			!strings.Contains(g, "internal/synctest.Run(") && !strings.Contains(g, "synctest.testingSynctestTest(") {
			out = append(out, g)
		}
	}
	return out
}

// ---- handlers ----

// recorder is a handler that checks the chain's contract from the inside:
// one Release per Acquire that returned nil, losses reported once and
// never during or after a release.
type recorder struct {
	mu      sync.Mutex
	reqs    map[*distlock.Request]*reqRecord
	byToken map[uint64]*reqRecord
}

type reqRecord struct {
	key                      string
	token                    uint64
	acquiredAt               time.Time     // the Request's Acquired
	ttl                      time.Duration // the Request's TTL
	acquired, released, lost int
	releasing                bool
	events                   []recEvent
}

// recEvent is a Release call's end (err) or a loss report.
type recEvent struct {
	at   time.Time
	lost bool
	err  error
}

func newRecorder() *recorder {
	return &recorder{reqs: map[*distlock.Request]*reqRecord{}, byToken: map[uint64]*reqRecord{}}
}

func (h *recorder) rec(r *distlock.Request) *reqRecord {
	rr := h.reqs[r]
	if rr == nil {
		rr = &reqRecord{key: r.Key}
		h.reqs[r] = rr
	}
	return rr
}

// lostToken reports whether a loss was reported for the lock of token.
func (h *recorder) lostToken(token uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	rr := h.byToken[token]
	return rr != nil && rr.lost > 0
}

func (h *recorder) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	err := next(ctx, r)
	if err == nil {
		h.mu.Lock()
		rr := h.rec(r)
		rr.acquired++
		rr.token = r.Token
		rr.acquiredAt, rr.ttl = r.Acquired, r.TTL
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
	defer h.mu.Unlock()
	rr := h.rec(r)
	rr.releasing = false
	rr.events = append(rr.events, recEvent{at: time.Now(), err: err})
	if err == nil || errors.Is(err, distlock.ErrNotHeld) {
		rr.released++
	}
	return err
}

func (h *recorder) LockLost(r *distlock.Request, _ error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	rr := h.rec(r)
	rr.lost++
	rr.events = append(rr.events, recEvent{at: time.Now(), lost: true})
	if rr.releasing || rr.released > 0 {
		rr.lost += 100 // reported during or after a release: check says so
	}
}

// failedOnly reports whether every Release call of the request failed:
// the release Close gave up on at its bound.
func (rr *reqRecord) failedOnly() bool {
	n := 0
	for _, e := range rr.events {
		if !e.lost {
			n++
		}
	}
	return n > 0 && rr.released == 0
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
	for _, rr := range h.reqs {
		switch {
		case rr.acquired > 1:
			return fmt.Errorf("%q: Acquire returned nil %d times for one request", rr.key, rr.acquired)
		case rr.released > rr.acquired:
			return fmt.Errorf("%q (token %d): %d Releases for %d Acquires", rr.key, rr.token, rr.released, rr.acquired)
		case rr.lost >= 100:
			return fmt.Errorf("%q (token %d): loss reported during or after its release", rr.key, rr.token)
		case rr.lost > 1:
			return fmt.Errorf("%q (token %d): loss reported %d times", rr.key, rr.token, rr.lost)
		case final && rr.released != rr.acquired && !rr.failedOnly():
			return fmt.Errorf("%q (token %d): %d Releases for %d Acquires after Close; events: %v", rr.key, rr.token, rr.released, rr.acquired, rr.events)
		}
	}
	return nil
}

// closeRetryLoss finds a loss reported for a lock during Close [start,
// end], before its bound, while the lock was still valid by the facade's
// clock (validUntil: zero when unknown), which was then released before
// Close returned: the store still held it, and Close could release it,
// so it was not lost. (At its bound, Close reports what it could not
// release lost; an Unlock may still delete it.)
func (h *recorder) closeRetryLoss(start, end, bound time.Time, validUntil func(token uint64, acquired time.Time, ttl time.Duration) time.Time) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, rr := range h.reqs {
		for i, e := range rr.events {
			if !e.lost || e.at.Before(start) || !e.at.Before(bound) || e.at.After(end) {
				continue
			}
			if valid := validUntil(rr.token, rr.acquiredAt, rr.ttl); valid.IsZero() || !e.at.Before(valid) {
				continue
			}
			for _, later := range rr.events[i+1:] {
				if !later.lost && later.err == nil && !later.at.After(end) {
					return fmt.Errorf("%q (token %d): a loss was reported during Close while the lock was valid, and it was then released before Close returned", rr.key, rr.token)
				}
			}
		}
	}
	return nil
}

// slowHandler blocks the chain's return once when armed, ignoring ctx: a
// handler whose writer blocks a moment.
type slowHandler struct {
	delay atomic.Int64
	fired atomic.Int64
}

func (h *slowHandler) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	err := next(ctx, r)
	if d := h.delay.Swap(0); d > 0 {
		h.fired.Add(1)
		time.Sleep(time.Duration(d)) // the injected fault: a slow handler
	}
	return err
}

func (h *slowHandler) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	return next(ctx, r)
}

// ---- watchdog ----

// watchdog watches the schedules from outside their bubbles, in real
// time. A facade that spins at one virtual instant keeps virtual time
// from advancing, and so the schedule from taking its next step. When
// neither happens for a while, it prints every goroutine and the
// schedule's trace, and panics: the bubble cannot be ended from outside.
type watchdog struct {
	steps    atomic.Int64 // steps taken, over all schedules
	virtual  atomic.Int64 // the virtual time of the last store call
	calls    atomic.Int64 // store calls
	trace    atomic.Pointer[string]
	schedule atomic.Int64
	done     chan struct{}
}

const (
	stuckAfter = 60 * time.Second
	// Sooner when the bubble is busy meanwhile: goroutines made (a timer
	// firing again and again) or store calls (a loop that never sleeps).
	spinAfter    = 5 * time.Second
	spinCreation = 200000
	spinCalls    = 200000
)

func startWatchdog() *watchdog {
	w := &watchdog{done: make(chan struct{})}
	go w.watch()
	return w
}

func (w *watchdog) stop() { close(w.done) }

func (w *watchdog) begin() { w.schedule.Add(1); w.steps.Add(1) }

// call records a store call at the virtual instant now.
func (w *watchdog) call(now time.Time) {
	w.calls.Add(1)
	w.virtual.Store(now.UnixNano())
}

func (w *watchdog) watch() {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	sample := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	created := func() int64 {
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return int64(sample[0].Value.Uint64())
	}
	steps, virtual := w.steps.Load(), w.virtual.Load()
	since, made, calls := time.Now(), created(), w.calls.Load()
	for {
		select {
		case <-w.done:
			return
		case <-tick.C:
		}
		if s, v := w.steps.Load(), w.virtual.Load(); s != steps || v != virtual {
			steps, virtual = s, v
			since, made, calls = time.Now(), created(), w.calls.Load()
			continue
		}
		idle, spun, called := time.Since(since), created()-made, w.calls.Load()-calls
		if idle < stuckAfter && (idle < spinAfter || spun < spinCreation && called < spinCalls) {
			continue
		}
		buf := make([]byte, 8<<20)
		buf = buf[:runtime.Stack(buf, true)]
		trace := ""
		if tr := w.trace.Load(); tr != nil {
			trace = *tr
		}
		msg := fmt.Sprintf("TestLifecycleModel: schedule %d took no step and its virtual time stood still for %v, while %d goroutines were made and the store was called %d times: the facade spins at one virtual instant, or hangs",
			w.schedule.Load(), idle.Round(time.Second), spun, called)
		fmt.Fprintf(os.Stderr, "%s\n\nthe schedule's last steps (virtual time):\n%s\n\ngoroutines:\n%s\n", msg, trace, buf)
		panic(msg)
	}
}
