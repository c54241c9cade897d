package safety

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/internal/testserver/proxy"
	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/safety/harness"
	"github.com/distlock/distlock/safety/history"
)

// TestRedisKinds runs the fault scenarios of semaphores and read/write
// locks on Redis: a cancel storm for each (limit never
// exceeded, a writer never with another holder, 0 stale writes accepted,
// tokens in order, 0 orphans), and a writer frozen past its TTL, whose
// next write a fenced register must refuse. Writers write the register
// through redis.Fence (see redisRegister).
func TestRedisKinds(t *testing.T) {
	srv := testserver.Redis(t)
	t.Run("SemaphoreCancelStorm", func(t *testing.T) { testKindsStorm(t, srv.Addr, backend.KindSemaphore) })
	t.Run("RWMutexCancelStorm", func(t *testing.T) { testKindsStorm(t, srv.Addr, backend.KindWrite) })
	t.Run("RWMutexFrozenWriter", func(t *testing.T) { testRWFrozenWriter(t, srv.Addr) })
}

// testKindsStorm makes 1,000 acquisitions of one semaphore (limit 3), or
// of one read/write lock (2 writers, 4 readers), each with a context that
// ends at a random moment (0-100ms: most are cancelled mid-acquire), while
// the proxy delays every request and reply by 0-20ms, from six goroutines
// over six DistributeLocks. Holders count themselves in and out around
// their holding: never more than the limit, never a writer with anyone.
// After every failed acquire the store must hold nothing of its owner
// value (no permit, grant or intent), allowing 2s for the clean-up the
// DistributeLock runs in the background; once the storm is over nothing
// of the lock is left.
func testKindsStorm(t *testing.T, addr string, kind backend.Kind) {
	const limit, workers = 3, 6
	p := startProxy(t, addr)
	delay := randomDelay(24, 20*time.Millisecond)
	p.SetDelay(proxy.Down, delay)
	p.SetDelay(proxy.Up, delay)
	via := redisVia(t, p.Addr)
	direct := redisVia(t, addr)
	res := newRedis(t, via)
	t.Cleanup(func() { _ = res.Close() })
	key := uniqueKey(t)
	lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
	sem, rw := redisscript.SemaphoreKeys(lock), redisscript.RWKeys(lock)
	// holdsNothing reports whether value has no grant and no intent.
	holdsNothing := func(value string) (bool, error) {
		sets := []string{sem[1]}
		if kind != backend.KindSemaphore {
			sets = []string{rw[1], rw[4], rw[5]}
		}
		for _, s := range sets {
			_, err := direct.ZScore(context.Background(), s, value).Result()
			if err == nil {
				return false, nil
			}
			if !errors.Is(err, goredis.Nil) {
				return false, err
			}
		}
		return true, nil
	}

	total := 1000 * soak
	var (
		acquired, cancelled, late, orphans, checkErrs, violations atomic.Int64
		inside, writers, most                                     atomic.Int64
		evMu                                                      sync.Mutex
		evs                                                       []history.Event
	)
	reg := newRedisRegister(t, addr, key)
	var wg sync.WaitGroup
	for g := range workers {
		write := kind == backend.KindWrite && g < 2
		wg.Go(func() {
			var value string
			n := 0
			d, err := distlock.New(res, distlock.WithDefaultTTL(30*time.Second),
				distlock.WithValueFunc(func() string { n++; value = fmt.Sprintf("g%d-%d", g, n); return value }))
			if err != nil {
				t.Error(err)
				return
			}
			defer d.Close()
			r := rand.New(rand.NewPCG(seed, uint64(g)+200))
			for range total / workers {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.Int64N(int64(100*time.Millisecond))))
				call := history.Now()
				var lk *distlock.Lock
				switch {
				case kind == backend.KindSemaphore:
					lk, err = d.Semaphore(key, limit).TryAcquire(ctx, time.Second)
				case write:
					lk, err = d.RWMutex(key).TryLock(ctx, time.Second)
				default:
					lk, err = d.RWMutex(key).TryRLock(ctx, time.Second)
				}
				ret := history.Now()
				cancel()
				if err == nil {
					acquired.Add(1)
					evMu.Lock()
					evs = append(evs, history.Event{Kind: history.Acquire, Owner: value, Call: call, Return: ret, Token: lk.Token()})
					evMu.Unlock()
					in := inside.Add(1)
					for m := most.Load(); in > m && !most.CompareAndSwap(m, in); m = most.Load() {
					}
					switch {
					case kind == backend.KindSemaphore && in > limit:
						violations.Add(1)
						t.Errorf("%d holders of a semaphore of %d", in, limit)
					case write:
						if w := writers.Add(1); w > 1 || in > 1 {
							violations.Add(1)
							t.Errorf("a writer holds with %d writers and %d holders", w, in)
						}
					case kind != backend.KindSemaphore && writers.Load() > 0:
						violations.Add(1)
						t.Errorf("a reader holds with a writer")
					}
					if write {
						if _, err := reg.write(context.Background(), value, lk.Token()); err != nil {
							t.Errorf("write: %v", err)
						}
					}
					time.Sleep(time.Duration(r.Int64N(int64(10 * time.Millisecond)))) // the holding: work
					if write {
						writers.Add(-1)
					}
					inside.Add(-1)
					uctx, ucancel := context.WithTimeout(context.Background(), 5*time.Second)
					if err := lk.Unlock(uctx); err != nil {
						t.Errorf("Unlock: %v", err)
					}
					ucancel()
					continue
				}
				if !errors.Is(err, distlock.ErrNotAcquired) {
					t.Errorf("acquire = %v; want ErrNotAcquired", err)
				}
				if ctx.Err() != nil {
					cancelled.Add(1)
				}
				// The clean-up or the withdrawal of an attempt cut short
				// runs in the background: allow it 2s.
				for first, end := true, time.Now().Add(2*time.Second); ; first = false {
					ok, cerr := holdsNothing(value)
					switch {
					case cerr != nil:
						checkErrs.Add(1)
					case ok:
						if !first {
							late.Add(1)
						}
					case time.Now().Before(end):
						time.Sleep(2 * time.Millisecond) // polling with a deadline
						continue
					default:
						orphans.Add(1)
						t.Errorf("orphan: %s still holds a grant or intent 2s after its acquire failed", value)
					}
					break
				}
			}
		})
	}
	wg.Wait()
	if checkErrs.Load() > 0 {
		t.Errorf("%d orphan checks failed", checkErrs.Load())
	}
	left := 0
	waitUntil(t, 10*time.Second, "the lock's keys to go", func() bool {
		left = 0
		for _, k := range redisscript.StateKeys(redis.DefaultPrefix, key) {
			if n, err := direct.Exists(context.Background(), k).Result(); err != nil || n > 0 {
				left++
			}
		}
		return left == 0
	})
	name, notes := fmt.Sprintf("semaphore (limit %d)", limit), fmt.Sprintf("at most %d holders at once", most.Load())
	if kind != backend.KindSemaphore {
		name = "read/write (2 writers, 4 readers)"
		notes = fmt.Sprintf("%d writes, %d refused", reg.accepted, reg.refused)
	}
	stale := reg.stale(evs)
	fault := fmt.Sprintf("%s: %d random ctx cancels mid-acquire, requests and replies delayed 0-20ms", name, total)
	r := &harness.Result{Backend: "redis", Fault: fault, Acquisitions: int(acquired.Load()),
		TokenIssues: history.TokenOrder(evs), Stale: stale, Rejected: reg.refused,
		Orphans: int(orphans.Load()) + left, LossLatency: -1, Recovery: -1,
		Notes: fmt.Sprintf("%s; %d holdings broke the kind's rule; %d cancelled; %d cleaned up in the background within 2s",
			notes, violations.Load(), cancelled.Load(), late.Load())}
	r.Log(t)
	if cancelled.Load() < int64(total)/4 {
		t.Errorf("only %d of %d acquisitions were cancelled: the storm did not storm", cancelled.Load(), total)
	}
	if acquired.Load() == 0 || (kind == backend.KindSemaphore && most.Load() < 2) {
		t.Errorf("%d acquisitions, at most %d holders at once: the run measured nothing", acquired.Load(), most.Load())
	}
	if len(r.TokenIssues) != 0 || len(stale) != 0 || reg.refused != 0 || r.Orphans != 0 {
		t.Errorf("%d token issues, %d stale writes accepted, %d writes refused, %d orphans; want 0 each",
			len(r.TokenIssues), len(stale), reg.refused, r.Orphans)
	}
}

// testRWFrozenWriter: a writer holding a read/write lock (TTL 300ms, no
// renewal) freezes for three TTLs, as a process in a long GC pause, not
// looking at Done. Readers and then a writer take the lock once its grant
// expired, and use the resource; the frozen writer wakes and writes with
// its old token: the register must refuse it (the writer that followed
// wrote with a larger token), and it must have seen its Done closed.
func testRWFrozenWriter(t *testing.T, addr string) {
	c := redisVia(t, addr)
	key := uniqueKey(t)
	procs := make([]*distlock.DistributeLock, 3)
	for i := range procs {
		res := newRedis(t, c)
		d, err := distlock.New(res, distlock.WithDefaultTTL(redisTTL), distlock.WithAutoRenew())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close(); _ = res.Close() })
		procs[i] = d
	}
	frozenD, err := distlock.New(newRedis(t, c), distlock.WithDefaultTTL(redisTTL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = frozenD.Close() })
	reg := newRedisRegister(t, addr, key)
	var (
		mu  sync.Mutex
		evs []history.Event
	)
	take := func(d *distlock.DistributeLock, owner string, write bool) (*distlock.Lock, int64, int64) {
		t.Helper()
		call := history.Now()
		var lk *distlock.Lock
		var err error
		if write {
			lk, err = d.RWMutex(key).TryLock(t.Context(), 10*redisTTL)
		} else {
			lk, err = d.RWMutex(key).TryRLock(t.Context(), 10*redisTTL)
		}
		if err != nil {
			t.Errorf("%s: %v", owner, err)
			return nil, 0, 0
		}
		ret := history.Now()
		mu.Lock()
		evs = append(evs, history.Event{Kind: history.Acquire, Owner: owner, Call: call, Return: ret, Token: lk.Token()})
		mu.Unlock()
		return lk, call, ret
	}
	frozen, fcall, fret := take(frozenD, "frozen", true)
	if frozen == nil {
		t.FailNow()
	}
	done := frozen.Done() // watched, as a holder does; looked at only on waking
	if ok, err := reg.write(t.Context(), "frozen", frozen.Token()); !ok || err != nil {
		t.Fatalf("the frozen writer's first write: accepted %v, %v; want true", ok, err)
	}
	frozeAt := time.Now()
	// Others queue while it holds, then get in once its grant expired.
	var wg sync.WaitGroup
	var grantedAfter atomic.Int64 // ns after the freeze of the first grant
	var others []history.Interval
	for i, d := range procs {
		write := i == 2
		wg.Go(func() {
			owner := fmt.Sprintf("p%d", i)
			lk, call, ret := take(d, owner, write)
			if lk == nil {
				return
			}
			grantedAfter.CompareAndSwap(0, int64(time.Since(frozeAt)))
			if write {
				if ok, err := reg.write(context.Background(), owner, lk.Token()); !ok || err != nil {
					t.Errorf("%s's write: accepted %v, %v; want true", owner, ok, err)
				}
			}
			time.Sleep(redisTTL / 2) // the holding: work
			mu.Lock()
			others = append(others, history.Interval{Owner: owner, Token: lk.Token(), Call: call, Start: ret, End: history.Now(), EndedBy: "unlock"})
			mu.Unlock()
			if err := lk.Unlock(context.Background()); err != nil {
				t.Errorf("%s: Unlock: %v", owner, err)
			}
		})
	}
	time.Sleep(3 * redisTTL) // the pause: the frozen writer does nothing, as a stopped process
	woke := history.Now()
	wg.Wait()
	zombie, err := reg.write(context.Background(), "frozen", frozen.Token())
	if err != nil {
		t.Fatal(err)
	}
	lost := isDone(done)
	if err := frozen.Unlock(context.Background()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("the frozen writer's Unlock = %v; want ErrNotHeld", err)
	}
	// The frozen writer believed it held until it woke.
	mine := history.Interval{Owner: "frozen", Token: frozen.Token(), Call: fcall, Start: fret, End: woke, EndedBy: "end"}
	var overlaps []history.Overlap
	for _, o := range others {
		if o.Start < mine.End {
			overlaps = append(overlaps, history.Overlap{Older: mine, Newer: o, From: o.Start, To: min(o.End, mine.End)})
		}
	}
	left := 0
	waitUntil(t, 10*time.Second, "the lock's keys to go", func() bool {
		left = 0
		for _, k := range redisscript.StateKeys(redis.DefaultPrefix, key) {
			if n, err := c.Exists(context.Background(), k).Result(); err != nil || n > 0 {
				left++
			}
		}
		return left == 0
	})
	var uncaught []history.Overlap
	if zombie {
		uncaught = overlaps
	}
	stale := reg.stale(evs)
	r := &harness.Result{Backend: "redis", Fault: "read/write: writer frozen 3x TTL (2 readers and a writer wait)",
		Acquisitions: len(evs), TokenIssues: history.TokenOrder(evs), Stale: stale,
		Rejected: reg.refused, Overlaps: overlaps, Uncaught: uncaught,
		Orphans: left, LossLatency: -1, Recovery: time.Duration(grantedAfter.Load()),
		Notes: fmt.Sprintf("recovery from the freeze; the frozen writer's Done closed: %v; its write after waking refused: %v", lost, !zombie)}
	r.Log(t)
	if len(overlaps) == 0 {
		t.Errorf("no holding overlapped the frozen writer's: the run measured nothing")
	}
	if zombie || len(stale) != 0 || len(r.TokenIssues) != 0 || left != 0 || !lost {
		t.Errorf("frozen writer's late write accepted %v, %d stale writes accepted, %d token issues, %d keys left, Done closed %v; want false, 0, 0, 0, true",
			zombie, len(stale), len(r.TokenIssues), left, lost)
	}
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
