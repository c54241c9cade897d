package main

import (
	"context"
	"time"
)

func init() { variantHooks = append(variantHooks, cancellableVariants) }

// cancellableVariants adds, for the distlock peers whose stores run a
// request on the caller's goroutine only when the caller's context cannot
// be cancelled (Redis), the same with a caller's context that
// can be (one per instance, as a server's request context would be): the
// cost of watching it. They run in the uncontended and parallel
// workloads.
func cancellableVariants() {
	for _, base := range registry {
		if base.name != "distlock" || len(base.only) > 0 || base.store != "redis" {
			continue
		}
		register(&peer{
			name: base.name + "-cancellable", store: base.store,
			note: base.note + "; the caller's context can be cancelled (context.WithCancel, as a request's): each acquire waits for its reply from another goroutine",
			only: []string{"uncontended", "parallel"},
			open: func(ctx context.Context, s *servers, o openOpts) (instance, error) {
				in, err := base.open(ctx, s, o)
				if err != nil {
					return nil, err
				}
				cctx, cancel := context.WithCancel(context.Background())
				return &cancellable{instance: in, ctx: cctx, cancel: cancel}, nil
			},
			counters: base.counters,
		})
	}
}

// cancellable runs an instance's calls under a context that can be
// cancelled, ended when the instance closes.
type cancellable struct {
	instance
	ctx    context.Context
	cancel context.CancelFunc
}

func (c *cancellable) cycle(_ context.Context, key string) error { return c.instance.cycle(c.ctx, key) }

func (c *cancellable) worker(context.Context) (locker, error) { return c, nil }

func (c *cancellable) lock(_ context.Context, key string, wait time.Duration) (held, error) {
	l, err := c.instance.worker(c.ctx)
	if err != nil {
		return nil, err
	}
	return l.lock(c.ctx, key, wait)
}

func (c *cancellable) close() error {
	c.cancel()
	return c.instance.close()
}
