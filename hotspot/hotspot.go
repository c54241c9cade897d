package hotspot

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
)

var _ distlock.Handler = (*Handler)(nil)

// DefaultIdleAfter is how long a promoted key may stay unused before it is
// demoted, unless [WithIdleAfter] says otherwise.
const DefaultIdleAfter = 30 * time.Second

// Handler is the hotspot handler. Build it with [New] or [NewWithOptions];
// it is safe for concurrent use, and one Handler may serve several
// [distlock.DistributeLock]s of one process.
type Handler struct {
	mu      sync.Mutex
	entries map[string]*entry // keys with a local lock, and retired ones still in use

	// adaptive mode; threshold == 0: off
	threshold int
	capacity  int
	idleAfter time.Duration
	now       func() time.Time
	waiting   map[string]int // goroutines inside Acquire per key; only in adaptive mode
	lru       *list.List     // promoted entries, most recently used at the front

	notifier backend.Notifier // standing subscriptions; nil: none
	yieldMax time.Duration    // yield mode; 0: off

	// Semaphores and read/write locks of hot keys: their local gates,
	// and the gate each acquisition holds until its Release.
	gates    map[gateID]*gate
	gateHeld map[*distlock.Request]heldGate
}

type heldGate struct {
	id gateID
	g  *gate
	n  int64
}

// entry is the local lock of one key.
type entry struct {
	key  string
	sem  chan struct{} // capacity 1: full when held
	refs int           // goroutines waiting for or holding sem

	registered bool          // by New or Register
	promoted   bool          // by auto-detection
	elem       *list.Element // in lru while promoted
	lastUsed   time.Time     // when the last goroutine left; for demotion
	owner      *distlock.Request
	contended  bool // another process held the key during the last acquisition

	// WithYield: release notices of key while refs > 0
	notices     <-chan struct{}
	unsubscribe func()
}

// ownNoticeWait bounds how long a release waits for its own notice.
const ownNoticeWait = 5 * time.Millisecond

func (e *entry) active() bool { return e.registered || e.promoted }

// Option configures a Handler built by [NewWithOptions].
type Option func(*Handler) error

// WithKeys registers keys, as [Handler.Register] does.
func WithKeys(keys ...string) Option {
	return func(h *Handler) error {
		h.register(keys)
		return nil
	}
}

// WithAutoDetect turns on adaptive mode: a key gets a local lock while at
// least threshold goroutines of this process wait for it at once (counted
// as they enter the acquisition, the local wait included), and at most
// capacity keys are promoted so, the least recently used demoted first.
// Registered keys do not count against capacity. Default: off.
// threshold < 1 or capacity < 1 make NewWithOptions fail.
func WithAutoDetect(threshold, capacity int) Option {
	return func(h *Handler) error {
		if threshold < 1 || capacity < 1 {
			return fmt.Errorf("hotspot: auto-detect threshold %d and capacity %d must be >= 1", threshold, capacity)
		}
		h.threshold, h.capacity = threshold, capacity
		return nil
	}
}

// WithIdleAfter sets how long a promoted key may go unused (no goroutine
// waiting for or holding it) before it is demoted, checked whenever a key is
// promoted and by [Handler.Hot]. Default [DefaultIdleAfter]. d <= 0 makes
// NewWithOptions fail.
func WithIdleAfter(d time.Duration) Option {
	return func(h *Handler) error {
		if d <= 0 {
			return fmt.Errorf("hotspot: idle time %v must be > 0", d)
		}
		h.idleAfter = d
		return nil
	}
}

// WithNotifier keeps one subscription to a key's release notices from n
// while goroutines of this process wait for or hold the key (registered or
// promoted), so the store stays subscribed between handoffs instead of
// subscribing and unsubscribing for each waiter (Redis: a SUBSCRIBE, an
// UNSUBSCRIBE and a wake-up on each confirmation). n must be the Notifier
// of the store the locks are on. A nil n makes NewWithOptions fail.
// [WithYield] implies it.
func WithNotifier(n backend.Notifier) Option {
	return func(h *Handler) error {
		if n == nil {
			return errors.New("hotspot: nil notifier")
		}
		h.notifier = n
		return nil
	}
}

// WithYield makes the next local waiter of a key give way to other
// processes: when the acquisition that just released the key had to wait
// for another process (a failed remote attempt, or a release notice ended
// its own yield), the next goroutine of this process does not try the
// store at once, where it would race the waiters of the other processes
// that the release notice woke; it waits for the next release notice from
// n, at most max (and never past its deadline), then tries. Each release
// then costs one attempt per other waiting process instead of one per
// waiting process, and the processes take turns.
//
// While goroutines of this process wait for or hold a registered or
// promoted key, the handler keeps one subscription to the key's release
// notices, so the store stays subscribed between handoffs (Redis: no
// SUBSCRIBE and UNSUBSCRIBE per waiter, and no wake-up on each
// subscription's confirmation). A release whose successor will yield waits
// for its own notice (at most 5ms) before handing over locally, so that the
// successor sees only the next release.
//
// n must be the Notifier of the store the locks are on (a resource that
// implements [backend.Notifier], such as the Redis backend's). A nil n or
// max <= 0 make NewWithOptions fail. Default: off.
func WithYield(n backend.Notifier, max time.Duration) Option {
	return func(h *Handler) error {
		if n == nil || max <= 0 {
			return fmt.Errorf("hotspot: yield needs a notifier and a maximum > 0, got %T and %v", n, max)
		}
		h.notifier, h.yieldMax = n, max
		return nil
	}
}

// New returns a Handler with a local lock for each of keys. Empty keys are
// ignored (the facade never passes one).
func New(keys ...string) *Handler {
	h := newHandler()
	h.register(keys)
	return h
}

// NewWithOptions returns a Handler configured by opts. It returns an error
// for a nil option or a bad value.
func NewWithOptions(opts ...Option) (*Handler, error) {
	h := newHandler()
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("hotspot: nil option")
		}
		if err := o(h); err != nil {
			return nil, err
		}
	}
	return h, nil
}

func newHandler() *Handler {
	return &Handler{
		entries:   make(map[string]*entry),
		idleAfter: DefaultIdleAfter,
		now:       time.Now,
		waiting:   make(map[string]int),
		lru:       list.New(),
		gates:     make(map[gateID]*gate),
		gateHeld:  make(map[*distlock.Request]heldGate),
	}
}

// Register gives keys a local lock from now on. Registering a key twice,
// or a promoted key, is harmless; registered keys are never demoted.
func (h *Handler) Register(keys ...string) { h.register(keys) }

func (h *Handler) register(keys []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range keys {
		if k == "" {
			continue
		}
		e := h.entries[k]
		if e == nil {
			e = &entry{key: k, sem: make(chan struct{}, 1)}
			h.entries[k] = e
		}
		e.registered = true
	}
}

// Unregister removes the local lock of keys for acquisitions that start
// from now on. Goroutines that already wait for or hold it keep using it
// until they leave; then it is freed. A promoted key stays promoted.
func (h *Handler) Unregister(keys ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range keys {
		if e := h.entries[k]; e != nil {
			e.registered = false
			h.dropIfUnusedLocked(e)
		}
	}
}

// Hot returns the keys that have a local lock now, registered and
// promoted, sorted. It demotes promoted keys that have been idle too long.
func (h *Handler) Hot() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.demoteIdleLocked()
	keys := make([]string, 0, len(h.entries))
	for k, e := range h.entries {
		if e.active() {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// Acquire implements [distlock.Handler]. For a key with a local lock it
// takes that lock within r's deadline and ctx before calling next, and
// frees it at once when next fails.
func (h *Handler) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	if r.Kind == distlock.KindElection {
		return next(ctx, r) // a campaign: no local lock
	}
	if r.Kind != distlock.KindMutex {
		return h.acquireGate(ctx, r, next)
	}
	e := h.enter(r.Key)
	if e == nil {
		err := next(ctx, r)
		h.leaveWaiting(r.Key)
		return err
	}
	if err := e.lock(ctx, r.Deadline); err != nil {
		h.leave(e)
		return err
	}
	notified, err := h.yield(ctx, e, r.Deadline)
	if err == nil {
		err = next(ctx, r)
	}
	if err != nil {
		h.leave(e)
		<-e.sem
		return err
	}
	h.mu.Lock()
	e.owner = r
	e.contended = notified || r.RemoteAttempts > 1
	if h.threshold > 0 {
		h.leaveWaitingLocked(r.Key)
	}
	h.mu.Unlock()
	return nil
}

// Release implements [distlock.Handler]: it calls next, then frees the
// local lock r holds, if any, whatever next returned.
func (h *Handler) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	if r.Kind == distlock.KindElection {
		return next(ctx, r)
	}
	if r.Kind != distlock.KindMutex {
		err := next(ctx, r)
		h.releaseGate(r)
		return err
	}
	h.mu.Lock()
	e := h.entries[r.Key]
	if e == nil || e.owner != r {
		h.mu.Unlock()
		return next(ctx, r)
	}
	// Under WithYield, when a local waiter will yield, consume our own
	// release notice before handing over, so that the waiter sees only
	// the next one: another process's release.
	var own <-chan struct{}
	if h.yieldMax > 0 && e.refs > 1 && e.contended {
		own = e.notices
	}
	h.mu.Unlock()
	drain(own)
	err := next(ctx, r)
	if own != nil && err == nil {
		t := time.NewTimer(min(h.yieldMax, ownNoticeWait))
		select {
		case <-own:
		case <-t.C:
		}
		t.Stop()
	}
	h.mu.Lock()
	e.owner = nil
	h.leaveLocked(e)
	h.mu.Unlock()
	<-e.sem
	return err
}

// yield waits for a release notice of e's key when yielding is on and the
// last holder met another process. It reports whether a notice came, and
// returns an error only when ctx ended.
func (h *Handler) yield(ctx context.Context, e *entry, deadline time.Time) (bool, error) {
	if h.yieldMax == 0 {
		return false, nil
	}
	h.mu.Lock()
	contended, ch := e.contended, e.notices
	h.mu.Unlock()
	if !contended || ch == nil {
		return false, nil
	}
	d := h.yieldMax
	if !deadline.IsZero() {
		d = min(d, time.Until(deadline))
	}
	if deadline.IsZero() || d <= 0 {
		return false, nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true, nil
	case <-t.C:
		return false, nil
	case <-ctx.Done():
		return false, errors.Join(distlock.ErrNotAcquired, ctx.Err())
	}
}

// drain empties ch of notices already delivered.
func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// enter counts a goroutine in for key and returns the key's local lock,
// or nil when the key has none.
func (h *Handler) enter(key string) *entry {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.entries[key]
	if h.threshold > 0 {
		n := h.waiting[key] + 1
		h.waiting[key] = n
		if n >= h.threshold && (e == nil || !e.active()) {
			e = h.promoteLocked(key, e)
		}
	}
	if e == nil || !e.active() {
		return nil
	}
	if e.promoted {
		h.lru.MoveToFront(e.elem)
	}
	e.refs++
	if e.refs == 1 && h.notifier != nil && e.unsubscribe == nil {
		// One standing subscription per key in use: the store stays
		// subscribed between handoffs instead of once per waiter.
		e.notices, e.unsubscribe = h.notifier.Subscribe(key)
	}
	return e
}

// leave counts a goroutine that did not get the lock out of e.
func (h *Handler) leave(e *entry) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.threshold > 0 {
		h.leaveWaitingLocked(e.key)
	}
	h.leaveLocked(e)
}

// leaveLocked counts a goroutine out of e, ending e's subscription and
// freeing e when it was the last.
func (h *Handler) leaveLocked(e *entry) {
	e.refs--
	e.lastUsed = h.now()
	if e.refs == 0 && e.unsubscribe != nil {
		e.unsubscribe()
		e.notices, e.unsubscribe = nil, nil
	}
	h.dropIfUnusedLocked(e)
}

func (h *Handler) leaveWaiting(key string) {
	if h.threshold == 0 {
		return
	}
	h.mu.Lock()
	h.leaveWaitingLocked(key)
	h.mu.Unlock()
}

func (h *Handler) leaveWaitingLocked(key string) {
	if n := h.waiting[key] - 1; n > 0 {
		h.waiting[key] = n
	} else {
		delete(h.waiting, key)
	}
}

// promoteLocked gives key a local lock, reusing e when it is a retired
// entry still in use, and demotes idle or least recently used keys to stay
// within capacity.
func (h *Handler) promoteLocked(key string, e *entry) *entry {
	h.demoteIdleLocked()
	for h.lru.Len() >= h.capacity {
		h.demoteLocked(h.lru.Back().Value.(*entry))
	}
	if e == nil {
		e = &entry{key: key, sem: make(chan struct{}, 1)}
		h.entries[key] = e
	}
	e.promoted = true
	e.elem = h.lru.PushFront(e)
	return e
}

// demoteIdleLocked demotes promoted keys nobody used for idleAfter.
func (h *Handler) demoteIdleLocked() {
	now := h.now()
	for el := h.lru.Back(); el != nil; {
		e := el.Value.(*entry)
		el = el.Prev()
		if e.refs == 0 && now.Sub(e.lastUsed) >= h.idleAfter {
			h.demoteLocked(e)
		}
	}
}

func (h *Handler) demoteLocked(e *entry) {
	h.lru.Remove(e.elem)
	e.elem = nil
	e.promoted = false
	h.dropIfUnusedLocked(e)
}

// dropIfUnusedLocked frees e when it has no local lock role left and no
// goroutine uses it.
func (h *Handler) dropIfUnusedLocked(e *entry) {
	if !e.active() && e.refs == 0 && h.entries[e.key] == e {
		delete(h.entries, e.key)
	}
}

// lock takes e's local lock, waiting until deadline (zero: no waiting) or
// until ctx ends.
func (e *entry) lock(ctx context.Context, deadline time.Time) error {
	if err := ctx.Err(); err != nil {
		return errors.Join(distlock.ErrNotAcquired, err)
	}
	select {
	case e.sem <- struct{}{}:
		return nil
	default:
	}
	d := time.Until(deadline)
	if deadline.IsZero() || d <= 0 {
		return fmt.Errorf("%w: %q is held in this process", distlock.ErrNotAcquired, e.key)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case e.sem <- struct{}{}:
		return nil
	case <-t.C:
		return fmt.Errorf("%w: %q was held in this process for the whole wait", distlock.ErrNotAcquired, e.key)
	case <-ctx.Done():
		return errors.Join(distlock.ErrNotAcquired, ctx.Err())
	}
}

// acquireGate is Acquire for a semaphore or a read/write lock: for a hot
// key, its local gate (see [gate]) is taken within r's deadline and ctx
// before next, and given back at once when next fails.
func (h *Handler) acquireGate(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	h.mu.Lock()
	e := h.entries[r.Key]
	if e == nil || !e.active() {
		h.mu.Unlock()
		return next(ctx, r)
	}
	id, n := gateOf(r)
	g := h.gates[id]
	if g == nil {
		g = &gate{size: int64(r.Limit)}
		if id.rw {
			g.size = rwSize
		}
		h.gates[id] = g
	}
	g.refs++
	h.mu.Unlock()
	err := g.acquire(ctx, n, r.Deadline, r.Key)
	if err == nil {
		if err = next(ctx, r); err != nil {
			g.release(n)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.dropGateLocked(id, g)
		return err
	}
	h.gateHeld[r] = heldGate{id: id, g: g, n: n}
	return nil
}

// releaseGate gives back the gate r took, if any.
func (h *Handler) releaseGate(r *distlock.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	held, ok := h.gateHeld[r]
	if !ok {
		return
	}
	delete(h.gateHeld, r)
	held.g.release(held.n)
	h.dropGateLocked(held.id, held.g)
}

// dropGateLocked counts a goroutine out of g, forgetting g when unused.
func (h *Handler) dropGateLocked(id gateID, g *gate) {
	if g.refs--; g.refs == 0 && h.gates[id] == g {
		delete(h.gates, id)
	}
}
