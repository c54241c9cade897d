package redis_test

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/redis"
)

// TestKindsModel runs random sequences of semaphore and read/write lock
// requests (attempts, retries of waiting requests, withdrawals, releases,
// refreshes, limits that disagree) against Redis and against
// backend/memory, the reference, and checks that both answer every
// request alike: the scripts keep the order of arrival, the limit and the
// kinds' rules as the reference does. TTLs are long: nothing expires.
// Tokens must increase strictly across each lock's grants.
func TestKindsModel(t *testing.T) {
	deployments(t, func(t *testing.T, c goredis.UniversalClient) {
		for seed := range uint64(8) {
			t.Run(fmt.Sprint(seed), func(t *testing.T) { kindsModel(t, c, seed) })
		}
	})
}

// request is one acquisition of the model run: a lease on both stores.
type request struct {
	red, mem *backend.Lease
}

func kindsModel(t *testing.T, c goredis.UniversalClient, seed uint64) {
	ctx := t.Context()
	r := newResource(t, c)
	m := memory.New()
	rnd := rand.New(rand.NewPCG(seed, 19))
	key := uniqueKey(t)
	var holders, waiting, released []request
	lastToken := map[backend.Kind]uint64{} // read and write share one
	n := 0
	newRequest := func(kind backend.Kind, limit int) request {
		n++
		l := backend.Lease{Key: key, Value: fmt.Sprintf("v%d", n), TTL: time.Minute, Kind: kind, Limit: int32(limit), Label: fmt.Sprintf("l%d", n)}
		red, mem := l, l
		return request{&red, &mem}
	}
	fence := func(k backend.Kind) backend.Kind {
		if k == backend.KindRead {
			return backend.KindWrite
		}
		return k
	}
	attempt := func(q request, what string) bool {
		t.Helper()
		okR, _, errR := r.TryAcquire(ctx, q.red)
		okM, _, errM := m.TryAcquire(ctx, q.mem)
		if okR != okM || errors.Is(errR, backend.ErrLimitMismatch) != errors.Is(errM, backend.ErrLimitMismatch) ||
			(errR != nil && !errors.Is(errR, backend.ErrLimitMismatch)) {
			t.Fatalf("%s %v %s (limit %d): redis %v, %v; reference %v, %v",
				what, q.red.Kind, q.red.Value, q.red.Limit, okR, errR, okM, errM)
		}
		if okR {
			f := fence(q.red.Kind)
			if q.red.Token <= lastToken[f] {
				t.Fatalf("%v grant %s: token %d after %d; want strictly increasing", q.red.Kind, q.red.Value, q.red.Token, lastToken[f])
			}
			lastToken[f] = q.red.Token
		}
		return okR
	}
	remove := func(qs []request, i int) []request {
		qs[i] = qs[len(qs)-1]
		return qs[:len(qs)-1]
	}
	for step := range 300 {
		what := fmt.Sprintf("step %d:", step)
		switch op := rnd.IntN(10); {
		case op < 4: // a new request
			kind := []backend.Kind{backend.KindSemaphore, backend.KindRead, backend.KindWrite}[rnd.IntN(3)]
			limit := 0
			if kind == backend.KindSemaphore {
				limit = 2
				if rnd.IntN(8) == 0 {
					limit = 3 // disagrees while holders took 2
				}
			}
			q := newRequest(kind, limit)
			switch {
			case attempt(q, what+" new"):
				holders = append(holders, q)
			case kind != backend.KindSemaphore:
				waiting = append(waiting, q)
			}
		case op < 6 && len(waiting) > 0: // a waiting request tries again
			i := rnd.IntN(len(waiting))
			if q := waiting[i]; attempt(q, what+" retry") {
				waiting = remove(waiting, i)
				holders = append(holders, q)
			}
		case op < 7 && len(waiting) > 0: // a waiting request gives up
			i := rnd.IntN(len(waiting))
			q := waiting[i]
			waiting = remove(waiting, i)
			if err := r.Withdraw(ctx, q.red); err != nil {
				t.Fatalf("%s Withdraw: %v", what, err)
			}
			if err := m.Withdraw(ctx, q.mem); err != nil {
				t.Fatal(err)
			}
		case op < 9 && len(holders) > 0: // a holder lets go
			i := rnd.IntN(len(holders))
			q := holders[i]
			holders = remove(holders, i)
			if rnd.IntN(4) == 0 {
				if err := r.Refresh(ctx, q.red); err != nil {
					t.Fatalf("%s Refresh of a holder: %v", what, err)
				}
			}
			if err := r.Release(ctx, q.red); err != nil {
				t.Fatalf("%s Release of a holder: %v", what, err)
			}
			if err := m.Release(ctx, q.mem); err != nil {
				t.Fatal(err)
			}
			released = append(released, q)
		case len(released) > 0: // a late release finds nothing
			q := released[rnd.IntN(len(released))]
			if err := r.Release(ctx, q.red); !errors.Is(err, backend.ErrNotHeld) {
				t.Fatalf("%s second Release = %v; want ErrNotHeld", what, err)
			}
			if err := r.Refresh(ctx, q.red); !errors.Is(err, backend.ErrNotHeld) {
				t.Fatalf("%s Refresh after Release = %v; want ErrNotHeld", what, err)
			}
		}
	}
	for _, q := range waiting {
		if err := r.Withdraw(ctx, q.red); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range holders {
		if err := r.Release(ctx, q.red); err != nil {
			t.Fatalf("final Release: %v", err)
		}
	}
	if left := stateKeys(t, c, key); len(left) != 0 {
		t.Errorf("left behind: %q", left)
	}
}

// stateKeys lists the keys of key's locks that exist (fences and
// tombstones aside).
func stateKeys(t *testing.T, c goredis.UniversalClient, key string) []string {
	t.Helper()
	var left []string
	for _, k := range redisscript.StateKeys(redis.DefaultPrefix, key) {
		if exists(t, c, k) {
			left = append(left, k)
		}
	}
	return left
}

// TestKindsRoundTrips: one script call per attempt and per release, for a
// semaphore and for both sides of a read/write lock.
func TestKindsRoundTrips(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c)
	ctx := t.Context()
	for _, kind := range []backend.Kind{backend.KindSemaphore, backend.KindRead, backend.KindWrite} {
		key := uniqueKey(t)
		l := newLease(key, time.Minute)
		l.Kind, l.Limit = kind, 1
		if kind != backend.KindSemaphore {
			l.Limit = 0
		}
		warm := *l
		warm.Value += "-warm"
		mustAcquire(t, r, &warm) // loads the scripts
		if err := r.Release(ctx, &warm); err != nil {
			t.Fatal(err)
		}
		s0 := commandStats(t, c)
		mustAcquire(t, r, l)
		s1 := commandStats(t, c)
		other := newLease(key, time.Minute)
		other.Kind, other.Limit = kind, l.Limit
		if kind == backend.KindRead { // readers share: a writer waits
			other.Kind = backend.KindWrite
		}
		if ok, _, err := r.TryAcquire(ctx, other); ok || err != nil {
			t.Fatalf("%v: contended TryAcquire = %v, %v; want false, nil", kind, ok, err)
		}
		s2 := commandStats(t, c)
		if err := r.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		s3 := commandStats(t, c)
		if err := r.Withdraw(ctx, other); err != nil {
			t.Fatal(err)
		}
		for _, d := range []struct {
			op    string
			delta map[string]int64
		}{{"acquire", statsDelta(s0, s1)}, {"contended attempt", statsDelta(s1, s2)}, {"release", statsDelta(s2, s3)}} {
			if d.delta["evalsha"] != 1 || d.delta["eval"] != 0 {
				t.Errorf("%v %s: %d EVALSHA, %d EVAL; want one EVALSHA", kind, d.op, d.delta["evalsha"], d.delta["eval"])
			}
			top := maps.Clone(d.delta)
			for _, inside := range []string{"evalsha", "time", "zrangebyscore", "zcard", "hget", "zscore", "exists", "get", "set",
				"zadd", "hset", "pttl", "pexpire", "zrange", "zrem", "hdel", "del", "hexists", "publish"} {
				delete(top, inside)
			}
			if len(top) != 0 {
				t.Errorf("%v %s ran %v besides the script's commands", kind, d.op, top)
			}
		}
	}
}

// TestKindsLimitMismatch: a semaphore held with one limit refuses another
// limit with ErrLimitMismatch, writing nothing; with no holder left, the
// next acquire sets the limit anew.
func TestKindsLimitMismatch(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c)
	key := uniqueKey(t)
	a := newLease(key, time.Minute)
	a.Kind, a.Limit = backend.KindSemaphore, 2
	mustAcquire(t, r, a)
	b := newLease(key, time.Minute)
	b.Kind, b.Limit = backend.KindSemaphore, 3
	if ok, _, err := r.TryAcquire(t.Context(), b); ok || !errors.Is(err, backend.ErrLimitMismatch) {
		t.Fatalf("TryAcquire with limit 3 while held with 2 = %v, %v; want ErrLimitMismatch", ok, err)
	}
	var ab *backend.AbandonedError
	if _, _, err := r.TryAcquire(t.Context(), b); errors.As(err, &ab) {
		t.Errorf("a refused limit is an AbandonedError; want a plain error (nothing to clean)")
	}
	lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
	dead := redisscript.DeadKey(lock, b.Value)
	if exists(t, c, dead) {
		t.Errorf("a refused limit wrote a tombstone: the script refuses before it writes")
	}
	if err := r.Release(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, r, b)
	if err := r.Release(t.Context(), b); err != nil {
		t.Fatal(err)
	}
}

// TestKindsTombstone: an attempt of a semaphore or read/write lock that
// reaches Redis after its clean-up (delayed on the way) takes nothing and
// records no intent: the clean-up's tombstone stops it.
func TestKindsTombstone(t *testing.T) {
	deployments(t, func(t *testing.T, c goredis.UniversalClient) {
		ctx := t.Context()
		for _, kind := range []backend.Kind{backend.KindSemaphore, backend.KindRead, backend.KindWrite} {
			key := uniqueKey(t)
			// A writer holds the read/write lock, so a late read or write
			// attempt would record an intent; the semaphore is free, so a
			// late attempt would take a permit.
			holder := newLease(key, time.Minute)
			holder.Kind = backend.KindWrite
			mustAcquire(t, newResource(t, c), holder)
			r := newResource(t, c)
			l := newLease(key, time.Minute)
			l.Kind = kind
			if kind == backend.KindSemaphore {
				l.Limit = 1
			}
			lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
			keys := redisscript.SemaphoreKeys(lock)[:3]
			if kind != backend.KindSemaphore {
				all := redisscript.RWKeys(lock)
				keys = append(all[:3:3], all[4:]...)
			}
			if err := redisscript.GroupCleanup.Run(ctx, c, keys, l.Value, 60000, "").Err(); err != nil {
				t.Fatalf("%v: clean-up: %v", kind, err)
			}
			ok, _, err := r.TryAcquire(ctx, l) // the late request
			var rerr goredis.Error
			if ok || !errors.As(err, &rerr) || !redisscript.IsDead(rerr) {
				t.Errorf("%v: attempt after its clean-up = %v, %v; want a DEAD error", kind, ok, err)
			}
			var ab *backend.AbandonedError
			if errors.As(err, &ab) {
				if cerr := ab.Cleanup(ctx); cerr != nil {
					t.Fatal(cerr)
				}
			}
			if err := newResource(t, c).Release(ctx, holder); err != nil {
				t.Fatal(err)
			}
			if left := stateKeys(t, c, key); len(left) != 0 {
				t.Errorf("%v: the late attempt left %q", kind, left)
			}
		}
	})
}

// TestRWIntentExpires: the intent of a writer that stopped trying (its
// process died) keeps new readers out for its TTL only.
func TestRWIntentExpires(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c)
	ctx := t.Context()
	key := uniqueKey(t)
	reader := newLease(key, time.Minute)
	reader.Kind = backend.KindRead
	mustAcquire(t, r, reader)
	writer := newLease(key, 300*time.Millisecond)
	writer.Kind = backend.KindWrite
	if ok, _, err := r.TryAcquire(ctx, writer); ok || err != nil {
		t.Fatalf("writer behind a reader = %v, %v; want false, nil", ok, err)
	}
	late := newLease(key, time.Minute)
	late.Kind = backend.KindRead
	ok, wait, err := r.TryAcquire(ctx, late)
	if ok || err != nil || wait <= 0 || wait > 300*time.Millisecond {
		t.Fatalf("reader behind a waiting writer = %v, %v, %v; want false, the intent's time left, nil", ok, wait, err)
	}
	waitFor(t, "the writer's intent to expire", func() bool {
		ok, _, err := r.TryAcquire(ctx, late)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	})
	for _, l := range []*backend.Lease{reader, late} {
		if err := r.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	if left := stateKeys(t, c, key); len(left) != 0 {
		t.Errorf("left behind: %q", left)
	}
}

// TestKindsNotices: a semaphore's release and a withdrawn intent send a
// notice on the key's channel, which waiters of every kind of lock on the
// key hear.
func TestKindsNotices(t *testing.T) {
	deployments(t, func(t *testing.T, c goredis.UniversalClient) {
		r := newResource(t, c)
		ctx := t.Context()
		key := uniqueKey(t)
		ch, cancel := r.Subscribe(key)
		defer cancel()
		heard := func(what string) {
			t.Helper()
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
				t.Fatalf("no notice for %s", what)
			}
		}
		// The subscription's confirmation sends one (waiters retry once).
		heard("the subscription")
		sem := newLease(key, time.Minute)
		sem.Kind, sem.Limit = backend.KindSemaphore, 1
		mustAcquire(t, r, sem)
		if err := r.Release(ctx, sem); err != nil {
			t.Fatal(err)
		}
		heard("a semaphore's release")
		reader := newLease(key, time.Minute)
		reader.Kind = backend.KindRead
		mustAcquire(t, r, reader)
		writer := newLease(key, time.Minute)
		writer.Kind = backend.KindWrite
		if ok, _, err := r.TryAcquire(ctx, writer); ok || err != nil {
			t.Fatalf("writer behind a reader = %v, %v; want false, nil", ok, err)
		}
		if err := r.Withdraw(ctx, writer); err != nil {
			t.Fatal(err)
		}
		heard("a withdrawn intent")
		if err := r.Release(ctx, reader); err != nil {
			t.Fatal(err)
		}
		heard("a reader's release")
	})
}

// TestKindsWaitReplicas: under WithWaitReplicas, a semaphore's or
// read/write lock's grant that no replica acknowledged is given up again
// with ErrNotReplicated, leaving nothing.
func TestKindsWaitReplicas(t *testing.T) {
	c := standalone(t)
	r := newResource(t, c, redis.WithWaitReplicas(1, 20*time.Millisecond))
	for _, kind := range []backend.Kind{backend.KindSemaphore, backend.KindRead, backend.KindWrite} {
		l := newLease(uniqueKey(t), time.Minute)
		l.Kind = kind
		if kind == backend.KindSemaphore {
			l.Limit = 2
		}
		ok, _, err := r.TryAcquire(t.Context(), l)
		if ok || !errors.Is(err, redis.ErrNotReplicated) {
			t.Errorf("%v: TryAcquire = %v, %v; want ErrNotReplicated", kind, ok, err)
		}
		if left := stateKeys(t, c, l.Key); len(left) != 0 {
			t.Errorf("%v: unreplicated grant left %q", kind, left)
		}
	}
}
