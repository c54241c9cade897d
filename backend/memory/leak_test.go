package memory_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/testsuite"
)

// TestNoGoroutineLeak checks that no goroutine outlives Close: renewers,
// expiry timers, waiters and Do's loss watch all end with it.
func TestNoGoroutineLeak(t *testing.T) {
	before := goleak.IgnoreCurrent()
	store := memory.New()
	testsuite.Exercise(t, store, store, 300*time.Millisecond)
	verifyNoLeak(t, before)
	if n := store.Len(); n != 0 {
		t.Errorf("store holds %d keys after Close; want 0", n)
	}
}

// verifyNoLeak fails t if goroutines other than those opts ignore are
// still running after a few seconds' grace for the ones already ending.
func verifyNoLeak(t *testing.T, opts ...goleak.Option) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); goleak.Find(opts...) != nil && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	goleak.VerifyNone(t, opts...)
}
