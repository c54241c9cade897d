package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/metrics"
)

// faulty fails TryAcquire with errStore on its failAt-th call (fault
// injection a real store cannot give on demand).
type faulty struct {
	*memory.Store
	calls, failAt atomic.Int64
}

var errStore = errors.New("store unreachable")

func (f *faulty) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	if f.calls.Add(1) == f.failAt.Load() {
		return false, 0, fmt.Errorf("faulty: acquire %q: %w", l.Key, errStore)
	}
	return f.Store.TryAcquire(ctx, l)
}

func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestStatsCountOutcomes(t *testing.T) {
	store := memory.New()
	f := &faulty{Store: store}
	f.failAt.Store(-1)
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	met := metrics.New(metrics.WithMeterProvider(provider), metrics.WithAttributes(attribute.String("backend", "memory")))
	if err := met.Err(); err != nil {
		t.Fatal(err)
	}
	d, err := distlock.New(f, distlock.WithHandlers(met), distlock.WithSpin(time.Millisecond, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	other, err := distlock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	key := t.Name()

	// acquired and released
	lk, err := d.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s := met.Stats(); s.Held != 1 {
		t.Errorf("Held = %d while held; want 1", s.Held)
	}
	if err := lk.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}

	// contention, with a wait: several remote attempts, not a failure
	theirs, err := other.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryLock(t.Context(), key, 20*time.Millisecond); !errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("TryLock under contention = %v", err)
	}
	// contention ended by the context
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { _, err := d.TryLock(ctx, key, time.Minute); errc <- err }()
	poll(t, "the caller waits", func() bool { return met.Stats().Waiting == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled TryLock = %v", err)
	}
	theirs.Unlock(t.Context())

	// a store error is a failure
	f.failAt.Store(f.calls.Load() + 1)
	if _, err := d.TryLock(t.Context(), key, time.Second); !errors.Is(err, errStore) {
		t.Fatalf("TryLock with a failing store = %v", err)
	}

	// a release that finds the lock gone
	lk, err = d.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	store.Evict(key)
	if err := lk.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Fatalf("Unlock after eviction = %v", err)
	}

	s := met.Stats()
	want := metrics.Stats{Acquired: 2, NotAcquired: 2, Failed: 1, Released: 1, ReleaseErrors: 1}
	got := s
	got.RemoteAttempts = 0
	if got != want {
		t.Errorf("Stats() = %+v;\nwant %+v", got, want)
	}
	// 1 + >=2 (20ms wait at 1-2ms spin) + >=1 (cancelled) + 1 (failed) + 1
	if s.RemoteAttempts < 6 {
		t.Errorf("RemoteAttempts = %d; want >= 6", s.RemoteAttempts)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	sums := map[string]int64{}
	counts := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != metrics.MeterName {
			continue
		}
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					if v, ok := dp.Attributes.Value("backend"); !ok || v.AsString() != "memory" {
						t.Errorf("%s: data point without the backend attribute: %v", m.Name, dp.Attributes)
					}
					o, _ := dp.Attributes.Value("outcome")
					sums[m.Name+"/"+o.AsString()] += dp.Value
				}
			case metricdata.Histogram[float64]:
				for _, dp := range data.DataPoints {
					o, _ := dp.Attributes.Value("outcome")
					counts[m.Name+"/"+o.AsString()] += dp.Count
				}
			case metricdata.Histogram[int64]:
				for _, dp := range data.DataPoints {
					o, _ := dp.Attributes.Value("outcome")
					counts[m.Name+"/"+o.AsString()] += dp.Count
				}
			}
		}
	}
	for name, want := range map[string]int64{
		"distlock.acquisitions/acquired":     2,
		"distlock.acquisitions/not_acquired": 2,
		"distlock.acquisitions/failed":       1,
		"distlock.releases/released":         1,
		"distlock.releases/not_held":         1,
		"distlock.remote_attempts/":          int64(s.RemoteAttempts),
		"distlock.held/":                     0,
		"distlock.waiting/":                  0,
	} {
		if got := sums[name]; got != want {
			t.Errorf("%s = %d; want %d", name, got, want)
		}
	}
	for name, want := range map[string]uint64{
		"distlock.wait.duration/acquired":        2,
		"distlock.wait.duration/not_acquired":    2,
		"distlock.wait.duration/failed":          1,
		"distlock.acquire.attempts/acquired":     2,
		"distlock.hold.duration/released":        1,
		"distlock.hold.duration/not_held":        1,
		"distlock.acquire.attempts/not_acquired": 2,
	} {
		if got := counts[name]; got != want {
			t.Errorf("%s: %d recordings; want %d", name, got, want)
		}
	}
}

func TestLostCounted(t *testing.T) {
	store := memory.New()
	met := metrics.New()
	d, err := distlock.New(store, distlock.WithHandlers(met), distlock.WithAutoRenew(),
		distlock.WithDefaultTTL(60*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	lk, err := d.TryLock(t.Context(), t.Name(), 0)
	if err != nil {
		t.Fatal(err)
	}
	store.Evict(t.Name()) // the next renewal finds it gone
	<-lk.Done()
	if s := met.Stats(); s.Lost != 1 {
		t.Errorf("Lost = %d; want 1", s.Lost)
	}
	if err := lk.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("Unlock of a lost lock = %v; want ErrNotHeld", err)
	}
	if s := met.Stats(); s.Held != 0 {
		t.Errorf("Held = %d after Unlock of a lost lock; want 0", s.Held)
	}
}

func TestNoAllocationWithoutProvider(t *testing.T) {
	met := metrics.New()
	ctx := context.Background()
	r := &distlock.Request{Key: "k", Acquired: time.Now()}
	acquire := func(context.Context, *distlock.Request) error { return nil }
	release := func(context.Context, *distlock.Request) error { return nil }
	allocs := testing.AllocsPerRun(100, func() {
		met.Acquire(ctx, r, acquire)
		met.Release(ctx, r, release)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per acquire and release; want 0", allocs)
	}
}

func BenchmarkHandler(b *testing.B) {
	for _, bc := range []struct {
		name string
		met  *metrics.Handler
	}{
		{"stats", metrics.New()},
		{"otel", metrics.New(metrics.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			r := &distlock.Request{Key: "k", RemoteAttempts: 1, Acquired: time.Now()}
			acquire := func(context.Context, *distlock.Request) error { return nil }
			release := func(context.Context, *distlock.Request) error { return nil }
			b.ReportAllocs()
			for b.Loop() {
				bc.met.Acquire(ctx, r, acquire)
				bc.met.Release(ctx, r, release)
			}
		})
	}
}

// Every measurement carries the lock's mode.
func TestModeAttribute(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	met := metrics.New(metrics.WithMeterProvider(provider))
	d, err := distlock.New(memory.New(), distlock.WithHandlers(met))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := t.Context()
	for _, take := range []func() (*distlock.Lock, error){
		func() (*distlock.Lock, error) { return d.TryLock(ctx, "m", 0) },
		func() (*distlock.Lock, error) { return d.Semaphore("s", 2).TryAcquire(ctx, 0) },
		func() (*distlock.Lock, error) { return d.RWMutex("rw").TryRLock(ctx, 0) },
		func() (*distlock.Lock, error) { return d.RWMutex("w").TryLock(ctx, 0) },
		func() (*distlock.Lock, error) { return d.Election("e").Campaign(ctx, "v") },
	} {
		lk, err := take()
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			data, ok := m.Data.(metricdata.Sum[int64])
			if !ok || m.Name != "distlock.acquisitions" {
				continue
			}
			for _, dp := range data.DataPoints {
				v, _ := dp.Attributes.Value("mode")
				got[v.AsString()] += dp.Value
			}
		}
	}
	for _, mode := range []string{"mutex", "semaphore", "read", "write", "election"} {
		if got[mode] != 1 {
			t.Errorf("acquisitions with mode %q: %d; want 1 (all: %v)", mode, got[mode], got)
		}
	}
}
