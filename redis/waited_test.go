package redis_test

import (
	"errors"
	"testing"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/redis"
)

// TestNoticeOnlyWhenWaited checks that a release publishes its notice only
// when an attempt of another owner was refused the lock (the waited mark,
// redisscript.WaitedMark), and that a marked lock is still its holder's
// for every script that compares the value: refresh, relabel, inspect
// (value and label), a resent acquire, a resent release, TryAcquireAll.
func TestNoticeOnlyWhenWaited(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c)
	ctx := t.Context()
	publishes := func(f func()) int64 {
		t.Helper()
		before := commandStats(t, c)
		f()
		return statsDelta(before, commandStats(t, c))["publish"]
	}
	release := func(l *backend.Lease) {
		t.Helper()
		if err := r.Release(ctx, l); err != nil {
			t.Fatalf("Release(%q) = %v", l.Key, err)
		}
	}

	l := newLease(uniqueKey(t), time.Minute)
	mustAcquire(t, r, l)
	if n := publishes(func() { release(l) }); n != 0 {
		t.Errorf("release of a lock nobody asked for: %d PUBLISH; want 0", n)
	}

	key := uniqueKey(t)
	lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
	l = newLease(key, time.Minute)
	l.Label = "host-1"
	mustAcquire(t, r, l)
	for range 2 { // the second refusal finds the mark and adds none
		other := newLease(key, time.Minute)
		if ok, _, err := r.TryAcquire(ctx, other); ok || err != nil {
			t.Fatalf("TryAcquire of a held lock = %v, %v; want false, nil", ok, err)
		}
		if got, err := c.Get(ctx, lock).Result(); err != nil || got != l.Value+redisscript.WaitedMark {
			t.Fatalf("lock holds %q, %v; want the holder's value with one waited mark", got, err)
		}
	}
	if err := r.Refresh(ctx, l); err != nil {
		t.Errorf("Refresh of a marked lock = %v; want nil", err)
	}
	l.Label = "host-2" // an election's Proclaim
	if err := r.Relabel(ctx, l); err != nil {
		t.Errorf("Relabel of a marked lock = %v; want nil", err)
	}
	in, err := r.Inspect(ctx, key, backend.KindMutex)
	if err != nil || len(in.Holders) != 1 || in.Holders[0].Token != l.Token || in.Holders[0].Label != "host-2" {
		t.Errorf("Inspect of a marked lock = %+v, %v; want the holder, token %d, label host-2", in, err, l.Token)
	}
	// A resent acquire (its first run's reply lost) takes the marked lock.
	again, err := redisscript.Acquire.Run(ctx, c, []string{lock}, l.Value, int64(60000)).Int64()
	if err != nil || again <= 0 {
		t.Errorf("resent acquire of a marked lock = %d, %v; want acquired", again, err)
	}
	if n := publishes(func() { release(l) }); n != 1 {
		t.Errorf("release of a lock an attempt was refused: %d PUBLISH; want 1", n)
	}
	if exists(t, c, lock) || exists(t, c, lock+redisscript.LabelSuffix) {
		t.Errorf("the marked lock or its label is left after its release")
	}
	// A resent release finds the marked value in the trace.
	if n, err := redisscript.Release.Run(ctx, c, []string{lock}, l.Value, "", "", "1").Int64(); err != nil || n != 1 {
		t.Errorf("resent release of a marked lock = %d, %v; want 1", n, err)
	}

	// An acquisition that was refused once takes the lock marked, as one
	// likely to be waited for: its release sends the notice.
	key = uniqueKey(t)
	lock, _ = redisscript.Layout(redis.DefaultPrefix, key)
	holder, waiter := newLease(key, time.Minute), newLease(key, time.Minute)
	mustAcquire(t, r, holder)
	if ok, _, err := r.TryAcquire(ctx, waiter); ok || err != nil {
		t.Fatalf("TryAcquire of a held lock = %v, %v; want false, nil", ok, err)
	}
	release(holder)
	mustAcquire(t, r, waiter)
	if got, err := c.Get(ctx, lock).Result(); err != nil || got != waiter.Value+redisscript.WaitedMark {
		t.Errorf("lock of an acquisition refused before holds %q, %v; want its value with the mark", got, err)
	}
	if n := publishes(func() { release(waiter) }); n != 1 {
		t.Errorf("release of a lock taken after a refusal: %d PUBLISH; want 1", n)
	}
	// A late copy of the acquisition's unmarked attempt set the lock: the
	// marked attempt counts it as its own, and the clean-up of the marked
	// value deletes it and names the tombstone after the unmarked value.
	v := newLease(key, time.Minute).Value
	if err := c.Set(ctx, lock, v, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := redisscript.Acquire.Run(ctx, c, []string{lock}, v+redisscript.WaitedMark, int64(60000)).Int64(); err != nil || n <= 0 {
		t.Errorf("marked acquire of the lock its unmarked copy set = %d, %v; want acquired", n, err)
	}
	if n, err := redisscript.Cleanup.Run(ctx, c, []string{lock}, v+redisscript.WaitedMark, int64(60000)).Int64(); err != nil || n != 1 {
		t.Errorf("clean-up of the marked value = %d, %v; want 1 (deleted)", n, err)
	}
	if err := redisscript.Acquire.Run(ctx, c, []string{lock}, v, int64(60000)).Err(); !redisscript.IsDead(err) {
		t.Errorf("late unmarked acquire after the clean-up = %v; want DEAD", err)
	}

	// TryAcquireAll marks the lock it finds held.
	a, b := newLease("{all}"+uniqueKey(t), time.Minute), newLease("{all}"+uniqueKey(t), time.Minute)
	mustAcquire(t, r, b)
	set := []*backend.Lease{a, {Key: b.Key, Value: a.Value, TTL: time.Minute}}
	if ok, _, err := r.TryAcquireAll(ctx, set); ok || err != nil {
		t.Fatalf("TryAcquireAll with one key held = %v, %v; want false, nil", ok, err)
	}
	if n := publishes(func() { release(b) }); n != 1 {
		t.Errorf("release of a lock TryAcquireAll was refused: %d PUBLISH; want 1", n)
	}
}

// TestValueEndingWithMark checks that an owner value the scripts could not
// tell from its marked form is refused with ErrInvalid, before anything is
// sent.
func TestValueEndingWithMark(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c)
	ctx := t.Context()
	before := commandStats(t, c)
	l := newLease(uniqueKey(t), time.Minute)
	l.Value += redisscript.WaitedMark
	if ok, _, err := r.TryAcquire(ctx, l); ok || !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("TryAcquire with a value ending in the mark = %v, %v; want false, ErrInvalid", ok, err)
	}
	if ok, _, err := r.TryAcquireAll(ctx, []*backend.Lease{l}); ok || !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("TryAcquireAll with a value ending in the mark = %v, %v; want false, ErrInvalid", ok, err)
	}
	if d := statsDelta(before, commandStats(t, c)); len(d) != 0 {
		t.Errorf("commands sent for refused values: %v; want none", d)
	}
}
