package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/distlock/backend"
)

// Clean-ups (the revoke of a failed acquisition's lease, the delete of its
// key on a shared lease, the revoke of a released lock's lease) never run
// on a context detached from the caller's: a call returns when its context
// ends, whatever the server does. What a failed acquisition made is
// removed by a job the Resource runs in the background, at once and then
// again with growing pauses until it succeeds, the client is closed or the
// Resource is: a queue key left behind would block the lock for every
// later waiter as long as its lease lives, and the Resource keeps a shared
// lease alive until Close. Acquire waits for the job while its context
// lives; when the context ends first it returns a [backend.AbandonedError]
// whose Cleanup waits for the job.

// Retries start after firstRetry and double up to lastRetry.
const (
	firstRetry = 50 * time.Millisecond
	lastRetry  = time.Second
)

// job is a clean-up the Resource runs in the background.
type job struct {
	done chan struct{} // closed when the job ends
	ok   atomic.Bool   // it ended with its work done
}

// errCleanupGaveUp is the Cleanup error of a job ended by Close or by the
// client's Close before its work was done.
var errCleanupGaveUp = errors.New("etcd: clean-up ended by Close or by a closed client; what is left expires with its lease")

// wait waits until the job ends or ctx does. It is the Cleanup of the
// AbandonedError of an acquisition that left the job to clean up after it.
func (j *job) wait(ctx context.Context) error {
	select {
	case <-j.done:
		if j.ok.Load() {
			return nil
		}
		return errCleanupGaveUp
	case <-ctx.Done():
		return fmt.Errorf("etcd: clean-up of an abandoned attempt still waiting for the server: %w", ctx.Err())
	}
}

// later runs clean in the background, after first and then again and
// again with growing pauses, until it reports that nothing is left to do,
// the client is closed or [Resource.Close] is called. Each run gets a
// context bounded by cleanupTimeout. The job is done at once, its work
// undone, when the client or the Resource is closed already.
func (r *Resource) later(first time.Duration, clean func(ctx context.Context) bool) *job {
	j := &job{done: make(chan struct{})}
	if r.clientClosed() {
		close(j.done) // what is left expires with its lease
		return j
	}
	started := r.background(func(ctx context.Context) {
		defer close(j.done)
		t := time.NewTimer(first)
		defer t.Stop()
		for pause := firstRetry; ; pause = min(2*pause, lastRetry) {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if r.clientClosed() {
				return // what is left expires with its lease
			}
			cctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
			done := clean(cctx)
			cancel()
			if done {
				j.ok.Store(true)
				return
			}
			t.Reset(pause)
		}
	})
	if !started {
		close(j.done)
	}
	return j
}

// undo removes what a failed acquisition made (clean, run at once by a
// background job) and returns err once that is done, or once the Resource
// or the client is closed (what is left then expires with its lease).
// When ctx ends first it returns a [backend.AbandonedError] carrying err
// (joined with ctx's error) whose Cleanup waits for the job.
func (r *Resource) undo(ctx context.Context, err error, clean func(ctx context.Context) bool) error {
	j := r.later(0, clean)
	select {
	case <-j.done:
		return err
	case <-ctx.Done():
	}
	select {
	case <-j.done:
		return err
	default:
	}
	if !errors.Is(err, ctx.Err()) && !errors.Is(err, backend.ErrNotAcquired) {
		err = fmt.Errorf("%w: %w", err, ctx.Err())
	}
	return &backend.AbandonedError{Err: err, Cleanup: j.wait}
}

// soon runs clean once within ctx, and in the background (see later) if
// that did not do it.
func (r *Resource) soon(ctx context.Context, clean func(ctx context.Context) bool) {
	if ctx.Err() == nil && !r.clientClosed() && clean(ctx) {
		return
	}
	r.later(firstRetry, clean)
}

// background runs f in a goroutine the Resource owns: its context ends
// with [Resource.Close], which waits for f to return. After Close, f does
// not run and background reports false.
func (r *Resource) background(f func(ctx context.Context)) bool {
	ctx, cancel := context.WithCancel(context.Background())
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		cancel()
		return false
	}
	r.nextTask++
	id := r.nextTask
	r.tasks[id] = cancel
	r.bg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.bg.Done()
		defer func() {
			r.mu.Lock()
			delete(r.tasks, id)
			r.mu.Unlock()
			cancel()
		}()
		f(ctx)
	}()
	return true
}

// stopTasks ends the background clean-ups and waits for them (Close).
func (r *Resource) stopTasks() {
	r.mu.Lock()
	for _, cancel := range r.tasks {
		cancel()
	}
	r.mu.Unlock()
	r.bg.Wait()
}

// revoker is a clean-up that revokes a lease, then calls gone (if not
// nil). A lease revoked is a lease on which no late request can make a
// key: a transaction that puts a key on it fails.
func (r *Resource) revoker(id clientv3.LeaseID, gone func()) func(ctx context.Context) bool {
	return func(ctx context.Context) bool {
		if !r.revokeNow(ctx, id) {
			return false
		}
		if gone != nil {
			gone()
		}
		return true
	}
}

// discarder is the clean-up of a failed acquisition on a shared lease: it
// deletes h's key if it is ours (or makes sure that it cannot be made,
// when the reply that would have told its create revision was lost: see
// fenceOff) and gives its name back. A key on a shared lease whose
// clean-up still fails a TTL after the first try makes the Resource give
// the lease up, as the TTL timer does: the lease then expires on the
// server, with the key, and the retries end once they find it gone.
//
// value is what the key holds (the fence-off compares it): needed only
// while h.rev is 0.
func (r *Resource) discarder(h *handle, value string) func(ctx context.Context) bool {
	giveUp := time.Now().Add(h.ttl())
	return func(ctx context.Context) bool {
		var err error
		if h.rev == 0 {
			err = r.fenceOff(ctx, h, value)
		} else {
			_, err = r.deleteOurs(ctx, h)
		}
		if err == nil {
			r.free(h)
			return true
		}
		if time.Now().After(giveUp) && h.sess != nil {
			h.sess.abandon()
		}
		return false
	}
}

// fenceOff deletes h's key on its shared lease if a transaction that may
// still be on its way made it, and, in the same transaction, puts the
// fence key of h's name (see session), so that such a transaction, should
// it land later, makes nothing. A lease gone is a fence too: nothing can
// be made on it any more, and its keys went with it.
func (r *Resource) fenceOff(ctx context.Context, h *handle, value string) error {
	s := h.sess
	key := r.name(h).key
	mine := []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(key), "=", value),
		clientv3.Compare(clientv3.LeaseValue(key), "=", int64(s.id)),
	}
	bump := clientv3.OpPut(s.fenceKey(key), "", clientv3.WithLease(s.id))
	resp, err := r.c.Txn(ctx).If(mine...).Then(clientv3.OpDelete(key), bump).Else(bump).Commit()
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil
		}
		return err
	}
	s.fenced(key, resp.Header.Revision, false)
	return nil
}
