package distlock_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
)

// BenchmarkTryLockUnlock is the uncontended acquire+release cycle on the
// in-process store: the facade's own cost.
func BenchmarkTryLockUnlock(b *testing.B) {
	d := newLock(b, memory.New())
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		lk, err := d.TryLock(ctx, "k", 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParallelDistinct: every goroutine locks its own keys.
func BenchmarkParallelDistinct(b *testing.B) {
	d := newLock(b, memory.New())
	ctx := b.Context()
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		key := "k" + strconv.FormatInt(next.Add(1), 10)
		for pb.Next() {
			lk, err := d.TryLock(ctx, key, 0)
			if err != nil {
				b.Error(err)
				return
			}
			lk.Unlock(ctx)
		}
	})
}

// BenchmarkParallelContended: every goroutine wants the same key, with the
// default spin and release notices. It reports store calls per acquisition.
func BenchmarkParallelContended(b *testing.B) {
	rec := &attempts{}
	d := newLock(b, memory.New(), distlock.WithHandlers(rec))
	ctx := b.Context()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			lk, err := d.TryLock(ctx, "hot", time.Minute)
			if err != nil {
				b.Error(err)
				return
			}
			lk.Unlock(ctx)
		}
	})
	b.ReportMetric(float64(rec.n.Load())/float64(b.N), "calls/op")
}

// attempts counts the remote attempts of every acquisition.
type attempts struct{ n atomic.Int64 }

func (a *attempts) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	err := next(ctx, r)
	a.n.Add(int64(r.RemoteAttempts))
	return err
}

func (a *attempts) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	return next(ctx, r)
}
