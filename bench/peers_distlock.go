package main

import (
	"context"
	"errors"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/stores"
)

// probe tells the handoff workload when a waiter is waiting.
type probe interface {
	mark(key string) int64
	waiting(ctx context.Context, key string, mark int64) bool
}

// dlInstance is one distlock.DistributeLock over one backend resource.
type dlInstance struct {
	probe
	res      backend.RemoteResource
	d        *distlock.DistributeLock
	closers  []func() error // run after d.Close, in order
	election bool           // lock campaigns for the key's election (openOpts.election)
}

// storeKey is the key the store holds for the workload's key: the
// election's mutex in the election workload.
func (i *dlInstance) storeKey(key string) string {
	if i.election {
		return backend.ElectionPrefix + key
	}
	return key
}

func (i *dlInstance) mark(key string) int64 { return i.probe.mark(i.storeKey(key)) }

func (i *dlInstance) waiting(ctx context.Context, key string, mark int64) bool {
	return i.probe.waiting(ctx, i.storeKey(key), mark)
}

// cycleWait is the wait of the uncontended cycle: a blocking lock, as the
// peers' Lock calls are. Uncontended, it is never used up.
const cycleWait = 10 * time.Second

func newDLInstance(res backend.RemoteResource, o openOpts, p probe, opts []distlock.Option, closers ...func() error) (*dlInstance, error) {
	all := []distlock.Option{distlock.WithDefaultTTL(o.ttl)}
	if o.autoRenew {
		all = append(all, distlock.WithAutoRenew())
	}
	all = append(all, opts...)
	if o.handlers != nil {
		hs, err := o.handlers(res)
		if err != nil {
			for _, c := range closers {
				_ = c()
			}
			return nil, err
		}
		all = append(all, distlock.WithHandlers(hs...))
	}
	d, err := distlock.New(res, all...)
	if err != nil {
		for _, c := range closers {
			_ = c()
		}
		return nil, err
	}
	return &dlInstance{probe: p, res: res, d: d, closers: closers, election: o.election}, nil
}

// openDistlock opens the store at raw (internal/stores' URL) with so, and
// a DistributeLock over it.
func openDistlock(ctx context.Context, raw string, o openOpts, p probe, so stores.Options) (*dlInstance, error) {
	res, closeClients, err := stores.Open(ctx, raw, o.ttl, so)
	if err != nil {
		return nil, err
	}
	return newDLInstance(res, o, p, nil, func() error { closeClients(); return nil })
}

func (i *dlInstance) cycle(ctx context.Context, key string) error {
	lk, err := i.d.TryLock(ctx, key, cycleWait)
	if err != nil {
		return err
	}
	return lk.Unlock(ctx)
}

func (i *dlInstance) worker(context.Context) (locker, error) { return i, nil }

func (i *dlInstance) lock(ctx context.Context, key string, wait time.Duration) (held, error) {
	if i.election {
		return i.campaign(ctx, key, wait)
	}
	lk, err := i.d.TryLock(ctx, key, wait)
	if errors.Is(err, distlock.ErrNotAcquired) && ctx.Err() == nil {
		return nil, errNotAcquired
	}
	if err != nil {
		return nil, err
	}
	return dlHeld{lk}, nil
}

// campaign campaigns for key's election within wait.
func (i *dlInstance) campaign(ctx context.Context, key string, wait time.Duration) (held, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	lk, err := i.d.Election(key).Campaign(wctx, "bench")
	if errors.Is(err, distlock.ErrNotAcquired) && ctx.Err() == nil {
		return nil, errNotAcquired
	}
	if err != nil {
		return nil, err
	}
	return dlHeld{lk}, nil
}

// dlHeld is a held distlock.Lock.
type dlHeld struct{ lk *distlock.Lock }

func (h dlHeld) unlock(ctx context.Context) error { return h.lk.Unlock(ctx) }

func (i *dlInstance) close() error {
	errs := []error{i.d.Close()}
	for _, c := range i.closers {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}
