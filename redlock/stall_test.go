package redlock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver/proxy"
	"github.com/distlock/distlock/redlock"
	"github.com/distlock/distlock/testsuite"
)

// TestRandomStallsAndCancels drives Resources directly, as the facade
// does, over five nodes behind proxies that delay requests at random,
// while nodes are frozen now and then (one, or a majority, for
// 50-250ms; once a majority for 1.5s) and calls get random deadlines and
// cancellations. Invariants:
//   - every call returns within testsuite.StallSlack of its context's end;
//   - two acquisitions of a key never hold it at once (from the return of
//     the round that got it to the first of its release and the end of
//     its validity);
//   - once the clean-up of a failed round has succeeded (at once, or the
//     AbandonedError's Cleanup, retried as the facade does), no node holds
//     that round's value again (a sampler reads every node every few
//     milliseconds, directly);
//   - every clean-up succeeds once the nodes answer.
func TestRandomStallsAndCancels(t *testing.T) {
	// The TTL is longer than the longest a request may take to run: the
	// proxy's delay (250ms at most) plus the longest freeze (1.5s), for a
	// request delivered to a node that then froze. A tombstone lives one
	// TTL: a request that runs later than that after its clean-up sets
	// the key (see the package doc).
	const (
		owners      = 3
		ttl         = 3 * time.Second
		nodeTimeout = 50 * time.Millisecond
	)
	run := 5 * time.Second
	if testing.Short() {
		run = 3 * time.Second
	}
	seed := testSeed(t)
	rnd := rand.New(rand.NewPCG(seed, 0))
	var rmu sync.Mutex
	randN := func(n time.Duration) time.Duration {
		rmu.Lock()
		defer rmu.Unlock()
		return time.Duration(rnd.Int64N(int64(n)))
	}
	c := startNodes(t, 5, nil)
	var clients []goredis.UniversalClient
	for _, s := range c.servers {
		p, err := proxy.Start(s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		p.SetDelay(proxy.Up, func() time.Duration {
			if randN(100) < 5 { // late: the round gives up on the node
				return nodeTimeout + randN(4*nodeTimeout)
			}
			return randN(time.Millisecond)
		})
		clients = append(clients, c.client(t, p.Addr))
	}
	base := uniqueKey(t)
	keys := []string{base + "-a", base + "-b"}

	type sample struct {
		node       int
		key, value string
		at         time.Time
	}
	type interval struct {
		owner      int
		from, till time.Time
	}
	var (
		mu        sync.Mutex
		samples   []sample
		cleaned   = map[string]time.Time{} // failed round's value -> its clean-up's success
		intervals = map[string][]interval{}
		stats     struct{ rounds, acquired, contended, abandoned, failed int }
	)
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			for _, k := range keys {
				for i, in := range c.inspect {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
					at := time.Now()
					v, err := in.Get(ctx, lockKey(k)).Result()
					cancel()
					if err == nil {
						mu.Lock()
						samples = append(samples, sample{i, k, v, at})
						mu.Unlock()
					}
				}
			}
		}
	})
	var cleanups sync.WaitGroup
	cleanUp := func(value string, ab *backend.AbandonedError) {
		cleanups.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			for backoff := 10 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
				err := ab.Cleanup(ctx)
				if err == nil {
					mu.Lock()
					cleaned[value] = time.Now()
					mu.Unlock()
					return
				}
				if ctx.Err() != nil {
					t.Errorf("Cleanup of %s never succeeded: %v", value, err)
					return
				}
				time.Sleep(backoff)
			}
		})
	}
	callCtx := func() (context.Context, context.CancelFunc, time.Time) {
		switch d := randN(3 * nodeTimeout); randN(3) {
		case 0:
			return context.Background(), func() {}, time.Time{}
		case 1:
			ctx, cancel := context.WithTimeout(context.Background(), d)
			return ctx, cancel, time.Now().Add(d + testsuite.StallSlack)
		default:
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(d, cancel)
			return ctx, cancel, time.Now().Add(d + testsuite.StallSlack)
		}
	}
	late := func(what string, bound time.Time) {
		if !bound.IsZero() && time.Now().After(bound) {
			t.Errorf("%s returned %v after its context's end plus %v", what, time.Since(bound), testsuite.StallSlack)
		}
	}

	end := time.Now().Add(run)
	var ws sync.WaitGroup
	for o := range owners {
		r, err := redlock.New(clients, redlock.WithNodeTimeout(nodeTimeout))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		ws.Go(func() {
			for i := 0; time.Now().Before(end); i++ {
				key := keys[(o+i)%len(keys)]
				l := newLease(key, ttl)
				for time.Now().Before(end) { // spin on the lease, as the facade does
					ctx, cancel, bound := callCtx()
					start := time.Now()
					ok, _, err := r.TryAcquire(ctx, l)
					late("TryAcquire", bound)
					cancel()
					mu.Lock()
					stats.rounds++
					mu.Unlock()
					var ab *backend.AbandonedError
					switch {
					case errors.As(err, &ab):
						mu.Lock()
						stats.abandoned++
						mu.Unlock()
						cleanUp(redlock.Stored(l), ab)
					case err != nil:
						mu.Lock()
						stats.failed++
						cleaned[redlock.Stored(l)] = time.Now()
						mu.Unlock()
					case !ok:
						mu.Lock()
						stats.contended++
						mu.Unlock()
						time.Sleep(randN(10 * time.Millisecond))
						continue
					default:
						from, validUntil := time.Now(), start.Add(l.Validity)
						time.Sleep(randN(100 * time.Millisecond))
						till := time.Now()
						if till.After(validUntil) {
							till = validUntil
						}
						ctx, cancel, bound := callCtx()
						err := r.Release(ctx, l)
						late("Release", bound)
						cancel()
						for err != nil && !errors.Is(err, backend.ErrNotHeld) && time.Now().Before(validUntil) {
							err = r.Release(context.Background(), l)
						}
						mu.Lock()
						stats.acquired++
						intervals[key] = append(intervals[key], interval{o, from, till})
						mu.Unlock()
					}
					break
				}
			}
		})
	}
	// Freezes of one node or a majority; the first, of a majority,
	// longer than testsuite.StallSlack.
	for long := true; time.Now().Before(end); long = false {
		time.Sleep(300*time.Millisecond + randN(400*time.Millisecond))
		frozen := []int{int(randN(5))}
		freeze := 50*time.Millisecond + randN(200*time.Millisecond)
		if long || randN(2) == 0 {
			frozen = []int{0, 2, 4}
		}
		if long {
			freeze = testsuite.StallSlack + 500*time.Millisecond
		}
		resume := c.stall(t, frozen...)
		time.Sleep(freeze)
		resume()
	}
	ws.Wait()
	cleanups.Wait()
	time.Sleep(6 * nodeTimeout) // the last delayed requests land
	close(stop)
	bg.Wait()

	t.Logf("%d rounds: %d acquired, %d contended, %d abandoned (cleaned up in the background), %d failed (cleaned up at once); %d samples",
		stats.rounds, stats.acquired, stats.contended, stats.abandoned, stats.failed, len(samples))
	if stats.abandoned == 0 || stats.acquired == 0 {
		t.Errorf("no round was abandoned, or none acquired: the test tested little")
	}
	for _, s := range samples {
		if at, ok := cleaned[s.value]; ok && s.at.After(at) {
			t.Errorf("node %d: %s held the value of a failed round %v after its clean-up succeeded", s.node, s.key, s.at.Sub(at))
		}
	}
	for key, ivs := range intervals {
		slices.SortFunc(ivs, func(a, b interval) int { return a.from.Compare(b.from) })
		for i, a := range ivs {
			for _, b := range ivs[i+1:] {
				if !b.from.Before(a.till) {
					break
				}
				t.Errorf("%s: owner %d acquired %v before owner %d's lock ended", key, b.owner, a.till.Sub(b.from), a.owner)
			}
		}
	}
}
