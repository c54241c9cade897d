package tracing_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace/noop"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/tracing"
)

// chains are the handler chains the cycle is measured with: none, the
// tracing handler with no provider set (the global one, unset in this
// process: see TestGlobalProvider), with a noop provider, and with the
// SDK recording every span.
func chains(tb testing.TB) []struct {
	name string
	h    []distlock.Handler
} {
	return []struct {
		name string
		h    []distlock.Handler
	}{
		{"bare", nil},
		{"unset", []distlock.Handler{tracing.New()}},
		{"noop", []distlock.Handler{tracing.New(tracing.WithTracerProvider(noop.NewTracerProvider()))}},
		{"sdk", []distlock.Handler{newFixture(tb).h}},
	}
}

// cycle is one uncontended acquire and release.
func cycle(tb testing.TB, ctx context.Context, d *distlock.DistributeLock) {
	lk, err := d.TryLock(ctx, "k", 0)
	if err != nil {
		tb.Fatal(err)
	}
	if err := lk.Unlock(ctx); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkCycle measures an uncontended acquire and release on the
// memory store under each chain (run with -benchmem): "unset" and "noop"
// allocate what "bare" does.
func BenchmarkCycle(b *testing.B) {
	for _, c := range chains(b) {
		b.Run(c.name, func(b *testing.B) {
			d, err := distlock.New(memory.New(), distlock.WithHandlers(c.h...))
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				cycle(b, ctx, d)
			}
		})
	}
}
