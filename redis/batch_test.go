package redis_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/redis"
)

// requestHook counts the requests a client sends: a command, or a
// pipeline (one round trip per server), besides the handshake of a new
// connection (HELLO, CLIENT SETINFO).
type requestHook struct{ n atomic.Int64 }

func handshake(cmd goredis.Cmder) bool { return cmd.Name() == "hello" || cmd.Name() == "client" }

func (h *requestHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *requestHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if !handshake(cmd) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *requestHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) > 0 && !handshake(cmds[0]) {
			h.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// TestRefreshAll: a batch of mutexes (some labeled, some no longer held),
// semaphore permits and read/write grants is extended in one pipeline:
// one request on a standalone server, one per master on Cluster; each
// lease gets its own result.
func TestRefreshAll(t *testing.T) {
	deployments(t, func(t *testing.T, c goredis.UniversalClient) {
		hook := &requestHook{}
		c.AddHook(hook)
		r := newResource(t, c)
		ctx := t.Context()
		base := uniqueKey(t)
		var ls []*backend.Lease
		for i := range 60 {
			l := newLease(fmt.Sprintf("%s-%d", base, i), 5*time.Second)
			switch {
			case i%10 == 1:
				l.Kind, l.Limit = backend.KindSemaphore, 2
			case i%10 == 2:
				l.Kind = backend.KindRead
			case i%10 == 3:
				l.Kind = backend.KindWrite
			case i%3 == 0:
				l.Label = "labeled"
			}
			mustAcquire(t, r, l)
			l.TTL = time.Minute // the refresh extends to a minute
			ls = append(ls, l)
		}
		gone := map[int]bool{4: true, 11: true, 12: true, 30: true}
		for i := range gone {
			if err := r.Release(ctx, ls[i]); err != nil {
				t.Fatal(err)
			}
		}
		want := int64(1)
		if cc, ok := c.(*goredis.ClusterClient); ok {
			want = int64(len(cc.Options().Addrs)) // at most one pipeline per master
		}
		// The first batch finds the scripts uncached: EVALSHA, then EVAL
		// in a second pipeline.
		n := hook.n.Load()
		r.RefreshAll(ctx, ls)
		if sent := hook.n.Load() - n; sent < 1 || sent > 2*want {
			t.Errorf("RefreshAll with the scripts uncached sent %d requests; want 1..%d", sent, 2*want)
		}
		n = hook.n.Load()
		errs := r.RefreshAll(ctx, ls)
		sent := hook.n.Load() - n
		if len(errs) != len(ls) {
			t.Fatalf("RefreshAll returned %d errors for %d leases", len(errs), len(ls))
		}
		for i, err := range errs {
			if gone[i] != errors.Is(err, backend.ErrNotHeld) || (!gone[i] && err != nil) {
				t.Errorf("lease %d (%v, released %v): %v", i, ls[i].Kind, gone[i], err)
			}
		}
		if sent < 1 || sent > want {
			t.Errorf("RefreshAll sent %d requests; want 1..%d", sent, want)
		}
		for i, l := range ls {
			if gone[i] {
				continue
			}
			lock, _ := redisscript.Layout(redis.DefaultPrefix, l.Key)
			var left time.Duration
			switch l.Kind {
			case backend.KindMutex:
				left = c.PTTL(ctx, lock).Val()
				if l.Label != "" {
					if lt := c.PTTL(ctx, lock+redisscript.LabelSuffix).Val(); lt <= 50*time.Second {
						t.Errorf("lease %d's label key: PTTL %v; want extended with the lock", i, lt)
					}
				}
			default:
				in, err := r.Inspect(ctx, l.Key, l.Kind)
				if err != nil || len(in.Holders) != 1 {
					t.Fatalf("Inspect of lease %d = %+v, %v", i, in, err)
				}
				left = in.Holders[0].TTL
			}
			if left <= 50*time.Second {
				t.Errorf("lease %d (%v): %v left after RefreshAll; want about a minute", i, l.Kind, left)
			}
			if err := r.Release(ctx, l); err != nil {
				t.Errorf("Release of lease %d: %v", i, err)
			}
		}
	})
}

// TestRefreshAllBatchOfMax: MaxRefreshBatch mutexes on one server are
// one script call.
func TestRefreshAllBatchOfMax(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c)
	ctx := t.Context()
	base := uniqueKey(t)
	ls := make([]*backend.Lease, backend.MaxRefreshBatch)
	for i := range ls {
		ls[i] = newLease(fmt.Sprintf("%s-%d", base, i), time.Minute)
		mustAcquire(t, r, ls[i])
	}
	before := commandStats(t, c)
	for i, err := range r.RefreshAll(ctx, ls) {
		if err != nil {
			t.Fatalf("lease %d: %v", i, err)
		}
	}
	d := statsDelta(before, commandStats(t, c))
	// Two PEXPIREs a lock: the lock and its fence (the fence
	// expires a grace after the lock, and a renewal lengthens both).
	if d["evalsha"] != 1 || d["pexpire"] != 2*int64(len(ls)) {
		t.Errorf("RefreshAll of %d locks ran %d EVALSHA, %d PEXPIRE; want 1, %d", len(ls), d["evalsha"], d["pexpire"], 2*len(ls))
	}
	for _, l := range ls {
		if err := r.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRefreshAllContext: RefreshAll returns when its context ends, with
// every lease's error wrapping the context's.
func TestRefreshAllContext(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c)
	base := uniqueKey(t)
	ls := []*backend.Lease{newLease(base+"-1", time.Minute), newLease(base+"-2", time.Minute)}
	for _, l := range ls {
		mustAcquire(t, r, l)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for i, err := range r.RefreshAll(ctx, ls) {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("lease %d: %v; want context.Canceled", i, err)
		}
	}
}
