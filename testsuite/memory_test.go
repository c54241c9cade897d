package testsuite_test

import (
	"context"
	"testing"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/testsuite"
)

// The tests of backend/memory that run this suite live here: the memory
// store is in the root module, which requires nothing, not even this
// suite (a module of its own), and its tests with it.

// TestConformance runs the suite on the memory store.
func TestConformance(t *testing.T) {
	store := memory.New()
	testsuite.Run(t, testsuite.Harness{
		NewResource: func(*testing.T) backend.RemoteResource { return store },
		NoStall:     "the in-process store answers in the caller's goroutine: nothing to stall",
		NoRefuse:    "the in-process store has no connection to refuse",
		NoLine: map[backend.Kind]string{
			backend.KindMutex:     "the memory store keeps no line of mutex waiters: after a release, whichever waiter tries first gets the lock",
			backend.KindSemaphore: "the memory store keeps no line of semaphore waiters: after a release, whichever waiter tries first gets the permit",
		},
		Leftovers: func(_ context.Context, key string) ([]string, error) {
			return store.Contents(key), nil
		},
		Evict: func(_ context.Context, key string) error {
			store.Evict(key)
			return nil
		},
	})
	if n := store.Len(); n != 0 {
		t.Errorf("store holds %d keys after the suite; want 0", n)
	}
}
