package metrics_test

import (
	"context"
	"fmt"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/metrics"
)

func Example() {
	ctx := context.Background()
	met := metrics.New() // add metrics.WithMeterProvider(mp) for OpenTelemetry
	d, err := distlock.New(memory.New(), distlock.WithHandlers(met))
	if err != nil {
		panic(err)
	}
	defer d.Close()

	lk, err := d.TryLock(ctx, "orders", 0)
	if err != nil {
		panic(err)
	}
	d.TryLock(ctx, "orders", 0) // contention, not failure
	lk.Unlock(ctx)

	s := met.Stats()
	fmt.Printf("acquired %d, not acquired %d, failed %d, released %d, remote attempts %d\n",
		s.Acquired, s.NotAcquired, s.Failed, s.Released, s.RemoteAttempts)
	// Output:
	// acquired 1, not acquired 1, failed 0, released 1, remote attempts 2
}
