package testsuite_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
)

// hostile is the lock store of the lifecycle model: the memory store (the
// reference for every kind of lock) behind a network that delays, reorders,
// fails, loses and stalls requests. It runs inside a testing/synctest
// bubble, so its delays, TTLs and expiries are on the bubble's virtual
// clock and a check at an instant is exact.
//
// Every request is applied ("lands") after a drawn request delay and
// answered after a drawn reply delay, so overlapping requests land and
// answer out of order. With faults on, a request may fail before it lands
// (fateFail), land and lose its reply (fateLose: an error; fateHang: no
// reply at all). While the store is stalled (all of it, or some of its
// shards, placed by Redis Cluster's hash tags; every request, or only
// those that update a held lock), requests that would land there are
// held; when the stall ends each lands late or is dropped (drawn). A call
// whose reply did not come returns when its context ends (or after
// connTimeout when it has no deadline, as a client's read timeout would);
// an acquire then returns a *backend.AbandonedError whose Cleanup is a
// compare-and-delete that also refuses a late landing of the request (a
// tombstone), as the backend contract asks of a real store. Each request
// draws from a source of its own, seeded by what it is, so that a replay
// of a schedule draws the same whichever goroutine reaches the store
// first.
//
// The store keeps a shadow of its holders with their expiry on the virtual
// clock: at the instant a holder expires, it tells the model (onExpire),
// which checks that the holder's Done was already closed, and may let a
// rival ("phantom") take what was freed for a moment. It also tracks what
// the facade cannot know (a release or a shortening refresh that landed
// but whose reply it did not get), which exempts a holder from the
// checks. Keys named with the calm prefix get no delays, faults nor
// stalls: the probes of the facade's own policies, and the 600-key lock,
// use them.
//
// hostile implements the optional abilities every model store has; the
// types made by resource add the ones drawn per schedule (a Spinner or a
// Waiter, BatchRefresher, MultiSpinner), which the facade finds by type
// assertion.
type hostile struct {
	mem        *memory.Store
	lostSignal bool // every acquired lease gets a Lost channel
	kept       bool // AutoRenew leases are kept alive by the store (KeptAlive)
	pRival     float64
	// onExpire is called (without the store's lock) at the instant a
	// holder that is not a phantom expires.
	onExpire func(id holderID, at time.Time)
	called   func(now time.Time) // told of every call: the watchdog's sign of life

	seed uint64

	// queued makes the store queue the waiters of mutexes and
	// semaphores as the Redis store does (backend.Queuer): see line.
	queued bool

	mu        sync.Mutex
	lines     map[lineID]*line  // the lines of waiters, with queued
	nreq      map[string]uint64 // requests so far by key and owner value
	net       netConfig
	faults    bool
	stalled   uint8                  // the shards stalled, a bit each
	rowsOnly  bool                   // the stall holds only requests that update a held lock
	held      []*request             // requests held by the stall
	tombs     map[string]bool        // owner values whose abandoned acquire was cleaned up
	shadows   map[holderID]*shadow   // live holders, with their expiry
	freed     map[holderID]time.Time // holders freed by expiry, and when
	histories map[holderID][]string  // what set their expiry
	tokens    map[uint64]string      // token -> owner value
	evicted   map[string]bool        // owner values deleted behind their holder's back
	storeLost map[string]bool        // owner values the store reported lost (Lost closed)
	ghosts    map[string]int         // released by a request whose reply the caller did not get
	shortens  map[string]int         // shortened by a refresh whose reply the caller did not get
	keys      map[string]bool        // every key ever used
	rivals    int
	gen       uint64   // the last expiry timer's
	problems  []string // contract violations the facade made in its calls
	instant   time.Time
	nInstant  int // calls at this instant
	window    time.Time
	nWindow   int // calls since window
}

// netConfig is how the network behaves while faults are on.
type netConfig struct {
	maxReq, maxReply    time.Duration
	pFail, pLose, pHang float64
	pLate               float64 // a request held by a stall lands when it ends (else it is dropped)
	pSlow               float64 // a request is ten times slower
}

// holderID names one holder of a lock: a mutex's, a semaphore permit's, a
// reader's or a writer's.
type holderID struct {
	kind  backend.Kind
	key   string
	value string
}

func (id holderID) String() string { return fmt.Sprintf("%v %q of %s", id.kind, id.key, id.value) }

type shadow struct {
	history []string // what set its expiry, for a failure's message
	expires time.Time
	timer   *time.Timer
	gen     uint64
	lost    chan struct{}
	kept    bool
	phantom bool
}

type fate uint8

const (
	fateOK   fate = iota
	fateFail      // refused before it lands
	fateLose      // lands; the reply is an error
	fateHang      // lands; no reply
)

// request is one call on its way through the network.
type request struct {
	rng    *rand.Rand // its own draws: the same request draws the same, whatever runs beside it
	shards uint8      // the shards of its keys
	update bool       // it updates a held lock (refresh, release)
	fate   fate
	calm   bool
	reply  time.Duration
	apply  func(r *request) // under s.mu, when it lands
	done   chan struct{}    // closed when the reply comes
	err    error            // the reply's error (a lost reply)
	landed bool
	gaveUp bool
	// delivered runs (under s.mu) when the caller gets the reply: what
	// the caller then knows stops exempting it.
	delivered []func()
}

var (
	// errReset is the network's error: a request that failed, or whose
	// reply was lost.
	errReset = errors.New("hostile: connection reset")
	// errTimeout is returned when no reply came within connTimeout.
	errTimeout = errors.New("hostile: read timeout")
)

const (
	// connTimeout bounds a call whose context has no deadline.
	connTimeout = 5 * time.Second
	// keptTTL is the lease time of a lock the store keeps alive itself.
	keptTTL = time.Hour
	// calmPrefix names keys whose requests are answered at once, always.
	calmPrefix = "calm-"
	// phantomPrefix names the values of the rivals the store lets in.
	phantomPrefix = "rival-"
	// Calls at one virtual instant, and within callWindow of virtual time,
	// beyond which the facade is taken to spin: well above what the
	// model's own bursts make (a few Extends of the 600-key lock at one
	// instant are thousands of refreshes).
	maxCallsInstant = 100000
	callWindow      = 100 * time.Millisecond
	maxCallsWindow  = 200000
)

func isCalm(key string) bool { return strings.HasPrefix(key, calmPrefix) }

func newHostile(seed uint64, net netConfig, called func(now time.Time)) *hostile {
	return &hostile{
		mem: memory.New(), seed: seed, nreq: map[string]uint64{}, net: net, called: called,
		tombs: map[string]bool{}, shadows: map[holderID]*shadow{}, freed: map[holderID]time.Time{},
		tokens: map[uint64]string{}, histories: map[holderID][]string{}, evicted: map[string]bool{}, storeLost: map[string]bool{},
		ghosts: map[string]int{}, shortens: map[string]int{}, keys: map[string]bool{},
		lines: map[lineID]*line{},
	}
}

// lineID names the line of a mutex's or a semaphore's waiters.
type lineID struct {
	kind backend.Kind
	key  string
}

// line is the line of a mutex's or semaphore's waiters of a store that
// queues them, with the Redis store's rules (redisscript's queue.lua): a
// refused attempt of a waiting acquisition (Lease.Waits) joins the line,
// or renews its place, for one TTL; a mutex released while someone waits
// is kept for the head of the line for what is left of the head's place,
// and only the head takes it; a waiter in line that finds the mutex free
// while another waiter is ahead keeps it for that head instead; a
// semaphore's attempt holds when fewer places precede its own than
// permits are free. A withdrawal or clean-up leaves the line, and hands
// a kept mutex on.
type line struct {
	waiters   []place // in order of arrival
	kept      string  // a mutex kept for this owner value (the head)
	keptUntil time.Time
}

type place struct {
	value   string
	expires time.Time
}

// lineLocked returns id's line, without the places that lapsed and a kept
// mutex whose time is up; nil when the store does not queue id's kind.
func (s *hostile) lineLocked(id lineID) *line {
	if !s.queued || (id.kind != backend.KindMutex && id.kind != backend.KindSemaphore) {
		return nil
	}
	ln := s.lines[id]
	if ln == nil {
		ln = &line{}
		s.lines[id] = ln
	}
	now := time.Now()
	ln.waiters = slices.DeleteFunc(ln.waiters, func(p place) bool { return !now.Before(p.expires) })
	if ln.kept != "" && !now.Before(ln.keptUntil) {
		ln.kept = ""
	}
	return ln
}

// at returns value's position in the line, or -1.
func (ln *line) at(value string) int {
	return slices.IndexFunc(ln.waiters, func(p place) bool { return p.value == value })
}

// join records value's place at the end of the line, or renews it.
func (ln *line) join(value string, ttl time.Duration) {
	until := time.Now().Add(ttl)
	if i := ln.at(value); i >= 0 {
		ln.waiters[i].expires = until
		return
	}
	ln.waiters = append(ln.waiters, place{value, until})
}

// leave drops value's place, if any.
func (ln *line) leave(value string) {
	if i := ln.at(value); i >= 0 {
		ln.waiters = slices.Delete(ln.waiters, i, i+1)
	}
}

// handOn keeps the free mutex for the head of the line, if anyone waits.
func (ln *line) handOn() {
	ln.kept = ""
	if len(ln.waiters) > 0 {
		ln.kept, ln.keptUntil = ln.waiters[0].value, ln.waiters[0].expires
	}
}

// queuedAcquireLocked is acquireLocked for a kind the store queues: the
// line's rules, then the memory store's.
func (s *hostile) queuedAcquireLocked(ln *line, l *backend.Lease) (bool, time.Duration, error) {
	now := time.Now()
	refuse := func(holderTTL time.Duration) (bool, time.Duration, error) {
		if l.Waits {
			ln.join(l.Value, l.TTL)
		}
		return false, holderTTL, nil
	}
	if l.Kind == backend.KindMutex && ln.kept != "" && ln.kept != l.Value {
		return refuse(ln.keptUntil.Sub(now))
	}
	if l.Kind == backend.KindSemaphore && len(ln.waiters) > 0 {
		in, _ := s.mem.Inspect(context.Background(), l.Key, l.Kind)
		free := int(l.Limit) - len(in.Holders)
		ahead := ln.at(l.Value)
		if ahead < 0 {
			ahead = len(ln.waiters)
		}
		if free > 0 && ahead >= free {
			return refuse(0)
		}
	}
	ok, holderTTL, err := s.mem.TryAcquire(context.Background(), l)
	if err != nil {
		return ok, holderTTL, err
	}
	if !ok {
		return refuse(holderTTL)
	}
	if l.Kind == backend.KindMutex && ln.kept == "" && l.Waits && ln.at(l.Value) > 0 {
		// Free, but another waiter is ahead: it is the head's.
		_ = s.mem.Release(context.Background(), l)
		ln.handOn()
		return refuse(ln.keptUntil.Sub(now))
	}
	ln.leave(l.Value)
	if ln.kept == l.Value {
		ln.kept = ""
	}
	return true, 0, nil
}

// leaveLineLocked drops value's place in id's line, and hands a mutex kept
// for it on.
func (s *hostile) leaveLineLocked(id lineID, value string) {
	ln := s.lineLocked(id)
	if ln == nil {
		return
	}
	ln.leave(value)
	if ln.kept == value {
		ln.handOn()
	}
}

// Queues implements backend.Queuer.
func (s *hostile) Queues(k backend.Kind) bool {
	return s.queued && (k == backend.KindMutex || k == backend.KindSemaphore)
}

// SubscribeHead implements backend.HeadNotifier with the memory store's
// notices, which are addressed to every waiter.
func (s *hostile) SubscribeHead(key, _ string) (<-chan struct{}, func()) { return s.mem.Subscribe(key) }

// inLine returns the owner values with a live place in a line, or a mutex
// kept for them.
func (s *hostile) inLine() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for id := range s.lines {
		ln := s.lineLocked(id)
		for _, p := range ln.waiters {
			out[p.value] = fmt.Sprintf("a place in the line of %v %q", id.kind, id.key)
		}
		if ln.kept != "" {
			out[ln.kept] = fmt.Sprintf("%v %q kept for it", id.kind, id.key)
		}
	}
	return out
}

// ioKey marks a context whose store calls are counted: the model asks
// whether a nested TryLock reached the store.
type ioKey struct{}

type ioCount struct{ n atomic.Int64 }

// randFor returns a source of draws for an event named by parts, at this
// virtual instant: the same event draws the same in every run of a
// schedule, whichever goroutine gets to the store first.
func (s *hostile) randFor(parts ...string) *rand.Rand {
	h := fnv.New64a()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return rand.New(rand.NewPCG(s.seed, h.Sum64()^uint64(time.Now().UnixNano())))
}

// send sends one request of who (an owner value) about key and waits for
// its reply, its context's end, or connTimeout when the context has no
// deadline. r is nil when nothing was sent (ctx had ended). apply runs
// under s.mu when the request lands.
func (s *hostile) send(ctx context.Context, key, who string, apply func(r *request)) (*request, error) {
	return s.sendAll(ctx, false, []string{key}, who, apply)
}

// sendUpdate is send for a request that updates a held lock's row: a
// refresh or a release.
func (s *hostile) sendUpdate(ctx context.Context, key, who string, apply func(r *request)) (*request, error) {
	return s.sendAll(ctx, true, []string{key}, who, apply)
}

// sendAll is send for a request about several keys: it stalls when any
// of their shards does.
func (s *hostile) sendAll(ctx context.Context, update bool, keys []string, who string, apply func(r *request)) (*request, error) {
	key := keys[0]
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("hostile: %s: not sent: %w", key, err)
	}
	s.called(time.Now())
	if c, ok := ctx.Value(ioKey{}).(*ioCount); ok {
		c.n.Add(1)
	}
	r := &request{calm: true, update: update, apply: apply, done: make(chan struct{})}
	for _, k := range keys {
		r.calm = r.calm && isCalm(k)
		r.shards |= shardOf(k)
	}
	s.mu.Lock()
	for _, k := range keys {
		s.keys[k] = true
	}
	s.countLocked()
	n := s.nreq[key+"\x00"+who]
	s.nreq[key+"\x00"+who] = n + 1
	r.rng = s.randFor(key, who, fmt.Sprint(n))
	if r.calm {
		s.landLocked(r)
		s.mu.Unlock()
		return r, s.delivered(r)
	}
	var req time.Duration
	req, r.reply = s.delay(r.rng, s.net.maxReq), s.delay(r.rng, s.net.maxReply)
	if s.faults {
		switch x := r.rng.Float64(); {
		case x < s.net.pFail:
			r.fate = fateFail
		case x < s.net.pFail+s.net.pLose:
			r.fate = fateLose
		case x < s.net.pFail+s.net.pLose+s.net.pHang:
			r.fate = fateHang
		}
	}
	// A timer due at once is not armed: it lands (or fails) now. (Under
	// the race detector, Go 1.26's runtime has crashed running bubbled
	// timers that are due at once, concurrently.)
	switch {
	case r.fate == fateFail && req+r.reply == 0:
		r.err = errReset
		close(r.done)
	case r.fate == fateFail:
		time.AfterFunc(req+r.reply, func() {
			r.err = errReset
			close(r.done)
		})
	case req == 0:
		s.landLocked(r)
	default:
		time.AfterFunc(req, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.landLocked(r)
		})
	}
	s.mu.Unlock()

	var timeout <-chan time.Time
	if _, ok := ctx.Deadline(); !ok {
		t := time.NewTimer(connTimeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-r.done:
		return r, s.delivered(r)
	case <-ctx.Done():
		s.giveUp(r)
		return r, fmt.Errorf("hostile: %s: no reply: %w", key, ctx.Err())
	case <-timeout:
		s.giveUp(r)
		return r, fmt.Errorf("hostile: %s: %w", key, errTimeout)
	}
}

func (s *hostile) delivered(r *request) error {
	if r.err != nil {
		return r.err
	}
	s.mu.Lock()
	for _, f := range r.delivered {
		f()
	}
	r.delivered = nil
	s.mu.Unlock()
	return nil
}

func (s *hostile) giveUp(r *request) {
	s.mu.Lock()
	r.gaveUp = true
	r.delivered = nil
	s.mu.Unlock()
}

// delay draws a delay in [0, max], now and then ten times longer.
func (s *hostile) delay(rng *rand.Rand, max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	d := time.Duration(rng.Int64N(int64(max) + 1))
	if rng.Float64() < s.net.pSlow {
		d *= 10
	}
	return d
}

// landLocked applies r, or holds it while the store is stalled, and
// schedules its reply.
func (s *hostile) landLocked(r *request) {
	if s.stalled&r.shards != 0 && (r.update || !s.rowsOnly) && !r.calm {
		s.held = append(s.held, r)
		return
	}
	r.landed = true
	r.apply(r)
	if r.gaveUp {
		r.delivered = nil // the caller will not learn what it did
	}
	switch {
	case r.fate == fateHang:
	case r.reply == 0:
		s.replyLocked(r)
	default:
		time.AfterFunc(r.reply, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.replyLocked(r)
		})
	}
}

func (s *hostile) replyLocked(r *request) {
	if r.fate == fateLose {
		r.err = errReset
		r.delivered = nil
	}
	close(r.done)
}

// countLocked counts a call and records a problem when calls explode: a
// facade that spins shows as many calls at one virtual instant, or within
// a short window.
func (s *hostile) countLocked() {
	now := time.Now()
	if !now.Equal(s.instant) {
		s.instant, s.nInstant = now, 0
	}
	if now.Sub(s.window) >= callWindow {
		s.window, s.nWindow = now, 0
	}
	s.nInstant++
	s.nWindow++
	if s.nInstant == maxCallsInstant+1 {
		s.problemLocked("more than %d store calls at one virtual instant: the facade spins", maxCallsInstant)
	}
	if s.nWindow == maxCallsWindow+1 {
		s.problemLocked("more than %d store calls within %v of virtual time: the facade spins", maxCallsWindow, callWindow)
	}
}

func (s *hostile) problemLocked(format string, args ...any) {
	s.problems = append(s.problems, fmt.Sprintf(format, args...))
}

// setFaults turns faults on or off.
func (s *hostile) setFaults(on bool, pFail, pLose, pHang float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = on
	s.net.pFail, s.net.pLose, s.net.pHang = pFail, pLose, pHang
}

// shards is how many shards the store's keys are spread over, as a Redis
// Cluster's are over its nodes: a stall may hit some and not others.
const shards = 3

// shardOf returns the bit of key's shard. As in Redis Cluster, a key with
// a hash tag ("{tag}rest") is placed by its tag alone.
func shardOf(key string) uint8 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	return 1 << (h.Sum32() % shards)
}

// stall stalls the shards of mask (a bit each; 0 ends the stall): every
// request, or (rowsOnly) those that update a held lock, as when another
// transaction holds the lock table's rows FOR UPDATE: refreshes and
// releases wait while acquisitions of free keys go through. When it ends,
// each request it held lands late or is dropped.
func (s *hostile) stall(mask uint8, rowsOnly bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if mask != 0 || s.stalled == 0 {
		s.stalled, s.rowsOnly = mask, rowsOnly
		return
	}
	s.stalled = 0
	held := s.held
	s.held = nil
	for _, r := range held {
		if r.rng.Float64() < s.net.pLate {
			s.landLocked(r)
		}
	}
}

// heal ends faults and stalls.
func (s *hostile) heal() {
	s.setFaults(false, 0, 0, 0)
	s.stall(0, false)
}

// trackLocked records a holder the store just granted or refreshed, with
// its expiry timer.
func (s *hostile) trackLocked(id holderID, ttl time.Duration, lost chan struct{}, kept, phantom bool) {
	sh := s.shadows[id]
	if sh == nil {
		sh = &shadow{lost: lost, kept: kept, phantom: phantom}
		s.shadows[id] = sh
	}
	s.gen++ // one sequence for the store: a stale timer never matches a holder made anew
	sh.gen = s.gen
	if len(sh.history) >= 8 {
		sh.history = sh.history[1:]
	}
	sh.history = append(sh.history, fmt.Sprintf("%s: %v until %s", time.Now().Format("15:04:05.000000"), ttl, time.Now().Add(ttl).Format("15:04:05.000000")))
	gen := sh.gen
	sh.expires = time.Now().Add(ttl)
	if sh.timer != nil {
		sh.timer.Stop()
	}
	sh.timer = time.AfterFunc(ttl, func() { s.expire(id, gen) })
}

// untrackLocked forgets a holder deleted by a request or from outside.
func (s *hostile) untrackLocked(id holderID) *shadow {
	sh := s.shadows[id]
	if sh != nil {
		sh.timer.Stop()
		delete(s.shadows, id)
	}
	return sh
}

// expire runs at the instant a holder's lease runs out: the store frees
// what it held. It tells the model, then maybe lets a rival in.
func (s *hostile) expire(id holderID, gen uint64) {
	s.mu.Lock()
	sh := s.shadows[id]
	now := time.Now()
	if sh == nil || sh.gen != gen || now.Before(sh.expires) {
		s.mu.Unlock()
		return
	}
	delete(s.shadows, id)
	s.freed[id] = now
	s.histories[id] = sh.history
	rng := s.randFor("expire", id.String())
	rival := !sh.phantom && !isCalm(id.key) && rng.Float64() < s.pRival
	ttl := time.Duration(1+rng.IntN(50)) * time.Millisecond
	write := rng.IntN(2) == 0
	onExpire := s.onExpire
	s.mu.Unlock()
	if !sh.phantom && onExpire != nil {
		onExpire(id, now)
	}
	if rival {
		s.mu.Lock()
		s.phantomLocked(id, ttl, write)
		s.mu.Unlock()
	}
}

// phantomLocked lets a rival that is no process of the model take what id
// held, for ttl: a facade that still believes it holds the key meets it.
func (s *hostile) phantomLocked(id holderID, ttl time.Duration, write bool) {
	s.rivals++
	l := backend.Lease{Key: id.key, Value: fmt.Sprintf("%s%d", phantomPrefix, s.rivals), TTL: ttl, Kind: id.kind}
	switch id.kind {
	case backend.KindSemaphore:
		l.Limit = semLimit
	case backend.KindRead, backend.KindWrite:
		l.Kind = backend.KindRead
		if write {
			l.Kind = backend.KindWrite
		}
	}
	if ln := s.lineLocked(lineID{l.Kind, l.Key}); ln != nil && (ln.kept != "" || (l.Kind == backend.KindSemaphore && len(ln.waiters) > 0)) {
		return // kept for the head of the line, or the line is first
	}
	ok, _, _ := s.mem.TryAcquire(context.Background(), &l)
	if !ok {
		_ = s.mem.Withdraw(context.Background(), &l) // no place in line for it
		return
	}
	s.trackLocked(holderID{l.Kind, l.Key, l.Value}, ttl, nil, false, true)
}

// acquireLocked makes one attempt at l (the caller's copy), on landing.
func (s *hostile) acquireLocked(l *backend.Lease) (bool, time.Duration, error) {
	if s.tombs[l.Value] {
		return false, 0, nil // cleaned up before it landed
	}
	ttl := l.TTL
	kept := s.kept && l.AutoRenew
	if kept {
		l.TTL = keptTTL
	}
	var (
		ok        bool
		holderTTL time.Duration
		err       error
	)
	if ln := s.lineLocked(lineID{l.Kind, l.Key}); ln != nil {
		ok, holderTTL, err = s.queuedAcquireLocked(ln, l)
	} else {
		ok, holderTTL, err = s.mem.TryAcquire(context.Background(), l)
	}
	storeTTL := l.TTL
	l.TTL = ttl
	if ok {
		s.grantedLocked(l, storeTTL, kept)
	}
	return ok, holderTTL, err
}

// grantedLocked records a grant of l.
func (s *hostile) grantedLocked(l *backend.Lease, storeTTL time.Duration, kept bool) {
	var lost chan struct{}
	if s.lostSignal || kept {
		lost = make(chan struct{})
		l.Handle = backend.LostChan(lost)
	}
	l.KeptAlive = kept
	s.tokens[l.Token] = l.Value
	id := holderID{l.Kind, l.Key, l.Value}
	delete(s.freed, id) // a push store's next attempt after a grant that ran out in transit
	s.trackLocked(id, storeTTL, lost, kept, false)
}

// abandoned is the error of an acquire whose reply did not come: its
// Cleanup deletes what the request may have taken, and a tombstone keeps
// the request from taking anything if it lands later.
func (s *hostile) abandoned(err error, value string, ids []holderID) error {
	return &backend.AbandonedError{Err: err, Cleanup: func(ctx context.Context) error {
		keys := make([]string, len(ids))
		for i, id := range ids {
			keys[i] = id.key
		}
		_, err := s.sendAll(ctx, false, keys, value, func(*request) {
			s.tombs[value] = true
			for _, id := range ids {
				s.deleteLocked(id)
			}
		})
		return err
	}}
}

// deleteLocked deletes id's grant or intent, if any.
func (s *hostile) deleteLocked(id holderID) {
	l := backend.Lease{Key: id.key, Value: id.value, Kind: id.kind}
	if s.mem.Release(context.Background(), &l) == nil {
		s.untrackLocked(id)
	}
	if id.kind == backend.KindRead || id.kind == backend.KindWrite {
		_ = s.mem.Withdraw(context.Background(), &l)
	}
	s.leaveLineLocked(lineID{id.kind, id.key}, id.value)
}

func leaseKeys(ls []*backend.Lease) []string {
	keys := make([]string, len(ls))
	for i, l := range ls {
		keys[i] = l.Key
	}
	return keys
}

func leaseIDs(ls []*backend.Lease) []holderID {
	ids := make([]holderID, len(ls))
	for i, l := range ls {
		ids[i] = holderID{l.Kind, l.Key, l.Value}
	}
	return ids
}

// tryAcquire implements backend.Spinner.TryAcquire.
func (s *hostile) tryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	lc := *l
	ids := leaseIDs([]*backend.Lease{l})
	var (
		ok        bool
		holderTTL time.Duration
		err       error
	)
	r, serr := s.send(ctx, l.Key, l.Value, func(*request) { ok, holderTTL, err = s.acquireLocked(&lc) })
	if serr != nil {
		if r == nil || r.fate == fateFail {
			return false, 0, serr
		}
		return false, 0, s.abandoned(serr, l.Value, ids)
	}
	if ok {
		l.Token, l.Handle, l.KeptAlive = lc.Token, lc.Handle, lc.KeptAlive
	}
	return ok, holderTTL, err
}

// tryAcquireAll implements backend.MultiSpinner.
func (s *hostile) tryAcquireAll(ctx context.Context, ls []*backend.Lease) (bool, time.Duration, error) {
	for _, l := range ls {
		if l.Kind != backend.KindMutex {
			return false, 0, errors.ErrUnsupported
		}
	}
	cs := make([]*backend.Lease, len(ls))
	for i, l := range ls {
		c := *l
		cs[i] = &c
	}
	ids := leaseIDs(ls)
	var (
		ok        bool
		holderTTL time.Duration
		err       error
	)
	r, serr := s.sendAll(ctx, false, leaseKeys(ls), ls[0].Value, func(*request) {
		if s.tombs[cs[0].Value] {
			return
		}
		ttl := cs[0].TTL
		kept := s.kept && cs[0].AutoRenew
		if kept {
			for _, c := range cs {
				c.TTL = keptTTL
			}
		}
		ok, holderTTL, err = s.mem.TryAcquireAll(context.Background(), cs)
		storeTTL := cs[0].TTL
		for _, c := range cs {
			c.TTL = ttl
			if ok {
				s.grantedLocked(c, storeTTL, kept)
			}
		}
	})
	if serr != nil {
		if r == nil || r.fate == fateFail {
			return false, 0, serr
		}
		return false, 0, s.abandoned(serr, ls[0].Value, ids)
	}
	if ok {
		for i, l := range ls {
			l.Token, l.Handle, l.KeptAlive = cs[i].Token, cs[i].Handle, cs[i].KeptAlive
		}
	}
	return ok, holderTTL, err
}

// acquireWait implements backend.Waiter.Acquire as a push store would: it
// attempts, and while held waits for a release notice (a watch) or for
// the holder's expiry, renewing its place in line at a third of its TTL;
// it leaves nothing behind when it gives up.
func (s *hostile) acquireWait(ctx context.Context, l *backend.Lease, deadline time.Time) error {
	lc := *l
	ids := leaseIDs([]*backend.Lease{l})
	var (
		wake   <-chan struct{}
		cancel func()
		timer  *time.Timer
	)
	defer func() {
		if cancel != nil {
			cancel()
		}
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		var (
			ok        bool
			holderTTL time.Duration
			err       error
			expires   time.Time
		)
		r, serr := s.send(ctx, l.Key, l.Value, func(*request) {
			ok, holderTTL, err = s.acquireLocked(&lc)
			if ok {
				expires = s.shadows[ids[0]].expires
			}
		})
		if serr != nil {
			if r == nil || r.fate == fateFail {
				return s.leave(ctx, lc, ids, serr)
			}
			return s.abandoned(serr, l.Value, ids)
		}
		if err != nil {
			return s.leave(ctx, lc, ids, err)
		}
		if ok && time.Now().Before(expires) {
			l.Token, l.Handle, l.KeptAlive = lc.Token, lc.Handle, lc.KeptAlive
			// Valid from Acquire's return until the store's expiry.
			l.Validity = time.Until(expires)
			return nil
		}
		// Granted, but the lease ran out before the reply came: the
		// store has freed it already. Not held: wait on, or give up.
		now := time.Now()
		if deadline.IsZero() || !now.Before(deadline) {
			return s.leave(ctx, lc, ids, backend.ErrNotAcquired)
		}
		if wake == nil {
			wake, cancel = s.mem.Subscribe(l.Key)
		}
		d := min(deadline.Sub(now), max(lc.TTL/3, time.Millisecond))
		if holderTTL > 0 {
			d = min(d, holderTTL)
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-wake:
		case <-timer.C:
		case <-ctx.Done():
			return s.leave(ctx, lc, ids, ctx.Err())
		}
	}
}

// leave withdraws a waiting reader's or writer's place in line before a
// Waiter's Acquire returns without the lock, and returns cause; when ctx
// has ended or the store does not answer, an AbandonedError whose Cleanup
// withdraws it.
func (s *hostile) leave(ctx context.Context, l backend.Lease, ids []holderID, cause error) error {
	if l.Kind != backend.KindRead && l.Kind != backend.KindWrite {
		return cause
	}
	if ctx.Err() != nil { // returns at once: the clean-up waits for the store
		return s.abandoned(cause, l.Value, ids)
	}
	if _, err := s.send(ctx, l.Key, l.Value, func(*request) { _ = s.mem.Withdraw(context.Background(), &l) }); err != nil {
		return s.abandoned(cause, l.Value, ids)
	}
	return cause
}

// Release implements backend.RemoteResource.
func (s *hostile) Release(ctx context.Context, l *backend.Lease) error {
	lc := *l
	id := holderID{l.Kind, l.Key, l.Value}
	var err error
	if _, serr := s.sendUpdate(ctx, l.Key, l.Value, func(r *request) {
		err = s.mem.Release(context.Background(), &lc)
		if err == nil {
			if ln := s.lineLocked(lineID{l.Kind, l.Key}); ln != nil && l.Kind == backend.KindMutex {
				ln.handOn()
			}
			s.untrackLocked(id)
			s.ghosts[id.value]++
			r.delivered = append(r.delivered, func() { s.ghosts[id.value]-- })
		}
	}); serr != nil {
		return serr
	}
	return err
}

// refreshLocked extends l (the caller's copy) on landing.
func (s *hostile) refreshLocked(r *request, l *backend.Lease) error {
	id := holderID{l.Kind, l.Key, l.Value}
	sh := s.shadows[id]
	ttl := l.TTL
	if sh != nil && sh.kept {
		l.TTL = keptTTL // kept alive: the store keeps its own lease time
	}
	err := s.mem.Refresh(context.Background(), l)
	if err != nil || sh == nil {
		return err
	}
	if time.Now().Add(l.TTL).Before(sh.expires) {
		// Shortened: until the caller gets the reply it cannot know.
		s.shortens[id.value]++
		r.delivered = append(r.delivered, func() { s.shortens[id.value]-- })
	}
	s.trackLocked(id, l.TTL, sh.lost, sh.kept, false)
	l.TTL = ttl
	return nil
}

// Refresh implements backend.Refresher.
func (s *hostile) Refresh(ctx context.Context, l *backend.Lease) error {
	lc := *l
	var err error
	if _, serr := s.sendUpdate(ctx, l.Key, l.Value, func(r *request) { err = s.refreshLocked(r, &lc) }); serr != nil {
		return serr
	}
	return err
}

// refreshAll implements backend.BatchRefresher.
func (s *hostile) refreshAll(ctx context.Context, ls []*backend.Lease) []error {
	errs := make([]error, len(ls))
	if len(ls) > backend.MaxRefreshBatch {
		s.mu.Lock()
		s.problemLocked("RefreshAll was passed %d leases; the contract says at most %d", len(ls), backend.MaxRefreshBatch)
		s.mu.Unlock()
	}
	if len(ls) == 0 {
		return errs
	}
	cs := make([]backend.Lease, len(ls))
	for i, l := range ls {
		cs[i] = *l
	}
	res := make([]error, len(ls)) // written when it lands, maybe after the caller gave up
	if _, serr := s.sendAll(ctx, true, leaseKeys(ls), ls[0].Value, func(r *request) {
		for i := range cs {
			res[i] = s.refreshLocked(r, &cs[i])
		}
	}); serr != nil {
		for i := range errs {
			errs[i] = serr
		}
		return errs
	}
	return res
}

// Withdraw implements backend.Withdrawer.
func (s *hostile) Withdraw(ctx context.Context, l *backend.Lease) error {
	lc := *l
	_, err := s.send(ctx, l.Key, l.Value, func(*request) {
		_ = s.mem.Withdraw(context.Background(), &lc)
		s.leaveLineLocked(lineID{lc.Kind, lc.Key}, lc.Value)
	})
	return err
}

// Inspect implements backend.Inspector.
func (s *hostile) Inspect(ctx context.Context, key string, kind backend.Kind) (backend.Inspection, error) {
	var in backend.Inspection
	if _, err := s.send(ctx, key, "inspect "+kind.String(), func(*request) { in, _ = s.mem.Inspect(context.Background(), key, kind) }); err != nil {
		return backend.Inspection{}, err
	}
	return in, nil
}

// Relabel implements backend.Relabeler: a request that updates a held
// lock, as a refresh.
func (s *hostile) Relabel(ctx context.Context, l *backend.Lease) error {
	lc := *l
	var err error
	if _, serr := s.sendUpdate(ctx, l.Key, l.Value, func(*request) { err = s.mem.Relabel(context.Background(), &lc) }); serr != nil {
		return serr
	}
	return err
}

// Subscribe implements backend.Notifier.
func (s *hostile) Subscribe(key string) (<-chan struct{}, func()) { return s.mem.Subscribe(key) }

// CheckKind implements backend.KindChecker: every kind.
func (s *hostile) CheckKind(backend.Kind) error { return nil }

// The store's optional abilities drawn per schedule, as types the facade
// finds by assertion.
type (
	spinStore      struct{ *hostile }
	spinBatchStore struct{ *hostile }
	spinMultiStore struct{ *hostile }
	spinBothStore  struct{ *hostile }
	waitStore      struct{ *hostile }
	waitBatchStore struct{ *hostile }
)

var (
	_ backend.Spinner        = spinStore{}
	_ backend.Refresher      = spinStore{}
	_ backend.Notifier       = spinStore{}
	_ backend.KindChecker    = spinStore{}
	_ backend.Withdrawer     = spinStore{}
	_ backend.Inspector      = spinStore{}
	_ backend.Relabeler      = spinStore{}
	_ backend.Relabeler      = waitStore{}
	_ backend.BatchRefresher = spinBatchStore{}
	_ backend.MultiSpinner   = spinMultiStore{}
	_ backend.BatchRefresher = spinBothStore{}
	_ backend.MultiSpinner   = spinBothStore{}
	_ backend.Waiter         = waitStore{}
	_ backend.BatchRefresher = waitBatchStore{}
)

func (s spinStore) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	return s.tryAcquire(ctx, l)
}

func (s spinBatchStore) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	return s.tryAcquire(ctx, l)
}

func (s spinBatchStore) RefreshAll(ctx context.Context, ls []*backend.Lease) []error {
	return s.refreshAll(ctx, ls)
}

func (s spinMultiStore) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	return s.tryAcquire(ctx, l)
}

func (s spinMultiStore) TryAcquireAll(ctx context.Context, ls []*backend.Lease) (bool, time.Duration, error) {
	return s.tryAcquireAll(ctx, ls)
}

func (s spinBothStore) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	return s.tryAcquire(ctx, l)
}

func (s spinBothStore) TryAcquireAll(ctx context.Context, ls []*backend.Lease) (bool, time.Duration, error) {
	return s.tryAcquireAll(ctx, ls)
}

func (s spinBothStore) RefreshAll(ctx context.Context, ls []*backend.Lease) []error {
	return s.refreshAll(ctx, ls)
}

func (s waitStore) Acquire(ctx context.Context, l *backend.Lease, deadline time.Time) error {
	return s.acquireWait(ctx, l, deadline)
}

func (s waitBatchStore) Acquire(ctx context.Context, l *backend.Lease, deadline time.Time) error {
	return s.acquireWait(ctx, l, deadline)
}

func (s waitBatchStore) RefreshAll(ctx context.Context, ls []*backend.Lease) []error {
	return s.refreshAll(ctx, ls)
}

// resource returns s with the abilities drawn: a Waiter (push store) or a
// Spinner, with or without batch renewal and multi-key acquisition.
func (s *hostile) resource(waiter, batch, multi bool) backend.RemoteResource {
	switch {
	case waiter && batch:
		return waitBatchStore{s}
	case waiter:
		return waitStore{s}
	case batch && multi:
		return spinBothStore{s}
	case batch:
		return spinBatchStore{s}
	case multi:
		return spinMultiStore{s}
	}
	return spinStore{s}
}

// The model's view into the store.

// holds reports whether the store holds id's grant.
func (s *hostile) holds(id holderID) bool {
	return slices.Contains(s.mem.Contents(id.key), id.kind.String()+" "+id.value)
}

// valueOf returns the owner value the store granted token to.
func (s *hostile) valueOf(token uint64) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.tokens[token]
	return v, ok
}

// exemption says why the checks cannot hold value's holder to the
// guarantees, or "": it was deleted behind its holder's back, or a
// request changed it and its caller did not learn it.
func (s *hostile) exemption(value string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.evicted[value]:
		return "evicted"
	case s.ghosts[value] > 0:
		return "released by a request whose reply the facade did not get"
	case s.shortens[value] > 0:
		return "shortened by a refresh whose reply the facade did not get"
	}
	return ""
}

// history tells what set id's expiry, last first.
func (s *hostile) history(id holderID) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.histories[id]
	if sh := s.shadows[id]; sh != nil {
		h = sh.history
	}
	return strings.Join(h, "; ")
}

// reportedLost reports whether the store reported value's lease lost.
func (s *hostile) reportedLost(value string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.storeLost[value]
}

// freedAt reports whether, and when, id's holder was freed by expiry.
func (s *hostile) freedAt(id holderID) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.freed[id]
	return at, ok
}

// evict deletes key, every kind and every holder and intent, as an
// operator would, and closes the holders' Lost channels (a watch sees
// the deletion). The holders are exempt from the checks from now on.
func (s *hostile) evict(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.shadows {
		if id.key != key {
			continue
		}
		sh := s.untrackLocked(id)
		s.evicted[id.value] = true
		if sh.lost != nil {
			close(sh.lost)
		}
	}
	s.mem.Evict(key)
}

// loseLease makes the store lose id's grant and report it (Lost closes),
// as a session or lease that ends does. It reports whether it did.
func (s *hostile) loseLease(id holderID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sh := s.shadows[id]
	if sh == nil || sh.lost == nil {
		return false
	}
	s.deleteLocked(id)
	s.untrackLocked(id)
	s.storeLost[id.value] = true
	close(sh.lost)
	return true
}

// problemsSeen returns the contract violations recorded so far.
func (s *hostile) problemsSeen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.problems)
}

// leftovers lists what the store holds, of every key: "kind value" for
// holders, "kind intent value" for intents.
func (s *hostile) leftovers() map[string][]string {
	s.mu.Lock()
	keys := make([]string, 0, len(s.keys))
	for k := range s.keys {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	out := map[string][]string{}
	for _, k := range keys {
		if c := s.mem.Contents(k); len(c) > 0 {
			out[k] = c
		}
	}
	return out
}
