package sqldb

import (
	"context"
	"time"
)

// cleanupTimeout bounds what an acquire does after its caller's ctx has
// ended: waiting for the reply of a statement already sent (see
// statementContext), and then the compare-and-delete of the row it may
// have written.
const cleanupTimeout = 5 * time.Second

// statementContext returns the context to run an acquire statement with,
// and a stop func to call once the statement has returned.
//
// A statement that may have been sent must not be abandoned when ctx
// ends. Both drivers then drop the connection and return at once, while
// the server carries on and commits; a clean-up DELETE sent over another
// connection can run before that commit, find nothing, and leave an orphan
// row until its TTL runs out. So the statement's context ends only
// cleanupTimeout after ctx does: by then the reply has normally come, and
// it says exactly whether the row was written (a reply means the statement
// has committed, so a DELETE over any connection comes after it). Only a
// reply that never comes leaves the outcome unknown.
//
// The returned context carries ctx's values. When ctx cannot end it is
// ctx itself, at no cost.
func statementContext(ctx context.Context) (context.Context, func()) {
	if ctx.Done() == nil {
		return ctx, func() {}
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stopAfter := context.AfterFunc(ctx, func() {
		t := time.NewTimer(cleanupTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-sctx.Done(): // the statement returned
		}
	})
	return sctx, func() {
		stopAfter()
		cancel()
	}
}

// cleanupContext is a context for the compare-and-delete after an
// acquire whose caller has given up or whose outcome is unknown: it
// survives the caller's cancellation but not long.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
}
