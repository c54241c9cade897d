package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
)

// waitFor polls cond until it holds, failing t after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("still waiting for %s after %v", what, d)
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

// TestLateReleaseSparesNextHolder is issue 23's second defect: a Release
// on a shared lease that checked the lock's state just before the lock's
// TTL timer expired it must not delete the key of the next acquisition in
// this process, which reuses the name the timer freed. The hook holds the
// Release between its check and its delete until the timer has expired
// the lock and the next acquisition holds the lock under the same name; a
// client elsewhere must then still find the lock held.
func TestLateReleaseSparesNextHolder(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	r := newResource(t, endpoints, WithSharedLease())
	other := newResource(t, endpoints)
	ctx := t.Context()
	key := uniqueKey(t)
	first := lease(key, time.Second)
	if err := r.Acquire(ctx, first, time.Time{}); err != nil {
		t.Fatal(err)
	}
	h1 := first.Handle.(*handle)
	next := lease(key, 10*time.Second)
	hooked := false
	r.hook = func(point string) {
		if point != "release" || hooked {
			return
		}
		hooked = true
		waitFor(t, 10*time.Second, "the TTL timer to expire the first lock", h1.freed.Load)
		if err := r.Acquire(ctx, next, time.Time{}); err != nil {
			t.Fatalf("next Acquire: %v", err)
		}
	}
	if err := r.Release(ctx, first); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release after the timer expired the lock = %v; want ErrNotHeld", err)
	}
	if !hooked {
		t.Fatal("Release did not reach its delete")
	}
	h2 := next.Handle.(*handle)
	if h2.key != h1.key {
		t.Fatalf("the next acquisition made %s; the test needs the freed name %s again", h2.key, h1.key)
	}
	if ok, err := r.keyExists(ctx, h2); err != nil || !ok {
		t.Errorf("the next holder's key exists: %v, %v; want true: the late release deleted it", ok, err)
	}
	intruder := lease(key, time.Second)
	if err := other.Acquire(ctx, intruder, time.Time{}); err != backend.ErrNotAcquired {
		t.Errorf("another client's Acquire while the next holder holds = %v; want ErrNotAcquired", err)
		if err == nil {
			_ = other.Release(context.Background(), intruder)
		}
	}
	if err := r.Refresh(ctx, next); err != nil {
		t.Errorf("Refresh of the next holder's lock = %v; want nil", err)
	}
	if err := r.Release(ctx, next); err != nil {
		t.Errorf("Release of the next holder's lock = %v; want nil", err)
	}
	waitKeys(t, r, key, 0)
}
