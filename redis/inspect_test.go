package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/redis"
)

// changes is the server's count of writes since the last save.
func changes(t *testing.T, c *goredis.Client) string {
	t.Helper()
	info, err := c.Info(context.Background(), "persistence").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "rdb_changes_since_last_save:"); ok {
			return v
		}
	}
	t.Fatal("no rdb_changes_since_last_save in INFO persistence")
	return ""
}

// TestInspect: holders of every kind with their tokens, time left and
// labels, read with one script that writes nothing; a label key left by
// an evicted holder is not shown as the next holder's.
func TestInspect(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c)
	ctx := t.Context()
	key := uniqueKey(t)

	in, err := r.Inspect(ctx, key, backend.KindMutex)
	if err != nil || len(in.Holders) != 0 {
		t.Fatalf("Inspect of a free key = %+v, %v; want no holder", in, err)
	}
	m := newLease(key, time.Minute)
	m.Label = "host-a:1 {with: colons}"
	mustAcquire(t, r, m)
	before := changes(t, c)
	in, err = r.Inspect(ctx, key, backend.KindMutex)
	if err != nil || len(in.Holders) != 1 {
		t.Fatalf("Inspect = %+v, %v; want one holder", in, err)
	}
	if h := in.Holders[0]; h.Kind != backend.KindMutex || h.Token != m.Token || h.Label != m.Label || h.TTL <= 50*time.Second || h.TTL > time.Minute {
		t.Errorf("holder = %+v; want mutex, token %d, label %q, TTL in (50s, 1m]", h, m.Token, m.Label)
	}
	if after := changes(t, c); after != before {
		t.Errorf("Inspect wrote to the server: changes %s -> %s", before, after)
	}
	// Evicted from outside, with its label key left: the next holder has
	// no label, and must not show the evicted one's.
	lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
	if err := c.Del(ctx, lock).Err(); err != nil {
		t.Fatal(err)
	}
	next := newLease(key, time.Minute)
	mustAcquire(t, r, next)
	if in, err = r.Inspect(ctx, key, backend.KindMutex); err != nil || len(in.Holders) != 1 || in.Holders[0].Label != "" {
		t.Errorf("Inspect after an eviction = %+v, %v; want one holder without a label", in, err)
	}
	if err := r.Release(ctx, next); err != nil {
		t.Fatal(err)
	}
	// The evicted holder's label key outlives its lock until the lock's
	// TTL would have ended, no longer.
	if pttl := c.PTTL(ctx, lock+redisscript.LabelSuffix).Val(); pttl <= 0 || pttl > time.Minute {
		t.Errorf("PTTL of the evicted holder's label key = %v; want in (0, 1m]", pttl)
	}
	c.Del(ctx, lock+redisscript.LabelSuffix)

	s1, s2 := newLease(key, time.Minute), newLease(key, 30*time.Second)
	for i, l := range []*backend.Lease{s1, s2} {
		l.Kind, l.Limit, l.Label = backend.KindSemaphore, 3, fmt.Sprintf("sem-%d", i)
		mustAcquire(t, r, l)
	}
	in, err = r.Inspect(ctx, key, backend.KindSemaphore)
	if err != nil || len(in.Holders) != 2 || in.Limit != 3 {
		t.Fatalf("Inspect of a semaphore = %+v, %v; want two holders, limit 3", in, err)
	}
	for i, l := range []*backend.Lease{s1, s2} {
		h := in.Holders[i]
		if h.Kind != backend.KindSemaphore || h.Token != l.Token || h.Label != l.Label || h.TTL <= 0 || h.TTL > l.TTL {
			t.Errorf("holder %d = %+v; want semaphore, token %d, label %q, TTL in (0, %v]", i, h, l.Token, l.Label, l.TTL)
		}
	}

	rd, wr := newLease(key, time.Minute), newLease(key, time.Minute)
	rd.Kind, rd.Label = backend.KindRead, "reader"
	wr.Kind, wr.Label = backend.KindWrite, "writer"
	mustAcquire(t, r, rd)
	if ok, _, err := r.TryAcquire(ctx, wr); ok || err != nil {
		t.Fatalf("writer behind a reader = %v, %v", ok, err)
	}
	for _, kind := range []backend.Kind{backend.KindWrite, backend.KindRead} {
		in, err = r.Inspect(ctx, key, kind)
		if err != nil || len(in.Holders) != 1 || in.Holders[0].Kind != backend.KindRead || in.Holders[0].Label != "reader" || in.Holders[0].Token != rd.Token {
			t.Errorf("Inspect(%v) of a read-held lock with a waiting writer = %+v, %v; want the reader alone", kind, in, err)
		}
	}
	for _, l := range []*backend.Lease{s1, s2, rd} {
		if err := r.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Withdraw(ctx, wr); err != nil {
		t.Fatal(err)
	}
	if left := stateKeys(t, c, key); len(left) != 0 {
		t.Errorf("left behind: %q", left)
	}
}

// countingHook counts the commands a client sends.
type countingHook struct{ n atomic.Int64 }

func (h *countingHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *countingHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h *countingHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// sameSlotKeys returns n distinct keys whose locks hash to one Cluster
// slot, and a key whose lock does not.
func sameSlotKeys(t *testing.T, n int) (keys []string, other string) {
	t.Helper()
	base := uniqueKey(t)
	bySlot := map[uint16][]string{}
	for i := 0; ; i++ {
		k := fmt.Sprintf("%s-%d", base, i)
		lock, _ := redisscript.Layout(redis.DefaultPrefix, k)
		s := redisscript.Slot(lock)
		bySlot[s] = append(bySlot[s], k)
		if len(bySlot[s]) == n {
			keys = bySlot[s]
			break
		}
	}
	for i := 0; ; i++ {
		k := fmt.Sprintf("%s-other-%d", base, i)
		lock, _ := redisscript.Layout(redis.DefaultPrefix, k)
		first, _ := redisscript.Layout(redis.DefaultPrefix, keys[0])
		if redisscript.Slot(lock) != redisscript.Slot(first) {
			return keys, k
		}
	}
}

func leases(keys []string, value string, ttl time.Duration) []*backend.Lease {
	ls := make([]*backend.Lease, len(keys))
	for i, k := range keys {
		ls[i] = &backend.Lease{Key: k, Value: value, TTL: ttl, Label: "multi"}
	}
	return ls
}

// TestTryAcquireAll: several mutexes in one script call, all or none,
// with a token each; held keys are not taken and report their holder's
// time left; on Cluster, keys of one slot go in one request and keys of
// several slots are refused with errors.ErrUnsupported before any I/O.
func TestTryAcquireAll(t *testing.T) {
	deployments(t, func(t *testing.T, c goredis.UniversalClient) {
		hook := &countingHook{}
		c.AddHook(hook)
		r := newResource(t, c)
		ctx := t.Context()
		keys, other := sameSlotKeys(t, 3)

		// One key held: none taken.
		held := newLease(keys[1], time.Minute)
		mustAcquire(t, r, held)
		ls := leases(keys, newLease("", 0).Value, time.Minute)
		ok, holderTTL, err := r.TryAcquireAll(ctx, ls)
		if ok || err != nil || holderTTL <= 50*time.Second {
			t.Fatalf("TryAcquireAll with a key held = %v, %v, %v; want false, the holder's TTL, nil", ok, holderTTL, err)
		}
		for _, k := range []string{keys[0], keys[2]} {
			if left := stateKeys(t, c, k); len(left) != 0 {
				t.Errorf("a failed TryAcquireAll took %q", left)
			}
		}
		if err := r.Release(ctx, held); err != nil {
			t.Fatal(err)
		}

		n := hook.n.Load()
		ok, _, err = r.TryAcquireAll(ctx, ls)
		if !ok || err != nil {
			t.Fatalf("TryAcquireAll = %v, %v; want the three keys", ok, err)
		}
		if sent := hook.n.Load() - n; sent != 1 {
			t.Errorf("TryAcquireAll of one slot's keys sent %d commands; want 1", sent)
		}
		for i, l := range ls {
			if l.Token == 0 || (i > 0 && l.Token == ls[i-1].Token) {
				t.Errorf("tokens %d, %d, %d; want one per key", ls[0].Token, ls[1].Token, ls[2].Token)
			}
			in, err := r.Inspect(ctx, l.Key, backend.KindMutex)
			if err != nil || len(in.Holders) != 1 || in.Holders[0].Token != l.Token || in.Holders[0].Label != "multi" {
				t.Errorf("Inspect(%q) = %+v, %v; want token %d, label multi", l.Key, in, err, l.Token)
			}
			if ok, _, err := r.TryAcquire(ctx, newLease(l.Key, time.Minute)); ok || err != nil {
				t.Errorf("TryAcquire(%q) of a key taken by TryAcquireAll = %v, %v; want false, nil", l.Key, ok, err)
			}
		}
		for _, l := range ls {
			if err := r.Refresh(ctx, l); err != nil {
				t.Errorf("Refresh(%q) = %v", l.Key, err)
			}
			if err := r.Release(ctx, l); err != nil {
				t.Errorf("Release(%q) = %v", l.Key, err)
			}
			if left := stateKeys(t, c, l.Key); len(left) != 0 {
				t.Errorf("left behind: %q", left)
			}
		}

		mixed := leases([]string{keys[0], other}, newLease("", 0).Value, time.Minute)
		n = hook.n.Load()
		ok, _, err = r.TryAcquireAll(ctx, mixed)
		_, isCluster := c.(*goredis.ClusterClient)
		switch {
		case isCluster && (ok || !errors.Is(err, errors.ErrUnsupported) || hook.n.Load() != n):
			t.Errorf("TryAcquireAll of keys of two slots on Cluster = %v, %v after %d commands; want ErrUnsupported, no I/O", ok, err, hook.n.Load()-n)
		case !isCluster && (!ok || err != nil):
			t.Errorf("TryAcquireAll of any keys on a standalone server = %v, %v; want both", ok, err)
		case !isCluster:
			for _, l := range mixed {
				if err := r.Release(ctx, l); err != nil {
					t.Error(err)
				}
			}
		}
	})
}

// TestTryAcquireAllTombstone: a TryAcquireAll that reaches Redis after the
// clean-up of its keys takes none of them.
func TestTryAcquireAllTombstone(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c)
	ctx := t.Context()
	keys, _ := sameSlotKeys(t, 2)
	ls := leases(keys, newLease("", 0).Value, time.Minute)
	lock, _ := redisscript.Layout(redis.DefaultPrefix, keys[1])
	if err := redisscript.Cleanup.Run(ctx, c, []string{lock}, ls[1].Value, 60000).Err(); err != nil {
		t.Fatal(err)
	}
	ok, _, err := r.TryAcquireAll(ctx, ls)
	var rerr goredis.Error
	if ok || !errors.As(err, &rerr) || !redisscript.IsDead(rerr) {
		t.Errorf("TryAcquireAll after a clean-up of one key = %v, %v; want a DEAD error", ok, err)
	}
	for _, k := range keys {
		if left := stateKeys(t, c, k); len(left) != 0 {
			t.Errorf("left behind: %q", left)
		}
	}
}
