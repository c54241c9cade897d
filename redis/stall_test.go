package redis_test

import (
	"context"
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

// TestRandomStallsAndCancels runs testsuite.RunRandomSpinStalls over four
// Resources of one client behind a proxy that delays requests and
// replies at random (one in twenty up to 30ms), while the server is
// frozen (SIGSTOP); attempts are of every kind. The sampler reads each
// key's lock, and the permits, grants and intents of its semaphore and
// read/write lock, directly; at the end no key of any lock is left.
//
// The client makes no retries of its own (MaxRetries -1): a resent
// request's late first copy is a case of its own (TestLateCopyOfEarlierAttempt).
func TestRandomStallsAndCancels(t *testing.T) {
	run := 4 * time.Second
	if testing.Short() {
		run = 2 * time.Second
	}
	rnd := testsuite.NewRand(testSeed(t))
	srv := testserver.Redis(t)
	p, err := proxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	delay := func() time.Duration {
		if rnd.IntN(100) < 5 {
			return rnd.Duration(30 * time.Millisecond)
		}
		return rnd.Duration(time.Millisecond)
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
	var clients []backend.Spinner
	for range 4 {
		clients = append(clients, newResource(t, c))
	}

	testsuite.RunRandomSpinStalls(t, testsuite.RandomSpinStalls{
		Clients: clients,
		Rand:    rnd,
		Run:     run,
		Keys:    3,
		TTL:     2 * time.Second,
		Context: 15 * time.Millisecond,
		Hold:    3 * time.Millisecond,
		Backoff: 5 * time.Millisecond,
		Freeze: func(bool) func() {
			srv.Pause()
			return srv.Resume
		},
		Sample: func(key string) []testsuite.SpinSample {
			var out []testsuite.SpinSample
			lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
			at := time.Now()
			if v, err := direct.Get(context.Background(), lock).Result(); err == nil {
				out = append(out, testsuite.SpinSample{Where: key, Value: v, At: at})
			}
			// Permits, grants and intents of the semaphore and the
			// read/write lock.
			rw := redisscript.RWKeys(lock)
			for _, set := range []string{redisscript.SemaphoreKeys(lock)[1], rw[1], rw[4], rw[5]} {
				vs, err := direct.ZRange(context.Background(), set, 0, -1).Result()
				if err != nil {
					continue
				}
				for _, v := range vs {
					out = append(out, testsuite.SpinSample{Where: set, Value: v, At: at})
				}
			}
			return out
		},
		Linger: 100 * time.Millisecond,
		Empty: func(t *testing.T, key string) {
			for _, sk := range redisscript.StateKeys(redis.DefaultPrefix, key) {
				if n, err := direct.Exists(context.Background(), sk).Result(); err != nil || n != 0 {
					t.Errorf("%s left (%v)", sk, err)
				}
			}
		},
	})
}
