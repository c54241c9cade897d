package sqldb

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// maxStatementTime bounds an acquire statement on the server: it writes
// nothing once min(its context's deadline, maxStatementTime) has passed
// since it reached the server (PostgreSQL: a guard in the statement;
// MariaDB: max_statement_time). A statement blocked that long, by a table
// another session locked, say, fails with a store error wrapping
// context.DeadlineExceeded. After that time an abandoned statement can
// take no key, whatever becomes of its connection.
const maxStatementTime = 5 * time.Second

// replyGrace is how long past its server-side bound the reply of an
// abandoned acquire statement is waited for before its connection is
// dropped: the reply is normally there by then, or the server is frozen
// or out of reach.
const replyGrace = time.Second

// cleanupTimeout bounds one compare-and-delete of a clean-up: the facade
// retries it with backoff while it fails.
const cleanupTimeout = 5 * time.Second

// statementBound returns the server-side bound of an acquire statement
// run under ctx: the time left until ctx's deadline, at most
// maxStatementTime (and at least a microsecond).
func statementBound(ctx context.Context) time.Duration {
	b := maxStatementTime
	if dl, ok := ctx.Deadline(); ok {
		b = min(b, time.Until(dl))
	}
	return max(b, time.Microsecond)
}

// A flight is an acquire statement (MySQL's, through database/sql) run
// in a goroutine of its own, so that
// TryAcquire can return when its context ends (the facade's rule: a store
// call returns then, whatever the store does) while the statement runs on
// until its reply. The reply says exactly whether the row was written: a
// statement abandoned mid-way is not undone by a DELETE sent blind over
// another connection, which could run before the statement commits and
// leave an orphan row; its clean-up waits for the reply, then deletes the
// row only if the statement wrote it (or its outcome stayed unknown).
//
// Who settles the statement's connection is decided once, in one place:
// the first of the reply (finish) and the caller's giving up (wait)
// wins. A replied flight's connection goes back to the pool; an abandoned
// one's only once no cancel request can reach a later statement on it.
type flight[T any] struct {
	state atomic.Uint32
	done  chan struct{} // closed once res is set and the connection settled
	res   T
	sent  time.Time     // when the statement was handed to the driver
	bound time.Duration // its server-side bound; 0: none
}

const (
	flying uint32 = iota
	replied
	abandoned
)

func newFlight[T any](bound time.Duration) *flight[T] {
	f := new(flight[T])
	f.init(bound)
	return f
}

// init makes f a flight sent now with the given bound, for a flight held
// in a larger struct.
func (f *flight[T]) init(bound time.Duration) {
	f.done, f.sent, f.bound = make(chan struct{}), time.Now(), bound
}

// finish records the reply; settle releases the connection, told whether
// the caller gave up first. Called once, by the flight's goroutine.
func (f *flight[T]) finish(res T, settle func(abandoned bool)) {
	settle(!f.state.CompareAndSwap(flying, replied))
	f.res = res
	close(f.done)
}

// wait returns the reply, or ok == false once ctx has ended first: the
// flight is then abandoned and its goroutine settles the connection when
// the reply comes. A reply that lands as ctx ends wins. prepare, if not
// nil, runs before the flight may be abandoned: what it writes, settle
// reads when told the flight was abandoned.
func (f *flight[T]) wait(ctx context.Context, prepare func()) (res T, ok bool) {
	select {
	case <-f.done:
		return f.res, true
	case <-ctx.Done():
	}
	if prepare != nil {
		prepare()
	}
	if f.state.CompareAndSwap(flying, abandoned) {
		return res, false
	}
	<-f.done // replied just now: settling it is quick
	return f.res, true
}

// replyBy is when an abandoned flight's reply is given up on: its
// server-side bound (maxStatementTime when it has none) and replyGrace
// after it was sent.
func (f *flight[T]) replyBy() time.Time {
	b := f.bound
	if b <= 0 {
		b = maxStatementTime
	}
	return f.sent.Add(b + replyGrace)
}

// await waits for an abandoned flight's reply within ctx.
func (f *flight[T]) await(ctx context.Context) (T, error) {
	select {
	case <-f.done:
		return f.res, nil
	case <-ctx.Done():
		var zero T
		return zero, fmt.Errorf("waiting for the abandoned statement's reply: %w", ctx.Err())
	}
}

// errLate says that an acquire statement reached the point where it
// would write after its server-side bound, and wrote nothing.
var errLate = errors.New("the statement did not run within its time on the server")

// lateError is the store error for an acquire statement that its
// server-side bound stopped: it wraps context.DeadlineExceeded (the store
// did not answer in time), never ErrNotAcquired.
func lateError(bound time.Duration, err error) error {
	return fmt.Errorf("%w (%v, table locked?): %w: %w", errLate, bound.Round(time.Microsecond), context.DeadlineExceeded, err)
}

// cleanupContext is the context of one compare-and-delete in a clean-up.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, cleanupTimeout)
}
