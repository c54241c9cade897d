// Package memory is an in-process lock store: a map under a mutex, with TTL
// expiry, a fencing-token counter and release notices.
//
// Several [github.com/distlock/distlock.DistributeLock]s over one [Store]
// behave like several processes over one server, which makes it the store
// for tests, examples and locks that never leave one process.
package memory

import (
	"context"
	"sync"
	"time"

	"github.com/distlock/distlock/backend"
)

var (
	_ backend.Spinner   = (*Store)(nil)
	_ backend.Refresher = (*Store)(nil)
	_ backend.Notifier  = (*Store)(nil)
)

// sweepEvery is how many acquisitions pass between sweeps of expired keys,
// which bounds the memory held by keys nobody touches again.
const sweepEvery = 1024

type entry struct {
	value   string
	expires time.Time // monotonic
}

// Store is an in-process lock store. The zero value is not usable; call
// [New]. It is safe for concurrent use.
type Store struct {
	mu     sync.Mutex
	locks  map[string]entry
	token  uint64 // last token handed out; one counter for the store
	subs   map[string]map[chan struct{}]struct{}
	sweeps int // acquisitions since the last sweep
}

// New returns an empty store.
func New() *Store {
	return &Store{locks: make(map[string]entry), subs: make(map[string]map[chan struct{}]struct{})}
}

// get returns key's entry if it has not expired, removing it if it has.
func (s *Store) get(key string, now time.Time) (entry, bool) {
	e, ok := s.locks[key]
	if ok && !now.Before(e.expires) {
		delete(s.locks, key)
		return entry{}, false
	}
	return e, ok
}

// TryAcquire adds l.Key with l.Value for l.TTL if no live entry holds it,
// and hands out the next token. Otherwise it reports the holder's time left.
func (s *Store) TryAcquire(_ context.Context, l *backend.Lease) (bool, time.Duration, error) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.get(l.Key, now); ok {
		return false, e.expires.Sub(now), nil
	}
	if s.sweeps++; s.sweeps >= sweepEvery {
		s.sweeps = 0
		for k, e := range s.locks {
			if !now.Before(e.expires) {
				delete(s.locks, k)
			}
		}
	}
	s.token++
	s.locks[l.Key] = entry{value: l.Value, expires: now.Add(l.TTL)}
	l.Token = s.token
	return true, 0, nil
}

// Release deletes l.Key if it still holds l.Value, and sends a release
// notice to the key's subscribers. backend.ErrNotHeld otherwise.
func (s *Store) Release(_ context.Context, l *backend.Lease) error {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.get(l.Key, now); !ok || e.value != l.Value {
		return backend.ErrNotHeld
	}
	delete(s.locks, l.Key)
	for ch := range s.subs[l.Key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	return nil
}

// Refresh extends l.Key for another l.TTL if it still holds l.Value.
// backend.ErrNotHeld otherwise.
func (s *Store) Refresh(_ context.Context, l *backend.Lease) error {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.get(l.Key, now); !ok || e.value != l.Value {
		return backend.ErrNotHeld
	}
	s.locks[l.Key] = entry{value: l.Value, expires: now.Add(l.TTL)}
	return nil
}

// Subscribe returns a channel that receives a value when key is released.
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

// Holder returns the owner value holding key and its time left, if any.
// Tests use it to look into the store.
func (s *Store) Holder(key string) (value string, ttl time.Duration, ok bool) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.get(key, now)
	return e.value, e.expires.Sub(now), ok
}

// Evict deletes key whoever holds it, as an operator or a failover would,
// without a release notice. It reports whether a live entry was there.
func (s *Store) Evict(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.get(key, time.Now())
	delete(s.locks, key)
	return ok
}

// Len returns the number of live entries.
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
	return n
}
