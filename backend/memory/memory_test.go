package memory_test

import (
	"context"
	"testing"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/testsuite"
)

func TestConformance(t *testing.T) {
	store := memory.New()
	testsuite.Run(t, testsuite.Harness{
		NewResource: func(*testing.T) backend.RemoteResource { return store },
		Leftovers: func(_ context.Context, key string) ([]string, error) {
			if v, _, ok := store.Holder(key); ok {
				return []string{key + "=" + v}, nil
			}
			return nil, nil
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
