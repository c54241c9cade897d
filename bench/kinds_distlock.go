package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
)

var _ kindsInstance = (*dlInstance)(nil)

// acquireKind takes a permit of key's semaphore of limit holders, or a
// side of key's read/write lock, through the facade, as a user would:
// d.Semaphore(key, limit).TryAcquire, d.RWMutex(key).TryRLock / TryLock.
func (i *dlInstance) acquireKind(ctx context.Context, key string, kind distlock.Kind, limit int, wait time.Duration) (held, error) {
	var (
		lk  *distlock.Lock
		err error
	)
	switch kind {
	case distlock.KindSemaphore:
		lk, err = i.d.Semaphore(key, limit).TryAcquire(ctx, wait)
	case distlock.KindRead:
		lk, err = i.d.RWMutex(key).TryRLock(ctx, wait)
	case distlock.KindWrite:
		lk, err = i.d.RWMutex(key).TryLock(ctx, wait)
	default:
		return nil, fmt.Errorf("bench: kind %v", kind)
	}
	if errors.Is(err, distlock.ErrNotAcquired) && ctx.Err() == nil {
		return nil, errNotAcquired
	}
	if err != nil {
		return nil, err
	}
	return dlHeld{lk}, nil
}

// memoryKindsPeer is distlock over backend/memory, the reference store:
// the facade's own cost. The instances share one store, as processes
// share a server; its requests are the calls into it.
func memoryKindsPeer() *kindsPeer {
	st := memory.New()
	return &kindsPeer{
		name: "distlock", store: "memory", serverRequests: true,
		note: "backend/memory, one store shared by the instances (in process): the facade's own cost; requests are calls into the store",
		open: func(_ context.Context, _ *servers, o openOpts, _ string) (kindsInstance, error) {
			return newDLInstance(countingKindsMemory{countingMemory{s: st}}, o, noProbe{}, nil)
		},
		counters: func(context.Context, *servers) (counts, error) {
			n := memCalls.Load()
			return counts{rt: n, cmds: n}, nil
		},
	}
}

// countingKindsMemory is countingMemory with the kinds: it holds
// semaphores and read/write locks, and counts the withdrawals of intents
// too.
type countingKindsMemory struct{ countingMemory }

var (
	_ backend.KindChecker = countingKindsMemory{}
	_ backend.Withdrawer  = countingKindsMemory{}
)

func (m countingKindsMemory) CheckKind(k backend.Kind) error { return m.s.CheckKind(k) }

func (m countingKindsMemory) Withdraw(ctx context.Context, l *backend.Lease) error {
	memCalls.Add(1)
	return m.s.Withdraw(ctx, l)
}
