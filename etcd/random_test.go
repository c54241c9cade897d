package etcd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
)

// seeded is the random source of a randomized test: seeded from the clock,
// the seed logged (the timing is not replayable, the choices are), and safe
// for the test's goroutines to share.
type seeded struct {
	mu  sync.Mutex
	rnd *rand.Rand
}

// newSeeded logs a new seed and returns a source on its stream.
func newSeeded(t *testing.T, stream uint64) *seeded {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	return &seeded{rnd: rand.New(rand.NewPCG(seed, stream))}
}

// intn returns a number in [0, n).
func (s *seeded) intn(n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rnd.IntN(n)
}

// between returns a duration in [lo, hi].
func (s *seeded) between(lo, hi time.Duration) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return lo + time.Duration(s.rnd.Int64N(int64(hi-lo)+1))
}

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
	between := newSeeded(t, 23).between
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

// TestOwnLeaseLostRandomized runs holders of three keys on leases of
// their own in two Resources, while a chaos goroutine revokes the lease or
// deletes the key of a current holder at random moments, and some holders
// keep the lock past its TTL. Checked for every holding: a lock ended from
// outside sees Lost closed and Release report ErrNotHeld; a lock whose
// Release succeeded never sees Lost closed; Lost never closes on a lock
// that was neither ended from outside nor past its TTL; holders do not
// overlap (a holding ends at the first of its release, its end from
// outside and its TTL) and tokens increase.
func TestOwnLeaseLostRandomized(t *testing.T) { testLostRandomized(t, false) }

// TestKeptAliveLostRandomized is TestOwnLeaseLostRandomized for locks the
// shared lease alone keeps alive (AutoRenew: KeptAlive, no timer, no
// refresh): the chaos deletes a current holder's key from outside (its
// lease is every lock's), and a lock held past its TTL stays held.
func TestKeptAliveLostRandomized(t *testing.T) { testLostRandomized(t, true) }

func testLostRandomized(t *testing.T, kept bool) {
	endpoints := testserver.Etcd(t).Endpoints
	admin := newClient(t, endpoints)
	between := newSeeded(t, 24).between
	keys := []string{uniqueKey(t) + "-0", uniqueKey(t) + "-1", uniqueKey(t) + "-2"}
	rs := []*Resource{newResource(t, endpoints), newResource(t, endpoints)}

	// current is what the chaos goroutine may end: the holders of now.
	type current struct {
		h     *handle
		busy  sync.WaitGroup // the chaos goroutine is ending the lock
		ended time.Time      // set by the chaos goroutine when it ended the lock
	}
	var (
		mu    sync.Mutex
		cur   = map[string]*current{}
		hs    = map[string][]holding{}
		wg    sync.WaitGroup
		until = time.Now().Add(8 * time.Second)
		ended atomic.Int64
		lost  atomic.Int64
	)
	wg.Go(func() { // chaos
		for time.Now().Before(until) {
			time.Sleep(between(0, 150*time.Millisecond)) // the fault's rhythm
			key := keys[between(0, time.Duration(len(keys)-1))]
			mu.Lock()
			c := cur[key]
			if c != nil {
				c.busy.Add(1)
			}
			mu.Unlock()
			if c == nil {
				continue
			}
			at := time.Now()
			var gone bool
			if !kept && between(0, 1) == 0 {
				// Revoke only a lease that still holds this key.
				resp, err := admin.Get(t.Context(), c.h.queueKey())
				if err == nil && len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == c.h.rev {
					_, err = admin.Revoke(t.Context(), c.h.leaseID())
					gone = err == nil
				}
			} else {
				resp, err := admin.Txn(t.Context()).
					If(clientv3.Compare(clientv3.CreateRevision(c.h.queueKey()), "=", c.h.rev)).
					Then(clientv3.OpDelete(c.h.queueKey())).Commit()
				gone = err == nil && resp.Succeeded
			}
			if gone {
				ended.Add(1)
				mu.Lock()
				c.ended = at
				mu.Unlock()
			}
			c.busy.Done()
		}
	})
	for i := range 4 * len(keys) {
		r, key := rs[i%2], keys[i%len(keys)]
		who := fmt.Sprintf("%c%d", 'a'+i%2, i)
		wg.Go(func() {
			for time.Now().Before(until) {
				l := lease(key, time.Second) // the server makes it 2s
				l.AutoRenew = kept
				if err := r.Acquire(context.Background(), l, time.Now().Add(30*time.Second)); err != nil {
					t.Errorf("%s: Acquire: %v", who, err)
					return
				}
				if l.KeptAlive != kept {
					t.Errorf("%s: KeptAlive = %v; want %v", who, l.KeptAlive, kept)
				}
				start := time.Now()
				end := start.Add(l.Validity - l.Validity/100 - 2*time.Millisecond)
				if kept {
					end = start.Add(time.Hour) // the lease keeps it
				}
				c := &current{h: l.Handle.(*handle)}
				mu.Lock()
				cur[key] = c
				mu.Unlock()
				hold := between(0, 50*time.Millisecond)
				if between(0, 9) == 0 {
					hold = l.TTL + 200*time.Millisecond // past the TTL: the lease expires
				}
				select {
				case <-time.After(hold):
				case <-l.Lost().Done():
				}
				mu.Lock()
				cur[key] = nil
				mu.Unlock()
				c.busy.Wait() // a chaos move under way on this lock
				mu.Lock()
				endedAt := c.ended
				mu.Unlock()
				call := time.Now()
				if !endedAt.IsZero() || call.After(end) {
					// Ended from outside or by the TTL: Lost must close.
					select {
					case <-l.Lost().Done():
						lost.Add(1)
					case <-time.After(10 * time.Second):
						t.Errorf("%s: Lost still open 10s after the lock ended (from outside at %v, TTL end %v)",
							who, endedAt.Format(time.StampMicro), end.Format(time.StampMicro))
					}
				}
				err := r.Release(context.Background(), l)
				switch {
				case err == nil:
					select {
					case <-l.Lost().Done():
						t.Errorf("%s: Lost closed although Release succeeded", who)
					default:
					}
				case errors.Is(err, backend.ErrNotHeld):
					if endedAt.IsZero() && call.Before(end) {
						t.Errorf("%s: Release = ErrNotHeld on a lock nobody ended before its TTL", who)
					}
				default:
					t.Errorf("%s: Release: %v", who, err)
				}
				if !endedAt.IsZero() && endedAt.Before(end) {
					end = endedAt
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
	t.Logf("%d locks ended from outside, %d losses seen", ended.Load(), lost.Load())
	if ended.Load() == 0 {
		t.Error("the chaos ended no lock: the test tested nothing")
	}
	for _, key := range keys {
		checkHoldings(t, hs[key])
		waitKeys(t, rs[0], key, 0)
	}
	for _, r := range rs {
		r.watch.mu.Lock()
		n := 0
		r.watch.names.each(func(h *handle) {
			if watched(h) {
				n++
			}
		})
		n += len(r.watch.wdel)
		r.watch.mu.Unlock()
		if n != 0 {
			t.Errorf("the key watch still holds %d keys after every lock ended", n)
		}
	}
}
