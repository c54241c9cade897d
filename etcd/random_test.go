package etcd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
)

// holding is one acquisition as a randomized test saw it: held from the
// return of Acquire until the call of Release or the end of its validity,
// whichever came first.
type holding struct {
	who        string
	token      uint64
	start, end time.Time
}

// checkHoldings fails t if two holdings overlap or tokens do not increase
// with the start of holding.
func checkHoldings(t *testing.T, hs []holding) {
	t.Helper()
	slices.SortFunc(hs, func(a, b holding) int { return a.start.Compare(b.start) })
	for i := 1; i < len(hs); i++ {
		prev, cur := hs[i-1], hs[i]
		if cur.start.Before(prev.end) {
			t.Errorf("%s (token %d) held from %v before %s (token %d) let go, %v later",
				cur.who, cur.token, cur.start.Format(time.StampMicro), prev.who, prev.token, prev.end.Sub(cur.start))
		}
		if cur.token <= prev.token {
			t.Errorf("token %d of %s after token %d of %s", cur.token, cur.who, prev.token, prev.who)
		}
	}
}

// TestSharedLeaseRandomized runs holders of three keys in two Resources on
// shared leases, with the lock's TTL timer, Release, Refresh and new
// acquisitions racing: holders let go at random around the end of their
// TTL, and a hook delays each Release between its state check and its
// delete by a random time. Checked: no two holders overlap, tokens
// increase, every error is one the contract allows, and nothing is left.
// The seed is logged (the timing is not replayable, the choices are).
func TestSharedLeaseRandomized(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	var rmu sync.Mutex
	rnd := rand.New(rand.NewPCG(seed, 23))
	between := func(lo, hi time.Duration) time.Duration {
		rmu.Lock()
		defer rmu.Unlock()
		return lo + time.Duration(rnd.Int64N(int64(hi-lo)+1))
	}
	keys := []string{uniqueKey(t) + "-0", uniqueKey(t) + "-1", uniqueKey(t) + "-2"}
	var rs []*Resource
	for range 2 {
		r := newResource(t, endpoints, WithSharedLease())
		r.hook = func(point string) {
			if point == "release" {
				time.Sleep(between(0, 200*time.Millisecond)) // the fault: a late release
			}
		}
		rs = append(rs, r)
	}
	var (
		mu    sync.Mutex
		hs    = map[string][]holding{}
		wg    sync.WaitGroup
		until = time.Now().Add(8 * time.Second)
	)
	for i := range 4 * len(keys) {
		r, key := rs[i%2], keys[i%len(keys)]
		who := fmt.Sprintf("%c%d", 'a'+i%2, i)
		wg.Go(func() {
			for time.Now().Before(until) {
				l := lease(key, time.Second)
				if err := r.Acquire(context.Background(), l, time.Now().Add(30*time.Second)); err != nil {
					t.Errorf("%s: Acquire: %v", who, err)
					return
				}
				start := time.Now()
				// As the facade counts it: less 1% + 2ms for the time
				// between the validity's reading and Acquire's return.
				end := start.Add(l.Validity - l.Validity/100 - 2*time.Millisecond)
				var hold time.Duration
				switch between(0, 3) {
				case 0, 1:
					hold = between(0, 20*time.Millisecond)
				case 2: // refresh once, then let go around the new end
					hold = between(0, l.Validity/2)
					time.Sleep(hold)
					rstart := time.Now()
					if err := r.Refresh(context.Background(), l); err == nil {
						end = rstart.Add(l.TTL - l.TTL/100 - 2*time.Millisecond)
					} else if !errors.Is(err, backend.ErrNotHeld) {
						t.Errorf("%s: Refresh: %v", who, err)
					}
					hold = time.Until(end) - between(-30*time.Millisecond, 200*time.Millisecond)
				default: // around the end of the TTL, when the timer fires
					hold = l.Validity - between(-30*time.Millisecond, 200*time.Millisecond)
				}
				time.Sleep(max(hold, 0))
				call := time.Now()
				err := r.Release(context.Background(), l)
				if err != nil && !errors.Is(err, backend.ErrNotHeld) {
					t.Errorf("%s: Release: %v", who, err)
				}
				if call.Before(end) {
					end = call
				}
				mu.Lock()
				hs[key] = append(hs[key], holding{who: who, token: l.Token, start: start, end: end})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, key := range keys {
		t.Logf("%s: %d holdings", key, len(hs[key]))
		checkHoldings(t, hs[key])
		waitKeys(t, rs[0], key, 0)
	}
}
