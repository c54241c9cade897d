package redis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/redis"
)

// stallSlack is how far past its bound a call on a frozen server may
// return in these tests: the promise is a few milliseconds, the slack is
// for two shared cores under the race detector. Before issue 26 the calls
// took seconds past it (the client's ReadTimeout, 5s by default, once or
// twice).
const stallSlack = time.Second

// TestStalledServer reproduces issue 26's table on a frozen Redis
// (SIGSTOP), through the facade, as a user would call it: a TryLock with
// a 300ms context and a 5s wait, one with a cancel-only context, one with
// a 500ms wait, and an Unlock with a 300ms context must each return at
// its bound; once the server answers again, nothing of the abandoned
// attempts is left and their keys go to the next owner. With go-redis's
// defaults (ContextTimeoutEnabled off: the client ignores the context's
// deadline, and its ReadTimeout is 5s) and with ContextTimeoutEnabled (it
// honours the deadline, never a cancellation without one).
func TestStalledServer(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  goredis.Options
	}{
		{"defaults", goredis.Options{}},
		{"ContextTimeoutEnabled", goredis.Options{ContextTimeoutEnabled: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testserver.Redis(t)
			opt := tc.opt
			opt.Addr = srv.Addr
			c := goredis.NewClient(&opt)
			t.Cleanup(func() { _ = c.Close() })
			check := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
			t.Cleanup(func() { _ = check.Close() })
			d, err := distlock.New(newResource(t, c), distlock.WithDefaultTTL(time.Minute),
				distlock.WithCloseTimeout(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = d.Close() })
			ctx := context.Background()
			base := uniqueKey(t)
			kCtx, kCancel, kWait, kHeld := base+"-ctx", base+"-cancel", base+"-wait", base+"-held"
			held, err := d.TryLock(ctx, kHeld, 0)
			if err != nil {
				t.Fatalf("TryLock before the stall: %v", err)
			}

			srv.Pause()
			resumed := false
			defer func() {
				if !resumed {
					srv.Resume()
				}
			}()
			timed := func(what string, bound time.Duration, fn func() error) error {
				t.Helper()
				start := time.Now()
				err := fn()
				el := time.Since(start)
				t.Logf("%s: returned after %v: %v", what, el.Round(time.Millisecond), err)
				if el > bound+stallSlack {
					t.Errorf("%s returned after %v; its bound was %v", what, el, bound)
				}
				return err
			}
			tryLock := func(ctx context.Context, key string, wait time.Duration) error {
				lk, err := d.TryLock(ctx, key, wait)
				if lk != nil {
					t.Errorf("TryLock(%q) on a frozen server returned a lock", key)
				}
				return err
			}

			err = timed("TryLock, 300ms context, 5s wait", 300*time.Millisecond, func() error {
				cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
				return tryLock(cctx, kCtx, 5*time.Second)
			})
			if !errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("TryLock = %v; want ErrNotAcquired joined with context.DeadlineExceeded", err)
			}
			err = timed("TryLock, context cancelled at 300ms, 5s wait", 300*time.Millisecond, func() error {
				cctx, cancel := context.WithCancel(ctx)
				defer cancel()
				time.AfterFunc(300*time.Millisecond, cancel)
				return tryLock(cctx, kCancel, 5*time.Second)
			})
			if !errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
				t.Errorf("TryLock = %v; want ErrNotAcquired joined with context.Canceled", err)
			}
			err = timed("TryLock, 500ms wait", 500*time.Millisecond, func() error {
				return tryLock(ctx, kWait, 500*time.Millisecond)
			})
			if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, distlock.ErrNotAcquired) {
				t.Errorf("TryLock = %v; want a store error wrapping context.DeadlineExceeded", err)
			}
			err = timed("Unlock, 300ms context", 300*time.Millisecond, func() error {
				cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
				return held.Unlock(cctx)
			})
			if err == nil {
				t.Errorf("Unlock on a frozen server = nil; want an error")
			}

			srv.Resume()
			resumed = true
			resumedAt := time.Now()
			// The abandoned attempts' requests run now; their clean-ups,
			// in the background, delete what they set.
			for _, k := range []string{kCtx, kCancel, kWait} {
				lock, _ := redisscript.Layout(redis.DefaultPrefix, k)
				waitFor(t, "no orphan under "+k, func() bool { return check.Exists(ctx, lock).Val() == 0 })
			}
			t.Logf("no orphan %v after SIGCONT", time.Since(resumedAt).Round(time.Millisecond))
			if err := held.Unlock(ctx); err != nil && !errors.Is(err, distlock.ErrNotHeld) {
				t.Errorf("Unlock once the server answers = %v; want nil or ErrNotHeld", err)
			}
			// The keys go to the next owner, and stay with it: no
			// abandoned attempt takes them (tombstones).
			other := newDistLock(t, newResource(t, c), distlock.WithDefaultTTL(time.Minute))
			for _, k := range []string{kCtx, kCancel, kWait, kHeld} {
				lk, err := other.TryLock(ctx, k, 10*time.Second)
				if err != nil {
					t.Fatalf("TryLock(%q) once the server answers: %v", k, err)
				}
				if lk2, err := d.TryLock(ctx, k, 0); !errors.Is(err, distlock.ErrNotAcquired) {
					t.Errorf("second TryLock(%q) = %v, %v; want ErrNotAcquired", k, lk2, err)
				}
				if err := lk.Unlock(ctx); err != nil {
					t.Errorf("Unlock(%q): %v", k, err)
				}
			}
			// Every clean-up is done: Close has nothing to report.
			if err := d.Close(); err != nil {
				t.Errorf("Close once the server answers = %v", err)
			}
		})
	}
}
