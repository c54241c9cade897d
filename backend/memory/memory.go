// Package memory is an in-process lock store: a map under a mutex, with TTL
// expiry, a fencing-token counter and release notices. It holds every kind
// of lock (mutexes, semaphores, read/write locks) and is the reference for
// their behaviour.
//
// Several [github.com/distlock/distlock.DistributeLock]s over one [Store]
// behave like several processes over one server, which makes it the store
// for tests, examples and locks that never leave one process.
package memory

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/distlock/distlock/backend"
)

var (
	_ backend.Spinner        = (*Store)(nil)
	_ backend.Refresher      = (*Store)(nil)
	_ backend.Notifier       = (*Store)(nil)
	_ backend.KindChecker    = (*Store)(nil)
	_ backend.Withdrawer     = (*Store)(nil)
	_ backend.Inspector      = (*Store)(nil)
	_ backend.MultiSpinner   = (*Store)(nil)
	_ backend.BatchRefresher = (*Store)(nil)
	_ backend.Relabeler      = (*Store)(nil)
	_ backend.Watcher        = (*Store)(nil)
)

// sweepEvery is how many acquisitions pass between sweeps of expired keys,
// which bounds the memory held by keys nobody touches again.
const sweepEvery = 1024

type entry struct {
	value   string
	expires time.Time // monotonic
	token   uint64
	label   string
}

// group is a semaphore's or a read/write lock's state under one key.
type group struct {
	holders map[string]holder // owner value -> its grant
	limit   int               // a semaphore's limit while it has holders
	intents map[string]intent // waiting requests of a read/write lock, by owner value
}

// intent is a waiting reader's or writer's place in line.
type intent struct {
	kind    backend.Kind
	seq     uint64 // arrival order
	expires time.Time
}

type holder struct {
	kind    backend.Kind
	expires time.Time
	token   uint64
	label   string
}

// Store is an in-process lock store. The zero value is not usable; call
// [New]. It is safe for concurrent use.
type Store struct {
	mu     sync.Mutex
	locks  map[string]entry  // mutexes
	sems   map[string]*group // semaphores
	rws    map[string]*group // read/write locks
	token  uint64            // last token handed out; one counter for the store
	subs   map[string]map[chan struct{}]struct{}
	watch  map[string]map[chan struct{}]struct{} // Watch: changes of a mutex
	sweeps int                                   // acquisitions since the last sweep
}

// New returns an empty store.
func New() *Store {
	return &Store{locks: make(map[string]entry), sems: make(map[string]*group), rws: make(map[string]*group),
		subs: make(map[string]map[chan struct{}]struct{})}
}

// CheckKind implements [backend.KindChecker]: the store holds every kind.
func (s *Store) CheckKind(backend.Kind) error { return nil }

// get returns key's entry if it has not expired, removing it if it has.
func (s *Store) get(key string, now time.Time) (entry, bool) {
	e, ok := s.locks[key]
	if ok && !now.Before(e.expires) {
		delete(s.locks, key)
		return entry{}, false
	}
	return e, ok
}

// group returns the live state of a semaphore or read/write lock, dropping
// expired holders and intents, or nil.
func (s *Store) group(m map[string]*group, key string, now time.Time) *group {
	g := m[key]
	if g == nil {
		return nil
	}
	for v, h := range g.holders {
		if !now.Before(h.expires) {
			delete(g.holders, v)
		}
	}
	for v, in := range g.intents {
		if !now.Before(in.expires) {
			delete(g.intents, v)
		}
	}
	if len(g.holders) == 0 && len(g.intents) == 0 {
		delete(m, key)
		return nil
	}
	return g
}

func (s *Store) groups(kind backend.Kind) map[string]*group {
	if kind == backend.KindSemaphore {
		return s.sems
	}
	return s.rws
}

// TryAcquire takes l if its kind's rules let it, and hands out the next
// token; otherwise it reports when the first holder's time runs out.
func (s *Store) TryAcquire(_ context.Context, l *backend.Lease) (bool, time.Duration, error) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sweeps++; s.sweeps >= sweepEvery {
		s.sweeps = 0
		s.sweepLocked(now)
	}
	if l.Kind == backend.KindMutex {
		if e, ok := s.get(l.Key, now); ok {
			return false, e.expires.Sub(now), nil
		}
		s.token++
		s.locks[l.Key] = entry{value: l.Value, expires: now.Add(l.TTL), token: s.token, label: l.Label}
		l.Token = s.token
		s.changedLocked(l.Key)
		return true, 0, nil
	}
	m := s.groups(l.Kind)
	g := s.group(m, l.Key, now)
	if g == nil {
		g = &group{holders: make(map[string]holder), intents: make(map[string]intent)}
		m[l.Key] = g
	}
	var ok bool
	switch l.Kind {
	case backend.KindSemaphore:
		if len(g.holders) > 0 && g.limit != int(l.Limit) {
			return false, 0, backend.ErrLimitMismatch
		}
		ok = len(g.holders) < int(l.Limit)
	case backend.KindRead:
		ok = !g.hasWriter() && !g.precedes(l.Value, backend.KindWrite)
	case backend.KindWrite:
		ok = len(g.holders) == 0 && !g.precedes(l.Value, backend.KindRead) && !g.precedes(l.Value, backend.KindWrite)
	}
	if !ok {
		if l.Kind != backend.KindSemaphore { // take, or keep, a place in line
			in, had := g.intents[l.Value]
			if !had {
				s.token++ // the store's counter orders arrivals too
				in = intent{kind: l.Kind, seq: s.token}
			}
			in.expires = now.Add(l.TTL)
			g.intents[l.Value] = in
		}
		return false, g.firstExpiry(now), nil
	}
	if len(g.holders) == 0 {
		g.limit = int(l.Limit)
	}
	delete(g.intents, l.Value)
	s.token++
	g.holders[l.Value] = holder{kind: l.Kind, expires: now.Add(l.TTL), token: s.token, label: l.Label}
	l.Token = s.token
	return true, 0, nil
}

// TryAcquireAll implements [backend.MultiSpinner] for mutexes: every key
// or none, under one lock of the store.
func (s *Store) TryAcquireAll(_ context.Context, ls []*backend.Lease) (bool, time.Duration, error) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range ls {
		if l.Kind != backend.KindMutex {
			return false, 0, errors.ErrUnsupported
		}
		if e, ok := s.get(l.Key, now); ok {
			return false, e.expires.Sub(now), nil
		}
	}
	for _, l := range ls {
		s.token++
		s.locks[l.Key] = entry{value: l.Value, expires: now.Add(l.TTL), token: s.token, label: l.Label}
		l.Token = s.token
		s.changedLocked(l.Key)
	}
	return true, 0, nil
}

// Inspect implements [backend.Inspector].
func (s *Store) Inspect(_ context.Context, key string, kind backend.Kind) (backend.Inspection, error) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var in backend.Inspection
	if kind == backend.KindMutex {
		if e, ok := s.get(key, now); ok {
			in.Holders = []backend.Holder{{Kind: kind, Token: e.token, TTL: e.expires.Sub(now), Label: e.label}}
		}
		return in, nil
	}
	g := s.group(s.groups(kind), key, now)
	if g == nil {
		return in, nil
	}
	for _, h := range g.holders {
		in.Holders = append(in.Holders, backend.Holder{Kind: h.kind, Token: h.token, TTL: h.expires.Sub(now), Label: h.label})
	}
	sort.Slice(in.Holders, func(i, j int) bool { return in.Holders[i].Token < in.Holders[j].Token })
	if len(in.Holders) > 0 && kind == backend.KindSemaphore {
		in.Limit = g.limit
	}
	return in, nil
}

// precedes reports whether an intent of kind is ahead of value's in line:
// any such intent when value has none.
func (g *group) precedes(value string, kind backend.Kind) bool {
	own, has := g.intents[value]
	for v, in := range g.intents {
		if v != value && in.kind == kind && (!has || in.seq < own.seq) {
			return true
		}
	}
	return false
}

func (g *group) hasWriter() bool {
	for _, h := range g.holders {
		if h.kind == backend.KindWrite {
			return true
		}
	}
	return false
}

// firstExpiry is how long until the first holder or intent may end.
func (g *group) firstExpiry(now time.Time) time.Duration {
	var first time.Time
	for _, h := range g.holders {
		if first.IsZero() || h.expires.Before(first) {
			first = h.expires
		}
	}
	for _, in := range g.intents {
		if first.IsZero() || in.expires.Before(first) {
			first = in.expires
		}
	}
	if first.IsZero() {
		return 0
	}
	return first.Sub(now)
}

func (s *Store) sweepLocked(now time.Time) {
	for k, e := range s.locks {
		if !now.Before(e.expires) {
			delete(s.locks, k)
		}
	}
	for _, m := range []map[string]*group{s.sems, s.rws} {
		for k := range m {
			s.group(m, k, now)
		}
	}
}

// Release deletes l's grant if the store still holds l.Value for it, and
// sends a release notice to the key's subscribers. backend.ErrNotHeld
// otherwise.
func (s *Store) Release(_ context.Context, l *backend.Lease) error {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.Kind == backend.KindMutex {
		if e, ok := s.get(l.Key, now); !ok || e.value != l.Value {
			return backend.ErrNotHeld
		}
		delete(s.locks, l.Key)
		s.changedLocked(l.Key)
	} else {
		m := s.groups(l.Kind)
		g := s.group(m, l.Key, now)
		if g == nil {
			return backend.ErrNotHeld
		}
		if h, ok := g.holders[l.Value]; !ok || h.kind != l.Kind {
			return backend.ErrNotHeld
		}
		delete(g.holders, l.Value)
		s.group(m, l.Key, now)
	}
	s.notifyLocked(l.Key)
	return nil
}

func (s *Store) notifyLocked(key string) {
	for ch := range s.subs[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// changedLocked tells key's watchers that its mutex changed.
func (s *Store) changedLocked(key string) {
	for ch := range s.watch[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Relabel implements [backend.Relabeler]: it sets the label of l's mutex
// if the store still holds l.Value for it. backend.ErrNotHeld otherwise.
func (s *Store) Relabel(_ context.Context, l *backend.Lease) error {
	if l.Kind != backend.KindMutex {
		return fmt.Errorf("memory: relabel %v %q: %w", l.Kind, l.Key, errors.ErrUnsupported)
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.get(l.Key, now)
	if !ok || e.value != l.Value {
		return backend.ErrNotHeld
	}
	e.label = l.Label
	s.locks[l.Key] = e
	s.changedLocked(l.Key)
	return nil
}

// Watch implements [backend.Watcher]: ch receives a value when key's mutex
// is taken, released, relabelled or evicted (an expiry sends none), and
// one at once.
func (s *Store) Watch(key string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	ch <- struct{}{}
	s.mu.Lock()
	if s.watch == nil {
		s.watch = make(map[string]map[chan struct{}]struct{})
	}
	m := s.watch[key]
	if m == nil {
		m = make(map[chan struct{}]struct{})
		s.watch[key] = m
	}
	m[ch] = struct{}{}
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		delete(m, ch)
		if len(m) == 0 && len(s.watch[key]) == 0 {
			delete(s.watch, key)
		}
		s.mu.Unlock()
	}
}

// Refresh extends l's grant for another l.TTL if the store still holds
// l.Value for it. backend.ErrNotHeld otherwise.
func (s *Store) Refresh(_ context.Context, l *backend.Lease) error {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.Kind == backend.KindMutex {
		e, ok := s.get(l.Key, now)
		if !ok || e.value != l.Value {
			return backend.ErrNotHeld
		}
		e.expires = now.Add(l.TTL)
		s.locks[l.Key] = e
		return nil
	}
	g := s.group(s.groups(l.Kind), l.Key, now)
	if g == nil {
		return backend.ErrNotHeld
	}
	h, ok := g.holders[l.Value]
	if !ok || h.kind != l.Kind {
		return backend.ErrNotHeld
	}
	h.expires = now.Add(l.TTL)
	g.holders[l.Value] = h
	return nil
}

// RefreshAll implements [backend.BatchRefresher]: Refresh of each lease.
func (s *Store) RefreshAll(ctx context.Context, ls []*backend.Lease) []error {
	errs := make([]error, len(ls))
	for i, l := range ls {
		errs[i] = s.Refresh(ctx, l)
	}
	return errs
}

// Withdraw implements [backend.Withdrawer]: it drops a waiting request's
// intent, and wakes those it kept waiting.
func (s *Store) Withdraw(_ context.Context, l *backend.Lease) error {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.group(s.rws, l.Key, now)
	if g == nil {
		return nil
	}
	if _, ok := g.intents[l.Value]; ok {
		delete(g.intents, l.Value)
		s.group(s.rws, l.Key, now)
		s.notifyLocked(l.Key)
	}
	return nil
}

// Subscribe returns a channel that receives a value when a lock of key,
// of any kind, is released.
func (s *Store) Subscribe(key string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	m := s.subs[key]
	if m == nil {
		m = make(map[chan struct{}]struct{})
		s.subs[key] = m
	}
	m[ch] = struct{}{}
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		delete(m, ch)
		if len(m) == 0 && len(s.subs[key]) == 0 {
			delete(s.subs, key)
		}
		s.mu.Unlock()
	}
}

// Holder returns the owner value holding the mutex key and its time left,
// if any. Tests use it to look into the store.
func (s *Store) Holder(key string) (value string, ttl time.Duration, ok bool) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.get(key, now)
	return e.value, e.expires.Sub(now), ok
}

// Contents lists what the store keeps for key, of every kind: holders as
// "kind value", waiting requests' intents as "kind intent value", sorted. Tests
// use it to look for leftovers.
func (s *Store) Contents(key string) []string {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	if e, ok := s.get(key, now); ok {
		out = append(out, "mutex "+e.value)
	}
	for _, m := range []map[string]*group{s.sems, s.rws} {
		if g := s.group(m, key, now); g != nil {
			for v, h := range g.holders {
				out = append(out, h.kind.String()+" "+v)
			}
			for v, in := range g.intents {
				out = append(out, in.kind.String()+" intent "+v)
			}
		}
	}
	sort.Strings(out)
	return out
}

// Evict deletes key whoever holds it, every kind of lock and intent, as an
// operator or a failover would, without a release notice. It reports
// whether a live entry was there.
func (s *Store) Evict(key string) bool {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.get(key, now)
	delete(s.locks, key)
	s.changedLocked(key)
	for _, m := range []map[string]*group{s.sems, s.rws} {
		if s.group(m, key, now) != nil {
			ok = true
		}
		delete(m, key)
	}
	return ok
}

// Len returns the number of live grants and intents, of every kind.
func (s *Store) Len() int {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.locks {
		if now.Before(e.expires) {
			n++
		}
	}
	for _, m := range []map[string]*group{s.sems, s.rws} {
		for k := range m {
			if g := s.group(m, k, now); g != nil {
				n += len(g.holders) + len(g.intents)
			}
		}
	}
	return n
}
