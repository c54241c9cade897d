package tracing_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/tracing"
)

func TestOutcomesRedis(t *testing.T) {
	srv := testserver.Redis(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	runOutcomes(t, kit{
		name: "redis",
		open: func(t *testing.T) (backend.RemoteResource, func(string)) {
			return newRedis(t, c), func(key string) {
				lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
				if err := c.Del(context.Background(), lock).Err(); err != nil {
					t.Errorf("DEL %s: %v", lock, err)
				}
			}
		},
		// A real server, stopped: the client's dial is refused.
		broken: func(t *testing.T) backend.RemoteResource {
			dead := testserver.Redis(t)
			dead.Stop()
			dc := goredis.NewClient(&goredis.Options{Addr: dead.Addr, MaxRetries: -1})
			t.Cleanup(func() { _ = dc.Close() })
			return newRedis(t, dc)
		},
		// The dial's error, under the store's wrapping and the joined
		// error of its clean-up.
		storeErrType: func(v attribute.Value) bool { return v.AsString() == "*net.OpError" },
	})
}

// spanHook makes a client span per Redis command under the span in the
// command's ctx, as redisotel's tracing hook does.
type spanHook struct{ tr trace.Tracer }

func (spanHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h spanHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		ctx, span := h.tr.Start(ctx, "redis "+cmd.Name(), trace.WithSpanKind(trace.SpanKindClient))
		defer span.End()
		return next(ctx, cmd)
	}
}

func (h spanHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		ctx, span := h.tr.Start(ctx, "redis pipeline", trace.WithSpanKind(trace.SpanKindClient))
		defer span.End()
		return next(ctx, cmds)
	}
}

// TestRedisCommandsNest: the Redis client's command spans nest under the
// acquisition span, one per attempt; the release's under Unlock's caller.
func TestRedisCommandsNest(t *testing.T) {
	srv := testserver.Redis(t)
	f := newFixture(t, tracing.WithStore("redis"))
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	c.AddHook(spanHook{tr: f.tp.Tracer("redis-client")})
	d := newLock(t, newRedis(t, c), distlock.WithHandlers(f.h))
	key := uniqueKey(t)

	holder, err := d.TryLock(context.Background(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() {
		// Release once the waiter below has tried twice (the holder's
		// script span is the first).
		deadline := time.Now().Add(10 * time.Second)
		for f.scriptSpans() < 3 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		released <- holder.Unlock(context.Background())
	}()
	ctx, caller := f.caller(t.Context(), "request")
	lk, err := d.TryLock(ctx, key, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	uctx, unlockCaller := f.caller(t.Context(), "unlock request")
	if err := lk.Unlock(uctx); err != nil {
		t.Fatal(err)
	}
	unlockCaller.End()
	caller.End()

	var acq trace.SpanContext
	var attempts int64
	for _, s := range f.ended(tracing.SpanAcquire) {
		if s.Parent().SpanID() == caller.SpanContext().SpanID() {
			acq, attempts = s.SpanContext(), attrs(s)[tracing.KeyRemoteAttempts].AsInt64()
		}
	}
	if !acq.IsValid() {
		t.Fatal("no acquisition span under the caller's")
	}
	var scripts, releases int
	for _, s := range f.rec.Ended() {
		if !strings.HasPrefix(s.Name(), "redis ") {
			continue
		}
		switch s.Parent().SpanID() {
		case acq.SpanID():
			if strings.HasPrefix(s.Name(), "redis eval") {
				scripts++
			}
		case unlockCaller.SpanContext().SpanID():
			releases++
		}
	}
	// Each attempt is one script run (EVALSHA, and EVAL after NOSCRIPT).
	if int64(scripts) < attempts || attempts < 2 {
		t.Errorf("%d script spans under the acquisition span, %d attempts; want at least 2 attempts, a span each", scripts, attempts)
	}
	if releases == 0 {
		t.Errorf("no Redis command span under Unlock's caller")
	}
}

// scriptSpans counts the ended spans of Redis script runs.
func (f *fixture) scriptSpans() int {
	n := 0
	for _, s := range f.rec.Ended() {
		if strings.HasPrefix(s.Name(), "redis eval") {
			n++
		}
	}
	return n
}

// TestRedisReleaseFails: a release that fails with a store error leaves
// the hold span open with the error recorded; once the store is back, the
// retried Unlock ends it (the restarted server lost the key: not_held).
func TestRedisReleaseFails(t *testing.T) {
	srv := testserver.Redis(t)
	f := newFixture(t, tracing.WithStore("redis"))
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	d := newLock(t, newRedis(t, c), distlock.WithHandlers(f.h))
	lk, err := d.TryLock(t.Context(), uniqueKey(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	if err := lk.Unlock(t.Context()); err == nil || errors.Is(err, distlock.ErrNotHeld) {
		t.Fatalf("Unlock with the server stopped = %v; want a store error", err)
	}
	if got := f.open(); len(got) != 1 || got[0] != tracing.SpanHold {
		t.Fatalf("open spans after a failed release: %v; want the hold span", got)
	}
	var events []string
	for _, s := range f.rec.Started() {
		if s.Name() == tracing.SpanHold {
			for _, e := range s.Events() {
				events = append(events, e.Name)
			}
		}
	}
	if len(events) != 1 || events[0] != "exception" {
		t.Errorf("hold span events %v; want one exception", events)
	}
	srv.Start()
	if err := lk.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Fatalf("Unlock after the restart = %v; want ErrNotHeld (the server lost its data)", err)
	}
	hold := f.one(t, tracing.SpanHold)
	checkAttrs(t, hold, want{tracing.KeyOutcome: tracing.OutcomeNotHeld})
	if len(f.open()) != 0 {
		t.Errorf("open spans: %v; want none", f.open())
	}
}

// newRedis returns redis.New(c), failing t on an error.
func newRedis(t *testing.T, c goredis.UniversalClient) *redis.Resource {
	t.Helper()
	r, err := redis.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
