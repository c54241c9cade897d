package main

import (
	"context"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/hotspot"
)

// yieldMax bounds a yielding waiter's wait for the next release notice
// (hotspot.WithYield).
const yieldMax = 50 * time.Millisecond

func init() { variantHooks = append(variantHooks, hotspotVariants) }

// hotspotVariants adds, for every store's distlock peer, the same with the
// hot key registered in a hotspot handler, and, where the store sends
// release notices, with hotspot.WithYield too. They run in the contended
// and scale workloads (a hot-key handler does nothing for one goroutine
// or for distinct keys).
func hotspotVariants() {
	for _, base := range registry {
		if base.name != "distlock" || len(base.only) > 0 {
			continue
		}
		register(&peer{
			name: base.name + "+hotspot", store: base.store, hotspot: true,
			note: base.note + "; hotspot.New(key): one goroutine per instance at the store",
			open: base.open,
			hot: func(ctx context.Context, s *servers, o openOpts, key string) (instance, error) {
				o.handlers = func(backend.RemoteResource) ([]distlock.Handler, error) {
					return []distlock.Handler{hotspot.New(key)}, nil
				}
				return base.open(ctx, s, o)
			},
			counters: base.counters,
		})
		if base.store != "redis" && base.store != "postgres" {
			continue // no release notices to yield on
		}
		register(&peer{
			name: base.name + "+hotspot+yield", store: base.store, hotspot: true,
			note: base.note + "; hotspot with WithKeys(key), WithYield(resource, 50ms): after a contended release the instance's next waiter waits for the next notice, so instances take turns",
			open: base.open,
			hot: func(ctx context.Context, s *servers, o openOpts, key string) (instance, error) {
				o.handlers = func(res backend.RemoteResource) ([]distlock.Handler, error) {
					n, _ := res.(backend.Notifier)
					h, err := hotspot.NewWithOptions(hotspot.WithKeys(key), hotspot.WithYield(n, yieldMax))
					if err != nil {
						return nil, err
					}
					return []distlock.Handler{h}, nil
				}
				return base.open(ctx, s, o)
			},
			counters: base.counters,
		})
	}
}
