package tracing_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/tracing"
)

// fixture is a tracing handler on an SDK TracerProvider whose spans go to
// an in-memory recorder, and the caller's span every test starts its
// calls under.
type fixture struct {
	rec *tracetest.SpanRecorder
	tp  *sdktrace.TracerProvider
	h   *tracing.Handler
}

func newFixture(t testing.TB, opts ...tracing.Option) *fixture {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	opts = append([]tracing.Option{tracing.WithTracerProvider(tp)}, opts...)
	return &fixture{rec: rec, tp: tp, h: tracing.New(opts...)}
}

// caller starts the caller's own span; end it with the returned func.
func (f *fixture) caller(ctx context.Context, name string) (context.Context, trace.Span) {
	return f.tp.Tracer("test").Start(ctx, name)
}

// ended returns the ended spans named name, in the order they ended.
func (f *fixture) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range f.rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// one returns the only ended span named name.
func (f *fixture) one(t testing.TB, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	ss := f.ended(name)
	if len(ss) != 1 {
		t.Fatalf("%d ended %s spans; want 1 (all ended: %v)", len(ss), name, names(f.rec.Ended()))
	}
	return ss[0]
}

// open returns the names of the spans started and not ended.
func (f *fixture) open() []string {
	ended := make(map[trace.SpanID]bool)
	for _, s := range f.rec.Ended() {
		ended[s.SpanContext().SpanID()] = true
	}
	var out []string
	for _, s := range f.rec.Started() {
		if !ended[s.SpanContext().SpanID()] {
			out = append(out, s.Name())
		}
	}
	return out
}

func names(ss []sdktrace.ReadOnlySpan) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Name()
	}
	return out
}

// attrs returns s's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value)
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// want is an attribute check: a value, or absent (nil).
type want map[attribute.Key]any

// checkAttrs compares s's attributes with w: an int, int64, float64 or
// string value must be equal; nil means absent; a func(attribute.Value)
// bool must accept the value.
func checkAttrs(t testing.TB, s sdktrace.ReadOnlySpan, w want) {
	t.Helper()
	got := attrs(s)
	for k, v := range w {
		g, ok := got[k]
		if v == nil {
			if ok {
				t.Errorf("%s: %s = %v; want absent", s.Name(), k, g.String())
			}
			continue
		}
		if !ok {
			t.Errorf("%s: %s absent; want %v", s.Name(), k, v)
			continue
		}
		var match bool
		switch v := v.(type) {
		case int:
			match = g.Type() == attribute.INT64 && g.AsInt64() == int64(v)
		case int64:
			match = g.Type() == attribute.INT64 && g.AsInt64() == v
		case uint64:
			match = g.Type() == attribute.INT64 && g.AsInt64() == int64(v)
		case float64:
			match = g.Type() == attribute.FLOAT64 && g.AsFloat64() == v
		case string:
			match = g.Type() == attribute.STRING && g.AsString() == v
		case func(attribute.Value) bool:
			match = v(g)
		default:
			t.Fatalf("checkAttrs: %T", v)
		}
		if !match {
			t.Errorf("%s: %s = %v; want %v", s.Name(), k, g.String(), v)
		}
	}
}

// checkStatus checks s's status code, and that its description contains
// sub.
func checkStatus(t testing.TB, s sdktrace.ReadOnlySpan, code codes.Code, sub string) {
	t.Helper()
	st := s.Status()
	if st.Code != code {
		t.Errorf("%s: status %v %q; want %v", s.Name(), st.Code, st.Description, code)
	}
	if !strings.Contains(st.Description, sub) {
		t.Errorf("%s: status description %q; want it to contain %q", s.Name(), st.Description, sub)
	}
}

// checkParent checks that s is a child of parent.
func checkParent(t testing.TB, s sdktrace.ReadOnlySpan, parent trace.SpanContext) {
	t.Helper()
	if got := s.Parent(); got.SpanID() != parent.SpanID() || got.TraceID() != parent.TraceID() {
		t.Errorf("%s: parent %v/%v; want %v/%v", s.Name(), got.TraceID(), got.SpanID(), parent.TraceID(), parent.SpanID())
	}
}

// checkHold checks that hold is linked to acq (and to nothing else), and
// is its sibling.
func checkHold(t testing.TB, hold, acq sdktrace.ReadOnlySpan) {
	t.Helper()
	links := hold.Links()
	if len(links) != 1 || links[0].SpanContext.SpanID() != acq.SpanContext().SpanID() {
		var ids []trace.SpanID
		for _, l := range links {
			ids = append(ids, l.SpanContext.SpanID())
		}
		t.Errorf("hold links %v; want [%v] (the acquisition span)", ids, acq.SpanContext().SpanID())
	}
	if hold.Parent().SpanID() != acq.Parent().SpanID() {
		t.Errorf("hold's parent %v; want the acquisition's parent %v", hold.Parent().SpanID(), acq.Parent().SpanID())
	}
	if hold.StartTime().Before(acq.StartTime()) || hold.StartTime().After(acq.EndTime()) {
		t.Errorf("hold starts at %v; want within the acquisition [%v, %v]", hold.StartTime(), acq.StartTime(), acq.EndTime())
	}
}

func positive(v attribute.Value) bool { return v.Type() == attribute.INT64 && v.AsInt64() > 0 }

func atLeast(n int64) func(attribute.Value) bool {
	return func(v attribute.Value) bool { return v.Type() == attribute.INT64 && v.AsInt64() >= n }
}

func poll(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// uniqueKey is t's name plus random hex, so tests never share a key.
func uniqueKey(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return t.Name() + "-" + hex.EncodeToString(b[:])
}

// probe is a handler placed inside the tracing handler: it records the
// span context of every acquisition's ctx, as a store's instrumentation
// (redisotel, otelpgx) would find it.
type probe struct {
	mu   sync.Mutex
	seen []trace.SpanContext
}

func (p *probe) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	p.mu.Lock()
	p.seen = append(p.seen, trace.SpanContextFromContext(ctx))
	p.mu.Unlock()
	return next(ctx, r)
}

func (p *probe) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	return next(ctx, r)
}

func (p *probe) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.seen)
}

// cancelAfter calls cancel once the probe has seen more than n
// acquisitions (or after 10s).
func (p *probe) cancelAfter(n int, cancel func()) {
	deadline := time.Now().Add(10 * time.Second)
	for p.count() <= n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
}

func (p *probe) last() trace.SpanContext {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.seen) == 0 {
		return trace.SpanContext{}
	}
	return p.seen[len(p.seen)-1]
}
