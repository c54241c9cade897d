// Command tracing prints the OpenTelemetry spans of a contended run on the
// in-process store with the stdout exporter, one JSON object per span as
// it ends: four jobs that take turns on one key, each a span with its
// distlock.acquire span (the wait: remote attempts, outcome, token) and
// its distlock.hold span (linked to the acquisition that granted it), and
// a "peek" that finds the key held and does not wait (outcome
// not_acquired).
//
//	go run ./examples/tracing
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/tracing"
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "tracing:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	exporter, err := stdouttrace.New(stdouttrace.WithWriter(out), stdouttrace.WithPrettyPrint())
	if err != nil {
		return err
	}
	// WithSyncer exports each span as it ends; a real application would
	// batch (sdktrace.WithBatcher) to an OTLP exporter.
	provider := sdktrace.NewTracerProvider(
		sdktrace.WithSyncer(exporter),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "tracing-example"))))
	defer provider.Shutdown(context.WithoutCancel(ctx))
	// An application would rather set it globally, otel.SetTracerProvider(provider),
	// and use tracing.New(tracing.WithStore("memory")).
	tr := tracing.New(tracing.WithTracerProvider(provider), tracing.WithStore("memory"))
	d, err := distlock.New(memory.New(), distlock.WithHandlers(tr))
	if err != nil {
		return err
	}
	defer d.Close()
	app := provider.Tracer("example")

	// job runs under a span of its own, as a request handler would.
	job := func(name string, work func()) error {
		ctx, span := app.Start(ctx, name)
		defer span.End()
		return d.Do(ctx, "orders", 2*time.Second, func(context.Context, *distlock.Lock) error {
			work()
			return nil
		})
	}

	// Job 0 holds the key while three more queue for it, and a fifth
	// caller finds it held and does not wait.
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	errs <- job("job 0", func() {
		for i := 1; i <= 3; i++ {
			wg.Go(func() {
				errs <- job(fmt.Sprintf("job %d", i), func() { time.Sleep(2 * time.Millisecond) })
			})
		}
		pctx, span := app.Start(ctx, "peek")
		if _, err := d.TryLock(pctx, "orders", 0); !errors.Is(err, distlock.ErrNotAcquired) {
			errs <- fmt.Errorf("peek: %v; want ErrNotAcquired", err)
		}
		span.End()
		time.Sleep(10 * time.Millisecond) // the work the lock protects
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
