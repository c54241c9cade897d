package redis_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/internal/testserver/proxy"
	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/testsuite"
)

// TestRandomStallsAndCancels drives Resources directly, as the facade
// does, through a proxy that delays requests and replies at random, while
// the server is frozen now and then (SIGSTOP for 50-250ms, once for
// 1.5s) and calls get
// random deadlines and cancellations. Invariants:
//   - every call returns within testsuite.StallSlack of its context's end;
//   - once the clean-up of a failed attempt has succeeded (at once, or the
//     AbandonedError's Cleanup, retried as the facade does), the key never
//     holds that attempt's value again (a sampler reads every key every
//     few milliseconds, directly);
//   - every clean-up succeeds once the server answers, and at the end no
//     key of any lock is left.
//
// Attempts are of every kind (mutex, semaphore, read, write); a waiting
// reader or writer withdraws its intent, as the facade does when its wait
// ends; holders are refreshed through RefreshAll, in a batch with a lease
// that is not held, and keys inspected, under the same random contexts.
//
// The client makes no retries of its own (MaxRetries -1): a resent
// request's late first copy is a case of its own (TestLateCopyOfEarlierAttempt).
func TestRandomStallsAndCancels(t *testing.T) {
	const (
		workers = 4
		ttl     = 2 * time.Second
	)
	run := 4 * time.Second
	if testing.Short() {
		run = 2 * time.Second
	}
	seed := testSeed(t)
	rnd := rand.New(rand.NewPCG(seed, 0))
	var rmu sync.Mutex
	randN := func(n time.Duration) time.Duration {
		rmu.Lock()
		defer rmu.Unlock()
		return time.Duration(rnd.Int64N(int64(n)))
	}

	srv := testserver.Redis(t)
	p, err := proxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	delay := func() time.Duration {
		if randN(100) < 5 {
			return randN(30 * time.Millisecond)
		}
		return randN(time.Millisecond)
	}
	p.SetDelay(proxy.Up, delay)
	p.SetDelay(proxy.Down, delay)
	// A ReadTimeout far above the freezes: a call that waited for the
	// client instead of its context would show.
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr, MaxRetries: -1, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	direct := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = direct.Close() })
	base := uniqueKey(t)
	keys := []string{base + "-a", base + "-b", base + "-c"}

	// The sampler: what each lock key holds, and when the GET was sent.
	type sample struct {
		key, value string
		at         time.Time
	}
	var (
		mu      sync.Mutex
		samples []sample
		cleaned = map[string]time.Time{} // failed attempt's value -> its clean-up's success
		stats   struct{ attempts, acquired, contended, abandoned, failed int }
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
				lock, _ := redisscript.Layout(redis.DefaultPrefix, k)
				at := time.Now()
				if v, err := direct.Get(context.Background(), lock).Result(); err == nil {
					mu.Lock()
					samples = append(samples, sample{k, v, at})
					mu.Unlock()
				}
				// Permits, grants and intents of the semaphore and the
				// read/write lock.
				rw := redisscript.RWKeys(lock)
				for _, set := range []string{redisscript.SemaphoreKeys(lock)[1], rw[1], rw[4], rw[5]} {
					vs, err := direct.ZRange(context.Background(), set, 0, -1).Result()
					if err != nil {
						continue
					}
					mu.Lock()
					for _, v := range vs {
						samples = append(samples, sample{set, v, at})
					}
					mu.Unlock()
				}
			}
		}
	})
	// cleanUp runs a failed attempt's Cleanup as the facade does.
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
	// callCtx returns a random context: none, a deadline, or a cancel,
	// and the latest time a call with it may return.
	callCtx := func() (context.Context, context.CancelFunc, time.Time) {
		switch d := randN(15 * time.Millisecond); randN(3) {
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
	for w := range workers {
		r := newResource(t, c)
		ws.Go(func() {
			for i := 0; time.Now().Before(end); i++ {
				l := newLease(keys[(w+i)%len(keys)], ttl)
				switch randN(4) {
				case 1:
					l.Kind, l.Limit = backend.KindSemaphore, 2
				case 2:
					l.Kind = backend.KindRead
				case 3:
					l.Kind = backend.KindWrite
				}
				if randN(8) == 0 {
					ctx, cancel, bound := callCtx()
					_, _ = r.Inspect(ctx, l.Key, l.Kind)
					late("Inspect", bound)
					cancel()
				}
				ctx, cancel, bound := callCtx()
				ok, _, err := r.TryAcquire(ctx, l)
				late("TryAcquire", bound)
				cancel()
				mu.Lock()
				stats.attempts++
				mu.Unlock()
				var ab *backend.AbandonedError
				switch {
				case errors.As(err, &ab):
					mu.Lock()
					stats.abandoned++
					mu.Unlock()
					cleanUp(l.Value, ab)
					continue
				case err != nil:
					// Cleaned up before it returned.
					mu.Lock()
					stats.failed++
					cleaned[l.Value] = time.Now()
					mu.Unlock()
					continue
				case !ok:
					mu.Lock()
					stats.contended++
					mu.Unlock()
					if l.Kind == backend.KindRead || l.Kind == backend.KindWrite {
						// The wait ends: withdraw the intent, as the facade
						// does, until the server answers.
						ctx, cancel, bound := callCtx()
						err := r.Withdraw(ctx, l)
						late("Withdraw", bound)
						cancel()
						for err != nil {
							err = r.Withdraw(context.Background(), l)
						}
						mu.Lock()
						cleaned[l.Value] = time.Now()
						mu.Unlock()
					}
					time.Sleep(randN(5 * time.Millisecond))
					continue
				}
				mu.Lock()
				stats.acquired++
				mu.Unlock()
				time.Sleep(randN(3 * time.Millisecond))
				ctx, cancel, bound = callCtx()
				errs := r.RefreshAll(ctx, []*backend.Lease{l, newLease(l.Key, ttl)})
				late("RefreshAll", bound)
				cancel()
				if errs[0] != nil && ctx.Err() == nil {
					t.Errorf("RefreshAll of a held %v lock: %v", l.Kind, errs[0])
				}
				if !errors.Is(errs[1], backend.ErrNotHeld) && ctx.Err() == nil {
					t.Errorf("RefreshAll of a lease never acquired: %v; want ErrNotHeld", errs[1])
				}
				ctx, cancel, bound = callCtx()
				err = r.Release(ctx, l)
				late("Release", bound)
				cancel()
				// A release cut short leaves the lock held: release it
				// for good (the facade's Unlock may be called again).
				for err != nil && !errors.Is(err, backend.ErrNotHeld) {
					err = r.Release(context.Background(), l)
				}
			}
		})
	}
	// Short freezes, and one longer than testsuite.StallSlack: a call that waited
	// for the server instead of its context would return too late.
	for long := true; time.Now().Before(end); long = false {
		time.Sleep(300*time.Millisecond + randN(400*time.Millisecond))
		freeze := 50*time.Millisecond + randN(200*time.Millisecond)
		if long {
			freeze = testsuite.StallSlack + 500*time.Millisecond
		}
		srv.Pause()
		time.Sleep(freeze)
		srv.Resume()
	}
	ws.Wait()
	cleanups.Wait()
	time.Sleep(100 * time.Millisecond) // the last delayed requests land
	close(stop)
	bg.Wait()

	t.Logf("%d attempts: %d acquired, %d contended, %d abandoned (cleaned up in the background), %d failed (cleaned up at once); %d samples",
		stats.attempts, stats.acquired, stats.contended, stats.abandoned, stats.failed, len(samples))
	if stats.abandoned == 0 {
		t.Errorf("no attempt was abandoned: the test tested nothing")
	}
	for _, s := range samples {
		if at, ok := cleaned[s.value]; ok && s.at.After(at) {
			t.Errorf("%s held the value of a failed attempt %v after its clean-up succeeded", s.key, s.at.Sub(at))
		}
	}
	for _, k := range keys {
		for _, sk := range redisscript.StateKeys(redis.DefaultPrefix, k) {
			if n, err := direct.Exists(context.Background(), sk).Result(); err != nil || n != 0 {
				t.Errorf("%s left (%v)", sk, err)
			}
		}
	}
}
