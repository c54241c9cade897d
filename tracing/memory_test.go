package tracing_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
)

// storeDown is the error of a store that cannot be reached.
type storeDown struct{ op string }

func (e storeDown) Error() string { return "store down: " + e.op }

// down is a memory store whose every acquire and release fails (fault
// injection the in-process store cannot give).
type down struct{ *memory.Store }

func (down) TryAcquire(_ context.Context, l *backend.Lease) (bool, time.Duration, error) {
	return false, 0, fmt.Errorf("down: acquire %q: %w", l.Key, storeDown{"acquire"})
}

var memoryKit = kit{
	name: "memory",
	open: func(t *testing.T) (backend.RemoteResource, func(string)) {
		s := memory.New()
		return s, func(key string) { s.Evict(key) }
	},
	broken: func(t *testing.T) backend.RemoteResource { return down{memory.New()} },
	storeErrType: func(v attribute.Value) bool {
		return v.AsString() == "github.com/distlock/distlock/tracing_test.storeDown"
	},
}

func TestOutcomesMemory(t *testing.T) { runOutcomes(t, memoryKit) }
