package accesslog_test

import (
	"context"
	"log/slog"
	"os"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/accesslog"
	"github.com/distlock/distlock/backend/memory"
)

func Example() {
	// A text logger without the attributes that change from run to run.
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			switch a.Key {
			case slog.TimeKey, "owner", "wait", "hold":
				return slog.Attr{}
			}
			return a
		},
	}))
	d, err := distlock.New(memory.New(), distlock.WithHandlers(accesslog.New(logger)))
	if err != nil {
		panic(err)
	}
	defer d.Close()

	ctx := context.Background()
	lk, err := d.TryLock(ctx, "orders", 0)
	if err != nil {
		panic(err)
	}
	d.TryLock(ctx, "orders", 0) // held: not acquired
	lk.Unlock(ctx)
	// Output:
	// level=INFO msg="distlock acquire" key=orders outcome=acquired remote_attempts=1 token=1
	// level=INFO msg="distlock acquire" key=orders outcome=not_acquired remote_attempts=1 error="distlock: not acquired"
	// level=INFO msg="distlock release" key=orders outcome=released
}
