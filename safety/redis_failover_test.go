package safety

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/internal/testserver/proxy"
	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/safety/harness"
	"github.com/distlock/distlock/safety/history"
)

// TestRedisFailover fails a Redis master over to its asynchronous replica
// while the replica lags (its replication stream is held in a proxy when
// the lock is granted and lost with the master, as a replica behind a slow
// link loses what was not yet sent), the way Sentinel would: the master is
// killed and the replica promoted (REPLICAOF NO ONE).
//
// Without WithWaitReplicas the promoted replica never saw the grant nor
// the fence's new value: a second owner gets the lock while the first
// still holds it (a double grant). Its token is nevertheless larger (the
// hybrid clock: the promoted replica's clock has moved on since the first
// grant), so the fenced store
// refuses the first owner's writes from then on. With WithWaitReplicas(1,
// ...) the first acquisition fails with ErrNotReplicated instead, and no
// one is granted twice.
func TestRedisFailover(t *testing.T) {
	const trials = 3
	for _, wait := range []bool{false, true} {
		name := "Async"
		if wait {
			name = "WaitReplicas"
		}
		t.Run(name, func(t *testing.T) {
			fault := "replica failover, async replication, replica lagging"
			if wait {
				fault += ", WithWaitReplicas(1, 200ms)"
			}
			var doubles, refusedGrants, sameToken int
			var res *harness.Result
			for i := range trials * soak {
				// A history per trial: each has its own servers.
				r := harness.NewRun(t)
				double, refused := failoverTrial(t, r.Client("a"), r.Client("b"), wait, i)
				if double {
					doubles++
				}
				if refused {
					refusedGrants++
				}
				evs := r.History()
				sameToken += refusedForSameToken(evs)
				res = merge(res, harness.Check(t, "redis", fault, evs))
			}
			res.Notes = fmt.Sprintf("double grants %d of %d trials; first acquisition refused (ErrNotReplicated) %d; "+
				"writes refused for carrying the last writer's token from another owner: %d",
				doubles, trials*soak, refusedGrants, sameToken)
			res.Log(t)
			if len(res.Stale) != 0 {
				t.Errorf("%d stale writes accepted; want 0", len(res.Stale))
			}
			if len(res.Uncaught) != 0 {
				t.Errorf("%d double grants not caught by the token", len(res.Uncaught))
			}
			if wait {
				if doubles != 0 || len(res.Overlaps) != 0 {
					t.Errorf("with WithWaitReplicas: %d double grants, %d overlaps; want 0", doubles, len(res.Overlaps))
				}
				if len(res.TokenIssues) != 0 || res.Linearizable != porcupine.Ok {
					t.Errorf("with WithWaitReplicas: %d token issues, porcupine %v; want 0, Ok", len(res.TokenIssues), res.Linearizable)
				}
				return
			}
			if doubles != trials*soak {
				t.Errorf("double grants in %d of %d trials; the lagging replica should give one every time", doubles, trials*soak)
			}
			if len(res.Overlaps) != doubles {
				t.Errorf("%d overlaps for %d double grants", len(res.Overlaps), doubles)
			}
			// The second owner's token is larger: the double grant is
			// caught by the token, not by the fence's refusal of an equal
			// token from another owner.
			if len(res.TokenIssues) != 0 || res.Linearizable != porcupine.Ok {
				t.Errorf("%d token issues, porcupine %v; want 0, Ok (the hybrid clock's tokens never go backwards)", len(res.TokenIssues), res.Linearizable)
			}
			if res.Rejected < doubles {
				t.Errorf("%d writes refused for %d double grants; want the first owner's write after the second's refused each time", res.Rejected, doubles)
			}
		})
	}
}

// failoverTrial runs one failover on a fresh master and replica: a takes
// and releases the lock a few times (so the fence counter is replicated),
// the replica is paused, a takes the lock and writes, the master is
// killed, the replica resumed and promoted, and b takes the lock on it
// and writes; then a writes again. It reports whether b was granted the
// lock while a held it, and whether a's last acquisition was refused.
func failoverTrial(t *testing.T, a, b *harness.Client, wait bool, i int) (double, refused bool) {
	master := testserver.Redis(t)
	replica := testserver.RedisReplica(t, master)
	// The replication stream goes through a proxy: stalled, it keeps the
	// grant from leaving the master; closed, it loses what it held, as a
	// crash loses what was not yet sent.
	link, err := proxy.Start(master.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	host, port, _ := net.SplitHostPort(link.Addr)
	direct := redisVia(t, replica.Addr)
	if err := direct.Do(t.Context(), "REPLICAOF", host, port).Err(); err != nil {
		t.Fatal(err)
	}
	var opts []redis.Option
	if wait {
		opts = append(opts, redis.WithWaitReplicas(1, 200*time.Millisecond))
	}
	da := newRedisLock(t, master.Addr, opts...)
	db := newRedisLock(t, replica.Addr)
	ctx := t.Context()
	key := fmt.Sprintf("%s-%d", uniqueKey(t), i)

	var fence string // the last token, as the fence key holds it
	for range 3 {
		lk, owner, err := a.TryLock(ctx, da, key, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Write(ctx, owner, lk.Token()); err != nil {
			t.Fatal(err)
		}
		fence = strconv.FormatUint(lk.Token(), 10)
		if err := a.Unlock(ctx, lk, owner); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 10*time.Second, "the replica to catch up through the proxy", func() bool {
		info, err := direct.Info(ctx, "replication").Result()
		if err != nil || !strings.Contains(info, "master_port:"+port+"\r\n") || !strings.Contains(info, "master_link_status:up") {
			return false
		}
		// The last release's DEL comes after the last grant's write of
		// the fence.
		v, err := direct.Get(ctx, "distlock:{"+key+"}:fence").Result()
		n, _ := direct.Exists(ctx, "distlock:{"+key+"}").Result()
		return err == nil && v == fence && n == 0
	})

	link.Stall(proxy.Down)
	lk, owner, err := a.TryLock(ctx, da, key, 0)
	switch {
	case wait && errors.Is(err, redis.ErrNotReplicated):
		refused = true
	case err != nil:
		t.Fatalf("a's acquisition: %v", err)
	default:
		if _, err := a.Write(ctx, owner, lk.Token()); err != nil {
			t.Fatal(err)
		}
	}
	master.Kill()
	_ = link.Close()
	replica.Promote()

	lkb, ownerb, err := b.TryLock(ctx, db, key, time.Second)
	if err != nil {
		v, _ := direct.Get(ctx, "distlock:{"+key+"}").Result()
		ttl, _ := direct.PTTL(ctx, "distlock:{"+key+"}").Result()
		info, _ := direct.Info(ctx, "replication").Result()
		t.Fatalf("b's acquisition on the promoted replica: %v (lock %q, pttl %v, a's %q)\n%s", err, v, ttl, owner, info)
	}
	double = lk != nil
	if _, err := b.Write(ctx, ownerb, lkb.Token()); err != nil {
		t.Fatal(err)
	}
	if lk != nil {
		// a still believes it holds the lock (its TTL is a minute).
		if _, err := a.Write(ctx, owner, lk.Token()); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Unlock(ctx, lkb, ownerb); err != nil {
		t.Fatal(err)
	}
	if lk != nil {
		// Its master is gone: Unlock fails, and ends a's holding.
		uctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_ = a.Unlock(uctx, lk, owner)
		cancel()
	}
	return double, refused
}

// newRedisLock returns a DistributeLock over the Redis at addr with a
// one-minute TTL, closed when t ends.
func newRedisLock(t *testing.T, addr string, opts ...redis.Option) *distlock.DistributeLock {
	res := newRedis(t, redisVia(t, addr), opts...)
	d, err := distlock.New(res, distlock.WithDefaultTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// merge adds the counts of b to a (a may be nil).
func merge(a, b *harness.Result) *harness.Result {
	if a == nil {
		return b
	}
	a.Acquisitions += b.Acquisitions
	a.Overlaps = append(a.Overlaps, b.Overlaps...)
	a.Uncaught = append(a.Uncaught, b.Uncaught...)
	a.Stale = append(a.Stale, b.Stale...)
	a.Counter.Increments += b.Counter.Increments
	a.Counter.Lost += b.Counter.Lost
	a.TokenIssues = append(a.TokenIssues, b.TokenIssues...)
	a.Rejected += b.Rejected
	if b.Linearizable != porcupine.Ok {
		a.Linearizable, a.Visualization = b.Linearizable, b.Visualization
	}
	return a
}

// refusedForSameToken counts the writes the fenced store refused although
// their token equalled that of the last accepted write: a store that only
// compares tokens (>=) would have accepted them.
func refusedForSameToken(evs []history.Event) int {
	var last uint64
	n := 0
	for _, e := range evs { // store events are in the store's order within one run
		if e.Kind != history.StoreWrite {
			continue
		}
		switch {
		case e.Accepted:
			last = e.Token
		case e.Token == last:
			n++
		}
	}
	return n
}
