package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

// go-zookeeper takes no context: a request returns when the server
// answers or the connection fails (its receive timeout is 2/3 of the
// session timeout; a frozen server can hold a reconnection for ten times
// that). Every request of the resource is therefore made from a goroutine
// of its own, which the caller waits for until its context ends and then
// leaves to complete on its own: see send, call and job.

// result is what one request returned.
type result[T any] struct {
	v   T
	err error
}

// send makes the request fn from a goroutine of its own and returns a
// channel that receives its result, whenever the client has one.
func send[T any](fn func() (T, error)) <-chan result[T] {
	ch := make(chan result[T], 1)
	go func() {
		v, err := fn()
		ch <- result[T]{v, err}
	}()
	return ch
}

// call makes the request fn and waits for its result until ctx ends; then
// it returns ctx's error and leaves the request to complete unwatched. It
// sends nothing when ctx has ended already. Use it for requests whose
// effect needs no undoing once abandoned: reads, and writes that the
// caller undoes or retries anyway.
func call[T any](ctx context.Context, fn func() (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	if ctx.Done() == nil { // never ends: no goroutine needed
		return fn()
	}
	select {
	case res := <-send(fn):
		return res.v, res.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// cleanup is what a job deletes: a znode by path, or every child of
// parent with guid in its name (a create whose reply was lost may have
// made one), once the request in flight, if any, has been answered.
type cleanup struct {
	path         string
	parent, guid string
	// after, when set, waits for a request in flight and returns what is
	// left to delete once the client has its result; false: nothing.
	after func() (cleanup, bool)
}

// job is a clean-up running in the background. It is not bound to the
// resource's life: a create abandoned in flight may land after Close, and
// its znode must not stay in the queue to be granted the lock unnoticed.
// It ends when nothing is left to delete (deleted, never created, or gone
// with its session), or when the connection is closed (the session ends
// with it, and its ephemeral znodes).
type job struct {
	done chan struct{}
}

// wait waits until the job is over or ctx ends. It is the Cleanup of the
// backend.AbandonedError that an abandoned request makes Acquire return.
func (j *job) wait(ctx context.Context) error {
	select {
	case <-j.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("zookeeper: clean-up of an abandoned attempt still waiting for the server: %w", ctx.Err())
	}
}

// later runs c in the background, backing off from 50ms to 2s between
// attempts, and returns its job.
func (r *Resource) later(c cleanup) *job {
	j := &job{done: make(chan struct{})}
	go func() {
		defer close(j.done)
		if c.after != nil {
			var ok bool
			if c, ok = c.after(); !ok {
				return
			}
		}
		backoff := 50 * time.Millisecond
		for closedOnce := false; ; {
			err := r.attempt(c)
			if err == nil {
				return
			}
			// A closed connection fails every request at once with
			// ErrConnectionClosed and stays disconnected; a broken one
			// fails those in flight so, but reconnects at once: seen
			// twice in a row, backoff apart, it is closed.
			closedNow := errors.Is(err, zk.ErrConnectionClosed) && r.conn.State() == zk.StateDisconnected
			if closedNow && closedOnce {
				return
			}
			closedOnce = closedNow
			t := time.NewTimer(backoff)
			<-t.C
			backoff = min(2*backoff, 2*time.Second)
		}
	}()
	return j
}

// attempt makes one try of c; nil when nothing is left to delete.
func (r *Resource) attempt(c cleanup) error {
	if c.path != "" {
		err := r.conn.Delete(c.path, -1)
		if gone(err) {
			return nil
		}
		return err
	}
	// A sync first: an ensemble member that lags then lists every create
	// of ours the leader accepted, one whose reply was lost included (the
	// leader refuses the later ones: the session moved). In Acquire the
	// create that succeeded orders the listing after the lost ones; here
	// every create failed, and nothing else does.
	if _, err := r.conn.Sync(c.parent); err != nil && !errors.Is(err, zk.ErrNoNode) {
		if gone(err) {
			return nil
		}
		return err
	}
	children, _, err := r.conn.Children(c.parent)
	if err != nil {
		if gone(err) {
			return nil
		}
		return err
	}
	var errs []error
	for _, name := range children {
		if strings.Contains(name, c.guid) {
			errs = append(errs, r.attempt(cleanup{path: c.parent + "/" + name}))
		}
	}
	return errors.Join(errs...)
}

// gone reports whether a request's error says that what it was about is
// gone, or goes with the session: the znode (or its parent) does not
// exist, the session expired, or the connection is closing.
func gone(err error) bool {
	return err == nil || errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrSessionExpired) || errors.Is(err, zk.ErrClosing)
}
