package redis_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/testsuite"
)

// sentLog records what a client sends: each request (a command alone, or
// a pipeline) as the list of its commands' keys, in the order sent.
type sentLog struct {
	mu   sync.Mutex
	reqs [][]string
}

func (*sentLog) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (s *sentLog) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		s.add(cmd)
		return next(ctx, cmd)
	}
}

func (s *sentLog) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		s.add(cmds...)
		return next(ctx, cmds)
	}
}

// add logs one request: for a script, its first key; else the command's
// name.
func (s *sentLog) add(cmds ...goredis.Cmder) {
	var keys []string
	for _, c := range cmds {
		args := c.Args()
		name := strings.ToLower(c.Name())
		if (name == "evalsha" || name == "eval") && len(args) > 3 {
			keys = append(keys, args[3].(string))
		} else {
			keys = append(keys, name)
		}
	}
	s.mu.Lock()
	s.reqs = append(s.reqs, keys)
	s.mu.Unlock()
}

// find returns the requests that carry key.
func (s *sentLog) find(key string) [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out [][]string
	for _, r := range s.reqs {
		for _, k := range r {
			if k == key {
				out = append(out, r)
				break
			}
		}
	}
	return out
}

func (s *sentLog) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}

// loggedClient is a client of srv whose requests l records.
func loggedClient(t *testing.T, addr string, l *sentLog) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	c.AddHook(l)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func lockKey(key string) string {
	lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
	return lock
}

// TestLoneCallSentAlone: a call that finds nothing in flight goes at
// once, as one command, not in a pipeline.
func TestLoneCallSentAlone(t *testing.T) {
	srv := testserver.Redis(t)
	var log sentLog
	r := newResource(t, loggedClient(t, srv.Addr, &log))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l := newLease(uniqueKey(t), time.Minute)
	for _, step := range []func() error{
		func() error { _, _, err := r.TryAcquire(ctx, l); return err },
		func() error { return r.Refresh(ctx, l) },
		func() error { return r.Release(ctx, l) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	// 3 requests, or up to 6 on a server that had not the scripts
	// cached (EVALSHA, then EVAL).
	reqs := log.find(lockKey(l.Key))
	if len(reqs) < 3 || len(reqs) > 6 {
		t.Fatalf("sent %v; want 3 requests (6 with NOSCRIPT)", reqs)
	}
	for _, rq := range reqs {
		if len(rq) != 1 {
			t.Errorf("a lone call went in a request of %d commands: %v", len(rq), rq)
		}
	}
}

// pauseWithCallsInFlight freezes srv and sends as many calls as the
// Resource keeps in flight (acquires of keys of their own), which will
// wait for it: the calls made next find every batch busy. It returns the
// calls' results and leases.
func pauseWithCallsInFlight(t *testing.T, srv *testserver.RedisServer, r *redis.Resource, log *sentLog) (<-chan error, []*backend.Lease) {
	t.Helper()
	srv.Pause()
	done := make(chan error, redis.MaxInFlight)
	var ls []*backend.Lease
	for i := range redis.MaxInFlight {
		l := newLease(uniqueKey(t)+"-first"+strconv.Itoa(i), time.Minute)
		ls = append(ls, l)
		go func() {
			_, _, err := r.TryAcquire(context.Background(), l)
			done <- err
		}()
		waitFor(t, "a first call sent", func() bool { return len(log.find(lockKey(l.Key))) == 1 })
	}
	return done, ls
}

// TestOverlappingCallsShareAPipeline: calls made while a batch is in
// flight go to the server together, in one pipeline, and each gets its
// own reply, the failing one its own error.
func TestOverlappingCallsShareAPipeline(t *testing.T) {
	srv := testserver.Redis(t)
	var log sentLog
	c := loggedClient(t, srv.Addr, &log)
	direct := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = direct.Close() })
	r := newResource(t, c)
	ctx := context.Background()
	base := uniqueKey(t)

	// held: a lease held before; free: one acquired in the batch; taken:
	// one whose key the held lease holds; wrong: a key of the wrong type.
	held := newLease(base+"-held", time.Minute)
	held.Label = "held"
	mustAcquire(t, r, held)
	free := newLease(base+"-free", time.Minute)
	free.Label = "free"
	taken := newLease(held.Key, time.Minute)
	wrong := newLease(base+"-wrong", time.Minute)
	if err := direct.HSet(ctx, lockKey(wrong.Key), "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	never := newLease(base+"-never", time.Minute)
	// The scripts are gone: the pipeline's EVALSHAs fail with NOSCRIPT
	// and are sent again with EVAL.
	if err := direct.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	firstDone, firsts := pauseWithCallsInFlight(t, srv, r, &log)
	type res struct {
		ok  bool
		ttl time.Duration
		err error
		ins backend.Inspection
	}
	var wg sync.WaitGroup
	var rFree, rTaken, rWrong, rRefresh, rNever, rInspect res
	wg.Go(func() { rFree.ok, rFree.ttl, rFree.err = r.TryAcquire(ctx, free) })
	wg.Go(func() { rTaken.ok, rTaken.ttl, rTaken.err = r.TryAcquire(ctx, taken) })
	wg.Go(func() { rWrong.ok, rWrong.ttl, rWrong.err = r.TryAcquire(ctx, wrong) })
	wg.Go(func() { rRefresh.err = r.Refresh(ctx, held) })
	wg.Go(func() { rNever.err = r.Release(ctx, never) })
	wg.Go(func() { rInspect.ins, rInspect.err = r.Inspect(ctx, held.Key, backend.KindMutex) })
	waitFor(t, "six calls queued", func() bool { return redis.Queued(r) == 6 })
	srv.Resume()
	wg.Wait()
	for range firsts {
		if err := <-firstDone; err != nil {
			t.Fatalf("first call: %v", err)
		}
	}

	if !rFree.ok || rFree.err != nil || free.Token == 0 {
		t.Errorf("TryAcquire(free) = %v, %v, token %d; want acquired with a token", rFree.ok, rFree.err, free.Token)
	}
	if rTaken.ok || rTaken.err != nil || rTaken.ttl <= 0 {
		t.Errorf("TryAcquire(taken) = %v, %v, %v; want not acquired with the holder's TTL", rTaken.ok, rTaken.ttl, rTaken.err)
	}
	if rWrong.ok || rWrong.err == nil || !strings.Contains(rWrong.err.Error(), "WRONGTYPE") {
		t.Errorf("TryAcquire(wrong type) = %v, %v; want a WRONGTYPE error", rWrong.ok, rWrong.err)
	}
	if rRefresh.err != nil {
		t.Errorf("Refresh(held) = %v; want nil", rRefresh.err)
	}
	if !errors.Is(rNever.err, backend.ErrNotHeld) {
		t.Errorf("Release(never acquired) = %v; want ErrNotHeld", rNever.err)
	}
	if rInspect.err != nil || len(rInspect.ins.Holders) != 1 || rInspect.ins.Holders[0].Label != "held" ||
		rInspect.ins.Holders[0].Token != held.Token {
		t.Errorf("Inspect(held) = %+v, %v; want the held lease (token %d)", rInspect.ins, rInspect.err, held.Token)
	}
	// The six went in one request, after the first calls'.
	reqs := log.find(lockKey(free.Key))
	if len(reqs) == 0 {
		t.Fatal("the free key's acquire was never sent")
	}
	if n := len(reqs[0]); n != 6 {
		t.Errorf("the free key's acquire went in a request of %d commands (%v); want the 6 calls together", n, reqs[0])
	}
	for _, first := range firsts {
		for _, rq := range log.find(lockKey(first.Key)) {
			if len(rq) != 1 {
				t.Errorf("a first call went in a request of %d commands: %v", len(rq), rq)
			}
		}
	}
	// The release's script was not cached: EVALSHA, then EVAL, each in a
	// pipeline with others'.
	if reqs := log.find(lockKey(never.Key)); len(reqs) != 2 || len(reqs[1]) < 2 {
		t.Errorf("the release went in %v; want the batch, then a pipeline of the NOSCRIPT retries", reqs)
	}
	for _, l := range append([]*backend.Lease{held, free}, firsts...) {
		if err := r.Release(ctx, l); err != nil {
			t.Errorf("Release(%s): %v", l.Key, err)
		}
	}
	_ = direct.Del(ctx, lockKey(wrong.Key))
}

// TestQueuedCallNeverSent: a call queued behind the batches in flight
// whose context ends returns at once and is never sent; a call made after
// those batches' callers gave up goes at once, on another connection,
// while they are still stuck.
func TestQueuedCallNeverSent(t *testing.T) {
	srv := testserver.Redis(t)
	var log sentLog
	// A ReadTimeout far above the waits: a call that went only once the
	// stuck batch failed would show.
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ReadTimeout: time.Minute, MaxRetries: -1})
	c.AddHook(&log)
	t.Cleanup(func() { _ = c.Close() })
	r := newResource(t, c)
	base := uniqueKey(t)

	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	// The first calls, one per batch the Resource keeps in flight: their
	// callers give up after 100ms.
	ctx1, cancel1 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel1()
	firstDone := make(chan error, redis.MaxInFlight)
	var firsts []*backend.Lease
	for i := range redis.MaxInFlight {
		first := newLease(base+"-first"+strconv.Itoa(i), time.Minute)
		firsts = append(firsts, first)
		go func() {
			_, _, err := r.TryAcquire(ctx1, first)
			firstDone <- err
		}()
		waitFor(t, "a first call sent", func() bool { return len(log.find(lockKey(first.Key))) == 1 })
	}
	// A queued call whose context ends before the first's.
	queued := newLease(base+"-queued", time.Minute)
	ctx2, cancel2 := context.WithCancel(context.Background())
	queuedDone := make(chan error, 1)
	go func() {
		_, _, err := r.TryAcquire(ctx2, queued)
		queuedDone <- err
	}()
	waitFor(t, "the call queued", func() bool { return redis.Queued(r) == 1 })
	cancel2()
	if err := <-queuedDone; !errors.Is(err, context.Canceled) {
		t.Errorf("queued call = %v; want an error wrapping context.Canceled", err)
	}
	var abs []*backend.AbandonedError
	for range firsts {
		var ab *backend.AbandonedError
		if err := <-firstDone; !errors.As(err, &ab) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("first call = %v; want an AbandonedError wrapping DeadlineExceeded", err)
		}
		abs = append(abs, ab)
	}
	// The first batches are stuck, and nobody waits for them: the next
	// call is sent at once.
	next := newLease(base+"-next", time.Minute)
	nextDone := make(chan error, 1)
	go func() {
		_, _, err := r.TryAcquire(context.Background(), next)
		nextDone <- err
	}()
	waitFor(t, "the next call sent while the first batches are stuck", func() bool {
		return len(log.find(lockKey(next.Key))) == 1
	})
	srv.Resume()
	resumed = true
	if err := <-nextDone; err != nil {
		t.Errorf("next call = %v", err)
	}
	ctx := context.Background()
	for _, ab := range abs {
		if err := ab.Cleanup(ctx); err != nil {
			t.Errorf("Cleanup of a first call: %v", err)
		}
	}
	if err := r.Release(ctx, next); err != nil {
		t.Errorf("Release(next): %v", err)
	}
	// The queued call never reached the server (its abandoned error's
	// clean-up was not run).
	for _, rq := range log.find(lockKey(queued.Key)) {
		t.Errorf("the queued call was sent: %v", rq)
	}
	direct := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = direct.Close() })
	for _, l := range append([]*backend.Lease{queued, next}, firsts...) {
		if n := direct.Exists(ctx, lockKey(l.Key)).Val(); n != 0 {
			t.Errorf("%s left behind", l.Key)
		}
	}
}

// TestDispatcherRandomized races calls of one Resource from many
// goroutines, with random contexts (none, deadlines, cancellations),
// through a proxy that delays replies, while the server freezes, and
// restarts (losing its data and its scripts). After every call it checks
// that the reply is the call's own: an acquire of a goroutine's own key
// succeeds with a fresh token, one of a key another lease holds does not,
// an inspection lists exactly the goroutine's own lease (label and
// token), a refresh and a release of a held lease succeed, and those of a
// lease never acquired find nothing held; no call returns after its
// context's end (plus slack), and every one returns. At the end no lock
// key is left on the server.
func TestDispatcherRandomized(t *testing.T) {
	const goroutines = 12
	run := 3 * time.Second
	if testing.Short() {
		run = 1500 * time.Millisecond
	}
	seed := testSeed(t)

	srv := testserver.Redis(t)
	var log sentLog
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, MaxRetries: -1,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
	c.AddHook(&log)
	t.Cleanup(func() { _ = c.Close() })
	direct := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = direct.Close() })
	r := newResource(t, c)
	base := uniqueKey(t)

	// restarts is odd while the server restarts, and goes up by 2 with
	// each: a lock held across one may be gone (the server keeps no
	// data). stable says none began since epoch, nor was under way then
	// (the new server may answer before Restart returns).
	var restarts atomic.Int64
	stable := func(epoch int64) bool { return epoch%2 == 0 && restarts.Load() == epoch }
	var cleanups sync.WaitGroup
	cleanUp := func(ab *backend.AbandonedError) {
		cleanups.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for backoff := 5 * time.Millisecond; ; backoff = min(2*backoff, 200*time.Millisecond) {
				err := ab.Cleanup(ctx)
				if err == nil || errors.Is(err, backend.ErrNotHeld) {
					return
				}
				if ctx.Err() != nil {
					t.Errorf("Cleanup never succeeded: %v", err)
					return
				}
				time.Sleep(backoff)
			}
		})
	}
	var stats struct {
		sync.Mutex
		calls, ok, abandoned, failed int
	}
	count := func(ok, abandoned, failed bool) {
		stats.Lock()
		defer stats.Unlock()
		stats.calls++
		switch {
		case abandoned:
			stats.abandoned++
		case failed:
			stats.failed++
		case ok:
			stats.ok++
		}
	}

	end := time.Now().Add(run)
	var ws sync.WaitGroup
	for g := range goroutines {
		rnd := rand.New(rand.NewPCG(seed, uint64(g)))
		// callCtx is a random context, and the latest time a call with
		// it may return.
		callCtx := func() (context.Context, context.CancelFunc, time.Time) {
			d := time.Duration(rnd.Int64N(int64(20 * time.Millisecond)))
			switch rnd.IntN(4) {
			case 0:
				return context.Background(), func() {}, time.Time{}
			case 1:
				ctx, cancel := context.WithTimeout(context.Background(), d)
				return ctx, cancel, time.Now().Add(d + testsuite.StallSlack)
			default:
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(d, cancel)
				return ctx, cancel, time.Now().Add(d + testsuite.StallSlack)
			}
		}
		late := func(what string, bound time.Time) {
			if !bound.IsZero() && time.Now().After(bound) {
				t.Errorf("%s returned %v after its context's end plus %v", what, time.Since(bound), testsuite.StallSlack)
			}
		}
		own := base + "-" + strconv.Itoa(g)
		ws.Go(func() {
			var lastToken uint64
			for i := 0; time.Now().Before(end); i++ {
				l := newLease(own, time.Minute)
				l.Label = "g" + strconv.Itoa(g) + "-" + strconv.Itoa(i)
				epoch := restarts.Load()
				ctx, cancel, bound := callCtx()
				ok, _, err := r.TryAcquire(ctx, l)
				late("TryAcquire", bound)
				cancel()
				var ab *backend.AbandonedError
				if errors.As(err, &ab) {
					count(false, true, false)
					cleanUp(ab)
					continue
				}
				if err != nil {
					count(false, false, true)
					continue
				}
				count(ok, false, false)
				if !ok {
					// Nobody else takes this goroutine's key, and every
					// earlier lease of it was released or cleaned up:
					// only a clean-up not yet run (a tombstone) or a
					// release cut short may hold it.
					continue
				}
				if l.Token == 0 || (l.Token <= lastToken && stable(epoch)) {
					t.Errorf("%s: token %d after %d: not this acquire's reply", l.Label, l.Token, lastToken)
				}
				lastToken = l.Token
				// Another lease of the same key: must not get it.
				other := newLease(own, time.Minute)
				ctx, cancel, bound = callCtx()
				ok2, ttl2, err := r.TryAcquire(ctx, other)
				late("TryAcquire(other)", bound)
				cancel()
				if errors.As(err, &ab) {
					cleanUp(ab)
				} else if err == nil && ok2 {
					if stable(epoch) {
						t.Errorf("%s: a second lease acquired a held key", l.Label)
					}
					_ = r.Release(context.Background(), other)
				} else if err == nil && ttl2 <= 0 && stable(epoch) {
					t.Errorf("%s: contended acquire reported holder TTL %v", l.Label, ttl2)
				}
				// Inspect: exactly this lease.
				ctx, cancel, bound = callCtx()
				ins, err := r.Inspect(ctx, own, backend.KindMutex)
				late("Inspect", bound)
				cancel()
				if err == nil && stable(epoch) {
					if len(ins.Holders) != 1 || ins.Holders[0].Label != l.Label || ins.Holders[0].Token != l.Token {
						t.Errorf("%s: Inspect = %+v; want this lease, token %d", l.Label, ins, l.Token)
					}
				}
				// Refresh this lease and a lease never acquired.
				ctx, cancel, bound = callCtx()
				err = r.Refresh(ctx, l)
				late("Refresh", bound)
				cancel()
				if isReply(err) && stable(epoch) {
					t.Errorf("%s: Refresh of the held lease = %v", l.Label, err)
				}
				ctx, cancel, bound = callCtx()
				err = r.Refresh(ctx, newLease(own, time.Minute))
				late("Refresh(never)", bound)
				cancel()
				if isReply(err) && !errors.Is(err, backend.ErrNotHeld) {
					t.Errorf("%s: Refresh of a lease never acquired = %v; want ErrNotHeld", l.Label, err)
				} else if err == nil {
					t.Errorf("%s: Refresh of a lease never acquired succeeded", l.Label)
				}
				// Release, until it answers (as Unlock may be retried).
				ctx, cancel, bound = callCtx()
				err = r.Release(ctx, l)
				late("Release", bound)
				cancel()
				if errors.Is(err, backend.ErrNotHeld) && stable(epoch) {
					t.Errorf("%s: Release of the held lease = ErrNotHeld", l.Label)
				}
				for err != nil && !errors.Is(err, backend.ErrNotHeld) {
					err = r.Release(context.Background(), l)
				}
			}
		})
	}
	// The injector: short freezes, and one restart (which loses the
	// data and the script cache: NOSCRIPT in pipelines).
	inj := rand.New(rand.NewPCG(seed, 1<<32))
	for restarted := false; time.Now().Before(end); {
		time.Sleep(100*time.Millisecond + time.Duration(inj.Int64N(int64(200*time.Millisecond))))
		if !restarted && time.Until(end) < run/2 {
			restarted = true
			restarts.Add(1)
			srv.Restart()
			restarts.Add(1)
			continue
		}
		srv.Pause()
		time.Sleep(20*time.Millisecond + time.Duration(inj.Int64N(int64(100*time.Millisecond))))
		srv.Resume()
	}
	ws.Wait()
	cleanups.Wait()

	stats.Lock()
	t.Logf("%d acquire attempts: %d acquired, %d abandoned, %d failed; %d requests sent", stats.calls,
		stats.ok, stats.abandoned, stats.failed, log.count())
	stats.Unlock()
	if stats.abandoned == 0 || stats.ok == 0 {
		t.Errorf("no attempt abandoned or none acquired: the test tested little")
	}
	batched := 0
	log.mu.Lock()
	for _, rq := range log.reqs {
		if len(rq) > 1 {
			batched++
		}
	}
	log.mu.Unlock()
	if batched == 0 {
		t.Errorf("no request carried more than one call: nothing was batched")
	}
	t.Logf("%d requests carried several calls", batched)
	ctx := context.Background()
	for g := range goroutines {
		for _, sk := range redisscript.StateKeys(redis.DefaultPrefix, base+"-"+strconv.Itoa(g)) {
			if n, err := direct.Exists(ctx, sk).Result(); err != nil || n != 0 {
				t.Errorf("%s left (%v)", sk, err)
			}
		}
	}
}

// isReply reports whether err is a reply of the server (ErrNotHeld, or
// an error reply), not the client's (a broken connection, a context
// that ended): a call that got a reply must have got its own.
func isReply(err error) bool {
	var re goredis.Error
	return errors.Is(err, backend.ErrNotHeld) || errors.As(err, &re)
}

// TestClusterBatches: on Cluster, calls that overlap go in pipelines that
// go-redis splits by node, and each call still gets its own reply: 32
// goroutines acquire, inspect, refresh and release keys of their own,
// spread over the slots, and check every reply.
func TestClusterBatches(t *testing.T) {
	const goroutines, rounds = 32, 15
	srv := testserver.RedisCluster(t)
	var log sentLog
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: srv.Addrs})
	c.AddHook(&log)
	t.Cleanup(func() { _ = c.Close() })
	r := newResource(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := uniqueKey(t)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range rounds {
				l := newLease(base+"-"+strconv.Itoa(g), time.Minute)
				l.Label = "g" + strconv.Itoa(g) + "-" + strconv.Itoa(i)
				ok, _, err := r.TryAcquire(ctx, l)
				if err != nil || !ok || l.Token == 0 {
					t.Errorf("%s: TryAcquire = %v, %v, token %d", l.Label, ok, err, l.Token)
					return
				}
				ins, err := r.Inspect(ctx, l.Key, backend.KindMutex)
				if err != nil || len(ins.Holders) != 1 || ins.Holders[0].Label != l.Label || ins.Holders[0].Token != l.Token {
					t.Errorf("%s: Inspect = %+v, %v; want this lease, token %d", l.Label, ins, err, l.Token)
				}
				if err := r.Refresh(ctx, l); err != nil {
					t.Errorf("%s: Refresh = %v", l.Label, err)
				}
				if err := r.Refresh(ctx, newLease(l.Key, time.Minute)); !errors.Is(err, backend.ErrNotHeld) {
					t.Errorf("%s: Refresh of a lease never acquired = %v; want ErrNotHeld", l.Label, err)
				}
				if err := r.Release(ctx, l); err != nil {
					t.Errorf("%s: Release = %v", l.Label, err)
				}
			}
		})
	}
	wg.Wait()
	batched := 0
	log.mu.Lock()
	for _, rq := range log.reqs {
		if len(rq) > 1 {
			batched++
		}
	}
	n := len(log.reqs)
	log.mu.Unlock()
	t.Logf("%d requests for %d calls, %d of them carrying several", n, goroutines*rounds*5, batched)
	if batched == 0 {
		t.Errorf("no request carried more than one call: nothing was batched")
	}
	for g := range goroutines {
		if n := c.Exists(ctx, lockKey(base+"-"+strconv.Itoa(g))).Val(); n != 0 {
			t.Errorf("key %d left", g)
		}
	}
}
