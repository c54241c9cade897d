package safety

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/distlock/distlock/backend"
)

// spyRes wraps a pull store and records the outcome of the last TryAcquire
// per key, so that an orphan's report says what the backend returned.
type spyRes struct {
	backend.Spinner
	mu   sync.Mutex
	last map[string]string
}

func (s *spyRes) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	ok, d, err := s.Spinner.TryAcquire(ctx, l)
	s.mu.Lock()
	if s.last == nil {
		s.last = map[string]string{}
	}
	s.last[l.Key] = fmt.Sprintf("ok=%v err=%v (%T)", ok, err, err)
	s.mu.Unlock()
	return ok, d, err
}

func (s *spyRes) lastOf(key string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[key]
}
