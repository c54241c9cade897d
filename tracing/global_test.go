package tracing_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/tracing"
)

const globalChild = "DISTLOCK_TRACING_GLOBAL_CHILD"

// TestGlobalProvider: without WithTracerProvider the handler makes no
// span while no global provider is set, and uses the global one from
// the moment it is set, and the next one set after it. It sets the
// process's global provider, which cannot be unset: it runs in a child
// process, so the other tests (the allocation test above all) keep theirs
// unset.
func TestGlobalProvider(t *testing.T) {
	if os.Getenv(globalChild) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestGlobalProvider$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), globalChild+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "--- PASS: TestGlobalProvider") {
			t.Fatalf("child did not pass:\n%s", out)
		}
		return
	}

	h := tracing.New()
	d := newLock(t, memory.New(), distlock.WithHandlers(h))
	ctx := context.Background()
	lk, err := d.TryLock(ctx, "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	if h.Open() != 0 {
		t.Errorf("unset global provider: the handler keeps %d hold spans; want 0", h.Open())
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// A noop provider set globally costs nothing either.
	otel.SetTracerProvider(noop.NewTracerProvider())
	if a := testing.AllocsPerRun(100, func() { cycle(t, ctx, d) }); !raceEnabled && a > bareAllocs(t) {
		t.Errorf("global noop provider: %v allocations per cycle; want %v, as with no handler", a, bareAllocs(t))
	}

	for i := range 2 {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		otel.SetTracerProvider(tp)
		lk, err := d.TryLock(ctx, "k", 0)
		if err != nil {
			t.Fatal(err)
		}
		if h.Open() != 1 {
			t.Errorf("provider %d: the handler keeps %d hold spans; want 1", i, h.Open())
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if got := names(rec.Ended()); len(got) != 2 || got[0] != tracing.SpanAcquire || got[1] != tracing.SpanHold {
			t.Errorf("provider %d recorded %v; want [%s %s]", i, got, tracing.SpanAcquire, tracing.SpanHold)
		}
		_ = tp.Shutdown(ctx)
	}
}

// bareAllocs is what an uncontended cycle allocates with no handler.
func bareAllocs(t *testing.T) float64 {
	d := newLock(t, memory.New())
	return testing.AllocsPerRun(100, func() { cycle(t, context.Background(), d) })
}
