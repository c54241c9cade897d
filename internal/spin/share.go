package spin

import (
	"sync"

	"github.com/distlock/distlock/backend"
)

// Share returns a Notifier over n whose subscribers to one key share one
// subscription of n, and so one channel: each notice n sends wakes one of
// them, the one that has waited longest (Go queues a channel's receivers
// in order), instead of all. Of the waiters of one process, only one can
// take the lock a release frees; the others would each spend a failed
// attempt on it. A woken waiter that loses to another process waits again,
// behind the others, so they take turns. A nil n gives nil.
//
// The subscription of n starts with the key's first subscriber and is
// cancelled with its last. n.Subscribe is called under a lock shared by
// all keys, as the Notifier contract allows (it must not block).
func Share(n backend.Notifier) backend.Notifier {
	if n == nil {
		return nil
	}
	return &shared{n: n, subs: make(map[string]*sharedSub)}
}

type shared struct {
	n    backend.Notifier
	mu   sync.Mutex
	subs map[string]*sharedSub // key -> live subscription; refs > 0
}

type sharedSub struct {
	ch     <-chan struct{}
	cancel func()
	refs   int
}

// Subscribe implements [backend.Notifier].
func (s *shared) Subscribe(key string) (<-chan struct{}, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.subs[key]
	if e == nil {
		ch, cancel := s.n.Subscribe(key)
		e = &sharedSub{ch: ch, cancel: cancel}
		s.subs[key] = e
	}
	e.refs++
	var once sync.Once
	return e.ch, func() {
		once.Do(func() {
			s.mu.Lock()
			e.refs--
			last := e.refs == 0
			if last {
				delete(s.subs, key)
			}
			s.mu.Unlock()
			if last {
				e.cancel()
			}
		})
	}
}
