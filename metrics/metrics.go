package metrics

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/distlock/distlock"
)

var (
	_ distlock.Handler      = (*Handler)(nil)
	_ distlock.LossObserver = (*Handler)(nil)
)

// MeterName is the instrumentation scope name of the meter the Handler
// records on.
const MeterName = "github.com/distlock/distlock/metrics"

// Outcome attribute values.
const (
	OutcomeAcquired    = "acquired"
	OutcomeNotAcquired = "not_acquired"
	OutcomeFailed      = "failed"
	OutcomeReleased    = "released"
	OutcomeNotHeld     = "not_held"
)

// Stats is a snapshot of a Handler's counters. Counters only grow; Held and
// Waiting are gauges.
type Stats struct {
	Acquired       uint64 // acquisitions that got the lock
	NotAcquired    uint64 // contention: held by another owner for the whole wait, or the context ended
	Failed         uint64 // acquisitions that failed with any other error
	Released       uint64 // releases the store confirmed
	ReleaseErrors  uint64 // releases that returned an error, ErrNotHeld included
	Lost           uint64 // locks known lost before Unlock
	RemoteAttempts uint64 // calls that reached the backend's acquire, over all acquisitions

	Held    int64 // locks held now
	Waiting int64 // acquisitions under way now
}

// Option configures a Handler.
type Option func(*config)

type config struct {
	provider metric.MeterProvider
	attrs    []attribute.KeyValue
}

// WithMeterProvider records on OpenTelemetry instruments from mp as well.
// Default: none (only [Handler.Stats] counts). A nil mp is ignored.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.provider = mp }
}

// WithAttributes adds attributes to every measurement, for example the
// name of the backend or of the DistributeLock. Keep their values few.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return func(c *config) { c.attrs = append(c.attrs, attrs...) }
}

// Handler is the metrics handler. Build it with [New]; it is safe for
// concurrent use and may serve several DistributeLocks.
type Handler struct {
	acquired, notAcquired, failed atomic.Uint64
	released, releaseErrors, lost atomic.Uint64
	remoteAttempts                atomic.Uint64
	held, waiting                 atomic.Int64

	inst *instruments // nil without a MeterProvider
	err  error
}

// New returns a metrics Handler configured by opts. Nil options are
// ignored.
func New(opts ...Option) *Handler {
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	h := &Handler{}
	if c.provider != nil {
		h.inst, h.err = newInstruments(c.provider, c.attrs)
	}
	return h
}

// Err returns the error met creating the OpenTelemetry instruments, if any.
// The Handler still works then; the instruments that could not be made
// record nothing.
func (h *Handler) Err() error { return h.err }

// Stats returns a snapshot of the counters.
func (h *Handler) Stats() Stats {
	return Stats{
		Acquired:       h.acquired.Load(),
		NotAcquired:    h.notAcquired.Load(),
		Failed:         h.failed.Load(),
		Released:       h.released.Load(),
		ReleaseErrors:  h.releaseErrors.Load(),
		Lost:           h.lost.Load(),
		RemoteAttempts: h.remoteAttempts.Load(),
		Held:           h.held.Load(),
		Waiting:        h.waiting.Load(),
	}
}

// Acquire implements [distlock.Handler]: it counts the acquisition's
// outcome and remote attempts and times the wait.
func (h *Handler) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	start := time.Now()
	h.waiting.Add(1)
	k := mode(r)
	if h.inst != nil {
		h.inst.waiting.Add(ctx, 1, h.inst.base[k]...)
	}
	err := next(ctx, r)
	h.waiting.Add(-1)
	h.remoteAttempts.Add(uint64(r.RemoteAttempts))
	o := outcomeAcquired
	switch {
	case err == nil:
		h.acquired.Add(1)
		h.held.Add(1)
	case distlock.IsContention(ctx, r, err):
		o = outcomeNotAcquired
		h.notAcquired.Add(1)
	default:
		o = outcomeFailed
		h.failed.Add(1)
	}
	if in := h.inst; in != nil {
		in.waiting.Add(ctx, -1, in.base[k]...)
		in.acquisitions.Add(ctx, 1, in.acquireAdd[k][o]...)
		in.remoteAttempts.Add(ctx, int64(r.RemoteAttempts), in.base[k]...)
		in.attempts.Record(ctx, int64(r.RemoteAttempts), in.acquireRec[k][o]...)
		in.wait.Record(ctx, time.Since(start).Seconds(), in.acquireRec[k][o]...)
		if err == nil {
			in.held.Add(ctx, 1, in.base[k]...)
		}
	}
	return err
}

// Release implements [distlock.Handler]: it counts the release's outcome
// and times the hold. A release that failed with a store error leaves the
// lock counted as held (Unlock may be called again).
func (h *Handler) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	err := next(ctx, r)
	o := outcomeReleased
	switch {
	case err == nil:
		h.released.Add(1)
	case errors.Is(err, distlock.ErrNotHeld):
		o = outcomeNotHeld
		h.releaseErrors.Add(1)
	default:
		o = outcomeReleaseFailed
		h.releaseErrors.Add(1)
	}
	if o != outcomeReleaseFailed {
		h.held.Add(-1)
	}
	if in := h.inst; in != nil {
		k := mode(r)
		in.releases.Add(ctx, 1, in.releaseAdd[k][o-outcomeReleased]...)
		if o != outcomeReleaseFailed {
			in.held.Add(ctx, -1, in.base[k]...)
			if !r.Acquired.IsZero() {
				in.hold.Record(ctx, time.Since(r.Acquired).Seconds(), in.releaseRec[k][o-outcomeReleased]...)
			}
		}
	}
	return err
}

// LockLost implements [distlock.LossObserver].
func (h *Handler) LockLost(r *distlock.Request, _ error) {
	h.lost.Add(1)
	if in := h.inst; in != nil {
		in.lostCount.Add(context.Background(), 1, in.base[mode(r)]...)
	}
}

type outcome int

const (
	outcomeAcquired outcome = iota
	outcomeNotAcquired
	outcomeFailed
	outcomeReleased
	outcomeNotHeld
	outcomeReleaseFailed
)

// instruments are the OpenTelemetry instruments and the measurement
// options made once, so that recording allocates nothing of ours.
type instruments struct {
	acquisitions, releases, lostCount, remoteAttempts metric.Int64Counter
	attempts                                          metric.Int64Histogram
	wait, hold                                        metric.Float64Histogram
	held, waiting                                     metric.Int64UpDownCounter

	// By mode (the Request's Kind: mutex, semaphore, read, write,
	// election), then by outcome.
	base       [modes][]metric.AddOption
	acquireAdd [modes][3][]metric.AddOption
	acquireRec [modes][3][]metric.RecordOption
	releaseAdd [modes][3][]metric.AddOption
	releaseRec [modes][3][]metric.RecordOption
}

// modes is the number of kinds of lock (distlock.KindMutex ..
// distlock.KindElection), each measured under its "mode" attribute.
const modes = int(distlock.KindElection) + 1

// mode is r's index in the instruments' option arrays.
func mode(r *distlock.Request) int {
	if k := int(r.Kind); k < modes {
		return k
	}
	return 0
}

func newInstruments(mp metric.MeterProvider, attrs []attribute.KeyValue) (*instruments, error) {
	m := mp.Meter(MeterName)
	in := &instruments{}
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var err error
	in.acquisitions, err = m.Int64Counter("distlock.acquisitions",
		metric.WithDescription("Lock acquisitions by outcome: acquired, not_acquired (contention), failed."),
		metric.WithUnit("{acquisition}"))
	add(err)
	in.releases, err = m.Int64Counter("distlock.releases",
		metric.WithDescription("Lock releases by outcome: released, not_held, failed."),
		metric.WithUnit("{release}"))
	add(err)
	in.lostCount, err = m.Int64Counter("distlock.lost",
		metric.WithDescription("Locks known lost before Unlock."),
		metric.WithUnit("{lock}"))
	add(err)
	in.remoteAttempts, err = m.Int64Counter("distlock.remote_attempts",
		metric.WithDescription("Calls that reached the store's acquire."),
		metric.WithUnit("{call}"))
	add(err)
	in.attempts, err = m.Int64Histogram("distlock.acquire.attempts",
		metric.WithDescription("Calls that reached the store's acquire, per acquisition."),
		metric.WithUnit("{call}"),
		metric.WithExplicitBucketBoundaries(0, 1, 2, 3, 5, 10, 20, 50, 100, 200, 500))
	add(err)
	in.wait, err = m.Float64Histogram("distlock.wait.duration",
		metric.WithDescription("Time from the start of an acquisition to its outcome."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
	add(err)
	in.hold, err = m.Float64Histogram("distlock.hold.duration",
		metric.WithDescription("Time from a lock's acquisition to its release."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
	add(err)
	in.held, err = m.Int64UpDownCounter("distlock.held",
		metric.WithDescription("Locks held now."),
		metric.WithUnit("{lock}"))
	add(err)
	in.waiting, err = m.Int64UpDownCounter("distlock.waiting",
		metric.WithDescription("Acquisitions under way now."),
		metric.WithUnit("{acquisition}"))
	add(err)

	// A provider that failed may return nil instruments: record nothing then.
	if in.acquisitions == nil {
		in.acquisitions = noop.Int64Counter{}
	}
	if in.releases == nil {
		in.releases = noop.Int64Counter{}
	}
	if in.lostCount == nil {
		in.lostCount = noop.Int64Counter{}
	}
	if in.remoteAttempts == nil {
		in.remoteAttempts = noop.Int64Counter{}
	}
	if in.attempts == nil {
		in.attempts = noop.Int64Histogram{}
	}
	if in.wait == nil {
		in.wait = noop.Float64Histogram{}
	}
	if in.hold == nil {
		in.hold = noop.Float64Histogram{}
	}
	if in.held == nil {
		in.held = noop.Int64UpDownCounter{}
	}
	if in.waiting == nil {
		in.waiting = noop.Int64UpDownCounter{}
	}

	set := func(extra ...attribute.KeyValue) metric.MeasurementOption {
		kv := append(append([]attribute.KeyValue(nil), attrs...), extra...)
		return metric.WithAttributeSet(attribute.NewSet(kv...))
	}
	for k := range modes {
		m := attribute.String("mode", distlock.Kind(k).String())
		in.base[k] = []metric.AddOption{set(m)}
		for i, o := range []string{OutcomeAcquired, OutcomeNotAcquired, OutcomeFailed} {
			s := set(m, attribute.String("outcome", o))
			in.acquireAdd[k][i] = []metric.AddOption{s}
			in.acquireRec[k][i] = []metric.RecordOption{s}
		}
		for i, o := range []string{OutcomeReleased, OutcomeNotHeld, OutcomeFailed} {
			s := set(m, attribute.String("outcome", o))
			in.releaseAdd[k][i] = []metric.AddOption{s}
			in.releaseRec[k][i] = []metric.RecordOption{s}
		}
	}
	return in, errors.Join(errs...)
}
