package redis_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/redis"
)

// deployments starts a standalone server and a three-master Cluster and
// runs f on each.
func deployments(t *testing.T, f func(t *testing.T, c goredis.UniversalClient)) {
	t.Run("standalone", func(t *testing.T) { f(t, standalone(t)) })
	t.Run("cluster", func(t *testing.T) { f(t, cluster(t)) })
}

// mustNew returns redis.New(c, opts...), failing t on an error.
func mustNew(t testing.TB, c goredis.UniversalClient, opts ...redis.Option) *redis.Resource {
	t.Helper()
	r, err := redis.New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func newResource(t testing.TB, c goredis.UniversalClient, opts ...redis.Option) *redis.Resource {
	r := mustNew(t, c, opts...)
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

func mustAcquire(t testing.TB, r *redis.Resource, l *backend.Lease) {
	t.Helper()
	ok, _, err := r.TryAcquire(context.Background(), l)
	if err != nil || !ok {
		t.Fatalf("TryAcquire(%q) = %v, %v; want true, nil", l.Key, ok, err)
	}
}

func exists(t testing.TB, c goredis.UniversalClient, key string) bool {
	t.Helper()
	n, err := c.Exists(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("EXISTS %q: %v", key, err)
	}
	return n == 1
}

func TestResource(t *testing.T) {
	deployments(t, func(t *testing.T, c goredis.UniversalClient) {
		ctx := t.Context()
		r := newResource(t, c)

		t.Run("acquire-release", func(t *testing.T) {
			key := uniqueKey(t)
			l1 := newLease(key, time.Minute)
			mustAcquire(t, r, l1)
			if l1.Token == 0 {
				t.Errorf("Token = 0; want > 0")
			}
			l2 := newLease(key, time.Minute)
			ok, holderTTL, err := r.TryAcquire(ctx, l2)
			if ok || err != nil {
				t.Fatalf("contended TryAcquire = %v, %v; want false, nil", ok, err)
			}
			if holderTTL <= 50*time.Second || holderTTL > time.Minute {
				t.Errorf("holderTTL = %v; want in (50s, 1m]", holderTTL)
			}
			if err := r.Release(ctx, l2); !errors.Is(err, backend.ErrNotHeld) {
				t.Errorf("Release by non-holder = %v; want ErrNotHeld", err)
			}
			if err := r.Release(ctx, l1); err != nil {
				t.Fatalf("Release = %v", err)
			}
			// A second run of the release (go-redis resends after a lost
			// reply: the store cannot tell) finds its trace and says
			// nil, touching nothing.
			if err := r.Release(ctx, l1); err != nil {
				t.Errorf("second Release = %v; want nil (the release's trace)", err)
			}
			mustAcquire(t, r, l2)
			if l2.Token <= l1.Token {
				t.Errorf("next holder's token %d; want > %d", l2.Token, l1.Token)
			}
			if err := r.Release(ctx, l2); err != nil {
				t.Errorf("Release = %v", err)
			}
			lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
			if exists(t, c, lock) {
				t.Errorf("lock key %q left after release", lock)
			}
		})

		t.Run("refresh", func(t *testing.T) {
			key := uniqueKey(t)
			l := newLease(key, 300*time.Millisecond)
			mustAcquire(t, r, l)
			l.TTL = time.Minute
			if err := r.Refresh(ctx, l); err != nil {
				t.Fatalf("Refresh = %v", err)
			}
			lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
			if pttl := c.PTTL(ctx, lock).Val(); pttl <= 50*time.Second {
				t.Errorf("PTTL after Refresh = %v; want > 50s", pttl)
			}
			other := newLease(key, time.Minute)
			if err := r.Refresh(ctx, other); !errors.Is(err, backend.ErrNotHeld) {
				t.Errorf("Refresh by non-holder = %v; want ErrNotHeld", err)
			}
			if err := r.Release(ctx, l); err != nil {
				t.Fatalf("Release = %v", err)
			}
			if err := r.Refresh(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
				t.Errorf("Refresh after Release = %v; want ErrNotHeld", err)
			}
		})

		t.Run("expired", func(t *testing.T) {
			key := uniqueKey(t)
			l := newLease(key, 20*time.Millisecond)
			mustAcquire(t, r, l)
			lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
			waitFor(t, "the lock to expire", func() bool { return !exists(t, c, lock) })
			if err := r.Refresh(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
				t.Errorf("Refresh after expiry = %v; want ErrNotHeld", err)
			}
			if err := r.Release(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
				t.Errorf("Release after expiry = %v; want ErrNotHeld", err)
			}
			next := newLease(key, time.Minute)
			mustAcquire(t, r, next)
			if next.Token <= l.Token {
				t.Errorf("token after expiry %d; want > %d", next.Token, l.Token)
			}
			_ = r.Release(ctx, next)
		})

		t.Run("ttl-rounds-up", func(t *testing.T) {
			l := newLease(uniqueKey(t), 10*time.Second+300*time.Microsecond)
			mustAcquire(t, r, l)
			defer r.Release(ctx, l)
			if want := 10*time.Second + time.Millisecond; l.TTL != want {
				t.Errorf("lease TTL = %v; want %v", l.TTL, want)
			}
			lock, _ := redisscript.Layout(redis.DefaultPrefix, l.Key)
			if pttl := c.PTTL(ctx, lock).Val(); pttl > 10*time.Second+time.Millisecond || pttl < 9*time.Second {
				t.Errorf("PTTL = %v; want in [9s, 10.001s]", pttl)
			}
		})

		t.Run("braces", func(t *testing.T) {
			base := uniqueKey(t)
			keys := []string{base, "{" + base + "}", base + "}", "{" + base, base + ":fence",
				"%7B" + base + "%7D", "{}" + base, base + "{x}", "}{" + base}
			var leases []*backend.Lease
			for _, k := range keys {
				l := newLease(k, time.Minute)
				ok, _, err := r.TryAcquire(ctx, l)
				if err != nil || !ok {
					t.Fatalf("TryAcquire(%q) = %v, %v; want true, nil (keys are independent)", k, ok, err)
				}
				leases = append(leases, l)
			}
			for _, l := range leases {
				lock, fence := redisscript.Layout(redis.DefaultPrefix, l.Key)
				if cc, ok := c.(*goredis.ClusterClient); ok {
					s1 := cc.ClusterKeySlot(ctx, lock).Val()
					s2 := cc.ClusterKeySlot(ctx, fence).Val()
					if s1 != s2 {
						t.Errorf("key %q: lock slot %d, fence slot %d", l.Key, s1, s2)
					}
				}
				if err := r.Release(ctx, l); err != nil {
					t.Errorf("Release(%q) = %v", l.Key, err)
				}
			}
		})

		t.Run("prefix", func(t *testing.T) {
			rp := newResource(t, c, redis.WithPrefix("app{1}:"))
			l := newLease(uniqueKey(t), time.Minute)
			mustAcquire(t, rp, l)
			want := "app%7B1%7D:{" + l.Key + "}"
			if !exists(t, c, want) {
				t.Errorf("key %q missing", want)
			}
			if err := rp.Release(ctx, l); err != nil {
				t.Errorf("Release = %v", err)
			}
		})

		t.Run("script-cache-flushed", func(t *testing.T) {
			// After SCRIPT FLUSH (a restart, a failover to a fresh
			// replica) EVALSHA fails with NOSCRIPT: EVAL takes over.
			flush := func(ctx context.Context, n *goredis.Client) error { return n.ScriptFlush(ctx).Err() }
			var err error
			if cc, ok := c.(*goredis.ClusterClient); ok {
				err = cc.ForEachMaster(ctx, flush)
			} else {
				err = flush(ctx, c.(*goredis.Client))
			}
			if err != nil {
				t.Fatalf("SCRIPT FLUSH: %v", err)
			}
			l := newLease(uniqueKey(t), time.Minute)
			mustAcquire(t, r, l)
			if err := r.Refresh(ctx, l); err != nil {
				t.Errorf("Refresh = %v", err)
			}
			if err := r.Release(ctx, l); err != nil {
				t.Errorf("Release = %v", err)
			}
		})

		t.Run("failed-acquire-cleans-up", func(t *testing.T) {
			// A fence of the wrong type makes the script fail after its
			// SET (its GET fails): the lock must not stay behind.
			key := uniqueKey(t)
			lock, fence := redisscript.Layout(redis.DefaultPrefix, key)
			if err := c.RPush(ctx, fence, "not a string").Err(); err != nil {
				t.Fatal(err)
			}
			l := newLease(key, time.Minute)
			ok, _, err := r.TryAcquire(ctx, l)
			if ok || err == nil {
				t.Fatalf("TryAcquire = %v, %v; want an error", ok, err)
			}
			if !strings.Contains(err.Error(), "redis: acquire "+`"`+key+`"`) {
				t.Errorf("error %q does not name the op and key", err)
			}
			if exists(t, c, lock) {
				t.Errorf("lock key %q left behind by a failed acquire", lock)
			}
			c.Del(ctx, fence)
		})
	})
}

func TestValidateKey(t *testing.T) {
	r := mustNew(t, goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}))
	for _, tc := range []struct {
		key string
		ok  bool
	}{
		{"", false},
		{"k", true},
		{"{}", true},
		{strings.Repeat("k", redis.MaxKeyLen), true},
		{strings.Repeat("k", redis.MaxKeyLen+1), false},
	} {
		err := r.ValidateKey(tc.key)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateKey(%d bytes) = %v; want ok %v", len(tc.key), err, tc.ok)
		}
	}
}

// TestNewBadInput checks that New refuses a nil client and a nil option
// with an error wrapping ErrInvalid.
func TestNewBadInput(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	for _, tc := range []struct {
		name string
		c    goredis.UniversalClient
		opts []redis.Option
	}{
		{"nil client", nil, nil},
		{"nil typed client", (*goredis.Client)(nil), nil},
		{"nil option", c, []redis.Option{nil}},
	} {
		r, err := redis.New(tc.c, tc.opts...)
		if r != nil || !errors.Is(err, distlock.ErrInvalid) {
			t.Errorf("%s: New = %v, %v; want nil, an ErrInvalid error", tc.name, r, err)
		}
	}
}

// TestRoundTrips counts commands on the server around one uncontended
// cycle: exactly one script call to acquire and one to release.
func TestRoundTrips(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c)
	ctx := t.Context()
	key := uniqueKey(t)

	// Warm up: load the scripts and open the connection.
	warm := newLease(key, time.Minute)
	mustAcquire(t, r, warm)
	if err := r.Release(ctx, warm); err != nil {
		t.Fatal(err)
	}

	l := newLease(key, time.Minute)
	before := commandStats(t, c)
	mustAcquire(t, r, l)
	mid := commandStats(t, c)
	if err := r.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	after := commandStats(t, c)

	// A contended attempt: the tombstone is not looked up; the holder's
	// value is (a resent request of the holder's own attempt takes it).
	mustAcquire(t, r, l)
	s0 := commandStats(t, c)
	if ok, _, err := r.TryAcquire(ctx, newLease(key, time.Minute)); ok || err != nil {
		t.Fatalf("contended TryAcquire = %v, %v; want false, nil", ok, err)
	}
	s1 := commandStats(t, c)
	if err := r.Release(ctx, l); err != nil {
		t.Fatal(err)
	}

	// Commands run inside a script count in commandstats too: allow each
	// script's own commands, and nothing else besides one EVALSHA.
	for _, tc := range []struct {
		op     string
		delta  map[string]int64
		inside map[string]int64
	}{
		// SET NX, then the token: TIME and one SET ... PX ... GET of the
		// fence (the hybrid clock; the fence expires). No
		// tombstone is looked up: no clean-up's hint lives.
		{"acquire", statsDelta(before, mid), map[string]int64{"set": 2, "time": 1}},
		// RENAME, not DEL: the release leaves its trace.
		// No PUBLISH: nobody was refused the lock.
		{"release", statsDelta(mid, after), map[string]int64{"get": 1, "rename": 1}},
		// The refused attempt marks the holder's lock as waited for.
		{"contended attempt", statsDelta(s0, s1), map[string]int64{"set": 1, "get": 1, "pttl": 1, "append": 1}},
	} {
		want := maps.Clone(tc.inside)
		want["evalsha"] = 1
		if !maps.Equal(tc.delta, want) {
			t.Errorf("%s ran %v on the server; want %v (one EVALSHA and the script's own commands)", tc.op, tc.delta, want)
		}
	}
}

func TestWaitReplicasWithoutReplica(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c, redis.WithWaitReplicas(1, 20*time.Millisecond))
	l := newLease(uniqueKey(t), time.Minute)
	ok, _, err := r.TryAcquire(t.Context(), l)
	if ok || !errors.Is(err, redis.ErrNotReplicated) {
		t.Fatalf("TryAcquire = %v, %v; want ErrNotReplicated", ok, err)
	}
	lock, _ := redisscript.Layout(redis.DefaultPrefix, l.Key)
	if exists(t, c, lock) {
		t.Errorf("unreplicated lock %q left behind", lock)
	}
}

// TestHeldKeepsNothing: a held mutex keeps nothing of the store's in its
// lease (a process holding many locks pays for the leases
// alone), and Refresh, RefreshAll and Release, which then build their
// commands per call, still act on the right keys, label key included.
// A lease that lost an attempt keeps its handle for the next one.
func TestHeldKeepsNothing(t *testing.T) {
	deployments(t, func(t *testing.T, c goredis.UniversalClient) {
		ctx := t.Context()
		r := newResource(t, c)
		for _, label := range []string{"", "host:1"} {
			t.Run("label="+label, func(t *testing.T) {
				key := uniqueKey(t)
				lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
				l1, l2 := newLease(key, time.Minute), newLease(key, time.Minute)
				l1.Label, l2.Label = label, label
				mustAcquire(t, r, l1)
				if l1.Handle != nil {
					t.Errorf("held lease's Handle = %T; want nil", l1.Handle)
				}
				if ok, _, err := r.TryAcquire(ctx, l2); ok || err != nil {
					t.Fatalf("contended TryAcquire = %v, %v; want false, nil", ok, err)
				}
				if l2.Handle == nil {
					t.Errorf("after a lost attempt Handle = nil; want the acquisition's")
				}
				l1.TTL = 2 * time.Minute
				if err := r.Refresh(ctx, l1); err != nil {
					t.Fatalf("Refresh = %v", err)
				}
				pttl := func(k string) time.Duration {
					t.Helper()
					d, err := c.PTTL(ctx, k).Result()
					if err != nil {
						t.Fatalf("PTTL %q: %v", k, err)
					}
					return d
				}
				if d := pttl(lock); d <= time.Minute {
					t.Errorf("PTTL after Refresh to 2m = %v; want > 1m", d)
				}
				if label != "" {
					if d := pttl(lock + redisscript.LabelSuffix); d <= time.Minute {
						t.Errorf("label key PTTL after Refresh to 2m = %v; want > 1m", d)
					}
				}
				l1.TTL = 3 * time.Minute
				other := newLease(uniqueKey(t), time.Minute)
				mustAcquire(t, r, other)
				for i, err := range r.RefreshAll(ctx, []*backend.Lease{l1, other}) {
					if err != nil {
						t.Errorf("RefreshAll[%d] = %v", i, err)
					}
				}
				if d := pttl(lock); d <= 2*time.Minute {
					t.Errorf("PTTL after RefreshAll to 3m = %v; want > 2m", d)
				}
				if err := r.Release(ctx, l1); err != nil {
					t.Fatalf("Release = %v", err)
				}
				if exists(t, c, lock) || exists(t, c, lock+redisscript.LabelSuffix) {
					t.Errorf("lock or label key left after Release")
				}
				mustAcquire(t, r, l2)
				if l2.Handle != nil {
					t.Errorf("Handle after the winning attempt = %T; want nil", l2.Handle)
				}
				for _, l := range []*backend.Lease{l2, other} {
					if err := r.Release(ctx, l); err != nil {
						t.Errorf("Release(%q) = %v", l.Key, err)
					}
				}
			})
		}
	})
}
