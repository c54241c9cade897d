package tracing_test

import (
	"context"
	"fmt"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/tracing"
)

// The handler makes a span for the acquisition and one for the hold. An
// application sets its provider globally (otel.SetTracerProvider) and
// uses tracing.New(tracing.WithStore(...)); here the spans go to an
// in-memory recorder.
func Example() {
	rec := tracetest.NewSpanRecorder()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer provider.Shutdown(context.Background())

	tr := tracing.New(tracing.WithTracerProvider(provider), tracing.WithStore("memory"))
	d, err := distlock.New(memory.New(), distlock.WithHandlers(tr))
	if err != nil {
		panic(err)
	}
	defer d.Close()

	ctx, span := provider.Tracer("app").Start(context.Background(), "request")
	err = d.Do(ctx, "orders", 0, func(ctx context.Context, lk *distlock.Lock) error {
		// A second caller finds the key held.
		_, err := d.TryLock(context.Background(), "orders", 0)
		fmt.Println("second caller:", err)
		return nil
	})
	span.End()
	if err != nil {
		panic(err)
	}
	for _, s := range rec.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == tracing.KeyOutcome {
				fmt.Printf("%s %s, %d link(s)\n", s.Name(), kv.Value.AsString(), len(s.Links()))
			}
		}
	}
	// Output:
	// second caller: distlock: not acquired
	// distlock.acquire held, 0 link(s)
	// distlock.acquire not_acquired, 0 link(s)
	// distlock.hold released, 1 link(s)
}
