package main

import (
	"context"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/stores"
)

func init() {
	register(&peer{
		name: "distlock-spin", store: "postgres", serverRequests: true, only: []string{"contended"},
		note: "sqldb.NewPostgres without its wake-up (the store wrapped to hide Subscribe, the line and the head notices): waiters spin with random sleeps, as on MySQL",
		open: func(ctx context.Context, s *servers, o openOpts) (instance, error) {
			raw, err := pgDistlockURL(s)
			if err != nil {
				return nil, err
			}
			sc := &stmtCounter{}
			res, closeClients, err := stores.Open(ctx, raw, o.ttl, stores.Options{PostgresTracer: sc})
			if err != nil {
				return nil, err
			}
			return newDLInstance(spinOnly{res.(spinStore)}, o, sc, nil, func() error { closeClients(); return nil })
		},
		counters: pgCounters,
	})
}

// spinStore is what spinOnly passes on.
type spinStore interface {
	backend.Spinner
	backend.Refresher
	backend.KeyValidator
	Close() error
}

// spinOnly is a pull store without its wake-up channel or line: the
// facade spins on it.
type spinOnly struct{ r spinStore }

func (s spinOnly) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	return s.r.TryAcquire(ctx, l)
}
func (s spinOnly) Release(ctx context.Context, l *backend.Lease) error { return s.r.Release(ctx, l) }
func (s spinOnly) Refresh(ctx context.Context, l *backend.Lease) error { return s.r.Refresh(ctx, l) }
func (s spinOnly) ValidateKey(key string) error                        { return s.r.ValidateKey(key) }
func (s spinOnly) Close() error                                        { return s.r.Close() }
