package testsuite_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/testsuite"
)

// TestMemoryNoGoroutineLeak checks that no goroutine of the memory store
// outlives Close: renewers, expiry timers, waiters and Do's loss watch all
// end with it. (verifyNoLeak is in leak_test.go.)
func TestMemoryNoGoroutineLeak(t *testing.T) {
	before := goleak.IgnoreCurrent()
	store := memory.New()
	testsuite.Exercise(t, store, store, 300*time.Millisecond)
	verifyNoLeak(t, before)
	if n := store.Len(); n != 0 {
		t.Errorf("store holds %d keys after Close; want 0", n)
	}
}
