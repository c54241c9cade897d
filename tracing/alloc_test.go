//go:build !race

package tracing_test

import (
	"context"
	"testing"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
)

// With no TracerProvider set, or a noop one, the handler adds no
// allocation to an uncontended cycle. Allocation counts are exact, so a
// test can hold them (BenchmarkCycle shows them with -benchmem).
func TestNoProviderNoAllocs(t *testing.T) {
	allocs := make(map[string]float64)
	for _, c := range chains(t) {
		d, err := distlock.New(memory.New(), distlock.WithHandlers(c.h...))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		allocs[c.name] = testing.AllocsPerRun(1000, func() { cycle(t, ctx, d) })
		_ = d.Close()
	}
	t.Logf("allocations per cycle: %v", allocs)
	for _, name := range []string{"unset", "noop"} {
		if allocs[name] != allocs["bare"] {
			t.Errorf("%s: %v allocations per cycle; want %v, as with no handler", name, allocs[name], allocs["bare"])
		}
	}
	if allocs["sdk"] <= allocs["bare"] {
		t.Errorf("sdk: %v allocations per cycle, bare %v: the recording chain made no span?", allocs["sdk"], allocs["bare"])
	}
}
