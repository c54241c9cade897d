package fence

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
)

// TestGates: requests of one resource are inside one at a time, those of
// different resources together, and a resource's gate is gone once no
// request holds it or waits for it, also after waiters gave up.
func TestGates(t *testing.T) {
	gs := &gates{m: make(map[string]*gate)}
	var inside [3]atomic.Int32
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Go(func() {
			res := string(rune('a' + w%3))
			for i := range 200 {
				ctx, cancel := context.WithCancel(context.Background())
				if i%7 == 0 {
					cancel() // gives up unless it gets in at once
				}
				leave, err := gs.enter(ctx, res)
				cancel()
				if err != nil {
					continue
				}
				if n := inside[w%3].Add(1); n != 1 {
					t.Errorf("%d requests inside %s's gate", n, res)
				}
				inside[w%3].Add(-1)
				leave()
			}
		})
	}
	wg.Wait()
	if len(gs.m) != 0 {
		t.Errorf("%d gates left; want 0", len(gs.m))
	}
}
