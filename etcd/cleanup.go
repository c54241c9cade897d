package etcd

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Clean-ups (the delete of a failed acquisition's key, the revoke of a
// lease that holds nothing more) run once in the caller's goroutine. One
// that fails (the connection dropped under it, no leader) is retried in
// the background until it succeeds, the client is closed or the Resource
// is: a queue key left behind would block the lock for every later waiter
// as long as its lease lives, and the Resource keeps a shared lease alive
// until Close.

// Retries start after firstRetry and double up to lastRetry.
const (
	firstRetry = 50 * time.Millisecond
	lastRetry  = time.Second
)

// later runs clean in the background, again and again with growing pauses,
// until it reports that nothing is left to do, the client is closed or
// [Resource.Close] is called. Each run gets a context bounded by
// cleanupTimeout.
func (r *Resource) later(clean func(ctx context.Context) bool) {
	if r.clientClosed() {
		return // what is left expires with its lease
	}
	r.background(func(ctx context.Context) {
		t := time.NewTimer(firstRetry)
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
				return
			}
			t.Reset(pause)
		}
	})
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

// revokeSoon revokes a lease, retrying in the background if it fails,
// and calls gone (if not nil) once the lease is known gone.
func (r *Resource) revokeSoon(ctx context.Context, id clientv3.LeaseID, gone func()) {
	if r.revoke(ctx, id) {
		if gone != nil {
			gone()
		}
		return
	}
	r.later(func(ctx context.Context) bool {
		if !r.revokeNow(ctx, id) {
			return false
		}
		if gone != nil {
			gone()
		}
		return true
	})
}

// deleteSoon deletes h's key if it is still ours and gives its name back,
// retrying in the background if the delete fails. When h's create
// revision is unknown (the reply of the transaction that may have made the
// key was lost), finding no key does not end it: the transaction may still
// be on its way to the server, so the background looks again for the
// lock's TTL before it gives the name back.
func (r *Resource) deleteSoon(ctx context.Context, h *handle) {
	doubt := h.rev == 0
	deleted, err := r.deleteKey(ctx, h)
	if err == nil && (deleted || !doubt) {
		r.free(h)
		return
	}
	r.deleteLater(h, time.Now().Add(h.ttl), doubt)
}

// deleteLater retries the delete of h's key in the background and gives
// its name back once the key is known gone: deleted, or, when doubt says
// the key may not have been made yet, not found after giveUp. A key on a
// shared lease whose delete still fails after giveUp makes the Resource
// give the lease up, as the TTL timer does: the lease then expires on the
// server, with the key, and the retries end once they find it gone.
func (r *Resource) deleteLater(h *handle, giveUp time.Time, doubt bool) {
	r.later(func(ctx context.Context) bool {
		deleted, err := r.deleteOurs(ctx, h)
		late := time.Now().After(giveUp)
		if err == nil && (deleted || !doubt || late) {
			r.free(h)
			return true
		}
		if err != nil && late && h.sess != nil {
			h.sess.abandon()
		}
		return false
	})
}
