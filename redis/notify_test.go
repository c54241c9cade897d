package redis_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/redis"
)

// subscribers returns how many connections are subscribed to key's release
// channel (sharded on Cluster, asked of the key's master).
func subscribers(t testing.TB, c goredis.UniversalClient, key string) int64 {
	t.Helper()
	ctx := context.Background()
	ch, _ := redisscript.Layout(redis.DefaultPrefix, key)
	var (
		m   map[string]int64
		err error
	)
	if cc, ok := c.(*goredis.ClusterClient); ok {
		var node *goredis.Client
		if node, err = cc.MasterForKey(ctx, ch); err == nil {
			m, err = node.PubSubShardNumSub(ctx, ch).Result()
		}
	} else {
		m, err = c.PubSubNumSub(ctx, ch).Result()
	}
	if err != nil {
		t.Fatalf("subscribers of %q: %v", ch, err)
	}
	return m[ch]
}

func newDistLock(t testing.TB, r *redis.Resource, opts ...distlock.Option) *distlock.DistributeLock {
	d, err := distlock.New(r, opts...)
	if err != nil {
		t.Fatalf("distlock.New: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

type result struct {
	lk  *distlock.Lock
	err error
	at  time.Time
}

// startWaiter runs TryLock(key, wait) in a goroutine.
func startWaiter(ctx context.Context, d *distlock.DistributeLock, key string, wait time.Duration) <-chan result {
	res := make(chan result, 1)
	go func() {
		lk, err := d.TryLock(ctx, key, wait)
		res <- result{lk, err, time.Now()}
	}()
	return res
}

// TestWakeUp checks that a waiter is woken by the release notice: its spin
// sleep is 10s, so acquiring well before that means the notice woke it.
func TestWakeUp(t *testing.T) {
	deployments(t, func(t *testing.T, c goredis.UniversalClient) {
		ctx := distlock.ContextWithTTL(t.Context(), time.Minute)
		holder := newDistLock(t, newResource(t, c))
		waiter := newDistLock(t, newResource(t, c), distlock.WithSpin(10*time.Second, 0))
		key := uniqueKey(t)

		lk, err := holder.TryLock(ctx, key, 0)
		if err != nil {
			t.Fatal(err)
		}
		res := startWaiter(ctx, waiter, key, 20*time.Second)
		waitFor(t, "the waiter to subscribe", func() bool { return subscribers(t, c, key) == 1 })
		released := time.Now()
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-res
		if r.err != nil {
			t.Fatalf("waiter: %v", r.err)
		}
		if took := r.at.Sub(released); took > 5*time.Second {
			t.Errorf("waiter acquired %v after release; a notice should wake it long before its 10s spin", took)
		}
		if r.lk.Token() <= lk.Token() {
			t.Errorf("waiter's token %d; want > %d", r.lk.Token(), lk.Token())
		}
		if err := r.lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the subscription to end", func() bool { return subscribers(t, c, key) == 0 })
	})
}

// TestWakeUpAfterPubSubKilled kills the subscription connection on the
// server: go-redis reconnects and subscribes again, and notices flow.
func TestWakeUpAfterPubSubKilled(t *testing.T) {
	c := standalone(t)
	ctx := distlock.ContextWithTTL(t.Context(), time.Minute)
	holder := newDistLock(t, newResource(t, c))
	waiter := newDistLock(t, newResource(t, c), distlock.WithSpin(10*time.Second, 0))
	key := uniqueKey(t)

	lk, err := holder.TryLock(ctx, key, 0)
	if err != nil {
		t.Fatal(err)
	}
	res := startWaiter(ctx, waiter, key, 20*time.Second)
	waitFor(t, "the waiter to subscribe", func() bool { return subscribers(t, c, key) == 1 })
	killed, err := c.ClientKillByFilter(ctx, "TYPE", "pubsub").Result()
	if err != nil || killed != 1 {
		t.Fatalf("CLIENT KILL TYPE pubsub = %d, %v; want 1", killed, err)
	}
	waitFor(t, "the subscription to come back", func() bool { return subscribers(t, c, key) == 1 })
	released := time.Now()
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	if took := r.at.Sub(released); took > 5*time.Second {
		t.Errorf("waiter acquired %v after release; want it woken by the notice", took)
	}
	_ = r.lk.Unlock(ctx)
}

// TestSpinWithoutPubSub denies SUBSCRIBE to the client's user with an ACL:
// every subscription fails, and the waiter still gets the lock by spinning.
func TestSpinWithoutPubSub(t *testing.T) {
	admin := standalone(t)
	ctx := distlock.ContextWithTTL(t.Context(), time.Minute)
	user := "nosub-" + uniqueKey(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all",
		"-subscribe", "-ssubscribe", "-psubscribe").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := cleanupCtx()
		defer cancel()
		admin.Do(ctx, "ACL", "DELUSER", user)
	})
	c := goredis.NewClient(&goredis.Options{Addr: admin.Options().Addr, Username: user, Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })

	holder := newDistLock(t, newResource(t, c))
	waiter := newDistLock(t, newResource(t, c), distlock.WithSpin(10*time.Millisecond, 10*time.Millisecond))
	key := uniqueKey(t)
	lk, err := holder.TryLock(ctx, key, 0)
	if err != nil {
		t.Fatal(err)
	}
	before := commandRejections(t, admin)
	res := startWaiter(ctx, waiter, key, 20*time.Second)
	waitFor(t, "a denied SUBSCRIBE", func() bool {
		return rejected(t, admin, "subscribe") > rejectedIn(before, "subscribe")
	})
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil {
		t.Fatalf("waiter without pub/sub: %v", r.err)
	}
	_ = r.lk.Unlock(ctx)
}

func rejected(t testing.TB, c *goredis.Client, cmd string) int64 {
	return rejectedIn(commandRejections(t, c), cmd)
}

func rejectedIn(m map[string]int64, cmd string) int64 { return m[cmd+".rejected"] }

// TestSubscribeRefcount checks that the Resource subscribes a key's
// channel while at least one local waiter wants it, fans notices out to
// every waiter, and closes its connection and goroutines on Close.
func TestSubscribeRefcount(t *testing.T) {
	deployments(t, func(t *testing.T, c goredis.UniversalClient) {
		ctx := t.Context()
		r := mustNew(t, c)
		key, other := uniqueKey(t), uniqueKey(t)

		ch1, cancel1 := r.Subscribe(key)
		ch2, cancel2 := r.Subscribe(key)
		waitFor(t, "subscription", func() bool { return subscribers(t, c, key) == 1 })
		// The confirmation of the subscription wakes both once (a release
		// before it would have reached nobody).
		for i, ch := range []<-chan struct{}{ch1, ch2} {
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
				t.Fatalf("waiter %d not woken by the subscription's confirmation", i+1)
			}
		}

		waitedCycle(t, r, key)
		for i, ch := range []<-chan struct{}{ch1, ch2} {
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
				t.Fatalf("waiter %d got no notice", i+1)
			}
		}

		cancel1()
		cancel1() // a second cancel is harmless
		// Changes are applied in order: once other is subscribed, the
		// first cancel has been handled too.
		_, cancelOther := r.Subscribe(other)
		waitFor(t, "subscription of the other key", func() bool { return subscribers(t, c, other) == 1 })
		if n := subscribers(t, c, key); n != 1 {
			t.Errorf("after one of two waiters left: %d subscribers; want 1", n)
		}
		cancel2()
		waitFor(t, "unsubscription", func() bool { return subscribers(t, c, key) == 0 })

		if subscriptionGoroutines() == 0 {
			t.Fatal("no subscription goroutines found before Close: the count below proves nothing")
		}
		if err := r.Close(); err != nil {
			t.Fatalf("Close = %v", err)
		}
		if err := r.Close(); err != nil {
			t.Errorf("second Close = %v", err)
		}
		cancelOther()
		waitFor(t, "the connection to close", func() bool { return subscribers(t, c, other) == 0 })
		if ch, cancel := r.Subscribe(key); ch != nil {
			t.Errorf("Subscribe after Close: non-nil channel")
		} else {
			cancel()
		}
		waitFor(t, "the subscription goroutines to end", func() bool { return subscriptionGoroutines() == 0 })
		if err := c.Ping(ctx).Err(); err != nil {
			t.Errorf("client unusable after Close: %v", err)
		}
	})
}

// subscriptionGoroutines counts live goroutines of the hub and of go-redis
// PubSub channels (their forwarders and health checks).
func subscriptionGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "distlock/redis.(*hub)") || strings.Contains(g, "go-redis/v9.(*channel)") {
			n++
		}
	}
	return n
}
