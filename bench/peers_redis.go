package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/stores"
	"github.com/distlock/distlock/redis"
)

// redisSent counts every command (and pipeline) any Redis client of this
// program sent: the round trips, with the (un)subscribe calls that INFO
// commandstats counts (go-redis sends those without its hooks). INFO
// commandstats also gives the server's side: every command it ran,
// those inside scripts too.
var redisSent atomic.Int64

// countHook counts the commands a client sends, in the program's total
// and in the client's own counter (the handoff probe). No allocation.
type countHook struct{ own *atomic.Int64 }

func (countHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h countHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		redisSent.Add(1)
		h.own.Add(1)
		return next(ctx, cmd)
	}
}

func (h countHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		redisSent.Add(1)
		h.own.Add(1)
		return next(ctx, cmds)
	}
}

// redisClients are the clients of one instance, with their command count.
type redisClients struct {
	cs   []*goredis.Client
	sent atomic.Int64
}

func newRedisClients(s *servers, n int) (*redisClients, error) {
	addrs, err := s.redisAddrs(n)
	if err != nil {
		return nil, err
	}
	rc := &redisClients{}
	for _, a := range addrs {
		c := goredis.NewClient(&goredis.Options{Addr: a})
		c.AddHook(countHook{own: &rc.sent})
		rc.cs = append(rc.cs, c)
	}
	return rc, nil
}

func (rc *redisClients) close() error {
	var errs []error
	for _, c := range rc.cs {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// mark and waiting: a pull-store waiter waits once its first attempt was
// sent (it then sleeps, or waits for a release notice).
func (rc *redisClients) mark(string) int64 { return rc.sent.Load() }

func (rc *redisClients) waiting(_ context.Context, _ string, mark int64) bool {
	return rc.sent.Load() > mark
}

func redisCounters(n int) func(ctx context.Context, s *servers) (counts, error) {
	return func(ctx context.Context, s *servers) (counts, error) {
		addrs, err := s.redisAddrs(n)
		if err != nil {
			return counts{}, err
		}
		rt := redisSent.Load()
		cmds, subs, err := redisCommands(ctx, addrs)
		return counts{rt: rt + subs, cmds: cmds}, err
	}
}

func init() {
	register(&peer{
		name: "floor", store: "redis", ref: true,
		note:     "bare go-redis: SET NX PX, then EVALSHA compare-and-delete; retry every 10ms",
		open:     openRedisFloor,
		counters: redisCounters(1),
	})
	register(&peer{
		name: "distlock", store: "redis", elects: true,
		note:    "redis.New, defaults: one script per attempt (SET NX PX, then the token: TIME and one SET ... GET of the fence), a release script that renames the lock to its trace and, when an attempt was refused the lock, PUBLISHes a notice waking the waiters, WithSpin 10ms+[0,10ms); no auto-renew except in the scale workload",
		renewal: "WithAutoRenew: a refresh script per lock every TTL/3",
		open: func(ctx context.Context, s *servers, o openOpts) (instance, error) {
			return openRedisDistlock(ctx, s, o)
		},
		counters: redisCounters(1),
	})
	register(&peer{
		name: "distlock-unqueued", store: "redis",
		note: "distlock as before its waiters queued: redis.New behind a wrapper that hides backend.Queuer and HeadNotifier, so that waiters do not queue and a release wakes one waiter per instance (spin.Share); otherwise as distlock",
		open: func(ctx context.Context, s *servers, o openOpts) (instance, error) {
			return openRedisDistlockUnqueued(ctx, s, o)
		},
		counters: redisCounters(1),
	})
	register(&peer{
		name: "lock loop", store: "redis", elects: true, only: []string{wlElection},
		note:     "a leader election hand-rolled on a Redis lock, as Redis users write it: each candidate tries SET NX PX every 10ms until it gets the key; the leader resigns with the compare-and-delete script",
		open:     openRedisFloor,
		counters: redisCounters(1),
	})
	register(&peer{
		name: "redislock", store: "redis",
		note:     "github.com/bsm/redislock: Obtain (Lua) + Release (Lua); LinearBackoff(10ms) while waiting",
		open:     openRedislock,
		counters: redisCounters(1),
	})
	for _, n := range []int{1, 5} {
		register(&peer{
			name: "redsync-" + strconv.Itoa(n), store: "redis",
			note: "github.com/go-redsync/redsync/v4 over " + strconv.Itoa(n) + " node(s): SET NX PX per node, Lua release; default retry delay (rand 50-250ms)",
			open: func(ctx context.Context, s *servers, o openOpts) (instance, error) {
				return openRedsync(s, o, n)
			},
			counters: redisCounters(n),
		})
	}
}

func openRedisDistlock(ctx context.Context, s *servers, o openOpts) (instance, error) {
	addrs, err := s.redisAddrs(1)
	if err != nil {
		return nil, err
	}
	rc := &redisClients{}
	return openDistlock(ctx, "redis://"+addrs[0], o, rc, stores.Options{RedisHook: countHook{own: &rc.sent}})
}

func openRedisDistlockUnqueued(ctx context.Context, s *servers, o openOpts) (instance, error) {
	addrs, err := s.redisAddrs(1)
	if err != nil {
		return nil, err
	}
	rc := &redisClients{}
	res, closeClients, err := stores.Open(ctx, "redis://"+addrs[0], o.ttl, stores.Options{RedisHook: countHook{own: &rc.sent}})
	if err != nil {
		return nil, err
	}
	r, ok := res.(*redis.Resource)
	if !ok {
		closeClients()
		return nil, fmt.Errorf("bench: redis:// opened a %T, not a *redis.Resource", res)
	}
	return newDLInstance(unqueued{r}, o, rc, nil, func() error { closeClients(); return nil })
}

// unqueued is a redis.Resource without its line of waiters: the facade
// finds no backend.Queuer (nor HeadNotifier), so no acquisition waits in
// line, and release notices are shared per instance.
type unqueued struct{ r *redis.Resource }

func (u unqueued) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	return u.r.TryAcquire(ctx, l)
}
func (u unqueued) Release(ctx context.Context, l *backend.Lease) error { return u.r.Release(ctx, l) }
func (u unqueued) Refresh(ctx context.Context, l *backend.Lease) error { return u.r.Refresh(ctx, l) }
func (u unqueued) Subscribe(key string) (<-chan struct{}, func())      { return u.r.Subscribe(key) }
func (u unqueued) ValidateKey(key string) error                        { return u.r.ValidateKey(key) }
func (u unqueued) Close() error                                        { return u.r.Close() }

// --- floor ---

// floorRelease is the usual compare-and-delete, as redislock has it.
var floorRelease = goredis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)

type redisFloor struct {
	*redisClients
	c     *goredis.Client
	ttl   time.Duration
	retry time.Duration
	floorValues
}

func openRedisFloor(_ context.Context, s *servers, o openOpts) (instance, error) {
	return newRedisFloor(s, o)
}

func newRedisFloor(s *servers, o openOpts) (*redisFloor, error) {
	rc, err := newRedisClients(s, 1)
	if err != nil {
		return nil, err
	}
	return &redisFloor{redisClients: rc, c: rc.cs[0], ttl: o.ttl, retry: o.retry, floorValues: newFloorValues()}, nil
}

func (f *redisFloor) cycle(ctx context.Context, key string) error {
	v := f.value()
	ok, err := f.c.SetNX(ctx, key, v, f.ttl).Result()
	if err != nil {
		return err
	}
	if !ok {
		return errNotAcquired
	}
	return floorRelease.Run(ctx, f.c, []string{key}, v).Err()
}

func (f *redisFloor) worker(context.Context) (locker, error) { return f, nil }

func (f *redisFloor) lock(ctx context.Context, key string, wait time.Duration) (held, error) {
	v := f.value()
	err := pollFloor(ctx, wait, f.retry, func() (bool, error) {
		return f.c.SetNX(ctx, key, v, f.ttl).Result()
	})
	if err != nil {
		return nil, err
	}
	return &redisFloorHeld{f, key, v}, nil
}

func (f *redisFloor) close() error { return f.redisClients.close() }

// redisFloorHeld is what a user of the bare floor keeps: key and value.
type redisFloorHeld struct {
	f        *redisFloor
	key, val string
}

func (h *redisFloorHeld) unlock(ctx context.Context) error {
	return floorRelease.Run(ctx, h.f.c, []string{h.key}, h.val).Err()
}

// pollFloor is a floor's wait: try every retry until it holds (nil) or
// wait is up (errNotAcquired); try's error or ctx's ends it early.
func pollFloor(ctx context.Context, wait, retry time.Duration, try func() (bool, error)) error {
	deadline := time.Now().Add(wait)
	for {
		ok, err := try()
		if err != nil || ok {
			return err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return errNotAcquired
		}
		if err := sleepCtx(ctx, min(retry, left)); err != nil {
			return err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// --- redislock ---

type redislockInstance struct {
	*redisClients
	c     *redislock.Client
	ttl   time.Duration
	retry *redislock.Options
}

func openRedislock(_ context.Context, s *servers, o openOpts) (instance, error) {
	rc, err := newRedisClients(s, 1)
	if err != nil {
		return nil, err
	}
	return &redislockInstance{redisClients: rc, c: redislock.New(rc.cs[0]), ttl: o.ttl,
		retry: &redislock.Options{RetryStrategy: redislock.LinearBackoff(o.retry)}}, nil
}

func (r *redislockInstance) cycle(ctx context.Context, key string) error {
	l, err := r.c.Obtain(ctx, key, r.ttl, nil)
	if err != nil {
		return err
	}
	return l.Release(ctx)
}

func (r *redislockInstance) worker(context.Context) (locker, error) { return r, nil }

func (r *redislockInstance) lock(ctx context.Context, key string, wait time.Duration) (held, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	l, err := r.c.Obtain(wctx, key, r.ttl, r.retry)
	if err != nil {
		if ctx.Err() == nil && (errors.Is(err, redislock.ErrNotObtained) || errors.Is(err, context.DeadlineExceeded)) {
			return nil, errNotAcquired
		}
		return nil, err
	}
	return redislockHeld{l}, nil
}

// redislockHeld is a held *redislock.Lock.
type redislockHeld struct{ l *redislock.Lock }

func (h redislockHeld) unlock(ctx context.Context) error { return h.l.Release(ctx) }

func (r *redislockInstance) close() error { return r.redisClients.close() }

// --- redsync ---

type redsyncInstance struct {
	*redisClients
	rs  *redsync.Redsync
	ttl time.Duration

	mu      sync.Mutex
	mutexes map[string]*redsync.Mutex // cycle's, reused per key
}

func openRedsync(s *servers, o openOpts, n int) (instance, error) {
	rc, err := newRedisClients(s, n)
	if err != nil {
		return nil, err
	}
	var pools []redsyncredis.Pool
	for _, c := range rc.cs {
		pools = append(pools, redsyncgoredis.NewPool(c))
	}
	return &redsyncInstance{redisClients: rc, rs: redsync.New(pools...), ttl: o.ttl, mutexes: map[string]*redsync.Mutex{}}, nil
}

func (r *redsyncInstance) cycle(ctx context.Context, key string) error {
	r.mu.Lock()
	m := r.mutexes[key]
	if m == nil {
		m = r.rs.NewMutex(key, redsync.WithExpiry(r.ttl))
		r.mutexes[key] = m
	}
	r.mu.Unlock()
	if err := m.LockContext(ctx); err != nil {
		return err
	}
	_, err := m.UnlockContext(ctx)
	return err
}

func (r *redsyncInstance) worker(context.Context) (locker, error) { return r, nil }

func (r *redsyncInstance) lock(ctx context.Context, key string, wait time.Duration) (held, error) {
	m := r.rs.NewMutex(key, redsync.WithExpiry(r.ttl), redsync.WithTries(math.MaxInt32))
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := m.LockContext(wctx); err != nil {
		var taken *redsync.ErrTaken
		if ctx.Err() == nil && (errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) || errors.Is(err, context.DeadlineExceeded)) {
			return nil, errNotAcquired
		}
		return nil, err
	}
	return redsyncHeld{m}, nil
}

// redsyncHeld is a held *redsync.Mutex.
type redsyncHeld struct{ m *redsync.Mutex }

func (h redsyncHeld) unlock(ctx context.Context) error {
	_, err := h.m.UnlockContext(ctx)
	return err
}

func (r *redsyncInstance) close() error { return r.redisClients.close() }
