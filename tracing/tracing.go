package tracing

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
)

var (
	_ distlock.Handler      = (*Handler)(nil)
	_ distlock.LossObserver = (*Handler)(nil)
)

// ScopeName is the instrumentation scope name of the tracer the Handler
// makes its spans with.
const ScopeName = "github.com/distlock/distlock/tracing"

// Span names.
const (
	SpanAcquire = "distlock.acquire"
	SpanHold    = "distlock.hold"
)

// Attribute keys. See the package documentation for which span has which.
const (
	KeyKey            = attribute.Key("distlock.key")
	KeyStore          = attribute.Key("distlock.store")
	KeyWait           = attribute.Key("distlock.wait")
	KeyTTL            = attribute.Key("distlock.ttl")
	KeyMode           = attribute.Key("distlock.mode")  // mutex, semaphore, read, write or election
	KeyLimit          = attribute.Key("distlock.limit") // a semaphore's limit
	KeyRemoteAttempts = attribute.Key("distlock.remote_attempts")
	KeyToken          = attribute.Key("distlock.token")
	KeyOutcome        = attribute.Key("distlock.outcome")
)

// Values of [KeyOutcome].
const (
	// Acquisition spans.
	OutcomeHeld         = "held"
	OutcomeNotAcquired  = "not_acquired"
	OutcomeContextEnded = "context_ended"
	OutcomeError        = "error"

	// Hold spans.
	OutcomeReleased = "released"
	OutcomeNotHeld  = "not_held"
	OutcomeLost     = "lost"
)

// Option configures a Handler.
type Option func(*config)

type config struct {
	provider trace.TracerProvider
	store    string
}

// WithTracerProvider makes the spans on tp. Default: the global
// TracerProvider (otel.GetTracerProvider), looked up at every acquisition;
// while none is set, no span is made. A nil tp is ignored. A
// [noop.TracerProvider], given here or set globally, makes no span and
// costs no allocation.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) {
		if tp != nil {
			c.provider = tp
		}
	}
}

// WithStore names the store the DistributeLock runs over ("redis", "etcd",
// "postgres", ...): the spans carry it as distlock.store. The handler
// cannot learn it itself (it sees requests, not the backend). Default:
// none, and no attribute.
func WithStore(name string) Option {
	return func(c *config) { c.store = name }
}

// Handler is the tracing handler. Build it with [New]; it is safe for
// concurrent use and may serve several DistributeLocks.
type Handler struct {
	store attribute.KeyValue // KeyStore's value; empty Key without WithStore

	// fixed is the tracer of WithTracerProvider's provider (nil for a noop
	// provider), used when explicit is set; otherwise the global provider's,
	// cached in global.
	explicit bool
	fixed    trace.Tracer
	global   atomic.Pointer[providerTracer]

	// holds are the open hold spans, by request: from a grant until its
	// release or loss. live counts them, so that Release and LockLost skip
	// the mutex when no span is open (tracing off).
	mu    sync.Mutex
	holds map[*distlock.Request]trace.Span
	live  atomic.Int64
}

// providerTracer is a TracerProvider and its tracer for this package.
type providerTracer struct {
	tp trace.TracerProvider
	tr trace.Tracer
}

// New returns a tracing Handler configured by opts. Nil options are
// ignored.
func New(opts ...Option) *Handler {
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	h := &Handler{holds: make(map[*distlock.Request]trace.Span)}
	if c.store != "" {
		h.store = KeyStore.String(c.store)
	}
	if c.provider != nil {
		h.explicit = true
		if _, ok := c.provider.(noop.TracerProvider); !ok {
			h.fixed = newTracer(c.provider)
		}
	}
	return h
}

func newTracer(tp trace.TracerProvider) trace.Tracer {
	return tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL))
}

// unsetGlobal is the global TracerProvider OpenTelemetry starts with: a
// placeholder that makes non-recording spans until otel.SetTracerProvider
// gives it a delegate, after which otel.GetTracerProvider never returns it
// again. It is recognized by its type (the otel module's internal/global
// package), so that the handler can skip all its work while no provider is
// set. Nil if a provider was set before this package was initialized.
var unsetGlobal = func() trace.TracerProvider {
	tp := otel.GetTracerProvider()
	if t := reflect.TypeOf(tp); t != nil && t.Kind() == reflect.Pointer &&
		t.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global" {
		return tp
	}
	return nil
}()

// tracer returns the tracer to make spans with, or nil: no spans.
func (h *Handler) tracer() trace.Tracer {
	if h.explicit {
		return h.fixed
	}
	tp := otel.GetTracerProvider()
	if tp == unsetGlobal { // never panics: unsetGlobal's type is a pointer
		return nil
	}
	if _, ok := tp.(noop.TracerProvider); ok {
		return nil
	}
	if c := h.global.Load(); c != nil && c.tp == tp { // the cache holds comparable providers only
		return c.tr
	}
	tr := newTracer(tp)
	if reflect.TypeOf(tp).Comparable() {
		h.global.Store(&providerTracer{tp: tp, tr: tr})
	}
	return tr
}

// Acquire implements [distlock.Handler]: it makes the acquisition span,
// passes it inward in ctx, and on success starts the hold span.
func (h *Handler) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	tr := h.tracer()
	if tr == nil {
		return next(ctx, r)
	}
	sctx, span := tr.Start(ctx, SpanAcquire, trace.WithAttributes(h.requestAttrs(r, true)...))
	err := next(sctx, r)
	o := acquireOutcome(ctx, r, err)
	span.SetAttributes(KeyOutcome.String(o), KeyRemoteAttempts.Int(r.RemoteAttempts))
	switch o {
	case OutcomeHeld:
		if r.Token != 0 {
			span.SetAttributes(tokenAttr(r.Token))
		}
		h.startHold(tr, ctx, r, span.SpanContext())
	case OutcomeContextEnded:
		span.SetAttributes(errorType(ctx.Err()))
		span.SetStatus(codes.Error, err.Error())
	case OutcomeError:
		span.SetAttributes(errorType(err))
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	return err
}

// acquireOutcome classifies an acquisition's end as the handler sees it:
// next's error and its context, which the caller's context, Close and the
// facade's bound on the wait (its end, plus a little grace for the last
// attempt) end.
func acquireOutcome(ctx context.Context, r *distlock.Request, err error) string {
	if err == nil {
		return OutcomeHeld
	}
	switch cerr := ctx.Err(); {
	case cerr != nil && !endedByWait(ctx, r, cerr):
		return OutcomeContextEnded
	case distlock.IsContention(ctx, r, err):
		return OutcomeNotAcquired
	}
	return OutcomeError
}

// endedByWait reports whether ctx, which ended with cerr, was ended by
// the facade's bound on r's wait rather than by the caller or Close. The
// context's deadline is the earlier of the caller's and the bound, which
// is at or after the wait's end: a deadline before the wait's end is the
// caller's. (A caller's deadline within the bound's grace after the wait's
// end counts as the wait's; TryLock calls that the caller's.)
func endedByWait(ctx context.Context, r *distlock.Request, cerr error) bool {
	if r.Wait <= 0 || !errors.Is(cerr, context.DeadlineExceeded) {
		return false
	}
	dl, ok := ctx.Deadline()
	return ok && !dl.Before(r.Deadline)
}

// requestAttrs are the attributes of r known before the outcome.
func (h *Handler) requestAttrs(r *distlock.Request, acquire bool) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 7)
	attrs = append(attrs, KeyKey.String(r.Key))
	if h.store.Key != "" {
		attrs = append(attrs, h.store)
	}
	attrs = append(attrs, KeyMode.String(r.Kind.String()))
	if r.Kind == distlock.KindSemaphore {
		attrs = append(attrs, KeyLimit.Int(r.Limit))
	}
	if acquire {
		attrs = append(attrs, KeyWait.Float64(r.Wait.Seconds()))
	}
	attrs = append(attrs, KeyTTL.Float64(r.TTL.Seconds()))
	return attrs
}

// tokenAttr is the fencing token as an attribute: OpenTelemetry has no
// unsigned integers, and a token past math.MaxInt64 (none of our stores
// makes one) is given as a decimal string rather than wrapped.
func tokenAttr(t uint64) attribute.KeyValue {
	if t > math.MaxInt64 {
		return KeyToken.String(strconv.FormatUint(t, 10))
	}
	return KeyToken.Int64(int64(t))
}

// startHold starts r's hold span, linked to the acquisition span acq and
// a child of the caller's span, and keeps it until the lock ends.
func (h *Handler) startHold(tr trace.Tracer, ctx context.Context, r *distlock.Request, acq trace.SpanContext) {
	// Only the caller's span is kept as the parent: the span may keep its
	// start context, and the acquisition's context (with everything the
	// caller's carries) must not live as long as the lock.
	parent := trace.ContextWithSpan(context.Background(), trace.SpanFromContext(ctx))
	at := r.Acquired
	if at.IsZero() {
		at = time.Now()
	}
	attrs := h.requestAttrs(r, false)
	if r.Token != 0 {
		attrs = append(attrs, tokenAttr(r.Token))
	}
	_, span := tr.Start(parent, SpanHold,
		trace.WithTimestamp(at),
		trace.WithLinks(trace.Link{SpanContext: acq}),
		trace.WithAttributes(attrs...))
	h.mu.Lock()
	h.holds[r] = span
	h.mu.Unlock()
	h.live.Add(1)
}

// takeHold removes and returns r's hold span, or nil.
func (h *Handler) takeHold(r *distlock.Request) trace.Span {
	if h.live.Load() == 0 {
		return nil
	}
	h.mu.Lock()
	span, ok := h.holds[r]
	if ok {
		delete(h.holds, r)
	}
	h.mu.Unlock()
	if ok {
		h.live.Add(-1)
	}
	return span
}

// peekHold returns r's hold span, or nil.
func (h *Handler) peekHold(r *distlock.Request) trace.Span {
	if h.live.Load() == 0 {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.holds[r]
}

// Release implements [distlock.Handler]: it ends the hold span with the
// release's outcome once the store answered; a store error is recorded on
// the span, which stays open (the lock is still held).
func (h *Handler) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	err := next(ctx, r)
	if err != nil && !errors.Is(err, distlock.ErrNotHeld) {
		if span := h.peekHold(r); span != nil {
			span.RecordError(err, trace.WithAttributes(errorType(err)))
		}
		return err
	}
	span := h.takeHold(r)
	if span == nil {
		return err
	}
	if err == nil {
		span.SetAttributes(KeyOutcome.String(OutcomeReleased))
	} else {
		span.SetAttributes(KeyOutcome.String(OutcomeNotHeld), errorType(err))
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	return err
}

// LockLost implements [distlock.LossObserver]: it ends the hold span with
// the cause.
func (h *Handler) LockLost(r *distlock.Request, cause error) {
	span := h.takeHold(r)
	if span == nil {
		return
	}
	span.SetAttributes(KeyOutcome.String(OutcomeLost), errorType(cause))
	span.SetStatus(codes.Error, cause.Error())
	span.End()
}

// errorType is err's error.type: the distlock and context sentinels by
// name, otherwise the type of the first error under fmt.Errorf's wrappers
// and errors.Join's (a store joins a clean-up's error to the one that made
// it clean up).
func errorType(err error) attribute.KeyValue {
	switch {
	case errors.Is(err, distlock.ErrNotHeld):
		return semconv.ErrorTypeKey.String("distlock.ErrNotHeld")
	case errors.Is(err, distlock.ErrClosed):
		return semconv.ErrorTypeKey.String("distlock.ErrClosed")
	case errors.Is(err, context.Canceled):
		return semconv.ErrorTypeKey.String("context.Canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return semconv.ErrorTypeKey.String("context.DeadlineExceeded")
	}
	return semconv.ErrorType(primary(err))
}

var fmtWrapType = reflect.TypeOf(fmt.Errorf("%w", errors.New("e")))

// primary returns the error that classifies err: err itself if it has an
// ErrorType method, else the first of the errors it joins or wraps with
// fmt.Errorf or backend.AbandonedError (an attempt given up while its
// request was in flight says nothing by its own type), recursively.
func primary(err error) error {
	for {
		switch u := err.(type) {
		case interface{ ErrorType() string }:
			return err
		case interface{ Unwrap() []error }: // errors.Join, fmt.Errorf with several %w
			if es := u.Unwrap(); len(es) > 0 && es[0] != nil {
				err = es[0]
				continue
			}
			return err
		}
		if a, ok := err.(*backend.AbandonedError); ok && a.Err != nil {
			err = a.Err
			continue
		}
		if reflect.TypeOf(err) == fmtWrapType {
			if u := errors.Unwrap(err); u != nil {
				err = u
				continue
			}
		}
		return err
	}
}
