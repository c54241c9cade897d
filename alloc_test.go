//go:build !race

package distlock_test

import (
	"testing"

	"github.com/distlock/distlock/backend/memory"
)

// The bound: an uncontended acquire+release on memory allocates at
// most 4 objects. Allocation counts are exact, so a test can hold them.
func TestCycleAllocs(t *testing.T) {
	d := newLock(t, memory.New())
	ctx := t.Context()
	allocs := testing.AllocsPerRun(1000, func() {
		lk, err := d.TryLock(ctx, "k", 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 4 {
		t.Errorf("cycle allocates %v objects; want at most 4", allocs)
	}
	t.Logf("%v allocations per cycle", allocs)
}
