package redlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/redlock"
)

// TestInspectMajority: a holder is the value a majority of the nodes
// hold, with the time until fewer than a majority hold it; a value on a
// minority is no holder; fewer than a majority of nodes answering is
// ErrNoQuorum.
func TestInspectMajority(t *testing.T) {
	c := startNodes(t, 5, nil)
	r := c.newResource(t)
	ctx := t.Context()
	key := uniqueKey(t)
	set := func(node int, value string, ttl time.Duration) {
		t.Helper()
		if err := c.inspect[node].Set(ctx, lockKey(key), value, ttl).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// a on two nodes, b on two: nobody holds a majority.
	set(0, "a#1", time.Minute)
	set(1, "a#1", time.Minute)
	set(2, "b#1", time.Minute)
	set(3, "b#1", time.Minute)
	if in, err := r.Inspect(ctx, key, backend.KindMutex); err != nil || len(in.Holders) != 0 {
		t.Errorf("Inspect with no majority = %+v, %v; want no holder", in, err)
	}
	// a on three nodes, with 10s, 20s and 60s left: held for 10s more.
	set(4, "a#1", 10*time.Second)
	set(1, "a#1", 20*time.Second)
	in, err := r.Inspect(ctx, key, backend.KindMutex)
	if err != nil || len(in.Holders) != 1 {
		t.Fatalf("Inspect with a on a majority = %+v, %v; want one holder", in, err)
	}
	if h := in.Holders[0]; h.TTL <= 9*time.Second || h.TTL > 10*time.Second || h.Token != 0 {
		t.Errorf("holder = %+v; want 10s left (the third longest), token 0", h)
	}
	// A majority frozen: no answer.
	resume := c.stall(t, 2, 3, 4)
	_, err = r.Inspect(ctx, key, backend.KindMutex)
	resume()
	if !errors.Is(err, redlock.ErrNoQuorum) {
		t.Errorf("Inspect with 3 of 5 nodes frozen = %v; want ErrNoQuorum", err)
	}
	if _, err := r.Inspect(ctx, key, backend.KindSemaphore); err == nil {
		t.Errorf("Inspect of a semaphore = nil error; want Redlock's refusal")
	}
}
