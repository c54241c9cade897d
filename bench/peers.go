package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
)

// errNotAcquired is what every peer's lock returns when its wait ran out
// with the key held by another owner: a timeout in the tables.
var errNotAcquired = errors.New("not acquired within the wait")

// peer is one lock library (or the bare floor) over one store: a row in
// every table. Peers register themselves in init functions (one file per
// store), so adding a backend or a library is one more registration.
type peer struct {
	name  string // "distlock", "floor", "redislock", ...
	store string // "redis", "etcd", "zookeeper", "postgres"
	// ref marks the peer the store's ratios are computed against: the
	// bare floor where there is one, else the store's own client recipe.
	ref bool
	// note says how the peer is configured, for the tables' footnotes.
	note string
	// renewal says how held locks stay alive ("" when they do not: the
	// lock lives for its TTL only).
	renewal string
	// hotspot is set on the distlock variant with the hotspot handler: it
	// runs only in the contended and scale workloads.
	hotspot bool
	// only, when set, lists the workloads the peer runs in (the memory
	// store: scale only); empty: every workload but the election.
	only []string
	// elects says the peer also runs in the election workload: its
	// instances campaign for the key when openOpts.election is set.
	elects bool
	// serverRequests says that counts.cmds counts the requests the store
	// received at the server (PostgreSQL's pg_stat_statements, etcd's
	// metrics, ZooKeeper's mntr), so that the scale workload takes them
	// from there; otherwise from counts.rt, the clients' count (Redis:
	// INFO commandstats counts the commands inside scripts too).
	serverRequests bool
	// open returns one instance, as one process would have it: its own
	// clients, sessions and connections.
	open func(ctx context.Context, s *servers, o openOpts) (instance, error)
	// hot, on a hotspot variant, returns the instance with the hotspot
	// handler registered for key.
	hot func(ctx context.Context, s *servers, o openOpts, key string) (instance, error)
	// counters returns the store's request counters (see counts).
	counters func(ctx context.Context, s *servers) (counts, error)
}

// openHot opens an instance for a workload on the hot key: with the
// hotspot handler on the hotspot variants.
func (p *peer) openHot(ctx context.Context, s *servers, o openOpts, key string) (instance, error) {
	if p.hot != nil {
		return p.hot(ctx, s, o, key)
	}
	return p.open(ctx, s, o)
}

// openOpts are the settings a workload asks of an instance.
type openOpts struct {
	ttl       time.Duration
	autoRenew bool          // distlock: WithAutoRenew (when the backend can)
	retry     time.Duration // sleep between attempts of peers that retry on a timer
	// handlers, when set, gives a distlock instance its handlers, made
	// for its resource (the hotspot variants).
	handlers func(res backend.RemoteResource) ([]distlock.Handler, error)
	// election makes a locker campaign for the key's election (the
	// election workload) instead of taking its mutex.
	election bool
}

// counts are a store's cumulative counters: rt counts requests the
// clients sent (round trips), cmds the commands the server executed
// (for Redis, the commands inside scripts too). Where the store counts
// only requests, the two are equal.
type counts struct{ rt, cmds int64 }

func (c counts) sub(d counts) counts { return counts{c.rt - d.rt, c.cmds - d.cmds} }

// instance is one process's lock client over a store.
type instance interface {
	// cycle acquires key (blocking, uncontended) and releases it. It may
	// keep per-key state to reuse, as a user of the library would.
	cycle(ctx context.Context, key string) error
	// worker returns a locker for one goroutine (etcd's Mutex needs a
	// session per goroutine; the others return the instance's own).
	worker(ctx context.Context) (locker, error)
	// waiting reports whether a lock call on key that started after mark
	// has tried once and now waits (see handoff).
	mark(key string) int64
	waiting(ctx context.Context, key string, mark int64) bool
	close() error
}

// locker acquires a key, waiting at most wait: errNotAcquired when the
// wait ran out.
type locker interface {
	lock(ctx context.Context, key string, wait time.Duration) (held, error)
}

// held is a lock a locker took, as its caller would keep it: the library's
// own handle where it has one (a pointer: no allocation to hold it), so
// that the heap a held lock costs is the library's.
type held interface {
	unlock(ctx context.Context) error
}

// runs reports whether the peer runs in workload w.
func (p *peer) runs(w string) bool {
	if w == wlElection && p.elects {
		return true
	}
	if len(p.only) == 0 {
		return w != wlElection
	}
	for _, o := range p.only {
		if o == w {
			return true
		}
	}
	return false
}

var registry []*peer

func register(p *peer) { registry = append(registry, p) }

// variantHooks derive more peers from the registered ones; they run once,
// after every init (which registers in file order).
var variantHooks []func()

func registerVariants() {
	for _, h := range variantHooks {
		h()
	}
	variantHooks = nil
}

// storeOrder is the order of the stores in tables.
var storeOrder = []string{"memory", "redis", "etcd", "zookeeper", "postgres", "mysql"}

func storeRank(s string) int {
	for i, n := range storeOrder {
		if n == s {
			return i
		}
	}
	return len(storeOrder)
}

// selectPeers returns the registered peers whose store is in stores and
// whose name is in names (empty: all), the reference of each store first.
func selectPeers(stores, names []string) ([]*peer, error) {
	in := func(list []string, s string) bool {
		if len(list) == 0 {
			return true
		}
		for _, x := range list {
			if x == s {
				return true
			}
		}
		return false
	}
	var out []*peer
	for _, p := range registry {
		if in(stores, p.store) && (in(names, p.name) || (p.ref && len(names) > 0)) {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no peer matches -store %v -peer %v; known: %s", stores, names, peerList())
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.store != b.store {
			return storeRank(a.store) < storeRank(b.store)
		}
		return a.ref && !b.ref
	})
	return out, nil
}

func peerList() string {
	s := ""
	for i, p := range registry {
		if i > 0 {
			s += ", "
		}
		s += p.store + "/" + p.name
	}
	return s
}

// byStore groups peers by store, keeping their order.
func byStore(ps []*peer) [][]*peer {
	var groups [][]*peer
	for _, p := range ps {
		if n := len(groups); n > 0 && groups[n-1][0].store == p.store {
			groups[n-1] = append(groups[n-1], p)
			continue
		}
		groups = append(groups, []*peer{p})
	}
	return groups
}

// floorValues makes a bare floor's owner values: the instance's random
// prefix (values are unique across instances) and a counter.
type floorValues struct {
	prefix string
	n      atomic.Uint64
}

func newFloorValues() floorValues {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return floorValues{prefix: hex.EncodeToString(b[:])}
}

// value is a fresh owner value, built with one allocation.
func (v *floorValues) value() string {
	b := make([]byte, 0, 40)
	b = append(b, v.prefix...)
	return string(strconv.AppendUint(b, v.n.Add(1), 16))
}
