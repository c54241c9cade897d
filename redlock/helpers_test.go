package redlock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/internal/testserver/proxy"
	"github.com/distlock/distlock/redlock"
)

// cluster is N independent Redis nodes for one top-level test, with a
// client per node for the Resource under test and one for the test's own
// checks (short timeouts, honoured: a paused node never blocks a check).
type cluster struct {
	servers []*testserver.RedisServer
	clients []goredis.UniversalClient
	inspect []*goredis.Client
	opt     func(*goredis.Options) // how clients are configured
}

// startNodes starts n Redis servers, and a client for each configured by
// opt. The defaults: ContextTimeoutEnabled, as the package doc recommends,
// and one dial attempt, so that a killed node fails at once rather than
// after go-redis's dial retries.
func startNodes(t testing.TB, n int, opt func(*goredis.Options)) *cluster {
	t.Helper()
	c := &cluster{servers: testserver.RedisNodes(t, n), opt: opt}
	for _, s := range c.servers {
		cl := c.client(t, s.Addr)
		in := goredis.NewClient(&goredis.Options{Addr: s.Addr, ContextTimeoutEnabled: true, DialerRetries: 1,
			MaxRetries: -1, ReadTimeout: time.Second, WriteTimeout: time.Second})
		t.Cleanup(func() { _ = in.Close() })
		c.clients = append(c.clients, cl)
		c.inspect = append(c.inspect, in)
	}
	return c
}

// client returns a client of addr configured as c's clients are, closed
// when t ends.
func (c *cluster) client(t testing.TB, addr string) *goredis.Client {
	o := &goredis.Options{Addr: addr, ContextTimeoutEnabled: true, DialerRetries: 1}
	if c.opt != nil {
		c.opt(o)
	}
	cl := goredis.NewClient(o)
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// viaProxy puts a proxy in front of node i for the Resources created
// after it: c.clients[i] then goes through the proxy (the checks do not).
func (c *cluster) viaProxy(t testing.TB, i int) *proxy.Proxy {
	t.Helper()
	p, err := proxy.Start(c.servers[i].Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c.clients[i] = c.client(t, p.Addr)
	return p
}

// direct returns a Resource of another owner over the check clients,
// which reach every node directly.
func (c *cluster) direct(t testing.TB, opts ...redlock.Option) *redlock.Resource {
	t.Helper()
	cs := make([]goredis.UniversalClient, len(c.inspect))
	for i, in := range c.inspect {
		cs[i] = in
	}
	r, err := redlock.New(cs, opts...)
	if err != nil {
		t.Fatalf("redlock.New: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// newResource returns a Resource over c's nodes, closed when t ends.
func (c *cluster) newResource(t testing.TB, opts ...redlock.Option) *redlock.Resource {
	t.Helper()
	r, err := redlock.New(c.clients, opts...)
	if err != nil {
		t.Fatalf("redlock.New: %v", err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

// stall freezes the nodes listed (SIGSTOP) and returns what resumes them
// (SIGCONT), once, also registered with t.Cleanup.
func (c *cluster) stall(t testing.TB, nodes ...int) func() {
	t.Helper()
	for _, i := range nodes {
		c.servers[i].Pause()
	}
	var once sync.Once
	resume := func() {
		once.Do(func() {
			for _, i := range nodes {
				c.servers[i].Resume()
			}
		})
	}
	t.Cleanup(resume)
	return resume
}

// lockKey is the Redis key of lock key under the default prefix.
func lockKey(key string) string {
	lock, _ := redisscript.Layout(redlock.DefaultPrefix, key)
	return lock
}

// values returns what each node holds under key's lock ("" when absent),
// or "<down>" for a node that does not answer within a second.
func (c *cluster) values(t testing.TB, key string) []string {
	t.Helper()
	out := make([]string, len(c.inspect))
	for i, cl := range c.inspect {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		v, err := cl.Get(ctx, lockKey(key)).Result()
		cancel()
		switch {
		case err == goredis.Nil:
		case err != nil:
			out[i] = "<down>"
		default:
			out[i] = v
		}
	}
	return out
}

// valueOn returns what node i holds under key's lock ("" when absent or
// on error).
func (c *cluster) valueOn(key string, i int) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	v, _ := c.inspect[i].Get(ctx, lockKey(key)).Result()
	return v
}

// ours reports whether v, what a node holds under a lock, is value or
// was stored by a round of the acquisition with owner value value (each
// round stores a value of its own made from the owner value).
func ours(v, value string) bool {
	return v == value || strings.HasPrefix(v, value+"#")
}

// count returns how many nodes hold value, or a value of owner value (of
// any of its rounds), under key's lock.
func (c *cluster) count(t testing.TB, key, value string) int {
	t.Helper()
	n := 0
	for _, v := range c.values(t, key) {
		if ours(v, value) {
			n++
		}
	}
	return n
}

// noneHoldNow fails t if any node holds a value of owner value under
// key's lock now.
func (c *cluster) noneHoldNow(t testing.TB, key, value string) {
	t.Helper()
	for i, v := range c.values(t, key) {
		if ours(v, value) {
			t.Errorf("node %d still holds our value under %q", i, key)
		}
	}
}

// noneHold waits until no node holds a value of owner value under key's
// lock: a release returns once a majority deleted it, the others follow
// in the background.
func (c *cluster) noneHold(t testing.TB, key, value string) {
	t.Helper()
	waitFor(t, "no node to hold our value under "+key, func() bool { return c.count(t, key, value) == 0 })
}

// eventually waits until cond holds for what the nodes hold under key's
// lock: an acquire returns once a majority set it, the others follow.
func (c *cluster) eventually(t testing.TB, key, what string, cond func(values []string) bool) {
	t.Helper()
	waitFor(t, what, func() bool { return cond(c.values(t, key)) })
}

// hold sets key's lock to value with ttl on the nodes listed, as another
// owner would.
func (c *cluster) hold(t testing.TB, key, value string, ttl time.Duration, nodes ...int) {
	t.Helper()
	for _, i := range nodes {
		if err := c.inspect[i].Set(context.Background(), lockKey(key), value, ttl).Err(); err != nil {
			t.Fatalf("SET on node %d: %v", i, err)
		}
	}
}

// del deletes key's lock on the nodes listed.
func (c *cluster) del(t testing.TB, key string, nodes ...int) {
	t.Helper()
	for _, i := range nodes {
		if err := c.inspect[i].Del(context.Background(), lockKey(key)).Err(); err != nil {
			t.Fatalf("DEL on node %d: %v", i, err)
		}
	}
}

// uniqueKey is t's name plus random hex, so tests never share a key.
func uniqueKey(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return t.Name() + "-" + hex.EncodeToString(b[:])
}

func newLease(key string, ttl time.Duration) *backend.Lease {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return &backend.Lease{Key: key, Value: hex.EncodeToString(b[:]), TTL: ttl}
}

// waitFor polls cond every few ms until it holds or 10s pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func nodes(idx ...int) []int { return idx }

func describe(v []string) string { return fmt.Sprintf("%q", v) }

// testSeed returns the seed of a randomized test: $DISTLOCK_TEST_SEED
// when set, else the time; it logs it, so that a failure can be rerun.
func testSeed(t testing.TB) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("DISTLOCK_TEST_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("seed %d (DISTLOCK_TEST_SEED=%d reruns it)", seed, seed)
	return seed
}
