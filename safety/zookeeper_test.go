package safety

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/internal/testserver/proxy"
	"github.com/distlock/distlock/safety/harness"
	"github.com/distlock/distlock/safety/history"
	"github.com/distlock/distlock/zookeeper"
)

const (
	zkTTL     = 500 * time.Millisecond
	zkSession = time.Second
)

// zkTarget is ZooKeeper at addrs. A ZooKeeper lock's TTL is enforced by
// its holder's process; a frozen holder's lock is freed by the server
// when the session times out.
func zkTarget(t testing.TB, addrs []string) target {
	conn, events, err := zk.Connect(addrs, 10*time.Second, zk.WithLogger(quietZK{}))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range events {
		}
	}()
	t.Cleanup(conn.Close)
	return target{
		name:    "zookeeper",
		backend: harness.Backend{Kind: "zookeeper", Addrs: addrs, SessionTimeout: zkSession},
		ttl:     zkTTL,
		expiry:  zkSession,
		hold:    100 * time.Millisecond,
		server:  addrs[0],
		via: func(hp string) harness.Backend {
			return harness.Backend{Kind: "zookeeper", Addrs: []string{hp}, SessionTimeout: zkSession}
		},
		leftovers: func(ctx context.Context, key string) ([]string, error) {
			// Our keys are letters, digits and '-': they stand for
			// themselves in the znode name. The key's mutex, semaphore
			// and read/write lock queue under parents of their own.
			var left []string
			for _, parent := range []string{key, key + "%sem", key + "%rw"} {
				children, _, err := conn.Children(zookeeper.DefaultRoot + "/" + parent)
				if errors.Is(err, zk.ErrNoNode) {
					continue
				} else if err != nil {
					return nil, err
				}
				left = append(left, children...)
			}
			return left, nil
		},
		token: func(ctx context.Context, key, entry string) (uint64, error) {
			// The token of a grant is its znode's czxid.
			for _, parent := range []string{key, key + "%sem", key + "%rw"} {
				ok, st, err := conn.Exists(zookeeper.DefaultRoot + "/" + parent + "/" + entry)
				if err != nil {
					return 0, err
				}
				if ok {
					return uint64(st.Czxid), nil
				}
			}
			return 0, fmt.Errorf("no znode %s under %s", entry, key)
		},
	}
}

type quietZK struct{}

func (quietZK) Printf(string, ...any) {}

func TestZooKeeper(t *testing.T) {
	srv := testserver.ZooKeeper(t)
	tg := zkTarget(t, []string{srv.Addr})
	t.Run("NoFault", func(t *testing.T) { testNoFault(t, tg) })
	t.Run("HolderPause", func(t *testing.T) { testHolderPause(t, tg) })
	t.Run("WaiterExpiredWhileQueued", func(t *testing.T) { testWaiterExpiredWhileQueued(t, tg) })
	t.Run("Partition", func(t *testing.T) { testPartition(t, tg) })
	t.Run("SilentPartition", func(t *testing.T) { testZKSilentPartition(t, tg) })
	t.Run("CancelStorm", func(t *testing.T) { testCancelStorm(t, tg) })
	t.Run("ServerPause", func(t *testing.T) { testServerPause(t, tg, srv) })
	t.Run("StoreStalled", func(t *testing.T) { testZKStalled(t, tg, srv) })
	t.Run("SemaphoreSilentPartition", func(t *testing.T) { testZKKindSilentPartition(t, tg, "semaphore") })
	t.Run("RWMutexSilentPartition", func(t *testing.T) { testZKKindSilentPartition(t, tg, "write") })
}

func TestZooKeeperEnsemble(t *testing.T) {
	ens := testserver.ZooKeeperEnsemble(t, 3)
	tg := zkTarget(t, ens.Addrs)
	testLeaderKill(t, tg, cluster{
		leader: ens.Leader,
		kill:   func(i int) { ens.Members[i].Kill() },
		start:  func(i int) { ens.Members[i].Start() },
	})
}

// testZKSilentPartition stalls the path between the holder and the server
// both ways for 3x the session timeout, with the connections left open, as
// a partition does that sends no reset: the client notices only when its
// receive timeout (2/3 of the session timeout) runs out. The holder's TTL
// is ten session timeouts (auto-renewed), so that the session alone tells
// the loss. The server expires the session one session timeout after it
// last heard from the holder, and a waiter gets the lock: the holder's
// Done must have closed by then (zookeeper.WithSessionTimeout counts from
// the last request the server answered).
func testZKSilentPartition(t *testing.T, tg target) {
	p := startProxy(t, tg.server)
	r := harness.NewRun(t)
	key := uniqueKey(t)
	hcfg := mixConfig(tg, key, 0)
	hcfg.Name, hcfg.Cycles, hcfg.Ops, hcfg.Hold, hcfg.Zombie = "holder", 1, 10000, 100*tg.expiry, true
	hcfg.TTL = 10 * tg.expiry
	hcfg.Backend = tg.via(p.Addr)
	holder := r.Worker(hcfg)
	if _, err := holder.WaitLine("acquired", 0, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "the holder's first write", func() bool { return accepted(r, "holder-", 0) })
	wcfg := mixConfig(tg, key, 1)
	wcfg.Name = "waiter"
	waiter := r.Worker(wcfg)
	if _, err := waiter.WaitLine("ready", 0, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	cutAt := r.Note("stall the holder's path both ways")
	p.Stall(proxy.Up)
	p.Stall(proxy.Down)
	if _, err := holder.WaitLine("lost", 0, 30*tg.expiry+30*time.Second); err != nil {
		t.Fatalf("the silenced holder's Done did not close: %v", err)
	}
	if _, err := waiter.WaitLine("acquired", 0, 30*tg.expiry+30*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Duration(cutAt+int64(3*tg.expiry)-history.Now()) * time.Nanosecond; d > 0 {
		time.Sleep(d) // the fault's length
	}
	r.Note("unstall")
	p.Unstall(proxy.Up)
	p.Unstall(proxy.Down)
	waitAcquisitions(t, tg, 3, waiter)
	stopAll(t, tg, holder, waiter)

	evs := r.History()
	res := harness.Check(t, tg.name, "holder's path silent (proxy stalls both ways, connections open) 3x expiry, TTL 10x expiry", evs)
	res.Orphans = orphans(t, tg, key)
	lost, _ := lostOf(evs, "holder-0")
	res.LossLatency = time.Duration(lost.At - cutAt)
	var grant history.Event
	for _, e := range evs {
		if e.Kind == history.Acquire && e.Err == "" && e.Proc == "waiter" {
			grant = e
			break
		}
	}
	res.Recovery = time.Duration(grant.Return - cutAt)
	res.Notes = fmt.Sprintf("loss latency and recovery from the stall; Done closed %v before the waiter's grant returned",
		time.Duration(grant.Return-lost.At).Round(10*time.Microsecond))
	res.Log(t)
	assertSafe(t, res)
	assertNoOverlap(t, res)
	if len(res.TokenIssues) != 0 || res.Linearizable != porcupine.Ok {
		t.Errorf("tokens: %d issues, porcupine %v; want none, Ok", len(res.TokenIssues), res.Linearizable)
	}
	if lost.At > grant.Return {
		t.Errorf("the waiter was granted the lock %v before the holder's Done closed", time.Duration(lost.At-grant.Return))
	}
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}

// testZKKindSilentPartition is testZKSilentPartition for a semaphore of 2
// (lock "semaphore") or a read/write lock (lock "write": the holder is a
// writer): the holder, reaching the server through a proxy, is silenced
// (both ways, connections open) for 3x the session timeout while three
// workers (semaphore: permits of the same semaphore; read/write lock: two
// readers and a writer) take the lock again and again. The server
// expires the holder's session and lets the others in: the holder's Done
// must close first, so that never more than 2 permits are held at once,
// and never a writer with another holder; its write once lost (with its
// old token) must not be accepted after a newer holder's; nothing is left
// behind.
func testZKKindSilentPartition(t *testing.T, tg target, lock string) {
	const limit = 2
	p := startProxy(t, tg.server)
	r := harness.NewRun(t)
	key := uniqueKey(t)
	hcfg := mixConfig(tg, key, 0)
	hcfg.Name, hcfg.Cycles, hcfg.Ops, hcfg.Hold, hcfg.Zombie = "holder", 1, 10000, 100*tg.expiry, true
	hcfg.TTL = 10 * tg.expiry
	hcfg.Backend = tg.via(p.Addr)
	hcfg.Lock, hcfg.Limit = lock, limit
	holder := r.Worker(hcfg)
	if _, err := holder.WaitLine("acquired", 0, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "the holder's first write", func() bool { return accepted(r, "holder-", 0) })
	var ws []*harness.Worker
	for i := range 3 {
		c := mixConfig(tg, key, i+1)
		c.Lock, c.Limit = lock, limit
		if lock == "write" && i < 2 {
			c.Lock = "read"
		}
		ws = append(ws, r.Worker(c))
	}
	if lock == "semaphore" {
		waitAcquisitions(t, tg, 3, ws...) // the other permit goes round
	} else {
		waitUntil(t, 60*time.Second, "the others to queue behind the writer", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			left, err := tg.leftovers(ctx, key)
			return err == nil && len(left) == 4
		})
	}
	cutAt := r.Note("stall the holder's path both ways")
	p.Stall(proxy.Up)
	p.Stall(proxy.Down)
	if _, err := holder.WaitLine("lost", 0, 30*tg.expiry+30*time.Second); err != nil {
		t.Fatalf("the silenced holder's Done did not close: %v", err)
	}
	if d := time.Duration(cutAt+int64(3*tg.expiry)-history.Now()) * time.Nanosecond; d > 0 {
		time.Sleep(d) // the fault's length
	}
	r.Note("unstall")
	p.Unstall(proxy.Up)
	p.Unstall(proxy.Down)
	waitAcquisitions(t, tg, 6, ws...)
	stopAll(t, tg, append(ws, holder)...)

	evs := r.History()
	what := map[string]string{"semaphore": "semaphore of 2", "write": "read/write lock, a writer"}[lock]
	res := harness.Check(t, tg.name, what+": holder's path silent (proxy stalls both ways) 3x expiry, TTL 10x expiry", evs)
	res.Orphans = orphans(t, tg, key)
	lost, _ := lostOf(evs, "holder-0")
	res.LossLatency = time.Duration(lost.At - cutAt)
	if first, ok := firstAcquisitionAfter(evs, lost.At); ok {
		res.Recovery = time.Duration(first.Return - cutAt)
	}
	res.Notes = fmt.Sprintf("at most %d holders at once; loss latency and recovery from the stall", res.MostHolders)
	res.Log(t)
	if len(res.Stale) != 0 {
		t.Errorf("%d stale writes accepted; want 0", len(res.Stale))
	}
	if len(res.Overlaps) != 0 {
		t.Errorf("%d overlaps of a writer with another holder; want 0: %v", len(res.Overlaps), res.Overlaps[0])
	}
	if lock == "semaphore" && res.MostHolders > limit {
		t.Errorf("%d holders of a semaphore of %d at once", res.MostHolders, limit)
	}
	if lock == "semaphore" && res.MostHolders < 2 {
		t.Errorf("never more than %d holder at once: the semaphore admitted one at a time", res.MostHolders)
	}
	if len(res.TokenIssues) != 0 {
		t.Errorf("%d token issues; want 0: %v", len(res.TokenIssues), res.TokenIssues[0])
	}
	if res.Counter.Lost != 0 {
		t.Errorf("%d increments lost; want 0", res.Counter.Lost)
	}
	if res.Acquisitions == 0 {
		t.Error("no acquisitions: the run measured nothing")
	}
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}

// testZKStalled runs the stalled-store scenario against the server,
// frozen by SIGSTOP, in two rounds with a 3s session: a stall of 1s, which
// the connections ride (go-zookeeper's receive timeout is 2s), and one of
// 2.5s, after which they reconnect (a create in flight then has no reply).
func testZKStalled(t *testing.T, tg target, srv *testserver.ZooKeeperServer) {
	b := tg.backend
	b.SessionTimeout = 3 * time.Second
	conn, events, err := zk.Connect(tg.backend.Addrs, 10*time.Second, zk.WithLogger(quietZK{}))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range events {
		}
	}()
	t.Cleanup(conn.Close)
	head := func(ctx context.Context, key string) (string, error) {
		parent := zookeeper.DefaultRoot + "/" + key
		children, _, err := conn.Children(parent)
		if errors.Is(err, zk.ErrNoNode) || err == nil && len(children) == 0 {
			return "", nil
		} else if err != nil {
			return "", err
		}
		first := slices.MinFunc(children, func(a, b string) int { return strings.Compare(a[len(a)-10:], b[len(b)-10:]) })
		data, _, err := conn.Get(parent + "/" + first)
		if errors.Is(err, zk.ErrNoNode) {
			return "", nil
		}
		return string(data), err
	}
	testStalledStore(t, tg, b, []time.Duration{time.Second, 2500 * time.Millisecond}, func() func() {
		srv.Pause()
		var once sync.Once
		resume := func() { once.Do(srv.Resume) }
		t.Cleanup(resume)
		return resume
	}, head)
}
