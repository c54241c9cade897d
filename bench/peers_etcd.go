package main

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/distlock/distlock/etcd"
	"github.com/distlock/distlock/internal/stores"
)

func init() {
	register(&peer{
		name: "concurrency.Mutex", store: "etcd", ref: true,
		note:     "go.etcd.io/etcd/client/v3/concurrency: one Session (lease kept alive) per instance, and per goroutine in the contended run; Mutex per key",
		renewal:  "the Session's one lease, kept alive by the client",
		open:     openEtcdMutex,
		counters: etcdCounters,
	})
	register(&peer{
		name: "distlock", store: "etcd", elects: true,
		note:    "etcd.New, WithAutoRenew: locks the facade renews share the resource's lease for their TTL (one create-if-absent txn to acquire, one delete to release), as a Session",
		renewal: "one shared lease kept alive: the locks the facade renews cost nothing more (backend.Lease.KeptAlive)",
		open: func(ctx context.Context, s *servers, o openOpts) (instance, error) {
			return openEtcdDistlock(ctx, s, o, true)
		},
		counters: etcdCounters,
	})
	register(&peer{
		name: "concurrency.Election", store: "etcd", elects: true, only: []string{wlElection},
		note:     "go.etcd.io/etcd/client/v3/concurrency: Election per key on a Session per goroutine; Campaign waits for the deletion of the keys created before its own, Resign deletes the leader's key",
		open:     openEtcdMutex,
		counters: etcdCounters,
	})
	register(&peer{
		name: "distlock-ttl", store: "etcd",
		note: "etcd.New without WithAutoRenew: a lease per lock, so that it ends after its TTL (grant, create-if-absent txn; guarded delete, revoke)",
		open: func(ctx context.Context, s *servers, o openOpts) (instance, error) {
			return openEtcdDistlock(ctx, s, o, false)
		},
		counters: etcdCounters,
	})
}

func etcdCounters(ctx context.Context, s *servers) (counts, error) {
	eps, err := s.etcdEndpoints()
	if err != nil {
		return counts{}, err
	}
	n, err := etcdRequests(ctx, eps)
	return counts{rt: n, cmds: n}, err
}

func newEtcdClient(s *servers) (*clientv3.Client, error) {
	eps, err := s.etcdEndpoints()
	if err != nil {
		return nil, err
	}
	return clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// etcdProbe: a waiter waits once its key is queued behind the holder's.
type etcdProbe struct {
	count func(ctx context.Context, key string) (int, error)
}

func (etcdProbe) mark(string) int64 { return 0 }

func (p etcdProbe) waiting(ctx context.Context, key string, _ int64) bool {
	n, err := p.count(ctx, key)
	return err == nil && n >= 2
}

func openEtcdDistlock(ctx context.Context, s *servers, o openOpts, autoRenew bool) (instance, error) {
	eps, err := s.etcdEndpoints()
	if err != nil {
		return nil, err
	}
	hosts := make([]string, len(eps))
	for i, ep := range eps {
		hosts[i] = strings.TrimPrefix(ep, "http://")
	}
	// The probe counts the keys queued under key, through the resource
	// the instance opens.
	var res *etcd.Resource
	p := etcdProbe{count: func(ctx context.Context, key string) (int, error) {
		keys, err := res.Leftovers(ctx, key)
		return len(keys), err
	}}
	o.autoRenew = autoRenew
	in, err := openDistlock(ctx, "etcd://"+strings.Join(hosts, ","), o, p, stores.Options{})
	if err != nil {
		return nil, err
	}
	res = in.res.(*etcd.Resource)
	return in, nil
}

// --- concurrency.Mutex ---

const mutexPrefix = "/bench-mutex/"

type etcdMutex struct {
	etcdProbe
	c        *clientv3.Client
	s        *concurrency.Session
	ttl      int
	election bool // workers campaign in a concurrency.Election (openOpts.election)

	mu       sync.Mutex
	mutexes  map[string]*concurrency.Mutex // cycle's, reused per key
	sessions []*concurrency.Session        // the workers'
}

func ttlSeconds(d time.Duration) int { return int((d + time.Second - 1) / time.Second) }

func openEtcdMutex(ctx context.Context, s *servers, o openOpts) (instance, error) {
	c, err := newEtcdClient(s)
	if err != nil {
		return nil, err
	}
	ttl := ttlSeconds(o.ttl)
	sess, err := concurrency.NewSession(c, concurrency.WithTTL(ttl), concurrency.WithContext(context.Background()))
	if err != nil {
		c.Close()
		return nil, err
	}
	m := &etcdMutex{c: c, s: sess, ttl: ttl, mutexes: map[string]*concurrency.Mutex{}, election: o.election}
	prefix := mutexPrefix
	if o.election {
		prefix = electionPrefix
	}
	m.etcdProbe = etcdProbe{count: func(ctx context.Context, key string) (int, error) {
		resp, err := c.Get(ctx, prefix+key+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 0, err
		}
		return int(resp.Count), nil
	}}
	return m, nil
}

func (m *etcdMutex) cycle(ctx context.Context, key string) error {
	m.mu.Lock()
	mu := m.mutexes[key]
	if mu == nil {
		mu = concurrency.NewMutex(m.s, mutexPrefix+key)
		m.mutexes[key] = mu
	}
	m.mu.Unlock()
	if err := mu.Lock(ctx); err != nil {
		return err
	}
	return mu.Unlock(ctx)
}

// worker gives the goroutine a session of its own: Mutexes on one session
// and one key share their queue key, so two goroutines of one session
// would both believe they hold the lock.
func (m *etcdMutex) worker(ctx context.Context) (locker, error) {
	s, err := concurrency.NewSession(m.c, concurrency.WithTTL(m.ttl), concurrency.WithContext(context.Background()))
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.sessions = append(m.sessions, s)
	m.mu.Unlock()
	if m.election {
		return electionLocker{s}, nil
	}
	return mutexLocker{s}, nil
}

type mutexLocker struct{ s *concurrency.Session }

func (l mutexLocker) lock(ctx context.Context, key string, wait time.Duration) (held, error) {
	mu := concurrency.NewMutex(l.s, mutexPrefix+key)
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := mu.Lock(wctx); err != nil {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return nil, errNotAcquired
		}
		return nil, err
	}
	return mutexHeld{mu}, nil
}

// electionLocker campaigns in a concurrency.Election of the key, on its
// goroutine's session.
type electionLocker struct{ s *concurrency.Session }

const electionPrefix = "/bench-election/"

func (l electionLocker) lock(ctx context.Context, key string, wait time.Duration) (held, error) {
	e := concurrency.NewElection(l.s, electionPrefix+key)
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := e.Campaign(wctx, "bench"); err != nil {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return nil, errNotAcquired
		}
		return nil, err
	}
	return electionHeld{e}, nil
}

// electionHeld is a leadership of a *concurrency.Election.
type electionHeld struct{ e *concurrency.Election }

func (h electionHeld) unlock(ctx context.Context) error { return h.e.Resign(ctx) }

// mutexHeld is a held *concurrency.Mutex.
type mutexHeld struct{ mu *concurrency.Mutex }

func (h mutexHeld) unlock(ctx context.Context) error { return h.mu.Unlock(ctx) }

func (m *etcdMutex) close() error {
	m.mu.Lock()
	ss := append(m.sessions, m.s)
	m.mu.Unlock()
	var errs []error
	for _, s := range ss {
		errs = append(errs, s.Close())
	}
	return errors.Join(append(errs, m.c.Close())...)
}
