package safety

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/redlock"
	"github.com/distlock/distlock/safety/harness"
)

// stalledRedis is a Redis-family store for the stalled-store scenario.
type stalledRedis struct {
	name, fault string
	// open returns a fresh resource over clients configured as a user
	// would (Redis: go-redis's defaults, ContextTimeoutEnabled off and
	// ReadTimeout 5s; Redlock: ContextTimeoutEnabled, as its doc
	// recommends), and what closes it.
	open func(t *testing.T) (backend.RemoteResource, func())
	// values returns what each server or node holds under key's lock
	// ("" when nothing, "<down>" when it does not answer).
	values func(key string) []string
	// stall freezes the store (SIGSTOP) until resume is called.
	stall func() (resume func())
}

// ofValue reports whether stored, what a server holds under a lock, was
// stored by the acquisition with owner value v (Redlock stores v#round).
func ofValue(stored, v string) bool {
	return stored == v || strings.HasPrefix(stored, v+"#")
}

// testRedisStalled freezes the store (SIGSTOP) for 1.5s while four
// "processes" (a DistributeLock each) keep calling it as users would:
// TryLock with a 100-500ms context and a 5s wait, with a context
// cancelled after 100-500ms, with a 100-500ms wait and no deadline, and
// Unlock of locks taken before the stall with a 100-500ms context. Every
// call must return within its bound (the row gives the largest
// overshoot past the context's end, the wait's end plus the facade's
// 10ms grace). Once the store answers again, a fresh owner takes every
// key and holds it for a second while a sampler reads what the store
// holds every 5ms: an abandoned attempt's value seen after the fresh
// owner got the key is a late grant. Orphans: what the store still holds
// for any key once every DistributeLock closed (Close waits for the
// clean-ups it runs in the background).
func testRedisStalled(t *testing.T, st stalledRedis) {
	const (
		workers  = 4
		held     = 2 // locks each worker takes before the stall
		stallFor = 1500 * time.Millisecond
		ttl      = time.Minute // an orphan would outlast the run
	)
	ctx := context.Background()
	base := uniqueKey(t)
	type call struct {
		what      string
		overshoot time.Duration
	}
	var (
		mu        sync.Mutex
		calls     []call
		abandoned = map[string]string{} // owner value of a failed TryLock -> key
		keys      []string
		granted   int // TryLocks granted while the store was stalled
	)
	type worker struct {
		d      *distlock.DistributeLock
		close  func()
		locks  []*distlock.Lock
		value  string // the owner value of the last TryLock
		rnd    *mrand.Rand
		failed []*distlock.Lock // Unlocks cut short
	}
	ws := make([]*worker, workers)
	for i := range ws {
		w := &worker{rnd: mrand.New(mrand.NewPCG(seed, uint64(i)+200))}
		res, closeRes := st.open(t)
		d, err := distlock.New(res, distlock.WithDefaultTTL(ttl), distlock.WithCloseTimeout(10*time.Second),
			distlock.WithValueFunc(func() string {
				w.value = fmt.Sprintf("w%d-%x", i, w.rnd.Uint64())
				return w.value
			}))
		if err != nil {
			t.Fatal(err)
		}
		w.d, w.close = d, closeRes
		for j := range held {
			k := fmt.Sprintf("%s-%d-held%d", base, i, j)
			lk, err := d.TryLock(ctx, k, 0)
			if err != nil {
				t.Fatalf("TryLock before the stall: %v", err)
			}
			w.locks = append(w.locks, lk)
			keys = append(keys, k)
		}
		ws[i] = w
	}

	resume := st.stall()
	resumed := false
	defer func() {
		if !resumed {
			resume()
		}
	}()
	stalledAt := time.Now()
	stallEnd := stalledAt.Add(stallFor)
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() {
			for n := 0; ; n++ {
				d := 100*time.Millisecond + time.Duration(w.rnd.Int64N(int64(400*time.Millisecond)))
				if time.Now().Add(d).After(stallEnd) {
					return
				}
				key := fmt.Sprintf("%s-%d-%d", base, i, n)
				var (
					what string
					lk   *distlock.Lock
					err  error
				)
				start := time.Now()
				switch kind := w.rnd.IntN(4); {
				case kind == 3 && len(w.locks) > 0:
					what = "Unlock, context"
					lk, w.locks = w.locks[0], w.locks[1:]
					cctx, cancel := context.WithTimeout(ctx, d)
					if err = lk.Unlock(cctx); err != nil {
						w.failed = append(w.failed, lk)
					}
					cancel()
					lk = nil
				case kind == 0:
					what = "TryLock, context, 5s wait"
					cctx, cancel := context.WithTimeout(ctx, d)
					lk, err = w.d.TryLock(cctx, key, 5*time.Second)
					cancel()
				case kind == 1:
					what = "TryLock, cancelled context, 5s wait"
					cctx, cancel := context.WithCancel(ctx)
					stop := time.AfterFunc(d, cancel)
					lk, err = w.d.TryLock(cctx, key, 5*time.Second)
					stop.Stop()
					cancel()
				default:
					what = "TryLock, wait"
					lk, err = w.d.TryLock(ctx, key, d)
				}
				bound := d
				if what == "TryLock, wait" {
					bound += 10 * time.Millisecond // the facade's grace after a wait's last attempt
				}
				over := time.Since(start) - bound
				mu.Lock()
				calls = append(calls, call{what, over})
				if strings.HasPrefix(what, "TryLock") {
					keys = append(keys, key)
					if lk != nil {
						granted++
					} else if err != nil {
						abandoned[w.value] = key
					}
				}
				mu.Unlock()
				if lk != nil {
					_ = lk.Unlock(ctx)
				}
			}
		})
	}
	wg.Wait()
	time.Sleep(time.Until(stallEnd))
	resume()
	resumed = true
	resumedAt := time.Now()

	// The locks whose Unlock was cut short are still held, as are those
	// not unlocked during the stall: unlock them now (nil, or ErrNotHeld
	// if a cut request landed after all).
	for _, w := range ws {
		for _, lk := range append(w.failed, w.locks...) {
			if err := lk.Unlock(ctx); err != nil && !errors.Is(err, distlock.ErrNotHeld) {
				t.Errorf("Unlock once the store answers = %v", err)
			}
		}
	}
	// A fresh owner takes every key and holds it while a sampler looks
	// for abandoned attempts' values.
	res, closeRes := st.open(t)
	fresh, err := distlock.New(res, distlock.WithDefaultTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	type seen struct {
		key, value string
		at         time.Time
	}
	var (
		smu     sync.Mutex
		samples []seen
	)
	stop := make(chan struct{})
	var sg sync.WaitGroup
	sg.Go(func() {
		for {
			for _, k := range keys {
				at := time.Now()
				for _, v := range st.values(k) {
					if v != "" {
						smu.Lock()
						samples = append(samples, seen{k, v, at})
						smu.Unlock()
					}
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
	grantedAt := map[string]time.Time{}
	var freshLocks []*distlock.Lock
	var recovery time.Duration
	for _, k := range keys {
		lk, err := fresh.TryLock(ctx, k, 30*time.Second)
		if err != nil {
			t.Fatalf("fresh TryLock(%q) once the store answers: %v", k, err)
		}
		grantedAt[k] = time.Now()
		recovery = max(recovery, time.Since(resumedAt))
		freshLocks = append(freshLocks, lk)
	}
	time.Sleep(time.Second)
	close(stop)
	sg.Wait()
	for _, lk := range freshLocks {
		if err := lk.Unlock(ctx); err != nil {
			t.Errorf("fresh Unlock(%q): %v", lk.Key(), err)
		}
	}
	if err := fresh.Close(); err != nil {
		t.Errorf("fresh Close: %v", err)
	}
	// Close waits for the background clean-ups: they must all succeed.
	var closeErrs []error
	for _, w := range ws {
		if err := w.d.Close(); err != nil {
			closeErrs = append(closeErrs, err)
		}
	}
	if len(closeErrs) > 0 {
		t.Errorf("Close once the store answers: %v", errors.Join(closeErrs...))
	}
	// The clients stay open until the end: a Redlock release returns once
	// a majority deleted the key, the other nodes' deletes finish on them.
	t.Cleanup(closeRes)
	for _, w := range ws {
		t.Cleanup(w.close)
	}

	lateGrants, seenAfter := 0, 0
	for _, s := range samples {
		for v, k := range abandoned {
			if k != s.key || !ofValue(s.value, v) {
				continue
			}
			seenAfter++
			if s.at.After(grantedAt[k]) {
				lateGrants++
				t.Errorf("%s held abandoned attempt %s %v after the fresh owner got it", k, v, s.at.Sub(grantedAt[k]))
			}
		}
	}
	// What the store still holds a second after every lock closed (the
	// last releases' stragglers are done by then).
	orphaned := 0
	settle := time.Now().Add(time.Second)
	for _, k := range keys {
		for i := range st.values(k) {
			var v string
			for v = st.values(k)[i]; v != "" && time.Now().Before(settle); v = st.values(k)[i] {
				time.Sleep(10 * time.Millisecond) // polling with a deadline
			}
			if v != "" {
				orphaned++
				t.Errorf("orphan: %s holds %q (server/node %d) once every lock closed", k, v, i)
			}
		}
	}
	var maxOver time.Duration
	over := 0
	for _, c := range calls {
		maxOver = max(maxOver, c.overshoot)
		if c.overshoot > stallSlack {
			over++
			t.Errorf("%s returned %v past its bound", c.what, c.overshoot)
		}
	}
	if granted > 0 {
		t.Errorf("%d TryLocks granted while the store was stalled", granted)
	}
	if len(abandoned) == 0 {
		t.Errorf("no TryLock failed during the stall: the scenario tested nothing")
	}
	out := &harness.Result{Backend: st.name, Fault: st.fault, Acquisitions: workers*held + len(freshLocks),
		Orphans: orphaned, LossLatency: -1, Recovery: recovery,
		Notes: fmt.Sprintf("%d calls during the stall, %d past their bound + %v (largest overshoot %v); %d TryLocks abandoned, seen in the store by %d samples after SIGCONT; %d late grants; recovery: every key taken by a fresh owner",
			len(calls), over, stallSlack, maxOver.Round(100*time.Microsecond), len(abandoned), seenAfter, lateGrants)}
	out.Log(t)
}

// testRedisStalledServer is the stalled-store scenario on one Redis.
func testRedisStalledServer(t *testing.T, srv *testserver.RedisServer) {
	direct := redisVia(t, srv.Addr)
	testRedisStalled(t, stalledRedis{
		name:  "redis",
		fault: "server SIGSTOP 1.5s under TryLock (100-500ms contexts, cancels, waits) and Unlock (100-500ms contexts), TTL 1m, go-redis defaults",
		open: func(t *testing.T) (backend.RemoteResource, func()) {
			c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
			r := newRedis(t, c)
			return r, func() { _ = r.Close(); _ = c.Close() }
		},
		values: func(key string) []string {
			lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
			return []string{getValue(direct, lock)}
		},
		stall: func() func() {
			srv.Pause()
			return srv.Resume
		},
	})
}

// testRedlockStalledMajority is the stalled-store scenario on Redlock,
// three of five nodes frozen.
func testRedlockStalledMajority(t *testing.T, nodes []*testserver.RedisServer) {
	var direct []*goredis.Client
	for _, n := range nodes {
		direct = append(direct, redisVia(t, n.Addr))
	}
	frozen := []int{0, 2, 4}
	testRedisStalled(t, stalledRedis{
		name:  "redlock",
		fault: "3 of 5 nodes SIGSTOP 1.5s under TryLock (100-500ms contexts, cancels, waits) and Unlock (100-500ms contexts), TTL 1m, ContextTimeoutEnabled",
		open: func(t *testing.T) (backend.RemoteResource, func()) {
			var cs []goredis.UniversalClient
			for _, n := range nodes {
				cs = append(cs, goredis.NewClient(&goredis.Options{Addr: n.Addr, ContextTimeoutEnabled: true}))
			}
			closeAll := func() {
				for _, c := range cs {
					_ = c.Close()
				}
			}
			r, err := redlock.New(cs)
			if err != nil {
				closeAll()
				t.Fatal(err)
			}
			return r, func() { _ = r.Close(); closeAll() }
		},
		values: func(key string) []string {
			lock, _ := redisscript.Layout(redlock.DefaultPrefix, key)
			out := make([]string, len(direct))
			for i, c := range direct {
				out[i] = getValue(c, lock)
			}
			return out
		},
		stall: func() func() {
			for _, i := range frozen {
				nodes[i].Pause()
			}
			return func() {
				for _, i := range frozen {
					nodes[i].Resume()
				}
			}
		},
	})
}

// getValue returns what c holds under key: "" when nothing, "<down>"
// when it does not answer within a second.
func getValue(c *goredis.Client, key string) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	v, err := c.Get(ctx, key).Result()
	switch {
	case err == goredis.Nil:
		return ""
	case err != nil:
		return "<down>"
	}
	return v
}
