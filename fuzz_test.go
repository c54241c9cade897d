package distlock_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
)

// longTTL is long enough that a lock taken with it is still held when the
// fuzz body looks again.
const longTTL = time.Minute

// FuzzTryLock feeds TryLock and Do any key, wait and TTL on the memory
// store: no input panics, bad input (empty key, negative wait, TTL <= 0)
// and only bad input is ErrInvalid, with nothing stored; good input locks,
// excludes a second owner and unlocks clean.
func FuzzTryLock(f *testing.F) {
	f.Add("k", int64(0), int64(time.Second))
	f.Add("", int64(0), int64(time.Second))
	f.Add("k", int64(-1), int64(time.Second))
	f.Add("k", int64(0), int64(0))
	f.Add("k", int64(0), int64(-1))
	f.Add("k", int64(math.MinInt64), int64(math.MinInt64))
	f.Add("k", int64(math.MaxInt64), int64(math.MaxInt64))
	f.Add("k", int64(time.Second), int64(1))
	f.Add("a/b{c}\x00é\xff", int64(1), int64(longTTL))
	f.Fuzz(func(t *testing.T, key string, wait, ttl int64) {
		store := memory.New()
		d, err := distlock.New(store)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ctx := distlock.ContextWithTTL(context.Background(), time.Duration(ttl))
		bad := key == "" || wait < 0 || ttl <= 0

		lk, err := d.TryLock(ctx, key, time.Duration(wait))
		if bad {
			if lk != nil || !errors.Is(err, distlock.ErrInvalid) {
				t.Fatalf("TryLock(%q, wait %d, TTL %d) = %v, %v; want nil, ErrInvalid", key, wait, ttl, lk, err)
			}
			called := false
			err = d.Do(ctx, key, time.Duration(wait), func(context.Context, *distlock.Lock) error { called = true; return nil })
			if called || !errors.Is(err, distlock.ErrInvalid) {
				t.Fatalf("Do(%q, wait %d, TTL %d) = %v (fn ran: %v); want ErrInvalid", key, wait, ttl, err, called)
			}
			if n := store.Len(); n != 0 {
				t.Fatalf("bad input left %d keys in the store", n)
			}
			return
		}
		if err != nil && errors.Is(err, distlock.ErrNotHeld) && time.Duration(ttl) < longTTL {
			// The TTL ran out before TryLock could return the lock: it
			// was rolled back, not returned expired.
			if n := store.Len(); n != 0 {
				t.Fatalf("a lock that expired before it was returned left %d keys in the store", n)
			}
			return
		}
		if err != nil {
			t.Fatalf("TryLock(%q, wait %d, TTL %d) = %v; want a lock", key, wait, ttl, err)
		}
		if time.Duration(ttl) >= longTTL {
			other, err := distlock.New(store)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			if got, err := other.TryLock(context.Background(), key, 0); got != nil || !errors.Is(err, distlock.ErrNotAcquired) {
				t.Fatalf("second owner: TryLock(%q) = %v, %v; want nil, ErrNotAcquired", key, got, err)
			}
		}
		if err := lk.Unlock(context.Background()); err != nil && !(errors.Is(err, distlock.ErrNotHeld) && time.Duration(ttl) < longTTL) {
			t.Fatalf("Unlock(%q) = %v; want nil", key, err)
		}
		err = d.Do(ctx, key, time.Duration(wait), func(context.Context, *distlock.Lock) error { return nil })
		if err != nil && !(errors.Is(err, distlock.ErrNotHeld) && time.Duration(ttl) < longTTL) {
			t.Fatalf("Do(%q, wait %d, TTL %d) = %v; want nil", key, wait, ttl, err)
		}
		if n := store.Len(); n != 0 {
			t.Fatalf("store holds %d keys after Unlock", n)
		}
	})
}

// FuzzOptions feeds New any default TTL, spin and reentrancy limit: New
// never panics, and fails with ErrInvalid exactly for the values the
// options' docs call bad (a spin whose min+random overflows counts as bad:
// it cannot be slept). A DistributeLock New accepts works, contended and
// reentered.
func FuzzOptions(f *testing.F) {
	f.Add(int64(10*time.Second), int64(10*time.Millisecond), int64(10*time.Millisecond), 0, false)
	f.Add(int64(0), int64(0), int64(0), -1, true)
	f.Add(int64(-1), int64(-1), int64(1), 1, false)
	f.Add(int64(1), int64(0), int64(1), 1, true)
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), int64(0), math.MaxInt, true)
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), int64(1), 2, false)
	f.Add(int64(math.MinInt64), int64(math.MinInt64), int64(math.MinInt64), math.MinInt, false)
	f.Fuzz(func(t *testing.T, ttl, spinMin, spinRandom int64, maxReentrancy int, autoRenew bool) {
		opts := []distlock.Option{
			distlock.WithDefaultTTL(time.Duration(ttl)),
			distlock.WithSpin(time.Duration(spinMin), time.Duration(spinRandom)),
			distlock.WithMaxReentrancy(maxReentrancy),
		}
		if autoRenew {
			opts = append(opts, distlock.WithAutoRenew())
		}
		bad := ttl <= 0 || spinMin < 0 || spinRandom < 0 || spinMin == 0 && spinRandom == 0 ||
			spinMin > math.MaxInt64-spinRandom || maxReentrancy < 0
		store := memory.New()
		d, err := distlock.New(store, opts...)
		if bad {
			if d != nil || !errors.Is(err, distlock.ErrInvalid) {
				t.Fatalf("New(TTL %d, spin %d+%d, max reentrancy %d) = %v, %v; want nil, ErrInvalid",
					ttl, spinMin, spinRandom, maxReentrancy, d, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("New(TTL %d, spin %d+%d, max reentrancy %d) = %v; want no error", ttl, spinMin, spinRandom, maxReentrancy, err)
		}
		defer d.Close()
		other, err := distlock.New(store, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()

		ctx := context.Background()
		lk, err := d.TryLock(ctx, "k", 0)
		if errors.Is(err, distlock.ErrNotHeld) && time.Duration(ttl) < longTTL {
			return // expired before it could be returned: rolled back
		}
		if err != nil {
			t.Fatalf("TryLock = %v; want a lock", err)
		}
		held := time.Duration(ttl) >= longTTL
		// A short wait bounds every spin sleep, however long the policy's.
		got, err := other.TryLock(ctx, "k", 2*time.Millisecond)
		if held && (got != nil || !errors.Is(err, distlock.ErrNotAcquired)) {
			t.Fatalf("contended TryLock = %v, %v; want nil, ErrNotAcquired", got, err)
		}
		if got != nil {
			_ = got.Unlock(ctx)
		}
		if held {
			nested, err := d.TryLock(distlock.ContextWithLock(ctx, lk), "k", 0)
			switch {
			case maxReentrancy == 1:
				if nested != nil || !errors.Is(err, distlock.ErrReentrancy) {
					t.Fatalf("nested TryLock with max reentrancy 1 = %v, %v; want nil, ErrReentrancy", nested, err)
				}
			case err != nil:
				t.Fatalf("nested TryLock with max reentrancy %d = %v; want a lock", maxReentrancy, err)
			default:
				if err := nested.Unlock(ctx); err != nil {
					t.Fatalf("nested Unlock = %v", err)
				}
			}
		}
		if err := lk.Unlock(ctx); err != nil && !(errors.Is(err, distlock.ErrNotHeld) && !held) {
			t.Fatalf("Unlock = %v; want nil", err)
		}
	})
}
