package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
)

// stallSlack is how far past its bound a call may return while a
// majority of nodes is frozen: the promise is a few milliseconds, the
// slack is for two shared cores under the race detector. Before issue 26
// the calls took the per-node timeout (5% of the TTL: 3s here) past it,
// waiting for the cleanup of the round they gave up.
const stallSlack = time.Second

// TestStalledMajority reproduces issue 26's table with three of five
// nodes frozen (SIGSTOP), through the facade: a TryLock with a 300ms
// context and a 5s wait, one with a 500ms wait, and an Unlock with a
// 300ms context must each return at its bound; once the nodes answer
// again, no node keeps anything of the abandoned attempts and their keys
// go to the next owner. With go-redis's defaults (ContextTimeoutEnabled
// off, ReadTimeout 5s) and with ContextTimeoutEnabled.
func TestStalledMajority(t *testing.T) {
	for _, tc := range []struct {
		name           string
		contextTimeout bool
	}{
		{"defaults", false},
		{"ContextTimeoutEnabled", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startNodes(t, 5, func(o *goredis.Options) { o.ContextTimeoutEnabled = tc.contextTimeout })
			d, err := distlock.New(c.newResource(t), distlock.WithDefaultTTL(time.Minute),
				distlock.WithCloseTimeout(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = d.Close() })
			ctx := context.Background()
			base := uniqueKey(t)
			kCtx, kWait, kHeld := base+"-ctx", base+"-wait", base+"-held"
			held, err := d.TryLock(ctx, kHeld, 0)
			if err != nil {
				t.Fatalf("TryLock before the stall: %v", err)
			}

			resume := c.stall(t, 2, 3, 4)
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
			err = timed("TryLock, 300ms context, 5s wait", 300*time.Millisecond, func() error {
				cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
				lk, err := d.TryLock(cctx, kCtx, 5*time.Second)
				if lk != nil {
					t.Errorf("TryLock with a majority frozen returned a lock")
				}
				return err
			})
			if !errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("TryLock = %v; want ErrNotAcquired joined with context.DeadlineExceeded", err)
			}
			err = timed("TryLock, 500ms wait", 500*time.Millisecond, func() error {
				lk, err := d.TryLock(ctx, kWait, 500*time.Millisecond)
				if lk != nil {
					t.Errorf("TryLock with a majority frozen returned a lock")
				}
				return err
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
				t.Errorf("Unlock with a majority frozen = nil; want an error")
			}

			resume()
			resumedAt := time.Now()
			// The frozen nodes run the abandoned rounds' requests now;
			// the clean-ups, in the background, delete what they set.
			for _, k := range []string{kCtx, kWait} {
				c.eventually(t, k, "no node to keep "+k, func(v []string) bool {
					for _, s := range v {
						if s != "" {
							return false
						}
					}
					return true
				})
			}
			t.Logf("no orphan %v after SIGCONT", time.Since(resumedAt).Round(time.Millisecond))
			if err := held.Unlock(ctx); err != nil && !errors.Is(err, distlock.ErrNotHeld) {
				t.Errorf("Unlock once the nodes answer = %v; want nil or ErrNotHeld", err)
			}
			// The keys go to the next owner, and stay with it: no
			// abandoned round takes them (tombstones).
			other, err := distlock.New(c.direct(t), distlock.WithDefaultTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = other.Close() })
			for _, k := range []string{kCtx, kWait, kHeld} {
				lk, err := other.TryLock(ctx, k, 10*time.Second)
				if err != nil {
					t.Fatalf("TryLock(%q) once the nodes answer: %v", k, err)
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
				t.Errorf("Close once the nodes answer = %v", err)
			}
		})
	}
}
