package main

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
)

// memCalls counts the calls into every memory store of this program: its
// requests (a batch renewal is one).
var memCalls atomic.Int64

func init() {
	register(&peer{
		name: "distlock", store: "memory", ref: true, only: []string{"scale"}, serverRequests: true,
		note:    "backend/memory, in process: the facade's own cost, with the store's map entries",
		renewal: "WithAutoRenew: the scheduler's batches (backend.BatchRefresher), up to 500 locks a call",
		open: func(_ context.Context, _ *servers, o openOpts) (instance, error) {
			return newDLInstance(countingMemory{memory.New()}, o, noProbe{}, nil)
		},
		counters: func(context.Context, *servers) (counts, error) {
			n := memCalls.Load()
			return counts{rt: n, cmds: n}, nil
		},
	})
}

// countingMemory is the memory store, counting the calls that reach it.
type countingMemory struct{ s *memory.Store }

var (
	_ backend.Spinner        = countingMemory{}
	_ backend.Refresher      = countingMemory{}
	_ backend.BatchRefresher = countingMemory{}
	_ backend.Notifier       = countingMemory{}
)

func (m countingMemory) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	memCalls.Add(1)
	return m.s.TryAcquire(ctx, l)
}

func (m countingMemory) Release(ctx context.Context, l *backend.Lease) error {
	memCalls.Add(1)
	return m.s.Release(ctx, l)
}

func (m countingMemory) Refresh(ctx context.Context, l *backend.Lease) error {
	memCalls.Add(1)
	return m.s.Refresh(ctx, l)
}

func (m countingMemory) RefreshAll(ctx context.Context, ls []*backend.Lease) []error {
	memCalls.Add(1)
	return m.s.RefreshAll(ctx, ls)
}

func (m countingMemory) Subscribe(key string) (<-chan struct{}, func()) { return m.s.Subscribe(key) }

// noProbe: the memory peer runs in the scale workload only, which does not
// ask whether a waiter waits.
type noProbe struct{}

func (noProbe) mark(string) int64                           { return 0 }
func (noProbe) waiting(context.Context, string, int64) bool { return false }
