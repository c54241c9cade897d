package redis_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/redis"
)

// channelOf is the release channel of key under the default prefix.
func channelOf(key string) string {
	ch, _ := redisscript.Layout(redis.DefaultPrefix, key)
	return ch
}

// keysOnOneMaster returns n keys whose release channels are in n
// distinct slots served by one master, and that master.
func keysOnOneMaster(t testing.TB, c *goredis.ClusterClient, n int) ([]string, *goredis.Client) {
	t.Helper()
	ctx := context.Background()
	type group struct {
		keys  []string
		slots map[int64]bool
		node  *goredis.Client
	}
	groups := map[string]*group{}
	base := uniqueKey(t)
	for i := 0; i < 1000; i++ {
		key := fmt.Sprintf("%s-%d", base, i)
		ch := channelOf(key)
		m, err := c.MasterForKey(ctx, ch)
		if err != nil {
			t.Fatalf("MasterForKey: %v", err)
		}
		slot, err := c.ClusterKeySlot(ctx, ch).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT: %v", err)
		}
		g := groups[m.Options().Addr]
		if g == nil {
			g = &group{slots: map[int64]bool{}, node: m}
			groups[m.Options().Addr] = g
		}
		if g.slots[slot] {
			continue
		}
		g.slots[slot] = true
		if g.keys = append(g.keys, key); len(g.keys) == n {
			return g.keys, g.node
		}
	}
	t.Fatalf("no %d keys of distinct slots on one master", n)
	return nil, nil
}

// shardSubscribers returns how many connections to node are subscribed to
// key's release channel (PUBSUB SHARDNUMSUB asked of that node).
func shardSubscribers(t testing.TB, node *goredis.Client, key string) int64 {
	t.Helper()
	ch := channelOf(key)
	m, err := node.PubSubShardNumSub(context.Background(), ch).Result()
	if err != nil {
		t.Fatalf("PUBSUB SHARDNUMSUB %q on %s: %v", ch, node.Options().Addr, err)
	}
	return m[ch]
}

// wake waits for a value on ch: a notice, or the confirmation of a
// subscription.
func wake(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("no wake-up: %s", what)
	}
}

// notices checks that releases of each key through r, each waited for,
// reach its waiter in chans: twice, each release then a wake-up, so that at least one wake-up
// is a notice even if a subscription's confirmation (which comes once)
// arrives meanwhile.
func notices(t testing.TB, r *redis.Resource, keys []string, chans []<-chan struct{}) {
	t.Helper()
	for i, key := range keys {
		for range 2 {
			waitedCycle(t, r, key)
			wake(t, chans[i], "the release notice of "+key)
		}
	}
}

// TestClusterNoticesAfterPubSubKilled: one subscription connection per
// master carries the channels of several slots. When it is killed,
// go-redis reconnects and subscribes them again in one SSUBSCRIBE, which
// Redis refuses (CROSSSLOT): the Resource must subscribe them again
// itself, and release notices must flow again.
func TestClusterNoticesAfterPubSubKilled(t *testing.T) {
	c := cluster(t)
	ctx := t.Context()
	r, other := newResource(t, c), newResource(t, c)
	keys, master := keysOnOneMaster(t, c, 3)
	var chans []<-chan struct{}
	for _, key := range keys {
		ch, cancel := r.Subscribe(key)
		t.Cleanup(cancel)
		chans = append(chans, ch)
	}
	for i, key := range keys {
		waitFor(t, "subscription of "+key, func() bool { return shardSubscribers(t, master, key) == 1 })
		wake(t, chans[i], "the confirmation of "+key)
	}
	notices(t, other, keys, chans)

	for round := range 2 { // and again: the repaired connection is repaired too
		killed, err := master.ClientKillByFilter(ctx, "TYPE", "pubsub").Result()
		if err != nil || killed != 1 {
			t.Fatalf("round %d: CLIENT KILL TYPE pubsub = %d, %v; want 1", round, killed, err)
		}
		for i, key := range keys {
			waitFor(t, "subscription of "+key+" again", func() bool { return shardSubscribers(t, master, key) == 1 })
			// The new subscription's confirmation wakes the waiters (a
			// release while unsubscribed reached nobody); the next value
			// can only be a notice.
			wake(t, chans[i], "the confirmation of "+key+" again")
		}
		notices(t, other, keys, chans)
	}
}

// clusterNode returns the id of node in its cluster.
func clusterNode(t testing.TB, node *goredis.Client) string {
	t.Helper()
	id, err := node.Do(context.Background(), "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatalf("CLUSTER MYID on %s: %v", node.Options().Addr, err)
	}
	return id
}

// TestClusterNoticesAfterSlotMigration: when the slot of a subscribed
// channel moves to another master, the old one unsubscribes its clients
// from the channel (SUNSUBSCRIBE); the Resource must subscribe it on the
// new master, and keep its other channels.
func TestClusterNoticesAfterSlotMigration(t *testing.T) {
	srvs := clusterServers(t)
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: srvs})
	t.Cleanup(func() { _ = c.Close() })
	r, other := newResource(t, c), newResource(t, c)
	keys, src := keysOnOneMaster(t, c, 2)
	moved, stays := keys[0], keys[1]
	var nodes []*goredis.Client
	for _, a := range srvs {
		n := goredis.NewClient(&goredis.Options{Addr: a})
		t.Cleanup(func() { _ = n.Close() })
		nodes = append(nodes, n)
	}
	var chans []<-chan struct{}
	for _, key := range keys {
		ch, cancel := r.Subscribe(key)
		t.Cleanup(cancel)
		chans = append(chans, ch)
	}
	for i, key := range keys {
		waitFor(t, "subscription of "+key, func() bool { return shardSubscribers(t, src, key) == 1 })
		wake(t, chans[i], "the confirmation of "+key)
	}

	// Move the slot of moved's channel (no key lives in it) to another master.
	dst := moveSlot(t, c, nodes, moved, 0)
	waitFor(t, "the moved channel to be subscribed on its new master", func() bool { return shardSubscribers(t, dst, moved) == 1 })
	if n := shardSubscribers(t, src, moved); n != 0 {
		t.Errorf("the old master still has %d subscribers of the moved channel", n)
	}
	wake(t, chans[0], "the confirmation of the moved channel")
	waitFor(t, "the other channel to stay subscribed", func() bool { return shardSubscribers(t, src, stays) == 1 })
	notices(t, other, keys, chans)
}

// clusterServers starts a Redis Cluster for t and returns its masters'
// addresses.
func clusterServers(t testing.TB) []string {
	t.Helper()
	return testserver.RedisCluster(t).Addrs
}

// moveSlot moves the (empty) slot of key's release channel from its
// master to another one of nodes (the pick-th other, modulo), as an
// operator resharding would, and returns that master.
func moveSlot(t testing.TB, c *goredis.ClusterClient, nodes []*goredis.Client, key string, pick int) *goredis.Client {
	t.Helper()
	ctx := context.Background()
	slot, err := c.ClusterKeySlot(ctx, channelOf(key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	var src *goredis.Client
	for _, n := range nodes {
		if ownsSlot(t, n, slot) {
			src = n
		}
	}
	if src == nil {
		t.Fatalf("no master owns slot %d", slot)
	}
	var others []*goredis.Client
	for _, n := range nodes {
		if n != src {
			others = append(others, n)
		}
	}
	dst := others[pick%len(others)]
	srcID, dstID, s := clusterNode(t, src), clusterNode(t, dst), fmt.Sprint(slot)
	for _, step := range []struct {
		node *goredis.Client
		args []any
	}{
		{dst, []any{"CLUSTER", "SETSLOT", s, "IMPORTING", srcID}},
		{src, []any{"CLUSTER", "SETSLOT", s, "MIGRATING", dstID}},
		{dst, []any{"CLUSTER", "SETSLOT", s, "NODE", dstID}},
		{src, []any{"CLUSTER", "SETSLOT", s, "NODE", dstID}},
	} {
		if err := step.node.Do(ctx, step.args...).Err(); err != nil {
			t.Fatalf("%s on %s: %v", strings.Trim(fmt.Sprint(step.args), "[]"), step.node.Options().Addr, err)
		}
	}
	for _, n := range others {
		if n != dst {
			_ = n.Do(ctx, "CLUSTER", "SETSLOT", s, "NODE", dstID).Err()
		}
	}
	// As a resharding tool does, wait until every master agrees.
	waitFor(t, "every master to see the slot moved", func() bool {
		for _, n := range nodes {
			if slotOwner(t, n, slot) != dst.Options().Addr {
				return false
			}
		}
		return true
	})
	return dst
}

// slotOwner returns the address of the master serving slot as node sees
// it (CLUSTER SHARDS), "" when none.
func slotOwner(t testing.TB, node *goredis.Client, slot int64) string {
	t.Helper()
	shards, err := node.ClusterShards(context.Background()).Result()
	if err != nil {
		t.Fatalf("CLUSTER SHARDS on %s: %v", node.Options().Addr, err)
	}
	for _, s := range shards {
		for _, r := range s.Slots {
			if r.Start > slot || slot > r.End {
				continue
			}
			for _, n := range s.Nodes {
				if n.Role == "master" {
					return net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
				}
			}
		}
	}
	return ""
}

// ownsSlot reports whether node serves slot, by its own CLUSTER SLOTS.
func ownsSlot(t testing.TB, node *goredis.Client, slot int64) bool {
	return slotOwner(t, node, slot) == node.Options().Addr
}

// TestHubRandomized drives a Resource's subscriptions with random
// actions (seeded): waiters come and go on a few keys, the subscription
// connections are killed on the server, and (on Cluster) slots move
// between masters. Once the actions stop, the servers must be subscribed
// to exactly the channels someone waits for, once each (on Cluster, on
// the master serving each, since no other accepts it), and a release of
// each such key must wake all its waiters; once every waiter is gone,
// nothing may stay subscribed.
func TestHubRandomized(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("DISTLOCK_TEST_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("seed %d (DISTLOCK_TEST_SEED=%d reruns its choices)", seed, seed)
	for _, kind := range []string{"standalone", "cluster"} {
		t.Run(kind, func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(seed, 0))
			var (
				c       goredis.UniversalClient
				cc      *goredis.ClusterClient
				masters []*goredis.Client
			)
			if kind == "cluster" {
				addrs := clusterServers(t)
				cc = goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs})
				t.Cleanup(func() { _ = cc.Close() })
				c = cc
				for _, a := range addrs {
					n := goredis.NewClient(&goredis.Options{Addr: a})
					t.Cleanup(func() { _ = n.Close() })
					masters = append(masters, n)
				}
			} else {
				sc := standalone(t)
				c, masters = sc, []*goredis.Client{sc}
			}
			r, other := newResource(t, c), newResource(t, c)
			base := uniqueKey(t)
			keys := make([]string, 8)
			for i := range keys {
				keys[i] = fmt.Sprintf("%s-%d", base, i)
			}
			type sub struct {
				key    string
				ch     <-chan struct{}
				cancel func()
			}
			var subs []sub
			actions := map[string]int{}
			for range 300 {
				switch n := rnd.IntN(100); {
				case n < 45:
					k := keys[rnd.IntN(len(keys))]
					ch, cancel := r.Subscribe(k)
					subs = append(subs, sub{k, ch, cancel})
					actions["subscribe"]++
				case n < 85:
					if len(subs) == 0 {
						continue
					}
					i := rnd.IntN(len(subs))
					subs[i].cancel()
					subs = append(subs[:i], subs[i+1:]...)
					actions["cancel"]++
				case n < 95:
					m := masters[rnd.IntN(len(masters))]
					if err := m.ClientKillByFilter(context.Background(), "TYPE", "pubsub").Err(); err != nil {
						t.Fatalf("CLIENT KILL: %v", err)
					}
					actions["kill"]++
				default:
					if cc == nil {
						continue
					}
					moveSlot(t, cc, masters, keys[rnd.IntN(len(keys))], rnd.IntN(2))
					actions["move slot"]++
				}
				if d := rnd.IntN(3); d > 0 {
					time.Sleep(time.Duration(d) * time.Millisecond) // let the hub work between some actions
				}
			}
			t.Logf("actions: %v; %d waiters left", actions, len(subs))

			want := map[string]bool{}
			for _, s := range subs {
				want[channelOf(s.key)] = true
			}
			// What the servers are subscribed to: channel -> subscriptions.
			subscribed := func() map[string]int64 {
				got := map[string]int64{}
				for _, m := range masters {
					for _, k := range keys {
						ch := channelOf(k)
						var n map[string]int64
						var err error
						if cc != nil {
							n, err = m.PubSubShardNumSub(context.Background(), ch).Result()
						} else {
							n, err = m.PubSubNumSub(context.Background(), ch).Result()
						}
						if err != nil {
							t.Fatalf("NUMSUB: %v", err)
						}
						if n[ch] > 0 {
							got[ch] += n[ch]
						}
					}
				}
				return got
			}
			settled := func() bool {
				got := subscribed()
				for ch := range want {
					if got[ch] != 1 {
						return false
					}
				}
				return len(got) == len(want)
			}
			// After failures the hub backs off (up to retryMax): wait long.
			deadline := time.Now().Add(time.Minute)
			for !settled() {
				if time.Now().After(deadline) {
					t.Fatalf("subscriptions %v; want each of %v once", subscribed(), want)
				}
				time.Sleep(10 * time.Millisecond)
			}
			for k := range keys {
				var chans []<-chan struct{}
				for _, s := range subs {
					if s.key == keys[k] {
						chans = append(chans, s.ch)
					}
				}
				if len(chans) == 0 {
					continue
				}
				for range 2 { // see notices(): one wake-up may be a confirmation
					waitedCycle(t, other, keys[k])
					for _, ch := range chans {
						wake(t, ch, "a release notice of "+keys[k])
					}
				}
			}
			for _, s := range subs {
				s.cancel()
			}
			waitFor(t, "every subscription to end", func() bool { return len(subscribed()) == 0 })
		})
	}
}
