package accesslog

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/distlock/distlock"
)

var (
	_ distlock.Handler      = (*Handler)(nil)
	_ distlock.LossObserver = (*Handler)(nil)
)

// Handler is the access-log handler. Build it with [New]; it is safe for
// concurrent use.
type Handler struct {
	log   *slog.Logger
	level slog.Level
}

// Option configures a Handler.
type Option func(*Handler)

// WithLevel sets the level of the records of successful and contended
// acquisitions and of releases. Default [slog.LevelInfo].
func WithLevel(l slog.Level) Option {
	return func(h *Handler) { h.level = l }
}

// New returns a Handler that writes to logger; a nil logger means
// slog.Default() at the time of each record.
func New(logger *slog.Logger, opts ...Option) *Handler {
	h := &Handler{log: logger, level: slog.LevelInfo}
	for _, o := range opts {
		if o != nil {
			o(h)
		}
	}
	return h
}

func (h *Handler) logger() *slog.Logger {
	if h.log != nil {
		return h.log
	}
	return slog.Default()
}

// Acquire implements [distlock.Handler].
func (h *Handler) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	start := time.Now()
	err := next(ctx, r)
	outcome, level := "acquired", h.level
	switch {
	case err == nil:
	case distlock.IsContention(ctx, r, err):
		outcome = "not_acquired"
	default:
		outcome, level = "failed", slog.LevelError
	}
	l := h.logger()
	if !l.Enabled(ctx, level) {
		return err
	}
	attrs := []slog.Attr{
		slog.String("key", r.Key),
		slog.String("owner", r.Value),
		slog.String("outcome", outcome),
		slog.Duration("wait", time.Since(start)),
		slog.Int("remote_attempts", r.RemoteAttempts),
	}
	attrs = appendKind(attrs, r)
	if err == nil {
		attrs = append(attrs, slog.Uint64("token", r.Token))
	} else {
		attrs = append(attrs, slog.Any("error", err))
	}
	l.LogAttrs(ctx, level, "distlock acquire", attrs...)
	return err
}

// Release implements [distlock.Handler].
func (h *Handler) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	err := next(ctx, r)
	outcome, level := "released", h.level
	switch {
	case err == nil:
	case errors.Is(err, distlock.ErrNotHeld):
		outcome, level = "not_held", slog.LevelWarn
	default:
		outcome, level = "failed", slog.LevelError
	}
	l := h.logger()
	if !l.Enabled(ctx, level) {
		return err
	}
	attrs := []slog.Attr{
		slog.String("key", r.Key),
		slog.String("owner", r.Value),
		slog.String("outcome", outcome),
	}
	attrs = appendKind(attrs, r)
	if !r.Acquired.IsZero() {
		attrs = append(attrs, slog.Duration("hold", time.Since(r.Acquired)))
	}
	if err != nil {
		attrs = append(attrs, slog.Any("error", err))
	}
	l.LogAttrs(ctx, level, "distlock release", attrs...)
	return err
}

// LockLost implements [distlock.LossObserver].
func (h *Handler) LockLost(r *distlock.Request, cause error) {
	ctx := context.Background()
	l := h.logger()
	if !l.Enabled(ctx, slog.LevelWarn) {
		return
	}
	attrs := []slog.Attr{
		slog.String("key", r.Key),
		slog.String("owner", r.Value),
		slog.String("outcome", "lost"),
	}
	if !r.Acquired.IsZero() {
		attrs = append(attrs, slog.Duration("hold", time.Since(r.Acquired)))
	}
	attrs = append(attrs, slog.Any("error", cause))
	l.LogAttrs(ctx, slog.LevelWarn, "distlock lost", attrs...)
}

// appendKind adds the kind of lock, and a semaphore's limit, unless it is
// a mutex.
func appendKind(attrs []slog.Attr, r *distlock.Request) []slog.Attr {
	if r.Kind == distlock.KindMutex {
		return attrs
	}
	attrs = append(attrs, slog.String("kind", r.Kind.String()))
	if r.Kind == distlock.KindSemaphore {
		attrs = append(attrs, slog.Int("limit", r.Limit))
	}
	return attrs
}
