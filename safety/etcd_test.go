package safety

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/distlock/distlock/etcd"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/internal/testserver/proxy"
	"github.com/distlock/distlock/safety/harness"
	"github.com/distlock/distlock/safety/history"
)

// etcdTTL is etcd's shortest lease: whole seconds, and at least 1.5
// election timeouts (2s with the default 1s).
const etcdTTL = 2 * time.Second

func etcdTarget(t testing.TB, endpoints []string) (target, *clientv3.Client) {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	res, err := etcd.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = res.Close(); _ = c.Close() })
	return target{
		name:    "etcd",
		backend: harness.Backend{Kind: "etcd", Addrs: endpoints, Timeout: 5 * time.Second},
		ttl:     etcdTTL,
		expiry:  etcdTTL,
		hold:    100 * time.Millisecond,
		server:  strings.TrimPrefix(endpoints[0], "http://"),
		via: func(hp string) harness.Backend {
			return harness.Backend{Kind: "etcd", Addrs: []string{"http://" + hp}, Timeout: 5 * time.Second}
		},
		leftovers: res.Leftovers,
		token: func(ctx context.Context, _, entry string) (uint64, error) {
			// The token of a grant is its queue key's create revision.
			resp, err := c.Get(ctx, entry)
			if err != nil {
				return 0, err
			}
			if len(resp.Kvs) != 1 {
				return 0, fmt.Errorf("no key %s", entry)
			}
			return uint64(resp.Kvs[0].CreateRevision), nil
		},
	}, c
}

func TestEtcd(t *testing.T) {
	srv := testserver.Etcd(t)
	tg, c := etcdTarget(t, srv.Endpoints)
	t.Run("NoFault", func(t *testing.T) { testNoFault(t, tg) })
	t.Run("HolderPause", func(t *testing.T) { testHolderPause(t, tg) })
	t.Run("WaiterExpiredWhileQueued", func(t *testing.T) { testWaiterExpiredWhileQueued(t, tg) })
	t.Run("WaiterLeaseRevoked", func(t *testing.T) { testEtcdWaiterLeaseRevoked(t, tg, c) })
	t.Run("Partition", func(t *testing.T) { testPartition(t, tg) })
	t.Run("HolderLeaseRevoked", func(t *testing.T) {
		testEtcdHolderEndedFromOutside(t, tg, "holder's own lease revoked from outside", func(ctx context.Context, key string) error {
			resp, err := c.Get(ctx, key)
			if err != nil || len(resp.Kvs) != 1 {
				return fmt.Errorf("the holder's key %s: %v", key, err)
			}
			_, err = c.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
			return err
		})
	})
	t.Run("HolderKeyDeleted", func(t *testing.T) {
		testEtcdHolderEndedFromOutside(t, tg, "holder's key deleted from outside (lease of its own)", func(ctx context.Context, key string) error {
			_, err := c.Delete(ctx, key)
			return err
		})
	})
	t.Run("CancelStorm", func(t *testing.T) { testCancelStorm(t, tg) })
	// On the shared lease (auto-renewed locks), an orphan left by
	// a clean-up that failed mid-flight would block the key for as long as
	// the Resource lives. (On leases of their own the client retries a
	// failed revoke by itself; the storm with drops found nothing there.)
	t.Run("CancelStormDropsSharedLease", func(t *testing.T) { runCancelStorm(t, tg, storm{drops: true, autoRenew: true}) })
	// Calls bounded by their context and wait while the store
	// does not answer, abandoned attempts cleaned up, none granted late.
	t.Run("StoreStalled", func(t *testing.T) { testEtcdStalled(t, tg, c, srv, false) })
	t.Run("StoreStalledSharedLease", func(t *testing.T) { testEtcdStalled(t, tg, c, srv, true) })
	t.Run("ConnectionStalled", func(t *testing.T) { testEtcdConnectionStalled(t, tg, c) })
	// A server stall that ends in the last third of an
	// auto-renewed lock's lease loses nothing.
	t.Run("StoreStalledLastThird", func(t *testing.T) { testEtcdStallLastThird(t, tg, srv) })
	// A semaphore and a read/write lock, a holder's connection
	// stalled past its lease.
	t.Run("SemaphoreHolderStalled", func(t *testing.T) { testEtcdSemaphoreStalled(t, tg) })
	t.Run("RWMutexWriterStalled", func(t *testing.T) { testEtcdRWStalled(t, tg) })
}

// etcdHead returns the owner value of key's holder (the oldest key of its
// queue), "" when nobody holds it.
func etcdHead(c *clientv3.Client) func(ctx context.Context, key string) (string, error) {
	return func(ctx context.Context, key string) (string, error) {
		resp, err := c.Get(ctx, etcd.DefaultPrefix+etcdEncode(key)+"/", clientv3.WithFirstCreate()...)
		if err != nil || len(resp.Kvs) == 0 {
			return "", err
		}
		return string(resp.Kvs[0].Value), nil
	}
}

// etcdEncode is the etcd package's key escaping, for keys made of
// unreserved bytes and '.' only, as uniqueKey's are; others panic.
func etcdEncode(key string) string {
	for _, c := range []byte(key) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~') {
			panic(fmt.Sprintf("etcdEncode: key %q needs escaping", key))
		}
	}
	return key
}

// testEtcdStalled runs the stalled-store scenario against the server,
// frozen by SIGSTOP (its connections stay open, nothing answers), in two
// rounds: 1s, and 2.5s, longer than etcd's shortest lease. shared puts
// every lock on the Resource's shared lease, where a key an abandoned
// attempt made would live as long as the Resource.
func testEtcdStalled(t *testing.T, tg target, c *clientv3.Client, srv *testserver.EtcdServer, shared bool) {
	b := tg.backend
	b.SharedLease = shared
	testStalledStore(t, tg, b, []time.Duration{time.Second, 2500 * time.Millisecond}, func() func() {
		srv.Pause()
		var once sync.Once
		resume := func() { once.Do(srv.Resume) }
		t.Cleanup(resume)
		return resume
	}, etcdHead(c))
}

// testEtcdConnectionStalled runs the stalled-store scenario with the
// connection stalled instead of the server: the clients reach the server through a proxy that
// stops forwarding, both ways, while the server itself runs on.
func testEtcdConnectionStalled(t *testing.T, tg target, c *clientv3.Client) {
	p := startProxy(t, tg.server)
	testStalledStore(t, tg, tg.via(p.Addr), []time.Duration{time.Second, 2500 * time.Millisecond}, func() func() {
		p.Stall(proxy.Up)
		p.Stall(proxy.Down)
		var once sync.Once
		resume := func() { once.Do(func() { p.Unstall(proxy.Up); p.Unstall(proxy.Down) }) }
		t.Cleanup(resume)
		return resume
	}, etcdHead(c))
}

func TestEtcdCluster(t *testing.T) {
	cl := testserver.EtcdCluster(t, 3)
	tg, _ := etcdTarget(t, cl.Endpoints())
	testLeaderKill(t, tg, cluster{
		leader: cl.Leader,
		kill:   func(i int) { cl.Members[i].Kill() },
		start:  func(i int) { cl.Members[i].Start() },
	})
}

// testEtcdWaiterLeaseRevoked revokes a queued waiter's lease from outside
// (an operator, or a lease lost to the server) while the waiter is
// running and watching its predecessor: its key goes with the lease, and
// when the holder lets go the waiter must not be granted the lock.
func testEtcdWaiterLeaseRevoked(t *testing.T, tg target, c *clientv3.Client) {
	r := harness.NewRun(t)
	key := uniqueKey(t)
	hcfg := mixConfig(tg, key, 0)
	hcfg.Name, hcfg.Cycles, hcfg.Ops, hcfg.Hold = "holder", 1, 1000, 1000*tg.ttl
	holder := r.Worker(hcfg)
	if _, err := holder.WaitLine("acquired", 0, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	wcfg := mixConfig(tg, key, 1)
	wcfg.Name, wcfg.Cycles, wcfg.Wait = "waiter", 1, 10*time.Minute
	waiter := r.Worker(wcfg)
	ctx := t.Context()
	var queued []string
	waitUntil(t, 60*time.Second, "the waiter to queue", func() bool {
		queued, _ = tg.leftovers(ctx, key)
		return len(queued) == 2
	})
	resp, err := c.Get(ctx, queued[1])
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the waiter's key %s: %v", queued[1], err)
	}
	r.Note("revoke the waiter's lease")
	if _, err := c.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "the waiter's key to go", func() bool {
		left, _ := tg.leftovers(ctx, key)
		return len(left) == 1
	})
	holder.Stop(60 * time.Second)
	waiter.Stop(60 * time.Second)

	evs := r.History()
	res := harness.Check(t, tg.name, "queued waiter's lease revoked from outside", evs)
	res.Orphans = orphans(t, tg, key)
	res.Log(t)
	assertSafe(t, res)
	assertNoOverlap(t, res)
	granted := false
	for _, e := range evs {
		if e.Kind == history.Acquire && e.Proc == "waiter" {
			if e.Err == "" {
				granted = true
			}
			t.Logf("the waiter's acquisition: %q", e.Err)
		}
	}
	if granted {
		t.Errorf("the waiter whose lease was revoked was granted the lock")
	}
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}

// testEtcdHolderEndedFromOutside ends a running holder's lock from outside
// (end: its lease revoked, or its key deleted, by an operator or a tool)
// while a waiter queues. The holder takes the lock without auto-renewal,
// so on a lease of its own with a TTL far longer than the test: it must
// learn of the loss through Lost (a watch), not at its TTL. It writes every
// 2s and the fault comes right after its first write, so that an overlap
// of the few milliseconds before it learns holds no write of its (the
// fence would catch it, but the table counts it uncaught); after the loss
// it writes once more with its old token. An increment it has under way
// when it learns is written back after its holding ended: the unfenced
// counter's damage, counted but not held against the run.
func testEtcdHolderEndedFromOutside(t *testing.T, tg target, fault string, end func(ctx context.Context, key string) error) {
	r := harness.NewRun(t)
	key := uniqueKey(t)
	hcfg := mixConfig(tg, key, 0)
	hcfg.Name, hcfg.Cycles, hcfg.AutoRenew, hcfg.Zombie = "holder", 1, false, true
	hcfg.TTL, hcfg.Ops, hcfg.Hold = time.Minute, 30, time.Minute
	holder := r.Worker(hcfg)
	if _, err := holder.WaitLine("acquired", 0, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "the holder's first write", func() bool { return accepted(r, "holder-", 0) })
	wcfg := mixConfig(tg, key, 1)
	wcfg.Name = "waiter"
	waiter := r.Worker(wcfg)
	ctx := t.Context()
	var queued []string
	waitUntil(t, 60*time.Second, "the waiter to queue", func() bool {
		queued, _ = tg.leftovers(ctx, key)
		return len(queued) == 2
	})
	endAt := r.Note(fault)
	if err := end(ctx, queued[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.WaitLine("lost", 0, 20*time.Second); err != nil {
		t.Fatalf("the holder did not see its Done closed within 20s of its lock's end (its TTL is %v): %v", hcfg.TTL, err)
	}
	waitAcquisitions(t, tg, 3, waiter)
	stopAll(t, tg, holder, waiter)

	evs := r.History()
	res := harness.Check(t, tg.name, fault, evs)
	res.Orphans = orphans(t, tg, key)
	lost, _ := lostOf(evs, "holder-0")
	res.LossLatency = time.Duration(lost.At - endAt)
	if first, ok := firstAcquisitionAfter(evs, endAt); ok {
		res.Recovery = time.Duration(first.Return - endAt)
	}
	res.Notes = "holder without auto-renew, TTL 1m; loss latency and recovery from the fault"
	res.Log(t)
	if len(res.Stale) != 0 {
		t.Errorf("%d stale writes accepted; want 0", len(res.Stale))
	}
	if len(res.Uncaught) != 0 {
		t.Errorf("%d overlaps not caught by the token: %v", len(res.Uncaught), res.Uncaught[0])
	}
	if len(res.TokenIssues) != 0 || res.Linearizable != porcupine.Ok {
		t.Errorf("tokens: %d issues, porcupine %v; want none, Ok", len(res.TokenIssues), res.Linearizable)
	}
	if lost.At == 0 || time.Duration(lost.At-endAt) > hcfg.TTL/2 {
		t.Errorf("the holder's Done closed %v after the fault; want it long before its TTL (%v)", time.Duration(lost.At-endAt), hcfg.TTL)
	}
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}

// testEtcdStallLastThird freezes the server (SIGSTOP) just after a
// renewal of the lease that keeps an auto-renewed holder's lock (its
// process's shared lease, granted with the lock: it lives the TTL, 2s,
// and is renewed every third of it), for 73% of the lease's life: the
// stall ends in the lease's last third, before the lease can expire on
// the server. The holder must keep its lock (Done open, its writes
// accepted), and a waiter started after the stall must get the lock only
// once the holder released it. Several trials, a fresh holder each (its
// lease granted as it acquires, so that its renewals' times are known).
func testEtcdStallLastThird(t *testing.T, tg target, srv *testserver.EtcdServer) {
	r := harness.NewRun(t)
	key := uniqueKey(t)
	life := tg.ttl           // a lease of auto-renewed locks alone lives their TTL
	period := life / 3       // and is renewed every third of it
	stall := life * 73 / 100 // ends in the lease's last third
	trials := 3 * soak
	lost := 0
	var answeredAt []int64
	for i := range trials {
		hcfg := mixConfig(tg, key, 2*i)
		hcfg.Name, hcfg.Cycles, hcfg.Ops, hcfg.Hold = fmt.Sprintf("holder%d", i), 1, 20, 2*life
		holder := r.Worker(hcfg)
		if _, err := holder.WaitLine("acquired", 0, 60*time.Second); err != nil {
			t.Fatal(err)
		}
		// The lease was granted as the acquire began, a few milliseconds
		// before this: its first renewal is a period after that.
		time.Sleep(period + 30*time.Millisecond) // the fault's timing
		r.Note("SIGSTOP server")
		srv.Pause()
		time.Sleep(stall) // the fault's length
		answeredAt = append(answeredAt, r.Note("SIGCONT server"))
		srv.Resume()
		wcfg := mixConfig(tg, key, 2*i+1)
		wcfg.Name, wcfg.Cycles = fmt.Sprintf("waiter%d", i), 1
		waiter := r.Worker(wcfg)
		if _, err := waiter.WaitLine("acquired", 0, 60*time.Second); err != nil {
			t.Fatal(err)
		}
		stopAll(t, tg, holder, waiter)
		lost += holder.Count("lost")
	}

	evs := r.History()
	fault := fmt.Sprintf("server SIGSTOP for %d%% of an auto-renewed lock's lease, just after a renewal: the stall ends in the lease's last third", 73)
	res := harness.Check(t, tg.name, fault, evs)
	res.Orphans = orphans(t, tg, key)
	// A loss, if any, counts from the moment the server answered again.
	for i, at := range answeredAt {
		if l, ok := lostOf(evs, fmt.Sprintf("holder%d-0", i)); ok {
			res.LossLatency = max(res.LossLatency, time.Duration(l.At-at))
		}
	}
	res.Notes = fmt.Sprintf("%d trials (TTL %v, lease renewed every %v, stall %v): holders' Done closed %d times (loss latency from SIGCONT); every waiter granted after its holder's release",
		trials, life, period.Round(time.Millisecond), stall, lost)
	res.Log(t)
	assertSafe(t, res)
	assertNoOverlap(t, res)
	if lost != 0 {
		t.Errorf("a holder's Done closed %d times in %d trials; want 0: the lease was renewed when the server answered, before it could expire", lost, trials)
	}
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}
