package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"
)

func init() {
	register(&peer{
		name: "rueidislock", store: "redis",
		note: "github.com/redis/rueidis/rueidislock: KeyMajority 1 (one key, as its README says for one server), NoLoopTracking; " +
			"SET NX PXAT in a Lua script over rueidis' automatic pipelining, release by script when the lock's context is cancelled; " +
			"waiters retry on a client-side-caching invalidation of the key; KeyValidity = the TTL, extended every TTL/2 (its own renewal, always on)",
		renewal:  "always: extends every KeyValidity/2 while held",
		open:     openRueidislock,
		counters: redisCounters(1),
	})
}

// countedClient counts the commands rueidislock sends (each Do, and each
// command of a DoMulti) in the program's total and the instance's own
// counter, as countHook does for go-redis. rueidis pipelines concurrent
// commands on its connection by itself: this counts commands, not
// round trips.
type countedClient struct {
	rueidis.Client
	own *atomic.Int64
}

func (c countedClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	redisSent.Add(1)
	c.own.Add(1)
	return c.Client.Do(ctx, cmd)
}

func (c countedClient) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	redisSent.Add(int64(len(cmds)))
	c.own.Add(int64(len(cmds)))
	return c.Client.DoMulti(ctx, cmds...)
}

type rueidislockInstance struct {
	l    rueidislock.Locker
	sent atomic.Int64

	mu      sync.Mutex
	guard   context.Context // see bounded
	guardTo time.Time
	stop    context.CancelFunc
}

// guardSpan is how long one guard context lives (see bounded).
const guardSpan = time.Minute

// bounded returns ctx, ended also within guardSpan: an uncontended
// WithContext that finds its key held (a release whose invalidation was
// lost, under load) waits for an invalidation with no timeout of its own,
// and hung a whole bench run once. One guard serves every cycle of a
// minute, so the bound costs the peer nothing per cycle.
func (r *rueidislockInstance) bounded(ctx context.Context) context.Context {
	if ctx.Done() != nil {
		return ctx
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.guard == nil || time.Until(r.guardTo) < guardSpan/2 {
		if r.stop != nil {
			old := r.stop
			time.AfterFunc(guardSpan, old) // cycles still on it end first
		}
		r.guardTo = time.Now().Add(guardSpan)
		r.guard, r.stop = context.WithDeadline(ctx, r.guardTo)
	}
	return r.guard
}

func openRueidislock(_ context.Context, s *servers, o openOpts) (instance, error) {
	addrs, err := s.redisAddrs(1)
	if err != nil {
		return nil, err
	}
	r := &rueidislockInstance{}
	r.l, err = rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption:   rueidis.ClientOption{InitAddress: addrs},
		KeyMajority:    1,
		NoLoopTracking: true,
		KeyValidity:    o.ttl,
		ClientBuilder: func(opt rueidis.ClientOption) (rueidis.Client, error) {
			c, err := rueidis.NewClient(opt)
			if err != nil {
				return nil, err
			}
			return countedClient{Client: c, own: &r.sent}, nil
		},
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (r *rueidislockInstance) cycle(ctx context.Context, key string) error {
	_, cancel, err := r.l.WithContext(r.bounded(ctx), key)
	if err != nil {
		return err
	}
	cancel() // releases, and returns once the release script answered
	return nil
}

func (r *rueidislockInstance) worker(context.Context) (locker, error) { return r, nil }

// lock waits at most wait. rueidislock's lock lives in the context it
// returns, derived from the one given: a context with the wait's timeout
// would end the lock at the wait's end. The wait is therefore a timer
// that cancels the attempt only while it has not returned a lock.
func (r *rueidislockInstance) lock(ctx context.Context, key string, wait time.Duration) (held, error) {
	lctx, lcancel := context.WithCancel(ctx)
	var (
		mu       sync.Mutex
		got      bool
		timedOut bool
	)
	t := time.AfterFunc(wait, func() {
		mu.Lock()
		defer mu.Unlock()
		if !got {
			timedOut = true
			lcancel()
		}
	})
	_, release, err := r.l.WithContext(lctx, key)
	mu.Lock()
	got = err == nil && !timedOut
	mu.Unlock()
	t.Stop()
	if !got {
		if release != nil {
			release()
		}
		lcancel()
		if ctx.Err() == nil && (timedOut || errors.Is(err, rueidislock.ErrNotLocked)) {
			return nil, errNotAcquired
		}
		if err == nil {
			err = ctx.Err()
		}
		return nil, err
	}
	return &rueidislockHeld{release: release, cancel: lcancel}, nil
}

func (r *rueidislockInstance) mark(string) int64 { return r.sent.Load() }

func (r *rueidislockInstance) waiting(_ context.Context, _ string, mark int64) bool {
	return r.sent.Load() > mark
}

func (r *rueidislockInstance) close() error {
	r.l.Close()
	r.mu.Lock()
	if r.stop != nil {
		r.stop()
	}
	r.mu.Unlock()
	return nil
}

// rueidislockHeld is what a rueidislock user keeps: the cancel function
// that releases the lock.
type rueidislockHeld struct{ release, cancel context.CancelFunc }

func (h *rueidislockHeld) unlock(context.Context) error {
	h.release()
	h.cancel()
	return nil
}
