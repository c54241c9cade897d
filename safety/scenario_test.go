package safety

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver/proxy"
	"github.com/distlock/distlock/safety/harness"
	"github.com/distlock/distlock/safety/history"
)

// target is one backend under test, as the scenarios need it.
type target struct {
	name    string
	backend harness.Backend
	// ttl is the lock TTL the workers use.
	ttl time.Duration
	// expiry is how long after a holder stops answering the store frees
	// its lock: the TTL, or the ZooKeeper session timeout (a ZooKeeper
	// lock's TTL is enforced by its holder's process).
	expiry time.Duration
	// hold is how long a mix worker holds the lock; default ttl/2.
	hold time.Duration
	// server is the store's host:port, and via the backend to use to
	// reach it through another host:port (a proxy); both only for the
	// partition test, with a single server.
	server string
	via    func(hostport string) harness.Backend
	// leftovers lists what the store still holds for key.
	leftovers func(ctx context.Context, key string) ([]string, error)
	// token, for a queueing store, is the fencing token a grant of the
	// entry named (as leftovers names it) would carry.
	token func(ctx context.Context, key, entry string) (uint64, error)
	// fence, when set, is where the workers' fenced writes go: a store
	// of the target's kind, written through distlock's public helpers
	// (package fence), instead of the run's register.
	fence harness.Fence
	// lock is the kind of lock the workers take (harness.Config.Lock):
	// "" for the mutex, "election" for an election's leadership (see
	// electionTarget).
	lock string
}

func (tg target) holdTime() time.Duration {
	if tg.hold > 0 {
		return tg.hold
	}
	return tg.ttl / 2
}

// uniqueKey is a key no other run uses.
func uniqueKey(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return strings.ReplaceAll(t.Name(), "/", "-") + "-" + hex.EncodeToString(b[:])
}

// mixConfig is a worker that takes the lock again and again, holding it
// for about a TTL with ops writes and increments.
func mixConfig(tg target, key string, n int) harness.Config {
	return harness.Config{
		Backend:   tg.backend,
		Key:       key,
		TTL:       tg.ttl,
		AutoRenew: true,
		Wait:      50 * tg.expiry,
		Seed:      seed + uint64(n),
		Ops:       3,
		Hold:      tg.holdTime(),
		Think:     tg.holdTime() / 2,
		Fence:     tg.fence,
		Lock:      tg.lock,
	}
}

// startMix starts n mix workers on key.
func startMix(r *harness.Run, tg target, key string, n int) []*harness.Worker {
	var ws []*harness.Worker
	for i := range n {
		ws = append(ws, r.Worker(mixConfig(tg, key, i)))
	}
	return ws
}

// stopAll stops the workers, each within a generous bound.
func stopAll(t testing.TB, tg target, ws ...*harness.Worker) {
	t.Helper()
	for _, w := range ws {
		w.Stop(60*tg.expiry + 30*time.Second)
	}
}

// waitAcquisitions waits until the run's workers have made n more
// acquisitions than when it was called.
func waitAcquisitions(t testing.TB, tg target, n int, ws ...*harness.Worker) {
	t.Helper()
	count := func() int {
		c := 0
		for _, w := range ws {
			c += w.Count("acquired")
		}
		return c
	}
	want := count() + n
	waitUntil(t, 100*tg.expiry+30*time.Second, "acquisitions", func() bool { return count() >= want })
}

// accepted reports whether the fenced store accepted a write by an owner
// whose name starts with prefix after at. (The register records its
// writes in store.jsonl, the workers those of a Fence in their own files.)
func accepted(r *harness.Run, prefix string, at int64) bool {
	evs, err := history.ReadDir(r.Dir)
	if err != nil {
		return false
	}
	for _, e := range evs {
		if e.Kind == history.StoreWrite && e.Accepted && e.At > at && strings.HasPrefix(e.Owner, prefix) {
			return true
		}
	}
	return false
}

// firstAcquisitionAfter returns the first successful acquisition that
// returned after at.
func firstAcquisitionAfter(evs []history.Event, at int64) (history.Event, bool) {
	for _, e := range evs {
		if e.Kind == history.Acquire && e.Err == "" && e.Return > at {
			return e, true
		}
	}
	return history.Event{}, false
}

// lostOf returns the Lost event of owner.
func lostOf(evs []history.Event, owner string) (history.Event, bool) {
	for _, e := range evs {
		if e.Kind == history.Lost && e.Owner == owner {
			return e, true
		}
	}
	return history.Event{}, false
}

// orphans counts what the store still holds for key once every worker
// has stopped.
func orphans(t testing.TB, tg target, key string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	left, err := tg.leftovers(ctx, key)
	if err != nil {
		t.Fatalf("leftovers: %v", err)
	}
	if len(left) > 0 {
		t.Logf("orphans: %v", left)
	}
	return len(left)
}

// assertSafe checks what must hold under every fault for a backend with
// tokens: no stale write accepted, and porcupine happy whenever the
// tokens were in order.
func assertSafe(t testing.TB, res *harness.Result) {
	t.Helper()
	if len(res.Stale) != 0 {
		t.Errorf("%d stale writes accepted; want 0", len(res.Stale))
	}
	if len(res.Uncaught) != 0 {
		t.Errorf("%d overlaps not caught by the token (the store accepted both holders' writes): %v", len(res.Uncaught), res.Uncaught[0])
	}
	if len(res.TokenIssues) == 0 && res.Linearizable != porcupine.Ok {
		t.Errorf("porcupine: %v with tokens in order (%s)", res.Linearizable, res.Visualization)
	}
	if len(res.Overlaps) == 0 && res.Counter.Lost != 0 {
		t.Errorf("%d increments lost without an overlap: the counter or the history is wrong", res.Counter.Lost)
	}
	if res.Acquisitions == 0 {
		t.Errorf("no acquisitions: the run measured nothing")
	}
}

// assertNoOverlap checks a run where the library must keep holders apart.
func assertNoOverlap(t testing.TB, res *harness.Result) {
	t.Helper()
	if len(res.Overlaps) != 0 {
		t.Errorf("%d overlaps; want 0: %v", len(res.Overlaps), res.Overlaps[0])
	}
	if len(res.TokenIssues) != 0 {
		t.Errorf("%d token issues; want 0: %v", len(res.TokenIssues), res.TokenIssues[0])
	}
	if res.Linearizable != porcupine.Ok {
		t.Errorf("porcupine: %v; want Ok (%s)", res.Linearizable, res.Visualization)
	}
	if res.Counter.Lost != 0 {
		t.Errorf("%d increments lost; want 0", res.Counter.Lost)
	}
}

// testNoFault is the baseline: a few workers, no fault.
func testNoFault(t *testing.T, tg target) {
	r := harness.NewRun(t)
	key := uniqueKey(t)
	ws := startMix(r, tg, key, 3)
	waitAcquisitions(t, tg, 15*soak, ws...)
	stopAll(t, tg, ws...)
	res := harness.Check(t, tg.name, "none (baseline)", r.History())
	res.Orphans = orphans(t, tg, key)
	res.Log(t)
	assertSafe(t, res)
	assertNoOverlap(t, res)
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}

// testHolderPause freezes the holder's process (SIGSTOP, keep-alives
// included) for three times the store's expiry, as a long GC pause
// would. Another worker takes the lock meanwhile and writes; the holder
// wakes, must see Done closed, and its write with the old token (it
// writes once more after the loss, as a client that did not look at Done
// would) must be refused.
func testHolderPause(t *testing.T, tg target) {
	r := harness.NewRun(t)
	key := uniqueKey(t)
	hcfg := mixConfig(tg, key, 0)
	hcfg.Name, hcfg.Cycles, hcfg.Ops, hcfg.Hold, hcfg.Zombie = "holder", 1, 10000, 10000*tg.ttl/4, true
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

	pauseAt := r.Note("SIGSTOP holder")
	holder.Pause()
	if _, err := waiter.WaitLine("acquired", 0, 30*tg.expiry+30*time.Second); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "the waiter's write", func() bool { return accepted(r, "waiter-", pauseAt) })
	if d := time.Duration(pauseAt+int64(3*tg.expiry)-history.Now()) * time.Nanosecond; d > 0 {
		time.Sleep(d) // the fault's length: the pause lasts 3x the expiry
	}
	resumeAt := r.Note("SIGCONT holder")
	holder.Resume()
	if _, err := holder.WaitLine("lost", 0, 30*time.Second); err != nil {
		t.Fatalf("the holder's Done did not close on wake: %v", err)
	}
	waitAcquisitions(t, tg, 3, waiter)
	stopAll(t, tg, holder, waiter)

	evs := r.History()
	res := harness.Check(t, tg.name, "holder SIGSTOP 3x expiry", evs)
	res.Orphans = orphans(t, tg, key)
	if lost, ok := lostOf(evs, "holder-0"); ok {
		res.LossLatency = time.Duration(lost.At - resumeAt)
	}
	if first, ok := firstAcquisitionAfter(evs, pauseAt); ok {
		res.Recovery = time.Duration(first.Return - pauseAt)
	}
	res.Notes = "loss latency from SIGCONT; recovery from SIGSTOP"
	res.Log(t)
	assertSafe(t, res)
	if len(res.Overlaps) == 0 {
		t.Errorf("no overlap: the paused holder was expected to overlap the next one")
	}
	for _, o := range res.Overlaps {
		if o.Older.Owner != "holder-0" {
			t.Errorf("unexpected overlap: %v", o)
		}
	}
	if res.Rejected == 0 {
		t.Errorf("no write refused: the woken holder's write with its old token should have been")
	}
	if len(res.TokenIssues) != 0 || res.Linearizable != porcupine.Ok {
		t.Errorf("tokens: %d issues, porcupine %v; want none, Ok", len(res.TokenIssues), res.Linearizable)
	}
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}

// testWaiterExpiredWhileQueued queues a waiter behind a holder, then
// freezes the waiter's process until the store has dropped its queue
// entry (its lease or session expired), wakes it and lets the holder go.
// The waiter's pending acquisition must never be granted: it must fail.
func testWaiterExpiredWhileQueued(t *testing.T, tg target) {
	r := harness.NewRun(t)
	key := uniqueKey(t)
	hcfg := mixConfig(tg, key, 0)
	hcfg.Name, hcfg.Cycles, hcfg.Ops, hcfg.Hold = "holder", 1, 1000, 1000*tg.ttl
	holder := r.Worker(hcfg)
	if _, err := holder.WaitLine("acquired", 0, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	var holderEntry string
	{
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		left, err := tg.leftovers(ctx, key)
		cancel()
		if err != nil || len(left) != 1 {
			t.Fatalf("leftovers: %v, %v; want the holder's", left, err)
		}
		holderEntry = left[0]
	}
	wcfg := mixConfig(tg, key, 1)
	wcfg.Name, wcfg.Cycles, wcfg.Wait = "waiter", 1, 10*time.Minute
	waiter := r.Worker(wcfg)
	entries := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		left, err := tg.leftovers(ctx, key)
		if err != nil {
			return -1
		}
		return len(left)
	}
	waitUntil(t, 60*time.Second, "the waiter to queue", func() bool { return entries() == 2 })
	// The waiter's entry, and the token a grant of it would carry: the
	// SIGSTOP may come before the create's reply reached the waiter, and
	// then, woken, it rightly queues again under a new session (a new
	// entry, a new token) and may be granted that one.
	var queued uint64
	{
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		left, err := tg.leftovers(ctx, key)
		if err != nil || len(left) != 2 || !slices.Contains(left, holderEntry) {
			cancel()
			t.Fatalf("leftovers: %v, %v; want the holder's (%s) and the waiter's", left, err, holderEntry)
		}
		mine := left[0]
		if mine == holderEntry {
			mine = left[1]
		}
		queued, err = tg.token(ctx, key, mine)
		cancel()
		if err != nil {
			t.Fatalf("the waiter's entry %s: %v", mine, err)
		}
	}
	pauseAt := r.Note("SIGSTOP waiter")
	waiter.Pause()
	waitUntil(t, 30*tg.expiry+30*time.Second, "the store to drop the waiter's entry", func() bool { return entries() == 1 })
	droppedAt := r.Note("waiter's entry gone")
	waiter.Resume()
	r.Note("SIGCONT waiter")
	// Give the woken waiter a moment in which a wrong grant would show,
	// queue a newcomer, then let the holder go.
	time.Sleep(tg.expiry)
	late := r.Worker(func() harness.Config { c := mixConfig(tg, key, 2); c.Name, c.Cycles = "late", 1; return c }())
	waitUntil(t, 60*time.Second, "the newcomer to queue", func() bool { return entries() >= 2 })
	holder.Stop(60 * time.Second)
	waiter.Stop(60 * time.Second)
	if _, err := late.WaitLine("acquired", 0, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	late.Stop(60 * time.Second)

	evs := r.History()
	res := harness.Check(t, tg.name, "waiter's lease/session expired while queued", evs)
	res.Orphans = orphans(t, tg, key)
	for _, e := range evs {
		if e.Kind == history.Release && e.Proc == "holder" {
			if first, ok := firstAcquisitionAfter(evs, e.Call); ok {
				res.Recovery = time.Duration(first.Return - e.Call)
			}
		}
	}
	res.Notes = fmt.Sprintf("entry dropped %v after SIGSTOP; recovery from the holder's release", time.Duration(droppedAt-pauseAt).Round(time.Millisecond))
	res.Log(t)
	assertSafe(t, res)
	assertNoOverlap(t, res)
	for _, e := range evs {
		if e.Kind == history.Acquire && e.Proc == "waiter" {
			switch {
			case e.Err == "" && e.Token == queued:
				t.Errorf("the waiter whose entry expired was granted the lock (token %d)", e.Token)
			case e.Err == "":
				t.Logf("the waiter queued again after the SIGSTOP (its create's reply was lost) and was granted its new entry, token %d (the dropped one's: %d)", e.Token, queued)
			default:
				t.Logf("the waiter's acquisition failed as it should: %s", e.Err)
			}
		}
	}
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}

// cluster is a replicated store whose leader can be killed.
type cluster struct {
	leader func() (int, error)
	kill   func(i int)
	start  func(i int)
}

// testLeaderKill kills the leader of a three-member cluster (SIGKILL) in
// the middle of a mix, waits for the two others to elect a new one and
// the workers to go on, and starts the old leader again.
func testLeaderKill(t *testing.T, tg target, c cluster) {
	r := harness.NewRun(t)
	key := uniqueKey(t)
	ws := startMix(r, tg, key, 3)
	waitAcquisitions(t, tg, 10*soak, ws...)
	leader, err := c.leader()
	if err != nil {
		t.Fatal(err)
	}
	killAt := r.Note(fmt.Sprintf("SIGKILL leader %d", leader))
	c.kill(leader)
	waitAcquisitions(t, tg, 1, ws...)
	evs := r.History()
	first, _ := firstAcquisitionAfter(evs, killAt)
	waitAcquisitions(t, tg, 10*soak, ws...)
	c.start(leader)
	r.Note(fmt.Sprintf("leader %d restarted", leader))
	waitAcquisitions(t, tg, 10*soak, ws...)
	stopAll(t, tg, ws...)

	evs = r.History()
	res := harness.Check(t, tg.name, "leader SIGKILL in a 3-member cluster", evs)
	res.Orphans = orphans(t, tg, key)
	res.Recovery = time.Duration(first.Return - killAt)
	res.Notes = "recovery from the kill"
	res.Log(t)
	assertSafe(t, res)
	assertNoOverlap(t, res)
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}

// testPartition cuts a holder off from the store: the holder runs in a
// network namespace of its own and reaches the store through a proxy on
// the host end of a veth pair; iptables then drops every packet on that
// link for 3x the store's expiry. The fenced store stays reachable (a
// Unix socket), as the resource a lock guards often is from the holder's
// side of a partition. The holder must learn of the loss from its own
// clock; a waiter takes the lock once the store frees it.
func testPartition(t *testing.T, tg target) {
	ns := harness.NewNetns(t)
	p, err := proxy.StartOn(ns.HostIP+":0", tg.server)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	r := harness.NewRun(t)
	key := uniqueKey(t)
	hcfg := mixConfig(tg, key, 0)
	hcfg.Name, hcfg.Cycles, hcfg.Ops, hcfg.Hold, hcfg.Zombie = "holder", 1, 10000, 10000*tg.ttl/4, true
	hcfg.Backend, hcfg.Netns = tg.via(p.Addr), ns.Name
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
	cutAt := r.Note("partition the holder")
	ns.Partition()
	if _, err := holder.WaitLine("lost", 0, 30*tg.expiry+30*time.Second); err != nil {
		t.Fatalf("the partitioned holder's Done did not close: %v", err)
	}
	if _, err := waiter.WaitLine("acquired", 0, 30*tg.expiry+30*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Duration(cutAt+int64(3*tg.expiry)-history.Now()) * time.Nanosecond; d > 0 {
		time.Sleep(d) // the fault's length
	}
	r.Note("heal")
	ns.Heal()
	waitAcquisitions(t, tg, 3, waiter)
	stopAll(t, tg, holder, waiter)

	evs := r.History()
	res := harness.Check(t, tg.name, "holder partitioned (netns + iptables) 3x expiry", evs)
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
	res.Notes = fmt.Sprintf("loss latency and recovery from the cut; Done closed %v before the waiter's grant returned",
		time.Duration(grant.Return-lost.At).Round(10*time.Microsecond))
	res.Log(t)
	assertSafe(t, res)
	if len(res.TokenIssues) != 0 || res.Linearizable != porcupine.Ok {
		t.Errorf("tokens: %d issues, porcupine %v; want none, Ok", len(res.TokenIssues), res.Linearizable)
	}
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}

// storm is how a cancel storm runs; the zero value is the plain storm.
type storm struct {
	// autoRenew takes the locks under distlock.WithAutoRenew (on etcd:
	// on the Resource's shared lease).
	autoRenew bool
	// drops closes the proxy's connections at random moments (every
	// 0-100ms), so that requests fail mid-flight, clean-ups among them:
	// TryLock may then fail with a store error, and Unlock is retried.
	drops bool
}

// testCancelStorm cancels 1,000 acquisitions at random moments (0-30ms)
// while a proxy delays every reply from the store by 0-20ms, so that many
// cancellations land after the store acted on a request and before its
// reply came back. Each of four goroutines uses a key of its own (no
// contention) and checks after every failed TryLock that the store holds
// nothing for it, allowing 2s for clean-ups the backend finishes in the
// background; what is still there then is an orphan.
func testCancelStorm(t *testing.T, tg target) { runCancelStorm(t, tg, storm{}) }

// runCancelStorm is testCancelStorm as st says. With drops, clean-ups
// that fail are the backend's to retry: it gets 10s instead of 2s, and a
// key still there then is an orphan only if it outlives the drops by a
// minute (the worker that left it stops).
func runCancelStorm(t *testing.T, tg target, st storm) {
	p, err := proxy.Start(tg.server)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	rnd := mrand.New(mrand.NewPCG(seed, 1))
	var rmu sync.Mutex
	between := func(hi time.Duration) time.Duration {
		rmu.Lock()
		defer rmu.Unlock()
		return time.Duration(rnd.Int64N(int64(hi)))
	}
	p.SetDelay(proxy.Down, func() time.Duration { return between(20 * time.Millisecond) })
	grace, fault := 2*time.Second, ""
	var drops atomic.Int64
	stopDrops := func() {}
	if st.drops {
		grace, fault = 10*time.Second, ", connections dropped every 0-100ms"
		stop := make(chan struct{})
		var dwg sync.WaitGroup
		dwg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(between(100 * time.Millisecond)): // the fault's rhythm
				}
				p.CloseConns()
				drops.Add(1)
			}
		})
		var once sync.Once
		stopDrops = func() { once.Do(func() { close(stop); dwg.Wait() }) }
		defer stopDrops()
	}
	opts := []distlock.Option{distlock.WithDefaultTTL(30 * time.Second)}
	if st.autoRenew {
		opts = append(opts, distlock.WithAutoRenew())
		fault += ", auto-renewed locks"
	}
	ctx := t.Context()
	res0, closeRes, err := tg.via(p.Addr).Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeRes)
	var res backend.RemoteResource = res0
	spy, isSpin := res0.(backend.Spinner)
	var sp *spyRes
	if isSpin {
		sp = &spyRes{Spinner: spy}
		res = sp
	}

	const workers = 4
	total := 1000 * soak
	var acquired, afterEnd, cancelled, failed, late, orphaned atomic.Int64
	var wg sync.WaitGroup
	// With drops, a key still there after the grace may be a clean-up the
	// fault keeps from the server (reconnects back off while connections
	// die under their handshake): it is judged once the drops stopped.
	var smu sync.Mutex
	slow := map[string]string{} // key -> what the failed TryLock said
	for g := range workers {
		wg.Go(func() {
			key := fmt.Sprintf("%s-%d", uniqueKey(t), g)
			d, err := distlock.New(res, opts...)
			if err != nil {
				t.Error(err)
				return
			}
			r := mrand.New(mrand.NewPCG(seed, uint64(g)+100))
			for range total / workers {
				cctx, cancel := context.WithTimeout(ctx, time.Duration(r.Int64N(int64(30*time.Millisecond))))
				lk, err := d.TryLock(cctx, key, time.Second)
				ended := cctx.Err() != nil
				cancel()
				if err == nil {
					acquired.Add(1)
					if ended {
						afterEnd.Add(1) // granted as the ctx ended: the caller has the lock
					}
					unlock(t, lk, st.drops)
					continue
				}
				switch {
				case errors.Is(err, distlock.ErrNotAcquired):
					cancelled.Add(1)
				case st.drops:
					failed.Add(1) // the connection dropped under the acquire
				default:
					t.Errorf("TryLock = %v; want ErrNotAcquired joined with the ctx's error", err)
				}
				if left := leftAfter(tg, key, grace); left == nil {
					continue
				} else if len(left) > 0 && st.drops {
					smu.Lock()
					slow[key] = err.Error()
					smu.Unlock()
					return // its next TryLock would queue behind the key
				} else if len(left) > 0 {
					orphaned.Add(1)
					diag := ""
					if sp != nil {
						diag = sp.lastOf(key)
					}
					t.Errorf("orphan for %s after its TryLock failed (%v; last attempt %s): %v", key, err, diag, left)
					return
				}
				late.Add(1)
			}
		})
	}
	wg.Wait()
	stopDrops()
	for key, why := range slow {
		if left := leftAfter(tg, key, time.Minute); len(left) > 0 {
			orphaned.Add(1)
			t.Errorf("orphan for %s a minute after the drops stopped, left by a TryLock that failed with %s: %v", key, why, left)
		}
	}
	notes := fmt.Sprintf("%d cancelled; %d granted although the ctx had ended by then; %d cleaned up in the background within %v",
		cancelled.Load(), afterEnd.Load(), late.Load(), grace)
	if st.drops {
		notes += fmt.Sprintf("; %d acquires failed with a store error; %d connection drops; %d keys cleaned up only after the drops stopped",
			failed.Load(), drops.Load(), len(slow)-int(orphaned.Load()))
	}
	out := &harness.Result{Backend: tg.name, Fault: fmt.Sprintf("%d random ctx cancels mid-acquire, replies delayed 0-20ms%s", total, fault),
		Acquisitions: int(acquired.Load()), Orphans: int(orphaned.Load()), LossLatency: -1, Recovery: -1, Notes: notes}
	out.Log(t)
	if hit := cancelled.Load() + afterEnd.Load() + failed.Load(); hit < int64(total)/4 {
		t.Errorf("only %d of %d acquisitions met their ctx's end: the storm did not storm", hit, total)
	}
	if out.Orphans != 0 {
		t.Errorf("%d orphans; want 0", out.Orphans)
	}
}

// unlock releases lk; with drops, a store error (the connection dropped
// under the release) is retried, as an application would.
func unlock(t *testing.T, lk *distlock.Lock, drops bool) {
	for end := time.Now().Add(30 * time.Second); ; {
		uctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := lk.Unlock(uctx)
		cancel()
		if err == nil || !drops || errors.Is(err, distlock.ErrNotHeld) || time.Now().After(end) {
			if err != nil && !(drops && errors.Is(err, distlock.ErrNotHeld)) {
				t.Errorf("Unlock: %v", err)
			}
			return
		}
	}
}

// leftAfter returns nil when the store holds nothing for key now, an empty
// non-nil slice when it held something that went away within wait, and
// what it still holds after wait otherwise.
func leftAfter(tg target, key string, wait time.Duration) []string {
	end := time.Now().Add(wait)
	for first := true; ; first = false {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		left, err := tg.leftovers(ctx, key)
		cancel()
		switch {
		case err == nil && len(left) == 0 && first:
			return nil
		case err == nil && len(left) == 0:
			return []string{}
		case time.Now().After(end):
			if err != nil {
				return []string{"error: " + err.Error()}
			}
			return left
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
}

// testServerPause freezes the server (SIGSTOP) for 3x the expiry while a
// worker holds the lock, two others waiting. The holder cannot renew: its
// Done must close while the server is still frozen (at its local expiry),
// so that nobody overlaps it once the server wakes.
func testServerPause(t *testing.T, tg target, srv interface {
	Pause()
	Resume()
}) {
	r := harness.NewRun(t)
	key := uniqueKey(t)
	hcfg := mixConfig(tg, key, 0)
	hcfg.Name, hcfg.Cycles, hcfg.Ops, hcfg.Hold = "holder", 1, 10000, 10000*tg.ttl/4
	holder := r.Worker(hcfg)
	if _, err := holder.WaitLine("acquired", 0, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	ws := []*harness.Worker{r.Worker(mixConfig(tg, key, 1)), r.Worker(mixConfig(tg, key, 2))}
	for _, w := range ws {
		if _, err := w.WaitLine("ready", 0, 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	pauseAt := r.Note("SIGSTOP server")
	srv.Pause()
	time.Sleep(3 * tg.expiry) // the fault's length
	resumeAt := r.Note("SIGCONT server")
	srv.Resume()
	if _, err := holder.WaitLine("lost", 0, 30*time.Second); err != nil {
		t.Fatalf("the holder's Done did not close: %v", err)
	}
	waitAcquisitions(t, tg, 10*soak, ws...)
	stopAll(t, tg, append(ws, holder)...)

	evs := r.History()
	res := harness.Check(t, tg.name, "server SIGSTOP 3x expiry", evs)
	res.Orphans = orphans(t, tg, key)
	if first, ok := firstAcquisitionAfter(evs, resumeAt); ok {
		res.Recovery = time.Duration(first.Return - resumeAt)
	}
	lost, _ := lostOf(evs, "holder-0")
	res.LossLatency = time.Duration(lost.At - pauseAt)
	if lost.At > resumeAt {
		t.Errorf("the holder learnt of the loss %v after the server woke", time.Duration(lost.At-resumeAt))
	}
	res.Notes = "loss latency from SIGSTOP (at most the expiry); recovery from SIGCONT"
	res.Log(t)
	assertSafe(t, res)
	assertNoOverlap(t, res)
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}
