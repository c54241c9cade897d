package redlock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver/proxy"
	"github.com/distlock/distlock/redlock"
	"github.com/distlock/distlock/testsuite"
)

// TestRandomStallsAndCancels runs testsuite.RunRandomSpinStalls over three
// owners of five nodes behind proxies that delay requests at random (one
// in twenty past the node timeout: the round gives up on the node), while
// one node or a majority is frozen (SIGSTOP; the first, long freeze, a
// majority). Owners spin on their lease, each round storing a value of
// its own (redlock.Stored); the sampler reads every node directly.
func TestRandomStallsAndCancels(t *testing.T) {
	// The TTL is longer than the longest a request may take to run: the
	// proxy's delay (250ms at most) plus the longest freeze (1.5s), for a
	// request delivered to a node that then froze. A tombstone lives one
	// TTL: a request that runs later than that after its clean-up sets
	// the key (see the package doc).
	const (
		ttl         = 3 * time.Second
		nodeTimeout = 50 * time.Millisecond
	)
	run := 5 * time.Second
	if testing.Short() {
		run = 3 * time.Second
	}
	rnd := testsuite.NewRand(testSeed(t))
	// A small pool per node: a request that finds its connections busy
	// (a frozen node holds every one until the node timeout) waits for
	// one and gives up unsent, instead of dialling anew. With go-redis's
	// default (10 per core), a freeze leaves a pool of connections that
	// all time out and are dropped, every later request pays a dial and
	// a handshake through the proxy, and on a loaded machine (the race
	// detector, other tests) that no longer fits in the node timeout:
	// every round is abandoned from then on.
	c := startNodes(t, 5, func(o *goredis.Options) { o.PoolSize = 3 })
	c.loadScripts(t) // no round pays a NOSCRIPT and an EVAL
	var clients []goredis.UniversalClient
	for _, s := range c.servers {
		p, err := proxy.Start(s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		p.SetDelay(proxy.Up, func() time.Duration {
			if rnd.IntN(100) < 5 { // late: the round gives up on the node
				return nodeTimeout + rnd.Duration(4*nodeTimeout)
			}
			return rnd.Duration(time.Millisecond)
		})
		clients = append(clients, c.client(t, p.Addr))
	}
	var owners []backend.Spinner
	for range 3 {
		r, err := redlock.New(clients, redlock.WithNodeTimeout(nodeTimeout))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		owners = append(owners, r)
	}

	testsuite.RunRandomSpinStalls(t, testsuite.RandomSpinStalls{
		Clients: owners,
		Rand:    rnd,
		Run:     run,
		Keys:    2,
		TTL:     ttl,
		Context: 3 * nodeTimeout,
		Hold:    100 * time.Millisecond,
		Backoff: 10 * time.Millisecond,
		Spin:    true,
		Stored:  redlock.Stored,
		Freeze: func(long bool) func() {
			frozen := []int{rnd.IntN(5)}
			if long || rnd.IntN(2) == 0 {
				frozen = []int{0, 2, 4}
			}
			return c.stall(t, frozen...)
		},
		Sample: func(key string) []testsuite.SpinSample {
			var out []testsuite.SpinSample
			for i, in := range c.inspect {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				at := time.Now()
				v, err := in.Get(ctx, lockKey(key)).Result()
				cancel()
				if err == nil {
					out = append(out, testsuite.SpinSample{Where: fmt.Sprintf("node %d: %s", i, key), Value: v, At: at})
				}
			}
			return out
		},
		Linger: 6 * nodeTimeout, // the proxies' longest delay, and then some
	})
	if t.Failed() {
		// On a saturated machine replies come later than the node
		// timeout, go-redis drops each connection whose reply did not
		// come and dials anew, and rounds wait for a pooled connection
		// past their node timeout: every round is then abandoned.
		for i, cl := range clients {
			st := cl.(*goredis.Client).PoolStats()
			t.Logf("node %d's pool: %d connections, %d made (misses), %d stale, %d waits for a connection (%v in all)",
				i, st.TotalConns, st.Misses, st.StaleConns, st.WaitCount, time.Duration(st.WaitDurationNs))
		}
	}
}
