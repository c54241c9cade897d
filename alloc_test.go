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

// The bound: a lock held with WithAutoRenew costs the facade at most
// 225 bytes of heap (BenchmarkHeldLocks shows the figure for 100,000
// locks): its grant (the 176-byte size class), owner value (32) and
// scheduler entry (about 10), so that every store has the rest of the
// 300 bytes per held lock the issue allows. Heap sizes after GC are exact
// enough over many locks for a test to hold them.
func TestHeldLockHeap(t *testing.T) {
	total, store, facade := heldBytes(t, 100_000)
	t.Logf("per held lock: %.0f B, of which the facade %.0f B and the memory store %.0f B", total, facade, store)
	if facade > 225 {
		t.Errorf("a held lock costs the facade %.0f B of heap; want at most 225", facade)
	}
}
