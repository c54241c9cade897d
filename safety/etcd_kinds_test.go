package safety

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/internal/testserver/proxy"
	"github.com/distlock/distlock/safety/harness"
)

// The semaphore and read/write runs of the fault suite for etcd (issue
// 24) run in this process: three DistributeLocks, each over a client of
// its own (one "process" each), one of which, the victim, reaches the
// server through a proxy that stops forwarding both ways for three TTLs
// while it holds. Its lock has no auto-renewal, so its lease expires on
// the server while it cannot answer, and the others take its place.

// kindHolding is one grant as the run saw it: valid from Acquire's
// return until the call of Unlock or the close of Done, whichever came
// first.
type kindHolding struct {
	who        string
	kind       distlock.Kind
	token      uint64
	start, end time.Time
}

// kindRun records the holdings of a run.
type kindRun struct {
	mu       sync.Mutex
	holdings []kindHolding
}

func (k *kindRun) add(h kindHolding) {
	k.mu.Lock()
	k.holdings = append(k.holdings, h)
	k.mu.Unlock()
}

// hold holds lk until release (or its Done), calling work every step
// while Done is open, and records the holding.
func (k *kindRun) hold(who string, kind distlock.Kind, lk *distlock.Lock, start time.Time, hold, step time.Duration, work func()) {
	end := time.Now().Add(hold)
	for time.Now().Before(end) {
		select {
		case <-lk.Done():
		case <-time.After(step): // the work's pace, not synchronisation
			work()
			continue
		}
		break
	}
	stop := time.Now()
	select {
	case <-lk.Done():
		stop = lk.Deadline() // when the facade closed it, at the latest
		if d := lk.Deadline(); d.IsZero() {
			stop = time.Now()
		}
	default:
	}
	k.add(kindHolding{who: who, kind: kind, token: lk.Token(), start: start, end: stop})
	_ = lk.Unlock(context.Background())
}

// sweep returns the largest number of valid semaphore holdings, or of
// read/write holdings, open at one moment, the number of moments a write
// holding opened beside another holding, and the periods during which
// more than limit semaphore holdings were open.
func (k *kindRun) sweep(limit int) (most int, mixed int, over [][2]time.Time) {
	type edge struct {
		at   time.Time
		open bool
		kind distlock.Kind
	}
	var es []edge
	for _, h := range k.holdings {
		es = append(es, edge{h.start, true, h.kind}, edge{h.end, false, h.kind})
	}
	slices.SortFunc(es, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		if a.open == b.open {
			return 0
		}
		if !a.open { // a close before an open at the same instant
			return -1
		}
		return 1
	})
	n := map[distlock.Kind]int{}
	var overSince time.Time
	for _, e := range es {
		if e.open {
			n[e.kind]++
		} else {
			n[e.kind]--
		}
		most = max(most, n[distlock.KindSemaphore], n[distlock.KindRead]+n[distlock.KindWrite])
		if e.open && (n[distlock.KindWrite] > 1 || n[distlock.KindWrite] == 1 && n[distlock.KindRead] > 0) {
			mixed++
		}
		switch sem := n[distlock.KindSemaphore]; {
		case sem > limit && overSince.IsZero():
			overSince = e.at
		case sem <= limit && !overSince.IsZero():
			over = append(over, [2]time.Time{overSince, e.at})
			overSince = time.Time{}
		}
	}
	return most, mixed, over
}

// rwFence is the read/write lock's protected resource: a register a
// writer writes with its token and a reader reads with its own. A read is
// accepted when its token is above the last accepted write's; a write
// when its token is above every token it has seen, or equal to the last
// write's from the same owner (read grants' tokens are above every
// earlier write grant's, write grants' above every earlier grant's).
type rwFence struct {
	mu        sync.Mutex
	maxAny    uint64 // the largest token seen, reads and writes
	lastWrite uint64
	lastOwner string
	lastRead  bool // a read came after the last write
}

func (f *rwFence) write(owner string, tok uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if tok > f.maxAny || tok == f.lastWrite && owner == f.lastOwner && !f.lastRead {
		f.maxAny, f.lastWrite, f.lastOwner, f.lastRead = tok, tok, owner, false
		return true
	}
	return false
}

func (f *rwFence) read(tok uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if tok > f.lastWrite {
		f.maxAny, f.lastRead = max(f.maxAny, tok), true
		return true
	}
	return false
}

// etcdKindsSetup starts the proxy and opens the victim (through it) and
// two others, with a 2s default TTL and no auto-renewal.
func etcdKindsSetup(t *testing.T, tg target) (p *proxy.Proxy, victim *distlock.DistributeLock, others []*distlock.DistributeLock) {
	p = startProxy(t, tg.server)
	open := func(b harness.Backend) *distlock.DistributeLock {
		res, closeRes, err := b.Open(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(closeRes)
		d, err := distlock.New(res, distlock.WithDefaultTTL(etcdTTL), distlock.WithSpin(5*time.Millisecond, 5*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d
	}
	return p, open(tg.via(p.Addr)), []*distlock.DistributeLock{open(tg.backend), open(tg.backend)}
}

// stallVictim stalls the proxy for three TTLs, starting after delay.
func stallVictim(p *proxy.Proxy, delay time.Duration) (done <-chan struct{}) {
	ch := make(chan struct{})
	time.AfterFunc(delay, func() {
		p.Stall(proxy.Up)
		p.Stall(proxy.Down)
		time.AfterFunc(3*etcdTTL, func() {
			p.Unstall(proxy.Up)
			p.Unstall(proxy.Down)
			close(ch)
		})
	})
	return ch
}

// testEtcdSemaphoreStalled: a semaphore of limit 3, held by 8 goroutines
// of two processes and by the victim, whose connection stalls for three
// TTLs while it holds a permit. Checked: never more than 3 valid
// holdings at once (a holding ends at Unlock or when Done closes, which
// must come before the store frees the permit), no write while more than
// 3 hold, tokens of grants whose Acquire started after another's return
// larger, and nothing left.
func testEtcdSemaphoreStalled(t *testing.T, tg target) {
	const limit = 3
	key := uniqueKey(t)
	p, victim, others := etcdKindsSetup(t, tg)
	var run kindRun
	var wmu sync.Mutex
	var writeTimes []time.Time
	work := func() {
		wmu.Lock()
		writeTimes = append(writeTimes, time.Now())
		wmu.Unlock()
	}
	ctx := t.Context()
	vlk, err := victim.Semaphore(key, limit).TryAcquire(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	vstart := time.Now()
	stalled := stallVictim(p, 200*time.Millisecond)
	var wg sync.WaitGroup
	wg.Go(func() {
		run.hold("victim", distlock.KindSemaphore, vlk, vstart, time.Hour, 20*time.Millisecond, work)
	})
	end := time.Now().Add(3*etcdTTL + 3*time.Second)
	var grants atomic.Int64
	type ret struct {
		at    time.Time
		token uint64
	}
	var rmu sync.Mutex
	var returns []ret
	var tokenIssues atomic.Int64
	for i := range 8 {
		d := others[i%2]
		wg.Go(func() {
			for time.Now().Before(end) {
				called := time.Now()
				lk, err := d.Semaphore(key, limit).TryAcquire(ctx, 10*time.Second)
				if errors.Is(err, distlock.ErrNotAcquired) {
					continue
				}
				if err != nil {
					t.Errorf("worker %d: %v", i, err)
					return
				}
				start := time.Now()
				grants.Add(1)
				rmu.Lock()
				for _, r := range returns {
					if r.at.Before(called) && r.token >= lk.Token() {
						tokenIssues.Add(1)
					}
				}
				returns = append(returns, ret{start, lk.Token()})
				rmu.Unlock()
				run.hold(fmt.Sprintf("w%d", i), distlock.KindSemaphore, lk, start, time.Duration(20+rand.IntN(200))*time.Millisecond, 10*time.Millisecond, work)
			}
		})
	}
	wg.Wait()
	<-stalled
	most, _, over := run.sweep(limit)
	writesOver := 0
	for _, at := range writeTimes {
		for _, o := range over {
			if !at.Before(o[0]) && at.Before(o[1]) {
				writesOver++
			}
		}
	}
	orphaned := orphans(t, tg, key)
	victimEnd := run.holdings[slices.IndexFunc(run.holdings, func(h kindHolding) bool { return h.who == "victim" })].end
	res := &harness.Result{Backend: tg.name, Fault: fmt.Sprintf("semaphore, limit %d: a holder's connection stalled (proxy) 3x expiry", limit),
		Acquisitions: int(grants.Load()) + 1, Orphans: orphaned, LossLatency: -1, Recovery: -1,
		Notes: fmt.Sprintf("at most %d valid holdings at once; %d writes, %d while more than %d held; %d token issues; the victim's Done closed %v after the stall began",
			most, len(writeTimes), writesOver, limit, tokenIssues.Load(), victimEnd.Sub(vstart.Add(200*time.Millisecond)).Round(time.Millisecond))}
	res.Log(t)
	if most > limit || writesOver != 0 || tokenIssues.Load() != 0 || orphaned != 0 {
		t.Errorf("%d holdings at once (limit %d), %d writes over the limit, %d token issues, %d orphans; want <= %d, 0, 0, 0",
			most, limit, writesOver, tokenIssues.Load(), orphaned, limit)
	}
	if most < 2 {
		t.Errorf("at most %d holding at once: the run did not contend", most)
	}
}

// testEtcdRWStalled: readers and writers of one read/write lock in two
// processes, and the victim, a writer whose connection stalls for three
// TTLs while it holds and which goes on writing, ignoring Done (a
// zombie). Writers write a fenced register with their token, readers read
// it with theirs (rwFence). Checked: no valid write holding beside another
// holding, 0 stale writes accepted (a zombie write accepted after the
// register accepted a read or write of a grant made after the victim's,
// as history.StaleWrites judges), no valid holder refused (token issues),
// and nothing left.
func testEtcdRWStalled(t *testing.T, tg target) {
	key := uniqueKey(t)
	p, victim, others := etcdKindsSetup(t, tg)
	var run kindRun
	var fence rwFence
	ctx := t.Context()
	vlk, err := victim.RWMutex(key).TryLock(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	vstart := time.Now()
	if !fence.write("victim", vlk.Token()) {
		t.Fatal("the victim's first write refused")
	}
	stalled := stallVictim(p, 200*time.Millisecond)
	var zombieAccepted, zombieRefused, stale, liveRefused, grants, reads, writes atomic.Int64
	var othersAccepted atomic.Bool // the fence accepted an op of a grant made after the victim's
	var wg sync.WaitGroup
	wg.Go(func() {
		// The zombie writes until the stall is over, Done or not.
		for {
			select {
			case <-stalled:
				run.add(kindHolding{who: "victim", kind: distlock.KindWrite, token: vlk.Token(), start: vstart, end: vlk.Deadline()})
				_ = vlk.Unlock(context.Background())
				return
			case <-time.After(50 * time.Millisecond): // the zombie's pace
			}
			ok := fence.write("victim", vlk.Token())
			lost := false
			select {
			case <-vlk.Done():
				lost = true
			default:
			}
			switch {
			case ok && lost:
				zombieAccepted.Add(1)
				if othersAccepted.Load() {
					stale.Add(1) // accepted after one of a newer grant
				}
			case !ok && lost:
				zombieRefused.Add(1)
			case !ok:
				liveRefused.Add(1)
			}
		}
	})
	end := time.Now().Add(3*etcdTTL + 3*time.Second)
	for i := range 6 {
		d := others[i%2]
		writer := i%3 == 0
		wg.Go(func() {
			who := fmt.Sprintf("w%d", i)
			for time.Now().Before(end) {
				var lk *distlock.Lock
				var err error
				kind := distlock.KindRead
				if writer {
					kind = distlock.KindWrite
					lk, err = d.RWMutex(key).TryLock(ctx, 10*time.Second)
				} else {
					lk, err = d.RWMutex(key).TryRLock(ctx, 10*time.Second)
				}
				if errors.Is(err, distlock.ErrNotAcquired) {
					continue
				}
				if err != nil {
					t.Errorf("%s: %v", who, err)
					return
				}
				start := time.Now()
				grants.Add(1)
				run.hold(who, kind, lk, start, time.Duration(10+rand.IntN(100))*time.Millisecond, 10*time.Millisecond, func() {
					var ok bool
					if writer {
						ok = fence.write(who, lk.Token())
						writes.Add(1)
					} else {
						ok = fence.read(lk.Token())
						reads.Add(1)
					}
					if ok {
						othersAccepted.Store(true)
					}
					select {
					case <-lk.Done():
					default:
						if !ok {
							liveRefused.Add(1)
						}
					}
				})
			}
		})
	}
	wg.Wait()
	_, mixed, _ := run.sweep(0)
	orphaned := orphans(t, tg, key)
	res := &harness.Result{Backend: tg.name, Fault: "read/write lock: a writer's connection stalled (proxy) 3x expiry, the writer a zombie",
		Acquisitions: int(grants.Load()) + 1, Orphans: orphaned, LossLatency: -1, Recovery: -1,
		Notes: fmt.Sprintf("%d reads, %d writes; %d moments with a writer beside another holder; zombie writes after Done: %d refused, %d accepted (%d after an op of a newer grant: stale); %d refused from valid holders",
			reads.Load(), writes.Load(), mixed, zombieRefused.Load(), zombieAccepted.Load(), stale.Load(), liveRefused.Load())}
	res.Log(t)
	if mixed != 0 || stale.Load() != 0 || liveRefused.Load() != 0 || orphaned != 0 {
		t.Errorf("%d moments with a writer beside another holder, %d stale writes accepted, %d refused from valid holders, %d orphans; want 0",
			mixed, stale.Load(), liveRefused.Load(), orphaned)
	}
	if reads.Load() == 0 || writes.Load() == 0 || zombieRefused.Load() == 0 {
		t.Errorf("%d reads, %d writes, %d zombie writes refused: the run tested too little", reads.Load(), writes.Load(), zombieRefused.Load())
	}
}
